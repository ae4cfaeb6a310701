"""Job statistics: per-job counters (scored, failed, skipped, by reason) and failure counts in
time buckets (``tracescore status``).

Scored and failed are counted by the score store in the same atomic step that records the
score (so a score is counted exactly once); skips are counted here.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tracing import ScoreRecord
from worker import _keys
from worker._reconnect import unavailable_as_error
from worker.store._keytypes import checked_async, checked_script
from worker.store._redis import OnRedis, RedisConnection, read_counters

__all__ = [
    "FAILURE_BUCKETS_KEPT",
    "FAILURE_WINDOW_SECONDS",
    "JOB_TTL_S",
    "JobStats",
    "RedisJobStats",
    "failure_bucket",
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


# Lua: the ids ``ids[first..last]`` that are new to a job's set of counted skips join it and
# are counted as its skips for ``reason`` (Lua's ``unpack`` takes a few thousand at a time). The
# one place a skip is counted once, by ``count_skipped_once`` and by the score store's put (a
# job's failure another's record replaced; a job's record refused for another's).
LUA_NEW_SKIPS = """
local function tracescore_new_skips(job, skips, reason, ids, first, last)
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
"""

# The ids and their count in one step, after both keys' types are checked (a script is not
# undone by an error halfway: the ids added, a failed count would never be made again).
_COUNT_NEW_SKIPS = LUA_NEW_SKIPS + checked_script(
    "{KEYS[1], 'hash', 'r', KEYS[2], 'set', 'r'}",
    """
local added = tracescore_new_skips(KEYS[1], KEYS[2], ARGV[1], ARGV, 3, #ARGV)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if #ARGV > 2 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
return added
""",
)


@runtime_checkable
class JobStats(Protocol):
    """Counters per job and recent failures by reason."""

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None: ...

    async def count_skipped_once(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        """Count as skipped those of ``score_ids`` the job has not counted so before (a message
        retried meets its runs another job scored again); how many were new."""
        ...

    async def progress(self, job_id: str) -> dict[str, int]:
        """The job's counters: ``scored``, ``failed``, ``skipped`` and ``<counter>:<reason>``."""
        ...

    async def recent_failures(self, buckets: int = 6) -> dict[str, int]:
        """Failed scores by reason over the last ``buckets`` × ``FAILURE_WINDOW_SECONDS``."""
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
        job_ttl_s: int = JOB_TTL_S,
        connection: RedisConnection | None = None,
    ) -> None:
        self._redis = connection or RedisConnection(url, max_connections=8, reconnect_s=reconnect_s)
        self.job_ttl_s = job_ttl_s

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None:
        client, key = self._redis.client, _keys.job_key(job_id)

        async def count() -> None:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hincrby(key, "skipped", n)
                pipe.hincrby(key, f"skipped:{reason}", n)
                pipe.expire(key, self.job_ttl_s)
                await pipe.execute()

        # Both counts fail together (one key), so the whole pipeline may be sent again.
        await checked_async(client, "count_skipped", [(key, "hash", False)], count)

    async def count_skipped_once(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        args = [_keys.job_key(job_id), _keys.job_skips_key(job_id), reason, str(self.job_ttl_s), *score_ids]
        (added,) = await self._redis.evalsha_each(_COUNT_NEW_SKIPS, [(2, args)], where="count_skipped_once")
        return int(added)

    async def progress(self, job_id: str) -> dict[str, int]:
        client, key = self._redis.client, _keys.job_key(job_id)
        raw = await checked_async(client, "progress", [(key, "hash", False)], lambda: client.hgetall(key))
        return read_counters(raw, key, "job_progress")

    async def recent_failures(self, buckets: int = 6) -> dict[str, int]:
        now = failure_bucket()
        client = self._redis.client
        keys = [_keys.failures_key(bucket) for bucket in range(now - buckets + 1, now + 1)]

        async def read() -> list[dict[str, str]]:
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hgetall(key)
                return list(await pipe.execute())

        totals: dict[str, int] = defaultdict(int)
        replies = await checked_async(client, "recent_failures", [(k, "hash", False) for k in keys], read)
        for key, reply in zip(keys, replies, strict=True):
            for reason, n in read_counters(reply, key, "failures").items():
                totals[reason] += n
        return dict(totals)
