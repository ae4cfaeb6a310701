"""The stores in one process's memory: the embedded mode (``tracescore score``, backfill without
a broker) and tests. Same contracts as the Redis stores; TTLs are ignored (the process is
short-lived)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence

from scorers import ScoreResult
from tracing import ScoreRecord
from worker.store._dead_letters import DeadLetter
from worker.store._jobs import failure_bucket, outcome
from worker.store._outbox import MemoryOutbox
from worker.store._scores import Claims

__all__ = ["MemoryDeadLetters", "MemoryJobStats", "MemoryScoreStore"]


class MemoryJobStats:
    """Job statistics in memory; ``MemoryScoreStore`` counts recorded scores into them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._failures: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def _recorded(self, record: ScoreRecord, replaced: ScoreRecord | None) -> None:
        with self._lock:
            if replaced is not None and record.job_id and replaced.job_id == record.job_id:
                self._jobs[record.job_id]["failed"] -= 1
                self._jobs[record.job_id][f"failed:{replaced.error_type}"] -= 1
            counter, reason = outcome(record)
            if record.job_id:
                self._jobs[record.job_id][counter] += 1
                if reason:
                    self._jobs[record.job_id][f"{counter}:{reason}"] += 1
            if reason:
                self._failures[failure_bucket()][reason] += 1

    async def count_skipped(self, job_id: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self._jobs[job_id]["skipped"] += n
            self._jobs[job_id][f"skipped:{reason}"] += n

    async def progress(self, job_id: str) -> dict[str, int]:
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

    async def close(self) -> None:
        return None


class MemoryScoreStore:
    """The exactly-once core in memory."""

    def __init__(self, jobs: MemoryJobStats | None = None, *, sinks: Sequence[str] = ()) -> None:
        self._lock = threading.Lock()
        self._jobs = jobs if jobs is not None else MemoryJobStats()
        self.records: dict[str, ScoreRecord] = {}
        # Every recorded score is queued here for each sink, as the Redis store's script does.
        self.outbox = MemoryOutbox(self._records_among, sinks)
        self._claims: dict[str, tuple[str, float]] = {}
        self._checkpoints: dict[str, ScoreResult] = {}
        self._by_trace: dict[str, list[str]] = defaultdict(list)

    @property
    def jobs(self) -> MemoryJobStats:
        return self._jobs

    async def existing(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        return self._records_among(score_ids)

    def _records_among(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        with self._lock:
            return {s: self.records[s] for s in score_ids if s in self.records}

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> Claims:
        now = time.monotonic()
        claims = Claims()
        with self._lock:
            for score_id in score_ids:
                job = self._kept_job(score_id)
                if job is not None:
                    claims.recorded[score_id] = job
                    continue
                current = self._claims.get(score_id)
                if current is None or current[1] <= now or current[0] == owner:
                    self._claims[score_id] = (owner, now + ttl_s)
                    claims.held.add(score_id)
        return claims

    def _kept_job(self, score_id: str) -> str | None:
        """The job id ("" for none) of ``score_id``'s record when a put would keep it, else None."""
        record = self.records.get(score_id)
        if record is None or record.retryable:
            return None
        return record.job_id or ""

    async def release(self, score_ids: Sequence[str], owner: str) -> None:
        with self._lock:
            for score_id in score_ids:
                if self._claims.get(score_id, ("", 0.0))[0] == owner:
                    del self._claims[score_id]

    async def claim_owners(self, score_ids: Sequence[str]) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            return {s: c[0] for s in score_ids if (c := self._claims.get(s)) is not None and c[1] > now}

    async def take_over(self, claims: Sequence[tuple[str, str]], owner: str, ttl_s: int) -> Claims:
        now = time.monotonic()
        taken = Claims()
        with self._lock:
            for score_id, previous in claims:
                job = self._kept_job(score_id)
                if job is not None:
                    taken.recorded[score_id] = job
                    continue
                current = self._claims.get(score_id)
                # (``owner`` holding it already: this take-over sent again, as in Redis.)
                if current is None or current[1] <= now or current[0] in (previous, owner):
                    self._claims[score_id] = (owner, now + ttl_s)
                    taken.held.add(score_id)
        return taken

    async def get_checkpoints(self, score_ids: Sequence[str]) -> dict[str, ScoreResult]:
        with self._lock:
            return {s: self._checkpoints[s] for s in score_ids if s in self._checkpoints}

    async def put_checkpoint(self, score_id: str, partial: ScoreResult, ttl_s: int) -> None:
        with self._lock:
            self._checkpoints[score_id] = partial.model_copy(deep=True)

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        fresh: list[bool] = []
        owed: list[str] = []
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
                else:
                    self._by_trace[record.trace_id].append(record.score_id)
                self.records[record.score_id] = record
                self._checkpoints.pop(record.score_id, None)
                if self._claims.get(record.score_id, ("", 0.0))[0] == owner:
                    del self._claims[record.score_id]
                self._jobs._recorded(record, replaced=prev)
                owed.append(record.score_id)
                fresh.append(True)
            # Under the store's lock, as one step with the record (a drainer reads records
            # without it: an id is never queued before its record is there).
            self.outbox.enqueue_all(owed)
        return fresh

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]:
        with self._lock:
            return [self.records[s] for s in self._by_trace.get(trace_id, [])]

    async def close(self) -> None:
        return None


class MemoryDeadLetters:
    """The dead-letter list in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._letters: list[DeadLetter] = []
        self._seen: set[str] = set()
        self._held: dict[str, float] = {}  # letter id -> when its hold ends (monotonic)

    async def push(self, letter: DeadLetter) -> bool:
        with self._lock:
            if letter.message_key is not None:
                if letter.message_key in self._seen:
                    return False
                self._seen.add(letter.message_key)
            self._letters.insert(0, letter)
            return True

    async def counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for letter in self._letters:
                counts[letter.reason] += 1
        return dict(counts)

    async def latest(self, limit: int = 100) -> list[DeadLetter]:
        with self._lock:
            return list(self._letters[:limit])

    async def take(self, letter_id: str) -> DeadLetter | None:
        with self._lock:
            for i, letter in enumerate(self._letters):
                if letter.id == letter_id:
                    return self._letters.pop(i)
        return None

    async def hold(self, letter_id: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._held.get(letter_id, 0.0) > now:
                return False
            self._held[letter_id] = now + ttl_s
            return True

    async def size(self) -> int:
        with self._lock:
            return len(self._letters)

    async def close(self) -> None:
        return None
