"""One Redis connection that the Redis stores share: a client per event loop, scripts by SHA."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from worker._reconnect import reconnecting_client

__all__ = ["RedisConnection"]


class RedisConnection:
    """A reconnecting ``redis.asyncio`` client, created on first use on the event loop that
    uses it (a client is bound to its loop) and again when another loop calls."""

    def __init__(self, url: str, *, max_connections: int = 32, reconnect_s: float = 2.0) -> None:
        self.url = url
        # How long a command keeps reconnecting before StoreUnavailableError (workers: 15 s).
        self.reconnect_s = reconnect_s
        self._max_connections = max_connections
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shas: dict[str, str] = {}

    @property
    def client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = reconnecting_client(
                self.url, max_connections=self._max_connections, reconnect_s=self.reconnect_s
            )
            self._loop = loop
        return self._client

    async def evalsha_many(self, script: str, numkeys: int, calls: Sequence[Sequence[str]]) -> list[Any]:
        """Run ``script`` once per argument list (``numkeys`` keys each) in one pipeline."""
        return await self.evalsha_each(script, [(numkeys, args) for args in calls])

    async def evalsha_each(self, script: str, calls: Sequence[tuple[int, Sequence[str]]]) -> list[Any]:
        """Run ``script`` once per (number of keys, keys and arguments) in one pipeline, by SHA
        (loaded on first use and again if Redis lost it), without redis-py's per-pipeline
        SCRIPT EXISTS."""
        client = self.client
        sha = self._shas.get(script)
        for _ in range(2):
            if sha is None:
                sha = self._shas[script] = await client.script_load(script)
            async with client.pipeline(transaction=False) as pipe:
                for numkeys, args in calls:
                    pipe.evalsha(sha, numkeys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    sha = None
        raise RuntimeError("Redis keeps losing tracescore's Lua scripts (SCRIPT FLUSH in a loop?)")

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)
