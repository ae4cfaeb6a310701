"""The judge rate limiter: a Redis token bucket per model shared by every worker process.

Each judge model has a requests bucket and a tokens bucket (refilled continuously at the
configured per-minute rates, using Redis' clock so machines agree). A 429 with Retry-After
sets a pause key for the model that every worker checks before each call. Inside one
process, calls per model are also bounded by a semaphore (``model_concurrency``).
Implements ``scorers.judge.JudgeLimiter``; install it with ``set_judge_hooks``.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import structlog

from worker import _keys
from worker._reconnect import COMMAND_SLACK_S, reconnecting_client, unavailable_as_error
from worker._settings import ModelRateLimit
from worker.metrics import observe_limiter_wait
from worker.store import checked_async, checked_script, known_counters, read_counters

__all__ = ["RedisRateLimiter"]

log = structlog.get_logger("tracescore.worker.limiter")

# Requests may burst this many seconds' worth of budget; tokens a little more, so one large
# request still fits (a request costing more than the whole bucket is charged the bucket).
REQUEST_BURST_SECONDS = 1.0
TOKEN_BURST_SECONDS = 6.0
MAX_WAIT_SLICE_S = 1.0

# The limiter's keys hold state it rebuilds (a bucket starts full, a pause is only a wait): one of
# another Redis type is deleted and counted (worker.store's key-type rule), never a failed run.
_BUCKETS = "{KEYS[1], 'hash', 'r', KEYS[2], 'hash', 'r', KEYS[3], 'string', 'r', KEYS[4], 'hash', 'r'}"

# KEYS: requests bucket, tokens bucket, pause key, granted-per-second hash
# ARGV: req rate/ms, req capacity, tok rate/ms, tok capacity, tok cost, key ttl s
# Returns 0 when admitted, else milliseconds to wait.
_ACQUIRE = checked_script(
    _BUCKETS,
    """
local pause = redis.call('PTTL', KEYS[3])
if pause > 0 then return pause end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A field that is no number, before anything is written: a bucket's time failed this script for
-- every call of the model (until the bucket expired), a level of -inf made a wait Redis answered
-- as a negative integer (every call admitted, none charged), a second's count failed the HINCRBY
-- below after the buckets were charged. Deleted (a bucket starts full), named and counted.
local bad = tracescore_check_counters({KEYS[1], KEYS[2]}, {'tokens', 'ts'}, {float = true})
  or tracescore_check_counters({KEYS[4]}, {tostring(math.floor(now / 1000))})
if bad then return bad end
local function level(key, rate, cap)
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil or ts == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  return tokens
end
local req_rate = tonumber(ARGV[1]); local req_cap = tonumber(ARGV[2])
local tok_rate = tonumber(ARGV[3]); local tok_cap = tonumber(ARGV[4])
local cost = math.min(tonumber(ARGV[5]), tok_cap)
local wait = 0
local req, tok
if req_rate > 0 then
  req = level(KEYS[1], req_rate, req_cap)
  if req < 1 then wait = math.max(wait, math.ceil((1 - req) / req_rate)) end
end
if tok_rate > 0 then
  tok = level(KEYS[2], tok_rate, tok_cap)
  if tok < cost then wait = math.max(wait, math.ceil((cost - tok) / tok_rate)) end
end
if wait > 0 then return wait end
local ttl = tonumber(ARGV[6])
if req_rate > 0 then
  redis.call('HSET', KEYS[1], 'tokens', req - 1, 'ts', now)
  redis.call('EXPIRE', KEYS[1], ttl)
end
if tok_rate > 0 then
  redis.call('HSET', KEYS[2], 'tokens', tok - cost, 'ts', now)
  redis.call('EXPIRE', KEYS[2], ttl)
end
redis.call('HINCRBY', KEYS[4], math.floor(now / 1000), 1)
redis.call('EXPIRE', KEYS[4], ttl)
return 0
""",
)

# KEYS: tokens bucket. ARGV: correction (tokens used - estimate).
_CORRECT = checked_script(
    "{KEYS[1], 'hash', 'r'}",
    """
local bad = tracescore_check_counters({KEYS[1]}, {'tokens'}, {float = true})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'tokens', -tonumber(ARGV[1]))
end
return 0
""",
)

# KEYS: pause key. ARGV: milliseconds. Only ever lengthens a pause.
_PAUSE = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], '1', 'PX', ms)
end
return 0
"""

_estimate: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar(
    "tracescore_limiter_estimate", default=None
)


def _capacity(per_minute: float, kind: str) -> float:
    """A bucket's size: its burst (``REQUEST_BURST_SECONDS`` / ``TOKEN_BURST_SECONDS``) of the limit;
    ``kind`` is ``req`` or ``tok``, as in its key."""
    return max(1.0, per_minute / 60 * (REQUEST_BURST_SECONDS if kind == "req" else TOKEN_BURST_SECONDS))


@unavailable_as_error
class RedisRateLimiter:
    """``JudgeLimiter`` backed by Redis; ``limits(model_id)`` gives each model's budget.

    Its client reconnects by itself (a Redis restart) for ``reconnect_s`` seconds per command;
    after that a judge call fails with ``StoreUnavailableError`` (transient: retried later)."""

    def __init__(
        self,
        url: str,
        limits: Callable[[str], ModelRateLimit],
        *,
        model_concurrency: int = 64,
        reconnect_s: float = 2.0,
        command_s: float = COMMAND_SLACK_S,
    ) -> None:
        self.url = url
        self.reconnect_s = reconnect_s
        self.command_s = command_s
        self._limits = limits
        self._concurrency = model_concurrency
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gates: dict[str, asyncio.Semaphore] = {}
        self.waits = 0  # how many times a caller had to wait (for logs and tests)

    def _redis(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # Blocking pool: callers beyond max_connections wait for a connection, never fail.
            self._client = reconnecting_client(
                self.url, max_connections=64, reconnect_s=self.reconnect_s, command_s=self.command_s
            )
            self._loop = loop
            self._gates = {}
            self._acquire = self._client.register_script(_ACQUIRE)
            self._correct = self._client.register_script(_CORRECT)
            self._pause = self._client.register_script(_PAUSE)
        return self._client

    def _gate(self, model_id: str) -> asyncio.Semaphore:
        gate = self._gates.get(model_id)
        if gate is None:
            gate = self._gates[model_id] = asyncio.Semaphore(self._concurrency)
        return gate

    async def try_acquire(self, model_id: str, estimated_tokens: int) -> int:
        """One attempt at a slot: 0 when admitted, else milliseconds to wait. Public so the class
        decorator bounds it like every Redis call here (reconnect deadline, then
        ``StoreUnavailableError``): a Redis outage must not hang or fail a run with a raw
        redis ``ConnectionError``."""
        client = self._redis()
        limit = self._limits(model_id)
        rpm = limit.requests_per_minute or 0.0
        tpm = limit.tokens_per_minute or 0.0
        keys = [
            _keys.limiter_bucket_key(model_id, "req"),
            _keys.limiter_bucket_key(model_id, "tok"),
            _keys.limiter_pause_key(model_id),
            _keys.limiter_granted_key(model_id),
        ]
        args = [
            rpm / 60_000,
            _capacity(rpm, "req"),
            tpm / 60_000,
            _capacity(tpm, "tok"),
            max(0, estimated_tokens) if tpm else 0,
            3600,
        ]
        waited = await checked_async(client, "limiter_acquire", [], lambda: self._acquire(keys=keys, args=args))
        return int(waited)

    async def _try(self, model_id: str, estimated_tokens: int) -> int:
        return await self.try_acquire(model_id, estimated_tokens)

    def slot(self, model_id: str, estimated_tokens: int) -> AbstractAsyncContextManager[None]:
        return self._slot(model_id, estimated_tokens)

    @asynccontextmanager
    async def _slot(self, model_id: str, estimated_tokens: int) -> AsyncIterator[None]:
        self._redis()
        async with self._gate(model_id):
            waited_since: float | None = None
            while True:
                wait_ms = await self.try_acquire(model_id, estimated_tokens)
                if wait_ms <= 0:
                    break
                self.waits += 1
                waited_since = waited_since or time.perf_counter()
                # A slice, with jitter, so waiters across processes do not all wake at once.
                await asyncio.sleep(min(wait_ms / 1000, MAX_WAIT_SLICE_S) * random.uniform(1.0, 1.2))
            if waited_since is not None:
                observe_limiter_wait(model_id, time.perf_counter() - waited_since)
            # Left set after the slot: the judge reports usage once the request is over. What the
            # bucket was charged: a call estimated past its capacity takes the capacity (the
            # script's min), and the correction must start from that, or each such call was
            # credited more than it paid and the limit let several times its tokens through.
            tpm = self._limits(model_id).tokens_per_minute or 0.0
            _estimate.set((model_id, min(max(0, estimated_tokens), _capacity(tpm, "tok")) if tpm else 0))
            yield

    async def record_usage(self, model_id: str, tokens: int) -> None:
        limit = self._limits(model_id)
        if not limit.tokens_per_minute:
            return
        current = _estimate.get()
        estimate = current[1] if current is not None and current[0] == model_id else 0.0
        _estimate.set(None)
        if tokens != estimate:
            client, key = self._redis(), _keys.limiter_bucket_key(model_id, "tok")
            await checked_async(
                client, "limiter_usage", [], lambda: self._correct(keys=[key], args=[tokens - estimate])
            )

    async def pause(self, model_id: str, seconds: float) -> None:
        if seconds <= 0:
            return
        self._redis()
        await self._pause(keys=[_keys.limiter_pause_key(model_id)], args=[int(seconds * 1000)])
        log.warning("judge_model_paused", model=model_id, seconds=round(seconds, 3))

    async def state(self) -> dict[str, dict[str, float | None]]:
        """Per model: remaining pause (s), bucket levels and calls admitted in the last minute
        (None: a second's count of it in Redis is no number)."""
        client = self._redis()
        out: dict[str, dict[str, float | None]] = {}
        prefix = _keys.limiter_prefix()
        seconds, micros = await client.time()  # Redis's clock, as the buckets' own scripts read it
        now_s, now_ms = int(seconds), int(seconds) * 1000 + int(micros) // 1000
        async for key in client.scan_iter(match=f"{prefix}*", count=500):
            kind, _, model = key[len(prefix) :].partition(":")
            entry = out.setdefault(model, {})
            if kind == "pause":
                entry["paused_s"] = max(0.0, await client.pttl(key) / 1000)
            elif kind == "granted":
                last_minute = [str(now_s - i) for i in range(1, 61)]
                granted = await client.hmget(key, last_minute)
                found = {s: g for s, g in zip(last_minute, granted, strict=True) if g is not None}
                # (a second's count no number: unknown, not the other seconds' smaller sum; only
                # the current second's is repaired, an older one expires with the key)
                calls = list(known_counters(found, key, "limiter_granted").values())
                entry["calls_last_60s"] = None if None in calls else float(sum(n for n in calls if n is not None))
            else:
                tokens, ts = await client.hmget(key, ["tokens", "ts"])
                try:
                    level, at_ms = float(tokens or 0), float(ts or 0)
                except ValueError:
                    level = at_ms = math.nan
                if not (math.isfinite(level) and math.isfinite(at_ms)):
                    # Written by hand, or damaged: unknown (left out, it was counted nowhere;
                    # the next call's script repairs it).
                    log.warning("counter_unreadable", key=key, field="tokens")
                    from worker.metrics import observe_unreadable  # the metrics load only for this

                    observe_unreadable("limiter_bucket")
                    entry[f"{kind}_bucket"] = None
                    continue
                # The level now, as the next call would find it: refilled since its last grant
                # (a debt a call past the bucket left is repaid over time).
                limit = self._limits(model)
                per_minute = (limit.requests_per_minute if kind == "req" else limit.tokens_per_minute) or 0.0
                if per_minute and at_ms:
                    level = min(_capacity(per_minute, kind), level + max(0.0, now_ms - at_ms) * per_minute / 60_000)
                entry[f"{kind}_bucket"] = round(level, 1)
        return out

    async def granted_per_second(self, model_id: str) -> dict[int, int]:
        """Judge calls admitted per epoch second (the last hour), across every worker."""
        key = _keys.limiter_granted_key(model_id)
        raw = read_counters(await self._redis().hgetall(key), key, "limiter_granted")
        return dict(sorted((int(k), v) for k, v in raw.items() if k.isdigit()))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)
