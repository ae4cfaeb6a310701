"""``DeliveryLog.close`` writes the delivery ends it kept while Redis was away: a batch handed
back to the queue just before its process exited must not count as a crash on its redelivery
(a crash count splits batches and can dead-letter a run)."""

from __future__ import annotations

import asyncio
import time

from tests._redis import RedisServer
from worker.store import DeliveryLog, new_token


def test_close_writes_the_ends_kept_while_redis_was_away(own_redis: RedisServer) -> None:
    """An end that could not be written (Redis down) and no next delivery in this process
    (it is shutting down): close() writes it, and the redelivery elsewhere counts no crash."""

    async def go() -> int:
        log = DeliveryLog(own_redis.url(12), ttl_s=60, reconnect_s=0.5)
        token = new_token()
        await log.start("m1", token)
        own_redis.stop()
        try:
            assert not await log.end("m1", token)  # kept for later
        finally:
            own_redis.start()
        await log.close()
        elsewhere = DeliveryLog(own_redis.url(12), ttl_s=60, reconnect_s=0.5)
        try:
            return await elsewhere.start("m1", new_token())
        finally:
            await elsewhere.close()

    assert asyncio.run(go()) == 0


def test_close_with_redis_still_away_returns_in_bounded_time(own_redis: RedisServer) -> None:
    """Redis still down at close: it gives up after its wait instead of hanging the shutdown."""

    async def go() -> float:
        log = DeliveryLog(own_redis.url(12), ttl_s=60, reconnect_s=0.5)
        token = new_token()
        await log.start("m1", token)
        own_redis.stop()
        assert not await log.end("m1", token)
        began = time.monotonic()
        await log.close(wait_s=1.0)
        return time.monotonic() - began

    assert asyncio.run(go()) < 5.0


def test_end_with_no_time_left_keeps_the_end_without_calling_redis(own_redis: RedisServer) -> None:
    """Past the shutdown's cleanup deadline (``wait_s`` 0), end() does not call Redis, even one
    that answers: the end is kept, and close() writes it. (It waited its own 2 s past the
    deadline, with Redis refusing connections.)"""

    async def go() -> tuple[bool, int]:
        log = DeliveryLog(own_redis.url(12), ttl_s=60, reconnect_s=0.5)
        token = new_token()
        await log.start("m1", token)
        written = await log.end("m1", token, wait_s=0.0)
        with own_redis.client(12) as client:
            assert client.smembers("tracescore:delivery:m1:ended") == set() or not written
        await log.close()
        elsewhere = DeliveryLog(own_redis.url(12), ttl_s=60, reconnect_s=0.5)
        try:
            return written, await elsewhere.start("m1", new_token())
        finally:
            await elsewhere.close()

    assert asyncio.run(go()) == (False, 0)
