"""The exactly-once core: score records, claims and step checkpoints.

Recording a score is one atomic step (a Lua script in Redis, a lock in memory): the first writer
wins, every later attempt learns it was a duplicate, so each score is recorded — and written
back — exactly once. The same step clears the score's checkpoint and claim and counts it in its
job's statistics (``store.jobs``) and queues it for every configured sink (the outbox,
``worker.store._outbox``): stored means owed to each sink.

A claim's owner is ``host:pid:d<delivery>``: one delivery of a message in one process. Claims
left by a process of this host that no longer exists (a prefork child killed for memory) are
taken over at once instead of waiting out their TTL (``claim``). A claim is refused for a score
whose record the put would keep (the put's own rule, in the same step): one stored since the
caller read the records (another delivery finished it), or one this version cannot read. Scoring
it would pay for judge calls whose record the put then refuses.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog
from pydantic import BaseModel, ValidationError

from scorers import ScoreResult
from tracing import ScoreRecord
from worker import _keys
from worker._process import alive
from worker._reconnect import COMMAND_SLACK_S, unavailable_as_error
from worker.store._jobs import (
    FAILURE_BUCKETS_KEPT,
    FAILURE_WINDOW_SECONDS,
    JOB_TTL_S,
    LUA_NEW_SKIPS,
    JobStats,
    RedisJobStats,
    failure_bucket,
    outcome,
)
from worker.store._keytypes import LUA_CHECK, RELEASE_OWNED, checked_async, checked_script
from worker.store._outbox import delivered_key
from worker.store._redis import OnRedis, RedisConnection, failed_fields

__all__ = ["Claims", "RedisScoreStore", "ScoreStore", "claim", "delivery_owner", "process_owner"]

log = structlog.get_logger("tracescore.worker.store")

_Stored = TypeVar("_Stored", bound=BaseModel)


@dataclass(slots=True)
class Claims:
    """What a claim got. ``held``: the caller's now, to score. ``recorded``: each score id whose
    record a put would keep (not marked retryable), with that record's job id ("" for none or
    unreadable): nothing to score. The rest is held by another delivery."""

    held: set[str] = field(default_factory=set)
    recorded: dict[str, str] = field(default_factory=dict)

    def add(self, other: Claims) -> None:
        self.held |= other.held
        self.recorded.update(other.recorded)


@runtime_checkable
class ScoreStore(Protocol):
    """The storage contract ``score_batch`` and the CLI use."""

    @property
    def jobs(self) -> JobStats:
        """The job statistics ``put_records`` counts recorded scores into."""
        ...

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        """The stored records among ``score_ids``. One that no longer reads (damaged, or stored
        by another version) is left out: a value that is not a record at all (not JSON) is
        scored again and replaced by ``put_records``; a JSON object is kept, and ``claim``
        refuses it."""
        ...

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> Claims:
        """Claim each id not claimed by someone else and not recorded (a record the put would
        keep), in one step."""
        ...

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        """Drop ``owner``'s claims (others' claims are left alone)."""
        ...

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        """Who holds each claimed id (ids without a claim are left out)."""
        ...

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> Claims:
        """For each (score id, previous owner): claim it for ``owner`` if that owner still holds it,
        nobody does any more, or ``owner`` already does (this call sent again after a lost reply),
        unless it is recorded (as ``claim``): a claim that vanished was often released by the put."""
        ...

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]:
        """The step checkpoints among ``score_ids``. One that no longer reads (damaged, or kept by
        another version) is left out, and its run starts over: a checkpoint only saves calls."""
        ...

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None: ...

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        """Record each score unless already recorded (True = newly recorded), clear its
        checkpoint and claim, and count it for its job and the failure statistics.

        A stored error record marked ``retryable`` is replaced, and its job's failed count
        corrected: replaced by its own job's record, or by another's (a job's or live traffic's),
        which makes it its job's skip (``already_scored``, counted once as
        ``count_skipped_once``). A job's record refused for another's counts the job's skip; a
        job's record stored for a score it had counted as a skip moves that count to the
        record's outcome. So a job counts each of its scores once; a job that ended
        (``JobStats.finish``) counts no new one, only such moves (a record it stores once ended
        is not counted, and replaced, moves nothing). The very same record put again (a retry
        whose reply was lost) is new again and counted once."""
        ...

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]: ...

    async def close(self) -> None: ...


def _readable(
    model: type[_Stored], score_ids: Sequence[str], values: Sequence[str | None], event: str
) -> dict[str, _Stored]:
    """The values present among ``values`` (MGET's, in ``score_ids`` order) read as ``model``.
    One that no longer validates (damaged, or kept by another version) is left out, logged as
    ``event`` with its score id and the failing fields (never its values), and counted in
    ``tracescore_store_unreadable_values`` under the event's name less ``_unreadable``."""
    found: dict[str, _Stored] = {}
    for score_id, value in zip(score_ids, values, strict=True):
        if not value:
            continue
        try:
            found[score_id] = model.model_validate_json(value)
        except ValidationError as exc:
            log.warning(event, score_id=score_id, failed=failed_fields(exc))
            from worker.metrics import observe_unreadable  # as read_counters: loaded only for this

            observe_unreadable(event.removesuffix("_unreadable"))
    return found


def process_owner() -> str:
    """This process as a claim owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def delivery_owner(process: str) -> str:
    """One delivery in ``process``: two deliveries of one message (two exporters saw the trace,
    a requeued dead letter) in one worker process must not both pay."""
    return f"{process}:d{secrets.token_hex(4)}"


def _host_and_pid(owner: str) -> tuple[str, str]:
    """An owner is ``host:pid:delivery`` (``host:pid`` before deliveries had their own)."""
    parts = owner.rsplit(":", 2)
    if len(parts) == 3 and not parts[2].isdigit():
        return parts[0], parts[1]
    host, _, pid = owner.rpartition(":")
    return host, pid


def _owner_is_dead_here(owner: str, me: str) -> bool:
    """True when ``owner``'s process ran on this host and no longer exists."""
    host, pid = _host_and_pid(owner)
    if host != _host_and_pid(me)[0] or not pid.isdigit():
        return False
    return not alive(int(pid))


async def claim(store: ScoreStore, score_ids: Sequence[str], owner: str, ttl_s: int) -> Claims:
    """``store.claim``, then take over the claims whose owner was a process of this host that
    is gone (its redelivered work is ours) and those that lapsed since."""
    claims = await store.claim(score_ids, owner, ttl_s)
    rest = [s for s in score_ids if s not in claims.held and s not in claims.recorded]
    if not rest:
        return claims
    owners = await store.claim_owners(rest)
    dead = [(s, o) for s, o in owners.items() if o != owner and _owner_is_dead_here(o, owner)]
    vanished = [(s, "") for s in rest if s not in owners]
    if dead or vanished:
        claims.add(await store.take_over([*dead, *vanished], owner, ttl_s))
    return claims


# A stored record as a put reads it, for every script that decides whether one is kept:
# ``tracescore_stored(value)`` returns its fields (nil when it is not a JSON object: damaged,
# which a put replaces) and whether a put keeps it (anything but a record marked retryable).
_LUA_STORED = """
local function tracescore_stored(value)
  local ok, prev = pcall(cjson.decode, value or '')
  if ok and type(prev) == 'table' then
    return prev, prev['retryable'] ~= true
  end
  return nil, false
end
-- The job id ('' for none) of the record at ``key`` when a put would keep it, else nil. (A
-- record key of another type is no record: the put repairs it.)
local function tracescore_kept_job(key)
  local value = redis.pcall('GET', key)
  if type(value) ~= 'string' then
    return nil
  end
  local prev, kept = tracescore_stored(value)
  if not kept then
    return nil
  end
  return type(prev['job_id']) == 'string' and prev['job_id'] or ''
end
"""


def _claims(score_ids: Sequence[str], replies: Sequence[Any]) -> Claims:
    """A claim script's replies, one per id: 1 held, 0 held by another, a string: recorded
    (the record's job id)."""
    claims = Claims()
    for score_id, reply in zip(score_ids, replies, strict=True):
        if isinstance(reply, str):
            claims.recorded[score_id] = reply
        elif reply:
            claims.held.add(score_id)
    return claims


# One call stores up to _PUT_CHUNK records, each as a call of its own would: a pipeline of one
# call per record spent most of its time in redis-py's per-command packing and parsing.
# KEYS: failures hash, then (with sinks) the set of sink names and per sink its outbox queue,
#       attempts hash, dead letters, delivered set, dead letters' order; then per record its record, trace set,
#       checkpoint, claim and job hash (5 each)
# ARGV: ttl, owner, failures ttl, now ms, the number of shared KEYS, the number of sinks, the job
#       ttl, the prefixes of a job's hash, of its set of counted skips and of its set of uncounted
#       records, the sink names, then per record: record json, score id, has_job (0/1), outcome,
#       reason, job id
# Returns per record 1 (stored now, or by our own earlier try) or 0 (taken).
#
# A job counts each of its scores once, as its own record's outcome (scored, failed) or as a
# skip (``already_scored``, the score id in its set of counted skips) while another's record
# stands for it. So a record replacing another job's retryable failure makes that failure the
# other job's skip; a job's put refused for another's record counts the job's skip; and a job's
# record stored for a score it counted as a skip moves the count back to the record's outcome.
# (Counted twice, a job's total passed its expected one, and a job waiting for its total ended
# while a score was still on its way.) A job that ended (``JobStats.finish``) counts no new score
# or skip; its scores still move (its retry's record replacing its failure). A record it stores
# once ended is not counted, so it joins the job's set of uncounted records: replaced, it has no
# count to move (a late delivery's failure, then scored by the job's `dlq retry`, left the job
# at failed -1, scored 2 of 1). The other job's keys are known only once the stored record is
# read, so the script names them itself; the project runs on one Redis, not a cluster, where
# that is allowed.
_PUT_RECORDS = (
    LUA_CHECK
    + _LUA_STORED
    + LUA_NEW_SKIPS
    + """
local ttl, owner, failures_ttl, now = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local shared, nsinks = tonumber(ARGV[5]), tonumber(ARGV[6])
local job_ttl, job_prefix, skips_prefix, uncounted_prefix = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10]
local sinks = {}
for s = 1, nsinks do
  sinks[s] = ARGV[10 + s]
end
local first = 11 + nsinks
local sinks_named = false
-- A key of ours holding another type would fail the script halfway, after earlier writes: every
-- key is checked before anything is written (worker.store._keytypes). A sink's queue and dead
-- letters are refused (undelivered scores, refusals), and so are a job's counters and its sets
-- of the scores it counted as skips and left uncounted: deleted, they made the job count those
-- again (its skip met on the next delivery: 2 of 1, its wait ending with a score on its way; its
-- mark of its end lost, a late delivery counted past its total), and no script can tell what
-- they held. The rest is ours to rebuild.
local checks = {}
local function check(key, kind, mode)
  local n = #checks
  checks[n + 1], checks[n + 2], checks[n + 3] = key, kind, mode
end
check(KEYS[1], 'hash', 'r')
if shared > 1 then
  check(KEYS[2], 'set', 'r')
end
for i = 3, shared, 5 do
  check(KEYS[i], 'zset', 'k')  -- the sink's queue: undelivered scores
  check(KEYS[i + 1], 'hash', 'r')
  check(KEYS[i + 2], 'hash', 'k')  -- the sink's dead letters
  check(KEYS[i + 3], 'zset', 'r')
  check(KEYS[i + 4], 'zset', 'r')
end
-- Per record, the other job whose retryable failure it replaces (false for none: no record, one
-- kept, our own job's): found here, so its keys are checked with the rest. (A value without
-- '"retryable":true' in it is not decoded: a put keeps it.)
local others, a, counters = {}, first, {}
for k = shared + 1, #KEYS, 5 do
  check(KEYS[k], 'string', 'r')
  check(KEYS[k + 1], 'set', 'r')
  check(KEYS[k + 3], 'string', 'r')
  if ARGV[a + 2] == '1' then  -- (a record without a job writes no job key)
    check(KEYS[k + 4], 'hash', 'k')
    counters[#counters + 1] = KEYS[k + 4]
    check(skips_prefix .. ARGV[a + 5], 'set', 'k')
    check(uncounted_prefix .. ARGV[a + 5], 'set', 'k')
  end
  local current, other = redis.pcall('GET', KEYS[k]), false
  if type(current) == 'string' and current ~= ARGV[a] and string.find(current, '"retryable":true', 1, true) then
    local prev, kept = tracescore_stored(current)
    local job = prev and prev['job_id']
    if not kept and type(job) == 'string' and job ~= '' and job ~= ARGV[a + 5] then
      other = job
      check(job_prefix .. job, 'hash', 'k')
      counters[#counters + 1] = job_prefix .. job
      check(skips_prefix .. job, 'set', 'k')
      check(uncounted_prefix .. job, 'set', 'k')
    end
  end
  others[#others + 1] = other
  a = a + 6
end
-- (a job's count that is no integer is kept aside, not refused: tracescore_job_counters)
local bad = tracescore_check(checks) or tracescore_check_counters({KEYS[1]})
  or tracescore_check_counters(counters, nil, tracescore_job_counters)
if bad then
  return bad
end

local function put(record, traces, checkpoint, claim, job, json, score_id, has_job, counter, reason, job_id, other)
  local moved = false  -- one of the job's scores changing outcome, not a new one
  if not redis.call('SET', record, json, 'NX', 'EX', ttl) then
    local current = redis.call('GET', record)
    -- This very record, stored by our own earlier try whose reply a dropped connection lost
    -- (the client retried): it is new to us, and its counters are already in.
    if current == json then
      return 1
    end
    -- Taken. Only an error record marked retryable (its retries ran out on a transient
    -- failure) may be replaced, by a later delivery (e.g. `tracescore dlq retry`), and a value
    -- that is not a record at all (damaged: not JSON), which no reader can use.
    local prev, kept = tracescore_stored(current)
    if kept then
      if has_job == '1' and prev['job_id'] ~= job_id then  -- another's record stands for it (a lapsed claim)
        tracescore_new_skips(job, skips_prefix .. job_id, 'already_scored', {score_id}, 1, 1)
        redis.call('EXPIRE', skips_prefix .. job_id, job_ttl)
      end
      return 0
    end
    redis.call('SET', record, json, 'EX', ttl)
    -- (A record its job stored once ended was never counted: nothing to correct.)
    local corrected = nil
    if prev and has_job == '1' and prev['job_id'] == job_id then
      -- (its counters expired, a record outliving them: nothing to correct, no -1 made anew)
      if redis.call('EXISTS', job) == 1 and redis.call('SREM', uncounted_prefix .. job_id, score_id) == 0 then
        corrected = job
        moved = true
      end
    elseif other and redis.call('EXISTS', job_prefix .. other) == 1  -- (expired: nothing to correct)
        and redis.call('SREM', uncounted_prefix .. other, score_id) == 0 then
      corrected = job_prefix .. other
      tracescore_add_skips(corrected, skips_prefix .. other, 'already_scored', {score_id}, 1, 1)
      redis.call('EXPIRE', skips_prefix .. other, job_ttl)
      redis.call('EXPIRE', corrected, job_ttl)
    end
    if corrected then
      redis.call('HINCRBY', corrected, 'failed', -1)
      if type(prev['error_type']) == 'string' then
        redis.call('HINCRBY', corrected, 'failed:' .. prev['error_type'], -1)
      end
    end
  end
  redis.call('SADD', traces, score_id)
  redis.call('EXPIRE', traces, ttl)
  -- The outbox: owed to every sink from the moment it is stored (a replaced record anew: its
  -- old dead letter and delivery are the old record's).
  if nsinks > 0 and not sinks_named then
    redis.call('SADD', KEYS[2], unpack(sinks))
    sinks_named = true
  end
  for i = 3, shared, 5 do
    redis.call('ZADD', KEYS[i], now, score_id)
    redis.call('HDEL', KEYS[i + 1], score_id)
    redis.call('HDEL', KEYS[i + 2], score_id)
    redis.call('ZREM', KEYS[i + 3], score_id)
    redis.call('ZREM', KEYS[i + 4], score_id)
  end
  redis.call('DEL', checkpoint)
  if redis.call('GET', claim) == owner then
    redis.call('DEL', claim)
  end
  if has_job == '1' then
    if redis.call('SREM', skips_prefix .. job_id, score_id) == 1 then  -- counted as its skip until now
      redis.call('HINCRBY', job, 'skipped', -1)
      redis.call('HINCRBY', job, 'skipped:already_scored', -1)
      moved = true
    end
    -- A job that ended counts no new score (a late delivery meeting its record expired).
    if moved or not tracescore_finished(job) then
      redis.call('HINCRBY', job, counter, 1)
      if reason ~= '' then
        redis.call('HINCRBY', job, counter .. ':' .. reason, 1)
      end
    else
      redis.call('SADD', uncounted_prefix .. job_id, score_id)
      redis.call('EXPIRE', uncounted_prefix .. job_id, job_ttl)
    end
  end
  if reason ~= '' then
    redis.call('HINCRBY', KEYS[1], reason, 1)
    redis.call('EXPIRE', KEYS[1], failures_ttl)
  end
  return 1
end

local done = {}
a = first
for k = shared + 1, #KEYS, 5 do
  done[#done + 1] = put(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
    ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], others[#done + 1])
  a = a + 6
end
return done
"""
)
# Records per call: bounds how long one call holds Redis (~1 ms here) and its argument count.
_PUT_CHUNK = 200


def _chunks(records: Sequence[ScoreRecord]) -> list[list[ScoreRecord]]:
    """``records`` in calls of at most ``_PUT_CHUNK``, a score id at most once in each: the script
    reads each record's stored value before it writes any (its key checks), so a second record
    of one id in one call would be put over a value it never read."""
    chunks: list[list[ScoreRecord]] = [[]]
    ids: set[str] = set()
    for record in records:
        if len(chunks[-1]) == _PUT_CHUNK or record.score_id in ids:
            chunks.append([])
            ids.clear()
        chunks[-1].append(record)
        ids.add(record.score_id)
    return chunks


# KEYS: per score its claim and its record. ARGV: owner, ttl. Per score: the record's job id
# when a put would keep the record (nothing to score: it is not claimed), else 1 when ``owner``
# holds the claim now (taken, or its own already: this same delivery retrying), else 0.
_CLAIM = (
    LUA_CHECK
    + _LUA_STORED
    + """
local checks = {}
for i = 1, #KEYS, 2 do
  checks[#checks + 1] = KEYS[i]; checks[#checks + 1] = 'string'; checks[#checks + 1] = 'r'
end
local bad = tracescore_check(checks)
if bad then
  return bad
end
local out, ttl = {}, tonumber(ARGV[2])
for i = 1, #KEYS, 2 do
  local job = tracescore_kept_job(KEYS[i + 1])
  if job then
    out[#out + 1] = job
  elseif redis.call('SET', KEYS[i], ARGV[1], 'NX', 'EX', ttl) or redis.call('GET', KEYS[i]) == ARGV[1] then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""
)
_CLAIM_CHUNK = 1000

# KEYS: claim, record. ARGV: previous owner, new owner, ttl. Compare-and-set (a vanished claim
# is free; one the new owner holds already is this call sent again after a repair or a lost
# reply), answered as ``_CLAIM`` (a kept record's job id: not claimed).
_TAKE_OVER = checked_script(
    "{KEYS[1], 'string', 'r'}",
    _LUA_STORED
    + """
local job = tracescore_kept_job(KEYS[2])
if job then
  return job
end
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] or current == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0
""",
)


@unavailable_as_error
class RedisScoreStore(OnRedis):
    """The store in Redis (``redis.asyncio``); every worker process shares it.

    The client is created on first use, on the event loop that uses it, and reconnects by
    itself; ``StoreUnavailableError`` means Redis stayed unreachable through the retries.
    """

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 32,
        job_ttl_s: int = JOB_TTL_S,
        reconnect_s: float = 2.0,
        command_s: float = COMMAND_SLACK_S,
        sinks: Sequence[str] = (),
    ) -> None:
        self._redis = RedisConnection(
            url, max_connections=max_connections, reconnect_s=reconnect_s, command_s=command_s
        )
        self._jobs = RedisJobStats(url, job_ttl_s=job_ttl_s, connection=self._redis)
        # Every recorded score is queued for these sinks (``worker.store.RedisOutbox``).
        self.sinks = tuple(sinks)
        # (The set of sink names too: `tracescore status` and a backfill's summary list them.)
        self._outbox_keys = (
            [
                _keys.outbox_sinks_key(),
                *(
                    k
                    for s in self.sinks
                    for k in (
                        _keys.outbox_key(s),
                        _keys.outbox_attempts_key(s),
                        _keys.outbox_dead_key(s),
                        delivered_key(s),
                        _keys.outbox_dead_order_key(s),
                    )
                ),
            ]
            if self.sinks
            else []
        )

    @property
    def jobs(self) -> RedisJobStats:
        return self._jobs

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        if not score_ids:
            return {}
        values = await self._redis.client.mget([_keys.record_key(s) for s in score_ids])
        return _readable(ScoreRecord, score_ids, values, "score_record_unreadable")

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> Claims:
        if not score_ids:
            return Claims()
        ttl = str(max(1, ttl_s))
        chunks = [score_ids[i : i + _CLAIM_CHUNK] for i in range(0, len(score_ids), _CLAIM_CHUNK)]
        replies = await self._redis.evalsha_each(
            _CLAIM,
            [
                (2 * len(chunk), [*(k for s in chunk for k in (_keys.claim_key(s), _keys.record_key(s))), owner, ttl])
                for chunk in chunks
            ],
            where="claim",
        )
        return _claims(score_ids, [got for reply in replies for got in reply])

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        if not score_ids:
            return
        await self._redis.evalsha_many(
            RELEASE_OWNED, 1, [(_keys.claim_key(s), owner) for s in score_ids], where="release"
        )

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        if not score_ids:
            return {}
        owners = await self._redis.client.mget([_keys.claim_key(s) for s in score_ids])
        return {s: o for s, o in zip(score_ids, owners, strict=True) if o is not None}

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> Claims:
        if not claims:
            return Claims()
        done = await self._redis.evalsha_many(
            _TAKE_OVER,
            2,
            [(_keys.claim_key(s), _keys.record_key(s), previous, owner, str(max(1, ttl_s))) for s, previous in claims],
            where="take_over",
        )
        return _claims([s for s, _ in claims], done)

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]:
        if not score_ids:
            return {}
        values = await self._redis.client.mget([_keys.checkpoint_key(s) for s in score_ids])
        return _readable(ScoreResult, score_ids, values, "checkpoint_unreadable")

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None:
        await self._redis.client.set(_keys.checkpoint_key(score_id), partial.model_dump_json(), ex=ttl_s)

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        if not records:
            return []
        shared = [_keys.failures_key(failure_bucket()), *self._outbox_keys]
        head = [
            str(ttl_s),
            owner,
            str(FAILURE_WINDOW_SECONDS * FAILURE_BUCKETS_KEPT),
            str(int(time.time() * 1000)),
            str(len(shared)),
            str(len(self.sinks)),
            str(self._jobs.job_ttl_s),
            _keys.job_key(""),
            _keys.job_skips_key(""),
            _keys.job_uncounted_key(""),
            *self.sinks,
        ]
        # Each record's keys and arguments go as UTF-8 bytes, made here: redis-py encodes a str
        # argument through a Python call and four type checks of its own, a bytes one it passes
        # with the first (its packing was 5% of a worker's CPU in bench/backfill.py; 11 arguments
        # a record, 1.7 µs a record less).
        calls: list[tuple[int, list[str | bytes]]] = []
        for chunk in _chunks(records):
            keys: list[str | bytes] = list(shared)
            args: list[str | bytes] = list(head)
            for record in chunk:
                counter, reason = outcome(record)
                score_id, job_id = record.score_id, record.job_id
                keys += (
                    _keys.record_key(score_id).encode(),
                    _keys.trace_key(record.trace_id).encode(),
                    _keys.checkpoint_key(score_id).encode(),
                    _keys.claim_key(score_id).encode(),
                    _keys.job_key(job_id or "-").encode(),
                )
                args += (
                    record.model_dump_json().encode(),
                    score_id.encode(),
                    b"1" if job_id else b"0",
                    counter.encode(),
                    reason.encode(),
                    job_id.encode() if job_id else b"",
                )
            calls.append((len(keys), keys + args))
        if len({r.score_id for r in records}) == len(records):
            replies = await self._redis.evalsha_each(_PUT_RECORDS, calls, where="put_records")
        else:  # one call after another: a call repaired is sent again after the others (``_chunks``)
            replies = [
                reply
                for call in calls
                for reply in await self._redis.evalsha_each(_PUT_RECORDS, [call], where="put_records")
            ]
        jobs = {r.job_id for r in records if r.job_id}
        if jobs:
            async with self._redis.client.pipeline(transaction=False) as pipe:
                for job_id in jobs:
                    pipe.expire(_keys.job_key(job_id), self._jobs.job_ttl_s)
                await pipe.execute()
        return [bool(done) for reply in replies for done in reply]

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]:
        client, key = self._redis.client, _keys.trace_key(trace_id)
        ids = sorted(
            await checked_async(client, "records_for_trace", [(key, "set", False)], lambda: client.smembers(key))
        )
        found = await self.existing(ids)
        return [found[s] for s in ids if s in found]
