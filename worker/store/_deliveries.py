"""Which deliveries of a queue message vanished (their worker process died while scoring it).

Each delivery of a message (one run of the task) has a random token. It is added to the
message's ``started`` set when the delivery begins and to its ``ended`` set when the delivery
ends in any way the task itself sees: scored, retried, dead-lettered, handed back to the queue
(Redis away, a wait that ran out). A crash is a started token that never ended: an OOM kill, a
segfault, a process recycled for a wedged loop or its memory. Counting by tokens in sets keeps
the count exact where a counter was not: redis-py re-sending a command whose reply was lost
adds nothing twice, and a delivery handed back while Redis was away is not taken for a crash.

When even the ``ended`` mark cannot be written (Redis still away), the token is kept in this
process and written before its next delivery begins (solo/threads pools get the redelivery in
this very process; a prefork sibling may count it once as a crash, which splits a batch but
never dead-letters a run by itself), or when the process closes the log on its way out.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

from worker import _keys
from worker._reconnect import reconnecting_client, unavailable_as_error
from worker.store._keytypes import checked_async

__all__ = ["DeliveryLog", "new_token"]

# How long marking a delivery as ended may take before the mark is kept for later: it runs on
# the way out of a delivery that often failed because Redis is away.
END_WAIT_S = 2.0


def new_token() -> str:
    return secrets.token_hex(8)


def _started_key(task_id: str) -> str:
    return f"{_keys.delivery_key(task_id)}:started"


def _ended_key(task_id: str) -> str:
    return f"{_keys.delivery_key(task_id)}:ended"


@unavailable_as_error
class DeliveryLog:
    """The started/ended delivery tokens of queue messages, in the score store's Redis."""

    def __init__(self, url: str, *, ttl_s: int, reconnect_s: float) -> None:
        self.url = url
        self.reconnect_s = reconnect_s
        self._ttl_s = ttl_s
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._unwritten: list[tuple[str, str]] = []  # (task id, token) whose end is not in Redis yet

    def _redis(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = reconnecting_client(self.url, max_connections=16, reconnect_s=self.reconnect_s)
            self._loop = loop
        return self._client

    async def start(self, task_id: str, token: str) -> int:
        """Record that delivery ``token`` of ``task_id`` began; returns how many earlier deliveries
        of it began and never ended (crashed)."""
        with self._lock:
            unwritten, self._unwritten = self._unwritten, []
        client = self._redis()

        async def mark() -> list[Any]:
            async with client.pipeline(transaction=True) as pipe:
                for old_task, old_token in unwritten:
                    pipe.sadd(_ended_key(old_task), old_token)
                    pipe.expire(_ended_key(old_task), self._ttl_s)
                pipe.sadd(_started_key(task_id), token)
                pipe.expire(_started_key(task_id), self._ttl_s)
                pipe.sdiff([_started_key(task_id), _ended_key(task_id)])
                return list(await pipe.execute())

        # Marks are ours to rebuild (a set of another type is deleted; sending them again adds
        # nothing twice). Unrepaired, every delivery of every message would fail right here.
        keys = {_started_key(task_id), _ended_key(task_id), *(_ended_key(t) for t, _ in unwritten)}
        try:
            replies = await checked_async(client, "delivery_start", [(k, "set", False) for k in sorted(keys)], mark)
        except BaseException:
            with self._lock:
                self._unwritten[:0] = unwritten
            raise
        vanished = set(replies[-1]) - {token}
        return len(vanished)

    async def end(self, task_id: str, token: str, wait_s: float = END_WAIT_S) -> bool:
        """Record that delivery ``token`` ended; False if Redis did not take it within ``wait_s``
        (it is kept and written before this process's next delivery, or at its ``close``)."""
        if wait_s <= 0:  # no time left (the shutdown's cleanup deadline passed): no Redis call
            self.keep(task_id, token)
            return False
        try:
            client, key = self._redis(), _ended_key(task_id)

            async def mark() -> None:
                async with client.pipeline(transaction=True) as pipe:
                    pipe.sadd(key, token)
                    pipe.expire(key, self._ttl_s)
                    await pipe.execute()

            async with asyncio.timeout(wait_s):
                await checked_async(client, "delivery_end", [(key, "set", False)], mark)
            return True
        except Exception:
            self.keep(task_id, token)
            return False

    def keep(self, task_id: str, token: str) -> None:
        """Remember an end that could not be written; ``start`` writes it first."""
        with self._lock:
            self._unwritten.append((task_id, token))

    async def close(self, wait_s: float = END_WAIT_S) -> None:
        """Write the ends kept for later (this process takes no next delivery to write them
        before; unwritten, a batch handed back to the queue would count as a crash when it is
        redelivered), waiting at most ``wait_s`` for Redis, then close the connections."""
        with self._lock:
            unwritten, self._unwritten = self._unwritten, []
        if unwritten:
            try:
                async with asyncio.timeout(wait_s):
                    async with self._redis().pipeline(transaction=True) as pipe:
                        for task_id, token in unwritten:
                            pipe.sadd(_ended_key(task_id), token)
                            pipe.expire(_ended_key(task_id), self._ttl_s)
                        await pipe.execute()
            except Exception:
                # Redis still away: a redelivery may count these once as crashes (split, never
                # dead-lettered on that alone); closing must not wait longer.
                with self._lock:
                    self._unwritten[:0] = unwritten
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)
