"""Where scores, claims, checkpoints, job counters and dead letters live.

``RedisScoreStore`` is shared by every worker; ``MemoryScoreStore`` is the same contract in one
process (the embedded mode and tests). Recording a score is one atomic step (a Lua script in
Redis, a lock in memory): the first writer wins, every later attempt learns it was a duplicate,
so each score is recorded — and written back — exactly once.

The Redis store reconnects by itself (a Redis restart, a failover) and retries the command;
when Redis stays away it raises ``StoreUnavailableError``, which hands a task's message back
to the queue (see ``worker._reconnect``).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field
from redis.exceptions import NoScriptError

from scorers import ScoreResult
from tracing._score_record import ScoreRecord
from worker import _keys
from worker._reconnect import StoreUnavailableError, reconnecting_client, unavailable_as_error

__all__ = [
    "DLQ_PUSH_SCRIPT",
    "FAILURE_WINDOW_SECONDS",
    "DeadLetter",
    "MemoryScoreStore",
    "RedisScoreStore",
    "ScoreStore",
    "StoreUnavailableError",
    "dead_letter_id",
    "dlq_push_args",
    "failure_bucket",
]

# Failure counts are kept in buckets of this many seconds (``tracescore status`` sums the last hour).
FAILURE_WINDOW_SECONDS = 600


def failure_bucket(at: float | None = None) -> int:
    return int((time.time() if at is None else at) // FAILURE_WINDOW_SECONDS)


class DeadLetter(BaseModel):
    """A queue message that could not be scored: why, and the message itself (to retry)."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    reason: str
    error: str = ""
    batch_id: str | None = None
    task_name: str = ""
    attempts: int = 0
    failed_at: float = Field(default_factory=time.time)
    # The task's argument as received (JSON); None when it was too large or unreadable to keep.
    payload: Any = None
    retryable: bool = True
    # Identifies the queue message (delivery tag or task id + retry): a redelivery of the same
    # message is not dead-lettered twice. None: never deduplicated.
    message_key: str | None = None
    # The runs ("trace_id:span_id") this letter is about, when it is about particular runs
    # (a run that killed its worker is dead-lettered alone).
    run_ids: list[str] = Field(default_factory=list)


# A message key is remembered this long after its dead letter (longer than any redelivery).
DLQ_SEEN_TTL_S = 7 * 24 * 3600


def dead_letter_id(message_key: str) -> str:
    """The letter id for a message key: the same message always makes the same letter."""
    return hashlib.sha256(message_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@runtime_checkable
class ScoreStore(Protocol):
    """The storage contract score_batch and the CLI use."""

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        """The stored records among ``score_ids``."""
        ...

    async def has_score(self, score_id: str) -> bool: ...

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> set[str]:
        """Claim each id not claimed by someone else; returns the ids now held by ``owner``."""
        ...

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        """Drop ``owner``'s claims (others' claims are left alone)."""
        ...

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        """Who holds each claimed id (ids without a claim are left out)."""
        ...

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> set[str]:
        """For each (score id, previous owner): claim it for ``owner`` if that owner still holds it."""
        ...

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]: ...

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None: ...

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        """Record each score unless already recorded (True = newly recorded), clear its
        checkpoint and claim, and count it for its job and the failure statistics. A stored
        error record marked ``retryable`` is replaced (its job's failed count corrected)."""
        ...

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]: ...

    async def count_delivery(self, task_id: str, ttl_s: int) -> int:
        """Count one more delivery of a queue message; returns the count so far (survives crashes)."""
        ...

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None: ...

    async def job_progress(self, job_id: str) -> dict[str, int]: ...

    async def recent_failures(self, buckets: int = 6) -> dict[str, int]: ...

    async def dlq_push(self, letter: DeadLetter) -> bool:
        """Add ``letter`` unless its ``message_key`` was dead-lettered before; True if added."""
        ...

    async def dlq_counts(self) -> dict[str, int]:
        """Dead letters on the list, by reason."""
        ...

    async def dlq_list(self, limit: int = 100) -> list[DeadLetter]: ...

    async def dlq_take(self, letter_id: str) -> DeadLetter | None:
        """Remove and return one dead letter by id (None if it is not there)."""
        ...

    async def dlq_len(self) -> int: ...

    async def close(self) -> None: ...


def _outcome(record: ScoreRecord) -> tuple[str, str]:
    if record.error_type:
        return "failed", record.error_type
    return "scored", ""


class MemoryScoreStore:
    """The store in one process's memory (TTLs are ignored: the process is short-lived)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: dict[str, ScoreRecord] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._checkpoints: dict[str, ScoreResult] = {}
        self._by_trace: dict[str, list[str]] = defaultdict(list)
        self._jobs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._failures: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._dlq: list[DeadLetter] = []
        self._dlq_seen: set[str] = set()
        self._deliveries: dict[str, int] = {}

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        with self._lock:
            return {s: self.records[s] for s in score_ids if s in self.records}

    async def has_score(self, score_id: str) -> bool:
        with self._lock:
            return score_id in self.records

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> set[str]:
        now = time.monotonic()
        held: set[str] = set()
        with self._lock:
            for score_id in score_ids:
                current = self._claims.get(score_id)
                if current is None or current[1] <= now or current[0] == owner:
                    self._claims[score_id] = (owner, now + ttl_s)
                    held.add(score_id)
        return held

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        with self._lock:
            for score_id in score_ids:
                if self._claims.get(score_id, ("", 0.0))[0] == owner:
                    del self._claims[score_id]

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            return {s: c[0] for s in score_ids if (c := self._claims.get(s)) is not None and c[1] > now}

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> set[str]:
        now = time.monotonic()
        taken: set[str] = set()
        with self._lock:
            for score_id, previous in claims:
                current = self._claims.get(score_id)
                if current is None or current[1] <= now or current[0] == previous:
                    self._claims[score_id] = (owner, now + ttl_s)
                    taken.add(score_id)
        return taken

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]:
        with self._lock:
            return {s: self._checkpoints[s] for s in score_ids if s in self._checkpoints}

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None:
        with self._lock:
            self._checkpoints[score_id] = partial.model_copy(deep=True)

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        fresh: list[bool] = []
        with self._lock:
            for record in records:
                prev = self.records.get(record.score_id)
                if prev is not None:
                    if prev == record:  # this very record again (as Redis answers a retried put)
                        fresh.append(True)
                        continue
                    if not prev.retryable:
                        fresh.append(False)
                        continue
                    if record.job_id and prev.job_id == record.job_id:
                        self._jobs[record.job_id]["failed"] -= 1
                        self._jobs[record.job_id][f"failed:{prev.error_type}"] -= 1
                else:
                    self._by_trace[record.trace_id].append(record.score_id)
                self.records[record.score_id] = record
                self._checkpoints.pop(record.score_id, None)
                if self._claims.get(record.score_id, ("", 0.0))[0] == owner:
                    del self._claims[record.score_id]
                outcome, reason = _outcome(record)
                if record.job_id:
                    self._jobs[record.job_id][outcome] += 1
                    if reason:
                        self._jobs[record.job_id][f"{outcome}:{reason}"] += 1
                if reason:
                    self._failures[failure_bucket()][reason] += 1
                fresh.append(True)
        return fresh

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]:
        with self._lock:
            return [self.records[s] for s in self._by_trace.get(trace_id, [])]

    async def count_delivery(self, task_id: str, ttl_s: int) -> int:
        with self._lock:
            self._deliveries[task_id] = self._deliveries.get(task_id, 0) + 1
            return self._deliveries[task_id]

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self._jobs[job_id]["skipped"] += n
            self._jobs[job_id][f"skipped:{reason}"] += n

    async def job_progress(self, job_id: str) -> dict[str, int]:
        with self._lock:
            return dict(self._jobs.get(job_id, {}))

    async def recent_failures(self, buckets: int = 6) -> dict[str, int]:
        now = failure_bucket()
        totals: dict[str, int] = defaultdict(int)
        with self._lock:
            for bucket in range(now - buckets + 1, now + 1):
                for reason, n in self._failures.get(bucket, {}).items():
                    totals[reason] += n
        return dict(totals)

    async def dlq_push(self, letter: DeadLetter) -> bool:
        with self._lock:
            if letter.message_key is not None:
                if letter.message_key in self._dlq_seen:
                    return False
                self._dlq_seen.add(letter.message_key)
            self._dlq.insert(0, letter)
            return True

    async def dlq_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for letter in self._dlq:
                counts[letter.reason] += 1
        return dict(counts)

    async def dlq_list(self, limit: int = 100) -> list[DeadLetter]:
        with self._lock:
            return list(self._dlq[:limit])

    async def dlq_take(self, letter_id: str) -> DeadLetter | None:
        with self._lock:
            for i, letter in enumerate(self._dlq):
                if letter.id == letter_id:
                    return self._dlq.pop(i)
        return None

    async def dlq_len(self) -> int:
        with self._lock:
            return len(self._dlq)

    async def close(self) -> None:
        return None


# KEYS: record, trace set, checkpoint, claim, job hash, failures hash
# ARGV: record json, ttl, score id, owner, has_job (0/1), outcome, reason, failures ttl, job id
_PUT_RECORD = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', tonumber(ARGV[2])) then
  -- This very record, stored by our own earlier try whose reply a dropped connection lost
  -- (the client retried): it is new to us, and its counters are already in.
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    return 1
  end
  -- Taken. Only an error record marked retryable (its retries ran out on a transient failure)
  -- may be replaced, by a later delivery (e.g. `tracescore dlq retry`).
  local ok, prev = pcall(cjson.decode, redis.call('GET', KEYS[1]) or '')
  if not ok or type(prev) ~= 'table' or prev['retryable'] ~= true then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  if ARGV[5] == '1' and prev['job_id'] == ARGV[9] then
    redis.call('HINCRBY', KEYS[5], 'failed', -1)
    if type(prev['error_type']) == 'string' then
      redis.call('HINCRBY', KEYS[5], 'failed:' .. prev['error_type'], -1)
    end
  end
end
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('DEL', KEYS[3])
if redis.call('GET', KEYS[4]) == ARGV[4] then
  redis.call('DEL', KEYS[4])
end
if ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
  if ARGV[7] ~= '' then
    redis.call('HINCRBY', KEYS[5], ARGV[6] .. ':' .. ARGV[7], 1)
  end
end
if ARGV[7] ~= '' then
  redis.call('HINCRBY', KEYS[6], ARGV[7], 1)
  redis.call('EXPIRE', KEYS[6], tonumber(ARGV[8]))
end
return 1
"""

# KEYS: claim. ARGV: previous owner, new owner, ttl. Compare-and-set (a vanished claim is free).
_TAKE_OVER = """
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0
"""

# KEYS: dlq list, seen key, reasons hash. ARGV: letter json, reason, push nonce, seen ttl.
# Seen-check, push and count in one step: two deliveries of one message make one letter.
DLQ_PUSH_SCRIPT = """
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'EX', tonumber(ARGV[4])) then
  -- 1 when our own earlier try (its reply lost, the client retried) pushed this very letter
  return redis.call('GET', KEYS[2]) == ARGV[3] and 1 or 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
return 1
"""

# KEYS: dlq list, reasons hash. ARGV: letter json, reason.
_DLQ_TAKE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return 1
"""


def dlq_push_args(letter: DeadLetter) -> tuple[list[str], list[str]]:
    """Keys and arguments of ``DLQ_PUSH_SCRIPT`` for ``letter`` (the consumer's guard runs it
    with a synchronous client)."""
    seen = _keys.dlq_seen_key(letter.message_key or f"letter:{letter.id}")
    return (
        [_keys.dlq_key(), seen, _keys.dlq_reasons_key()],
        # A fresh nonce per push: the client's own retry of this push sends the same one.
        [letter.model_dump_json(), letter.reason, uuid.uuid4().hex, str(DLQ_SEEN_TTL_S)],
    )


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@unavailable_as_error
class RedisScoreStore:
    """The store in Redis (``redis.asyncio``); every worker process shares it.

    The client is created on first use, on the event loop that uses it, and reconnects by
    itself; ``StoreUnavailableError`` means Redis stayed unreachable through the retries.
    """

    def __init__(
        self, url: str, *, max_connections: int = 32, job_ttl_s: int = 7 * 24 * 3600, reconnect_s: float = 2.0
    ) -> None:
        self.url = url
        # How long a command keeps reconnecting before StoreUnavailableError (workers: 15 s).
        self.reconnect_s = reconnect_s
        self._max_connections = max_connections
        self._job_ttl_s = job_ttl_s
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

    async def _evalsha_many(self, script: str, numkeys: int, calls: Sequence[Sequence[str]]) -> list[Any]:
        """Run ``script`` once per argument list in one pipeline, by SHA (loaded on first use
        and again if Redis lost it), without redis-py's per-pipeline SCRIPT EXISTS."""
        client = self.client
        sha = self._shas.get(script)
        for _ in range(2):
            if sha is None:
                sha = self._shas[script] = await client.script_load(script)
            async with client.pipeline(transaction=False) as pipe:
                for args in calls:
                    pipe.evalsha(sha, numkeys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    sha = None
        raise RuntimeError("Redis keeps losing tracescore's Lua scripts (SCRIPT FLUSH in a loop?)")

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        if not score_ids:
            return {}
        values = await self.client.mget([_keys.record_key(s) for s in score_ids])
        return {s: ScoreRecord.model_validate_json(v) for s, v in zip(score_ids, values, strict=True) if v}

    async def has_score(self, score_id: str) -> bool:
        return bool(await self.client.exists(_keys.record_key(score_id)))

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> set[str]:
        if not score_ids:
            return set()
        client = self.client
        async with client.pipeline(transaction=False) as pipe:
            for score_id in score_ids:
                pipe.set(_keys.claim_key(score_id), owner, nx=True, ex=max(1, ttl_s))
            got = await pipe.execute()
        held = {s for s, ok in zip(score_ids, got, strict=True) if ok}
        lost = [s for s in score_ids if s not in held]
        if lost:
            # A claim we already hold (this same delivery retrying) is still ours.
            owners = await client.mget([_keys.claim_key(s) for s in lost])
            held.update(s for s, o in zip(lost, owners, strict=True) if o == owner)
        return held

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        if not score_ids:
            return
        await self._evalsha_many(_RELEASE, 1, [(_keys.claim_key(s), owner) for s in score_ids])

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        if not score_ids:
            return {}
        owners = await self.client.mget([_keys.claim_key(s) for s in score_ids])
        return {s: o for s, o in zip(score_ids, owners, strict=True) if o is not None}

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> set[str]:
        if not claims:
            return set()
        done = await self._evalsha_many(
            _TAKE_OVER, 1, [(_keys.claim_key(s), previous, owner, str(max(1, ttl_s))) for s, previous in claims]
        )
        return {s for (s, _), ok in zip(claims, done, strict=True) if ok}

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]:
        if not score_ids:
            return {}
        values = await self.client.mget([_keys.checkpoint_key(s) for s in score_ids])
        return {s: ScoreResult.model_validate_json(v) for s, v in zip(score_ids, values, strict=True) if v}

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None:
        await self.client.set(_keys.checkpoint_key(score_id), partial.model_dump_json(), ex=ttl_s)

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        if not records:
            return []
        client = self.client
        failures_key = _keys.failures_key(failure_bucket())
        failures_ttl = str(FAILURE_WINDOW_SECONDS * 12)
        calls = []
        for record in records:
            outcome, reason = _outcome(record)
            calls.append(
                (
                    _keys.record_key(record.score_id),
                    _keys.trace_key(record.trace_id),
                    _keys.checkpoint_key(record.score_id),
                    _keys.claim_key(record.score_id),
                    _keys.job_key(record.job_id or "-"),
                    failures_key,
                    record.model_dump_json(),
                    str(ttl_s),
                    record.score_id,
                    owner,
                    "1" if record.job_id else "0",
                    outcome,
                    reason,
                    failures_ttl,
                    record.job_id or "",
                )
            )
        done = await self._evalsha_many(_PUT_RECORD, 6, calls)
        jobs = {r.job_id for r in records if r.job_id}
        if jobs:
            async with client.pipeline(transaction=False) as pipe:
                for job_id in jobs:
                    pipe.expire(_keys.job_key(job_id), self._job_ttl_s)
                await pipe.execute()
        return [bool(d) for d in done]

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]:
        ids = sorted(await self.client.smembers(_keys.trace_key(trace_id)))
        found = await self.existing(ids)
        return [found[s] for s in ids if s in found]

    async def count_delivery(self, task_id: str, ttl_s: int) -> int:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.incr(_keys.delivery_key(task_id))
            pipe.expire(_keys.delivery_key(task_id), ttl_s)
            count, _ = await pipe.execute()
        return int(count)

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(_keys.job_key(job_id), "skipped", n)
            pipe.hincrby(_keys.job_key(job_id), f"skipped:{reason}", n)
            pipe.expire(_keys.job_key(job_id), self._job_ttl_s)
            await pipe.execute()

    async def job_progress(self, job_id: str) -> dict[str, int]:
        raw = await self.client.hgetall(_keys.job_key(job_id))
        return {k: int(v) for k, v in raw.items()}

    async def recent_failures(self, buckets: int = 6) -> dict[str, int]:
        now = failure_bucket()
        totals: dict[str, int] = defaultdict(int)
        async with self.client.pipeline(transaction=False) as pipe:
            for bucket in range(now - buckets + 1, now + 1):
                pipe.hgetall(_keys.failures_key(bucket))
            for counts in await pipe.execute():
                for reason, n in counts.items():
                    totals[reason] += int(n)
        return dict(totals)

    async def dlq_push(self, letter: DeadLetter) -> bool:
        keys, args = dlq_push_args(letter)
        (pushed,) = await self._evalsha_many(DLQ_PUSH_SCRIPT, len(keys), [(*keys, *args)])
        return bool(pushed)

    async def dlq_counts(self) -> dict[str, int]:
        raw = await self.client.hgetall(_keys.dlq_reasons_key())
        return {k: int(v) for k, v in raw.items() if int(v) > 0}

    async def dlq_list(self, limit: int = 100) -> list[DeadLetter]:
        raw = await self.client.lrange(_keys.dlq_key(), 0, max(0, limit - 1))
        return [DeadLetter.model_validate_json(v) for v in raw]

    async def dlq_take(self, letter_id: str) -> DeadLetter | None:
        for raw in await self.client.lrange(_keys.dlq_key(), 0, -1):
            letter = DeadLetter.model_validate_json(raw)
            if letter.id == letter_id:
                (removed,) = await self._evalsha_many(
                    _DLQ_TAKE, 2, [(_keys.dlq_key(), _keys.dlq_reasons_key(), raw, letter.reason)]
                )
                return letter if removed else None
        return None

    async def dlq_len(self) -> int:
        return int(await self.client.llen(_keys.dlq_key()))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)
