"""One Redis connection that the Redis stores share: a client per event loop, scripts by SHA."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from pydantic import ValidationError
from redis.exceptions import NoScriptError

from tracing import printable
from worker._reconnect import COMMAND_SLACK_S, reconnecting_client, unavailable_as_error
from worker.store._keytypes import pipeline_replies

__all__ = ["OnRedis", "RedisConnection", "failed_fields", "known_counters", "read_counters"]

log = structlog.get_logger("tracescore.store")


class RedisConnection:
    """A reconnecting ``redis.asyncio`` client, created on first use on the event loop that
    uses it (a client is bound to its loop) and again when another loop calls."""

    def __init__(
        self, url: str, *, max_connections: int = 32, reconnect_s: float = 2.0, command_s: float = COMMAND_SLACK_S
    ) -> None:
        self.url = url
        # How long a command keeps reconnecting before StoreUnavailableError (workers: 15 s).
        self.reconnect_s = reconnect_s
        self.command_s = command_s
        self._max_connections = max_connections
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shas: dict[str, str] = {}

    @property
    def client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = reconnecting_client(
                self.url, max_connections=self._max_connections, reconnect_s=self.reconnect_s, command_s=self.command_s
            )
            self._loop = loop
        return self._client

    async def evalsha_many(
        self, script: str, numkeys: int, calls: Sequence[Sequence[str]], *, where: str = "store"
    ) -> list[Any]:
        """Run ``script`` once per argument list (``numkeys`` keys each) in one pipeline."""
        return await self.evalsha_each(script, [(numkeys, args) for args in calls], where=where)

    async def evalsha_each(
        self, script: str, calls: Sequence[tuple[int, Sequence[str | bytes]]], *, where: str = "store"
    ) -> list[Any]:
        """Run ``script`` once per (number of keys, keys and arguments) in one pipeline, by SHA
        (loaded on first use and again if Redis lost it), without redis-py's per-pipeline
        SCRIPT EXISTS. A call whose key check (``LUA_CHECK``) repaired keys is sent again, alone
        with the others that need it (``worker.store._keytypes``); ``where`` names the path in
        the repair's count and log line."""
        client = self.client
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(4):
            sha = self._shas.get(script)
            if sha is None:
                sha = self._shas[script] = await client.script_load(script)
            async with client.pipeline(transaction=False) as pipe:
                for i in pending:
                    numkeys, args = calls[i]
                    pipe.evalsha(sha, numkeys, *args)
                got = await pipe.execute(raise_on_error=False)
            for i, reply in zip(pending, got, strict=True):
                replies[i] = reply
            again = pipeline_replies(where, got)
            if any(isinstance(got[j], NoScriptError) for j in again):
                self._shas.pop(script, None)
            if not again:
                return replies
            pending = [pending[j] for j in again]
        raise RuntimeError("Redis keeps losing tracescore's Lua scripts or retyping its keys (SCRIPT FLUSH in a loop?)")

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)


@unavailable_as_error
class OnRedis:
    """A Redis store on a ``RedisConnection``, perhaps shared with the other stores: where it
    is, how long a call keeps reconnecting, and closing it."""

    _redis: RedisConnection

    @property
    def url(self) -> str:
        return self._redis.url

    @property
    def reconnect_s(self) -> float:
        return self._redis.reconnect_s

    @property
    def command_s(self) -> float:
        return self._redis.command_s

    async def close(self) -> None:
        await self._redis.close()


# A field name a validation error's place may show: an unknown field is named by its name,
# which is whatever text the value's keys hold (agent content, a secret by someone's mistake).
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def validation_place(loc: tuple[int | str, ...], whole: str = "(root)") -> str:
    """A validation error's place (``loc``) as dotted text, a part that is no plain name or
    index shown as ``<field>``; ``whole`` for the value itself."""
    parts = (str(p) if isinstance(p, int) or _PLAIN_NAME.fullmatch(p) else "<field>" for p in loc)
    return ".".join(parts) or whole


def failed_fields(exc: ValidationError) -> str:
    """Where a value read back from Redis fails validation (field and rule), never the values
    themselves: they may be agent content."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    places = {validation_place(e["loc"], "the whole value") + f" ({e['type']})" for e in errors}
    return ", ".join(sorted(places))[:300]


def known_counters(raw: Mapping[str, str], key: str, name: str) -> dict[str, int | None]:
    """A hash of counters (HGETALL's answer) as integers, None for a value that is not one (the
    key written by hand, or damaged): logged with its key and field (never its value) and
    counted under ``name`` in ``tracescore_store_unreadable_values``. ``tracescore status`` and
    the metrics show it unknown, not 0 (a sink that had delivered thousands showed none)."""
    out: dict[str, int | None] = {}
    for field, value in raw.items():
        try:
            out[field] = int(value)
        except (TypeError, ValueError):
            log.warning("counter_unreadable", key=key, field=printable(str(field))[:80])
            from worker.metrics import observe_unreadable  # the metrics load only for this

            observe_unreadable(name)
            out[field] = None
    return out


def read_counters(raw: Mapping[str, str], key: str, name: str) -> dict[str, int]:
    """``known_counters`` without the values that are not numbers, for the readers that go on
    with the others (a script adding to the hash repairs them first)."""
    return {field: n for field, n in known_counters(raw, key, name).items() if n is not None}
