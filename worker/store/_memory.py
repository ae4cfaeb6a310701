"""The stores in one process's memory: the embedded mode (``tracescore score``, backfill without
a broker) and tests. Same contracts as the Redis stores; TTLs are ignored (the process is
short-lived)."""

from __future__ import annotations

import heapq
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Sequence
from itertools import islice

from scorers import ScoreResult
from tracing import ScoreRecord
from worker._settings import DEFAULT_DLQ_MAX_BYTES, DEFAULT_DLQ_MAX_LETTERS
from worker.store._dead_letters import DeadLetter, letter_bytes
from worker.store._jobs import FAILURE_BUCKETS_KEPT, failure_bucket, outcome
from worker.store._outbox import MemoryOutbox
from worker.store._scores import Claims

__all__ = ["MemoryDeadLetters", "MemoryJobStats", "MemoryScoreStore"]


class MemoryJobStats:
    """Job statistics in memory; ``MemoryScoreStore`` counts recorded scores into them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._failures: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._skips: dict[str, set[str]] = defaultdict(set)  # (job_skips_key)
        self._finished: set[str] = set()  # (the job hash's ``finished`` field)
        self._uncounted: dict[str, set[str]] = defaultdict(set)  # (job_uncounted_key)

    def _recorded(self, record: ScoreRecord, replaced: ScoreRecord | None) -> None:
        # A job counts each score once: its record's outcome, or a skip while another's record
        # stands for it; one that ended counts no new score (the record it stores then is
        # uncounted: replaced, it moves nothing), its scores still move (the Redis put script's
        # rules).
        with self._lock:
            moved = False
            if replaced is not None and replaced.job_id and record.score_id in self._uncounted.get(replaced.job_id, ()):
                self._uncounted[replaced.job_id].discard(record.score_id)  # never counted: nothing to move
            elif replaced is not None and replaced.job_id:
                # Its own failure recorded again, or another's record in its place: that job's skip.
                counts = self._jobs[replaced.job_id]
                counts["failed"] -= 1
                counts[f"failed:{replaced.error_type}"] -= 1
                if replaced.job_id != record.job_id:
                    self._add_skips(replaced.job_id, "already_scored", [record.score_id])
                else:
                    moved = True
            counter, reason = outcome(record)
            if record.job_id:
                counts = self._jobs[record.job_id]
                skips = self._skips[record.job_id]
                if record.score_id in skips:  # its skip until now: its own record's outcome instead
                    skips.discard(record.score_id)
                    counts["skipped"] -= 1
                    counts["skipped:already_scored"] -= 1
                    moved = True
                if moved or record.job_id not in self._finished:
                    counts[counter] += 1
                    if reason:
                        counts[f"{counter}:{reason}"] += 1
                else:
                    self._uncounted[record.job_id].add(record.score_id)
            if reason:
                bucket = failure_bucket()
                if bucket not in self._failures:  # a new window: the old ones go, as in Redis (TTL)
                    for old in [b for b in self._failures if b < bucket - FAILURE_BUCKETS_KEPT]:
                        del self._failures[old]
                self._failures[bucket][reason] += 1

    def _kept(self, record: ScoreRecord, kept: ScoreRecord) -> None:
        """``record`` refused for ``kept``: its job's skip when ``kept`` is another's."""
        if record.job_id and kept.job_id != record.job_id:
            with self._lock:
                self._count_new_skips(record.job_id, "already_scored", [record.score_id])

    async def count_skipped_once(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        with self._lock:
            return self._count_new_skips(job_id, reason, score_ids)

    def _count_new_skips(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        """(Under the lock.) Count those of ``score_ids`` not counted for the job before, unless
        the job ended."""
        return 0 if job_id in self._finished else self._add_skips(job_id, reason, score_ids)

    def _add_skips(self, job_id: str, reason: str, score_ids: Sequence[str]) -> int:
        counted = self._skips[job_id]
        new = set(score_ids) - counted
        counted |= new
        if new:
            self._jobs[job_id]["skipped"] += len(new)
            self._jobs[job_id][f"skipped:{reason}"] += len(new)
        return len(new)

    async def progress(self, job_id: str) -> dict[str, int]:
        with self._lock:
            return dict(self._jobs.get(job_id, {}))

    async def finish(self, job_id: str) -> None:
        with self._lock:
            self._finished.add(job_id)
            if "failed" not in self._jobs.get(job_id, {}):  # (as in Redis: kept for its dlq retry)
                self._skips.pop(job_id, None)

    async def recent_failures(self, buckets: int = 6) -> dict[str, int | None]:
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
    """The exactly-once core in memory.

    A record is kept for the ``ttl_s`` of its put, as in Redis, and with ``max_records`` only the
    newest that many (a score is a few KB: an app scoring in process for weeks must not keep
    every one). A record still owed to a sink stays until it is delivered or dead-lettered, and
    what goes first is the oldest put. A forgotten record's score may be scored again if its run
    is sent again, as after its TTL in Redis."""

    def __init__(
        self,
        jobs: MemoryJobStats | None = None,
        *,
        sinks: Sequence[str] = (),
        max_records: int | None = None,
        max_dead_letters: int | None = None,
    ) -> None:
        """``max_dead_letters``: each sink's bound on its dead letters (default ``max_records``:
        a bounded store's letters are bounded alike)."""
        self._lock = threading.Lock()
        self._jobs = jobs if jobs is not None else MemoryJobStats()
        self.records: dict[str, ScoreRecord] = {}
        self.max_records = max_records
        # Score id -> when its record expires (monotonic), in the order they were put; and the
        # same as a heap by expiry (entries of records put again or dropped are skipped).
        self._expires: dict[str, float] = {}
        self._expiry_heap: list[tuple[float, str]] = []
        # Every recorded score is queued here for each sink, as the Redis store's script does.
        self.outbox = MemoryOutbox(
            self._records_among, sinks, max_dead_letters=max_records if max_dead_letters is None else max_dead_letters
        )
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
            self._forget_old(time.monotonic())  # a record past its TTL is gone, as in Redis
            return {s: self.records[s] for s in score_ids if s in self.records}

    async def claim(self, score_ids: Sequence[str], owner: str, ttl_s: int) -> Claims:
        now = time.monotonic()
        claims = Claims()
        with self._lock:
            self._forget_old(now)
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
            self._forget_old(now)
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
        now = time.monotonic()
        with self._lock:
            for record in records:
                prev = self.records.get(record.score_id)
                if prev is not None:
                    if prev == record:  # this very record again (as Redis answers a retried put)
                        fresh.append(True)
                        continue
                    if not prev.retryable:
                        self._jobs._kept(record, prev)
                        fresh.append(False)
                        continue
                else:
                    self._by_trace[record.trace_id].append(record.score_id)
                self.records[record.score_id] = record
                self._expires.pop(record.score_id, None)
                self._expires[record.score_id] = now + ttl_s
                heapq.heappush(self._expiry_heap, (now + ttl_s, record.score_id))
                self._checkpoints.pop(record.score_id, None)
                if self._claims.get(record.score_id, ("", 0.0))[0] == owner:
                    del self._claims[record.score_id]
                self._jobs._recorded(record, replaced=prev)
                owed.append(record.score_id)
                fresh.append(True)
            # Under the store's lock, as one step with the record (a drainer reads records
            # without it: an id is never queued before its record is there).
            self.outbox.enqueue_all(owed)
            self._forget_old(now)
        return fresh

    def _forget_old(self, now: float) -> None:
        """Drop the records past their TTL, then the oldest put past ``max_records``; a record a
        sink has yet to take stays (under the lock)."""
        heap, expires = self._expiry_heap, self._expires
        while heap and heap[0][0] <= now:
            due, score_id = heap[0]
            if expires.get(score_id) != due:  # put again since, or dropped already
                heapq.heappop(heap)
                continue
            if self.outbox.owes(score_id):
                break
            heapq.heappop(heap)
            self._drop(score_id)
        while self.max_records is not None and len(self.records) > self.max_records:
            score_id = next(iter(expires))
            if self.outbox.owes(score_id):
                break
            self._drop(score_id)
        if len(heap) > 2 * len(expires) + 64:  # the dropped records' entries: rebuilt
            self._expiry_heap = [(due, score_id) for score_id, due in expires.items()]
            heapq.heapify(self._expiry_heap)

    def _drop(self, score_id: str) -> None:
        del self._expires[score_id]
        record = self.records.pop(score_id)
        ids = self._by_trace.get(record.trace_id)
        if ids is not None:
            ids.remove(score_id)
            if not ids:
                del self._by_trace[record.trace_id]
        self.outbox.forget(score_id)

    async def records_for_trace(self, trace_id: str) -> list[ScoreRecord]:
        with self._lock:
            self._forget_old(time.monotonic())
            return [self.records[s] for s in self._by_trace.get(trace_id, [])]

    async def close(self) -> None:
        return None


class MemoryDeadLetters:
    """The dead-letter list in memory, bounded as in Redis, by letters and by their bytes (a
    dropped letter's message key is forgotten with it: in one process no message comes back to
    be deduplicated)."""

    def __init__(self, *, max_letters: int = DEFAULT_DLQ_MAX_LETTERS, max_bytes: int = DEFAULT_DLQ_MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._letters: deque[tuple[DeadLetter, int]] = deque()  # newest first, each with its bytes
        self._bytes = 0
        self._seen: set[str] = set()
        self._held: dict[str, float] = {}  # letter id -> when its hold ends (monotonic)
        self._dropped: Counter[str] = Counter()
        self.max_letters = max_letters
        self.max_bytes = max_bytes

    async def push(self, letter: DeadLetter) -> bool:
        size = letter_bytes(letter)
        with self._lock:
            if letter.message_key is not None:
                if letter.message_key in self._seen:
                    return False
                self._seen.add(letter.message_key)
            self._letters.appendleft((letter, size))
            self._bytes += size
            # The oldest go until both bounds hold; the newest stays, alone if it is over the bytes'.
            while len(self._letters) > 1 and (len(self._letters) > self.max_letters or self._bytes > self.max_bytes):
                oldest, dropped_bytes = self._letters.pop()
                self._bytes -= dropped_bytes
                self._seen.discard(oldest.message_key or "")
                self._dropped[oldest.reason] += 1
            return True

    async def dropped(self) -> dict[str, int | None]:
        with self._lock:
            return dict(self._dropped)

    async def counts(self) -> dict[str, int | None]:
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for letter, _ in self._letters:
                counts[letter.reason] += 1
        return dict(counts)

    async def latest(self, limit: int = 100) -> list[DeadLetter]:
        with self._lock:
            return [letter for letter, _ in islice(self._letters, limit)]

    async def each(self) -> AsyncIterator[DeadLetter]:
        with self._lock:
            letters = [letter for letter, _ in reversed(self._letters)]
        for letter in letters:
            yield letter

    async def take(self, letter_id: str) -> DeadLetter | None:
        with self._lock:
            for i, (letter, size) in enumerate(self._letters):
                if letter.id == letter_id:
                    del self._letters[i]
                    self._bytes -= size
                    return letter
        return None

    async def hold(self, letter_id: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._held.get(letter_id, 0.0) > now:
                return False
            self._held = {k: until for k, until in self._held.items() if until > now}  # lapsed holds go
            self._held[letter_id] = now + ttl_s
            return True

    async def release(self, letter_id: str) -> None:
        with self._lock:
            self._held.pop(letter_id, None)

    async def size(self) -> int:
        with self._lock:
            return len(self._letters)

    async def size_bytes(self) -> int | None:
        with self._lock:
            return self._bytes

    async def close(self) -> None:
        return None
