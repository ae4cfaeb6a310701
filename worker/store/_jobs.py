"""Job statistics: per-job counters (scored, failed, skipped, by reason) and failure counts in
time buckets (``tracescore status``).

Scored and failed are counted by the score store in the same atomic step that records the
score (so a score is counted exactly once); skips are counted here. A job that ended
(``finish``) counts nothing more: its total is final, and only a move of one of its scores from
one outcome to another (its ``dlq retry`` scoring its failure; another's record replacing its
retryable failure, which becomes its skip) still changes its counts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tracing import ScoreRecord, printable
from worker import _keys
from worker._errors import UnreadableCounterError
from worker._reconnect import COMMAND_SLACK_S, unavailable_as_error
from worker.store._keytypes import (
    JOB_COUNTER_AGAIN,
    JOB_COUNTER_ASIDE,
    JOB_COUNTER_TIMES,
    checked,
    checked_async,
    checked_script,
)
from worker.store._redis import OnRedis, RedisConnection, known_counters

__all__ = [
    "FAILURE_BUCKETS_KEPT",
    "FAILURE_WINDOW_SECONDS",
    "JOB_TTL_S",
    "JobStats",
    "RedisJobStats",
    "failure_bucket",
    "finish_job",
    "job_counts",
    "job_progress",
    "outcome",
]

# Failure counts are kept in buckets of this many seconds (``tracescore status`` sums the last hour).
FAILURE_WINDOW_SECONDS = 600
# Windows of failures kept (Redis: a bucket's TTL is this many windows).
FAILURE_BUCKETS_KEPT = 12
# A job's counters outlive its last update by this long.
JOB_TTL_S = 7 * 24 * 3600


def failure_bucket(at: float | None = None) -> int:
    return int((time.time() if at is None else at) // FAILURE_WINDOW_SECONDS)


def outcome(record: ScoreRecord) -> tuple[str, str]:
    """The job counter a recorded score adds to, and its reason (``""`` for a score)."""
    if record.error_type:
        return "failed", record.error_type
    return "scored", ""


# A field keeping a count's later values aside, or their count (``tracescore_keep_aside``), less
# this suffix: the field keeping its first.
_KEPT_AGAIN = re.compile(rf"(?:{re.escape(JOB_COUNTER_AGAIN)}[0-9]+|{re.escape(JOB_COUNTER_TIMES)})\Z")

# The field of a job's hash that says the job ended (``finish``); not a counter, so ``progress``
# leaves it out.
_FINISHED = "finished"

# Lua: the ids ``ids[first..last]`` that are new to a job's set of counted skips join it and
# are counted as its skips for ``reason`` (Lua's ``unpack`` takes a few thousand at a time). The
# one place a skip is counted once, by ``count_skipped_once`` and by the score store's put (a
# job's failure another's record replaced; a job's record refused for another's).
# ``tracescore_new_skips`` counts nothing for a job that ended: a late delivery of its message (a
# worker killed before its ack, a `dlq retry`) met its set gone (dropped when it ended) and
# counted its skips again, past its total. ``tracescore_add_skips`` is for a score moving from
# the job's failure to its skip, which leaves its total as it is.
LUA_NEW_SKIPS = f"""
local function tracescore_finished(job)
  return redis.call('HEXISTS', job, '{_FINISHED}') == 1
end
local function tracescore_add_skips(job, skips, reason, ids, first, last)
  local added = 0
  for i = first, last, 4000 do
    added = added + redis.call('SADD', skips, unpack(ids, i, math.min(i + 3999, last)))
  end
  if added > 0 then
    redis.call('HINCRBY', job, 'skipped', added)
    redis.call('HINCRBY', job, 'skipped:' .. reason, added)
  end
  return added
end
local function tracescore_new_skips(job, skips, reason, ids, first, last)
  if tracescore_finished(job) then
    return 0
  end
  return tracescore_add_skips(job, skips, reason, ids, first, last)
end
"""

# What a job counted is refused when its key holds another type (never deleted): its hash of
# counters (deleted, the job lost its counts, so a backfill waiting for its total waited for good,
# and the mark of its end, so a late delivery counted past its total), its set of counted skips
# (deleted, counted again) and of uncounted records (deleted, a replaced one moved a count it
# never made). The job counts nothing until an operator moves the key aside.
_JOB_KEYS = "KEYS[1], 'hash', 'k', KEYS[2], 'set', 'k'"

# The ids and their count in one step, after both keys' types are checked (a script is not
# undone by an error halfway: the ids added, a failed count would never be made again).
_COUNT_NEW_SKIPS = LUA_NEW_SKIPS + checked_script(
    f"{{{_JOB_KEYS}}}",
    """
local bad = tracescore_check_counters({KEYS[1]}, nil, tracescore_job_counters)
if bad then
  return bad
end
local added = tracescore_new_skips(KEYS[1], KEYS[2], ARGV[1], ARGV, 3, #ARGV)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if #ARGV > 2 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
return added
""",
)

# KEYS: the job's hash, its set of counted skips. ARGV: the job's TTL. The job is marked ended,
# and its set dropped (about 130 bytes a skip: every score of a job re-run to read its scores
# back), unless it recorded a failure (a ``failed`` field, even one brought back to 0): its
# ``dlq retry`` may yet record a run it counts as a skip (its failure another's record
# replaced), which moves that count to the record.
_FINISH = checked_script(
    f"{{{_JOB_KEYS}}}",
    f"""
redis.call('HSET', KEYS[1], '{_FINISHED}', 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'failed') == 0 then
  redis.call('DEL', KEYS[2])
end
""",
)


# KEYS: the job's hash, its sets of counted skips and of uncounted records. Its hash, flat (HGETALL).
# Each key of another type is refused: every put of the job is, so the job counts nothing more,
# and its progress is unknown (a backfill waiting for its total stops naming the key), not a
# figure short of its total for good. Its counters are checked as a put checks them, so a total
# that is no integer is summed again, and a count that is no integer kept aside, which ``_counters``
# refuses: that count started over, and the job's total would never be reached.
_PROGRESS = checked_script(
    f"{{{_JOB_KEYS}, KEYS[3], 'set', 'k'}}",
    """
local bad = tracescore_check_counters({KEYS[1]}, nil, tracescore_job_counters)
if bad then
  return bad
end
return redis.call('HGETALL', KEYS[1])
""",
)


def _progress_keys(job_id: str) -> list[str]:
    return [_keys.job_key(job_id), _keys.job_skips_key(job_id), _keys.job_uncounted_key(job_id)]


def _counters(flat: Sequence[Any], key: str) -> dict[str, int]:
    """A job's hash (``_PROGRESS``'s answer, repaired: every count an integer) read as its
    counters; ``job_counts`` raises for a count kept aside."""
    text = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
    counts = job_counts(dict(zip(text[::2], text[1::2], strict=True)), key)
    return {field: n for field, n in counts.items() if n is not None}


def job_counts(raw: Mapping[str, str], key: str) -> dict[str, int | None]:
    """A job's hash of counters (HGETALL's answer) without the mark of its end, a count that is no
    integer None (``known_counters``: a reader that writes nothing, such as ``tracescore status``,
    meets it before a script keeps it aside). ``UnreadableCounterError`` when a count of its was
    kept aside (it held no integer): the job's counts are unknown. It names the first such count
    (in the order of their names), every field keeping its values and the one counting them."""
    aside = sorted(field for field in raw if field.startswith(JOB_COUNTER_ASIDE))
    if aside:
        first = _KEPT_AGAIN.sub("", aside[0])
        counted = first + JOB_COUNTER_TIMES
        kept = [f for f in aside if f != counted and _KEPT_AGAIN.sub("", f) == first]
        times = raw.get(counted, "")

        def shown(field: str) -> str:  # (a name read from Redis: any text, shown on a terminal)
            return printable(field)[:120]

        raise UnreadableCounterError(  # (never a value)
            key,
            shown(first.removeprefix(JOB_COUNTER_ASIDE)),
            tuple(shown(f) for f in sorted(kept, key=len)),
            shown(counted) if counted in raw else "",
            # (a count written by hand: Lua's reads no more than 18 digits, int() no more than 4,300)
            max(int(times) if times.isascii() and times.isdigit() and len(times) <= 18 else 0, len(kept)),
        )
    return known_counters({k: v for k, v in raw.items() if k != _FINISHED}, key, "job_progress")


def finish_job(client: Any, job_id: str, job_ttl_s: int = JOB_TTL_S) -> None:
    """``JobStats.finish`` with a synchronous client (the backfill's)."""
    keys = [_keys.job_key(job_id), _keys.job_skips_key(job_id)]
    checks = [(keys[0], "hash", True), (keys[1], "set", True)]
    checked(client, "finish_job", checks, lambda: client.eval(_FINISH, 2, *keys, job_ttl_s))


def job_progress(client: Any, job_id: str) -> dict[str, int]:
    """``JobStats.progress`` with a synchronous client (the backfill's)."""
    keys = _progress_keys(job_id)
    checks = list(zip(keys, ("hash", "set", "set"), (True, True, True), strict=True))
    return _counters(checked(client, "job_progress", checks, lambda: client.eval(_PROGRESS, 3, *keys)), keys[0])


@runtime_checkable
class JobStats(Protocol):
    """Counters per job and recent failures by reason."""

    async def count_skipped_once(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        """Count as skipped those of ``score_ids`` the job has not counted so before (a message
        retried meets its runs another job scored again); how many were new."""
        ...

    async def progress(self, job_id: str) -> dict[str, int]:
        """The job's counters: ``scored``, ``failed``, ``skipped`` and ``<counter>:<reason>``.
        ``StoreKeyTypeError`` (Redis) when its hash or its sets of counted skips and uncounted
        records hold another type (refused): unknown; ``UnreadableCounterError``, one of its
        kind, when a count of its held no integer (kept aside, started over): unknown too."""
        ...

    async def finish(self, job_id: str) -> None:
        """The job ended (its backfill counted every score): from now on its total is final.
        A late delivery of its message (a worker killed before its ack, a `dlq retry`, a record
        that expired and was made again) counts nothing; a move of one of its scores from one
        outcome to another still does (its own record replacing its failure: failed → scored;
        another's replacing its retryable failure: failed → skipped)."""
        ...

    async def recent_failures(self, buckets: int = 6) -> dict[str, int | None]:
        """Failed scores by reason over the last ``buckets`` × ``FAILURE_WINDOW_SECONDS`` (None:
        a count of it in Redis is no number)."""
        ...

    async def close(self) -> None: ...


@unavailable_as_error
class RedisJobStats(OnRedis):
    """Job statistics in Redis (the keys ``RedisScoreStore`` counts recorded scores into)."""

    def __init__(
        self,
        url: str,
        *,
        reconnect_s: float = 2.0,
        command_s: float = COMMAND_SLACK_S,
        job_ttl_s: int = JOB_TTL_S,
        connection: RedisConnection | None = None,
    ) -> None:
        self._redis = connection or RedisConnection(
            url, max_connections=8, reconnect_s=reconnect_s, command_s=command_s
        )
        self.job_ttl_s = job_ttl_s

    async def count_skipped_once(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        args = [_keys.job_key(job_id), _keys.job_skips_key(job_id), reason, str(self.job_ttl_s), *score_ids]
        (added,) = await self._redis.evalsha_each(_COUNT_NEW_SKIPS, [(2, args)], where="count_skipped_once")
        return int(added)

    async def progress(self, job_id: str) -> dict[str, int]:
        keys = _progress_keys(job_id)
        (flat,) = await self._redis.evalsha_each(_PROGRESS, [(3, keys)], where="progress")
        return _counters(flat, keys[0])

    async def finish(self, job_id: str) -> None:
        args = [_keys.job_key(job_id), _keys.job_skips_key(job_id), str(self.job_ttl_s)]
        await self._redis.evalsha_each(_FINISH, [(2, args)], where="finish_job")

    async def recent_failures(self, buckets: int = 6) -> dict[str, int | None]:
        now = failure_bucket()
        client = self._redis.client
        keys = [_keys.failures_key(bucket) for bucket in range(now - buckets + 1, now + 1)]

        async def read() -> list[dict[str, str]]:
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hgetall(key)
                return list(await pipe.execute())

        totals: dict[str, int | None] = {}
        replies = await checked_async(client, "recent_failures", [(k, "hash", False) for k in keys], read)
        for key, reply in zip(keys, replies, strict=True):
            for reason, n in known_counters(reply, key, "failures").items():
                # (one bucket's count unknown leaves the reason's sum unknown, not smaller)
                so_far = totals.get(reason, 0)
                totals[reason] = None if so_far is None or n is None else so_far + n
        return totals
