"""The embedded mode: the worker's scoring code in this process, no broker, no Redis.

``tracescore backfill`` without a broker, and the exporter's default sink, score here with the
same ``score_batch`` the Celery task calls, a ``MemoryScoreStore`` and a writer — so the results
are the same as through Redis workers, on a machine that has neither. ``tracescore score`` uses
the same ``EmbeddedScorer`` for runs that are not traces (``score_runs``: the scorers called
directly, nothing stored) and yields each pair's ``Outcome`` for the one summary and table.

Limits and retries are the worker's, from the ``Settings`` given: ``TRACESCORE_RUN_TIMEOUT_SECONDS``
(default ¾ of the task soft time limit), ``TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN``, and a batch with
transient failures is tried 1 + ``TRACESCORE_RETRY_BUDGET`` times,
``TRACESCORE_RETRY_BACKOFF_SECONDS`` apart (doubling, at most ``TRACESCORE_MAX_ETA_SECONDS``), as a
worker tries a message (``score_runs`` tries its pairs that failed transiently the same way). A
command's first Ctrl-C (``EmbeddedScorer.should_stop``), or the shutdown of an app's exporter
(``embedded_sink``), ends a backoff under way and starts no retry: the pairs left for it are not
scored, counted as skipped (``interrupted``; the sink logs them, ``embedded_sink_not_scored``),
never failed.
Scoring runs on a ``GuardedLoop`` — a loop thread watched by the worker's ``LoopWatchdog`` — so a
run past the timeout (awaiting, or blocking the loop) and a run out of memory become ``timeout`` /
``memory`` error records and the other runs are scored. A step that blocks the loop in code that
cannot be interrupted (a C call such as ``time.sleep``) cannot end this process the way a worker is
replaced; instead its run is recorded as a ``timeout``, the stuck loop is abandoned
(``LoopThread.abandon``: should the C call return, nothing more runs on it; a daemon, its thread
does not keep the process alive) and the rest of the batch is scored on a fresh loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import structlog

from scorers import Scorer, ScorerError, ScoreResult
from scorers.judge import ModelPrice
from tracing import CallbackSink, ScoreRecord, ScoreSink, ScoreWriter
from tracing.queue import ScoreBatch
from worker._budget import default_attempt_cap, enter_run, price_table, run_key
from worker._delivery import Deliveries, DrainerWaker, DrainPolicy
from worker._errors import ScorerClosedError
from worker._loop import LoopThread, LoopWatchdog
from worker._registry import load_registry
from worker._runtime import _cap_memory
from worker._scoring import (
    BatchReport,
    RunLimitError,
    ScoringDeps,
    batch_pairs,
    batch_score_ids,
    expire_runs,
    run_limited,
    running_label,
    score_batch,
    scoring_run_of,
    transient_failure,
    wedged_record,
)
from worker._settings import Settings, load_settings
from worker._summary import Outcome
from worker.store import MemoryScoreStore, ScoreStore, SinkCounts, SinkDeadLetter

__all__ = [
    "EMBEDDED_RECORDS_KEPT",
    "MAX_BATCH_BYTES",
    "EmbeddedScorer",
    "EmbeddedSink",
    "Scored",
    "cli_limits",
    "embedded_sink",
]

T = TypeVar("T")

log = structlog.get_logger("tracescore.embedded")

# Scores an app's in-process sink remembers (about 4 KB each: some 40 MB).
EMBEDDED_RECORDS_KEPT = 10_000

# The span text (or, for ``tracescore score``, the lines of runs) one batch scored here holds, as
# well as its run count: each run's input is built from it while the batch is scored. A backfill
# scored 60 traces of 16 MB prompts as one batch (2 GB at its peak), `score` 120 lines of 16 MB
# (2.1 GB).
MAX_BATCH_BYTES = 64 * 2**20

_WEDGED_OUTCOME = "its loop was abandoned and the batch's other runs were scored on a new one"


class LoopWedgedError(Exception):
    """A ``GuardedLoop``'s loop stayed blocked in code its watchdog could not interrupt; the loop
    was replaced. ``task`` is the task it is stuck in (``running_label(task)`` names the run)."""

    def __init__(self, task: asyncio.Task[Any] | None, blocked_s: float) -> None:
        super().__init__(f"the event loop was blocked for {blocked_s:.0f} s in code that could not be interrupted")
        self.task = task
        self.blocked_s = blocked_s


def cli_limits(settings: Settings) -> float:
    """For a command that scores in its own process (``tracescore score``, ``backfill`` without
    a broker): the worker's memory cap (``TRACESCORE_MEMORY_LIMIT_MB``) on this process, and
    the run timeout to score with. (Not for the exporter's sink: that process is the app's.)"""
    _cap_memory(settings.memory_limit_mb)
    return settings.run_timeout


class GuardedLoop:
    """An event loop in a thread of its own, watched like a worker's (``LoopWatchdog`` at
    ``run_timeout_s``): ``run(coro)`` waits for ``coro``; when the loop is wedged it raises
    ``LoopWedgedError`` and runs later coroutines on a fresh loop."""

    def __init__(self, run_timeout_s: float | None, *, grace_s: float = 3.0) -> None:
        self.run_timeout_s = run_timeout_s or None
        self.grace_s = grace_s
        self._waiting: concurrent.futures.Future[Any] | None = None
        self._start()

    def _start(self) -> None:
        self.loop_thread = LoopThread(name="tracescore-embedded-loop")
        self.watchdog = (
            LoopWatchdog(
                self.loop_thread,
                limit_s=self.run_timeout_s,
                on_wedged=self._on_wedged,
                can_interrupt=scoring_run_of,
                grace_s=self.grace_s,
            )
            if self.run_timeout_s
            else None
        )

    def _on_wedged(self, task: asyncio.Task[Any] | None, blocked_s: float) -> None:
        # The watchdog's thread: wake the caller waiting on the stuck loop, then stop that loop
        # for good. Left to itself, once its C call returned the loop went on with the runs the
        # caller scores again on the fresh loop: their judge calls paid twice, their records (a
        # retryable one) put and written twice.
        waiting = self._waiting
        if waiting is None:
            return
        try:
            waiting.set_exception(LoopWedgedError(task, blocked_s))
        except concurrent.futures.InvalidStateError:
            # It finished as the watchdog fired: the loop goes on serving the caller, which got
            # its result (abandoned, its next call would wait for good, with no watchdog left).
            return
        self.loop_thread.abandon()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop_thread.loop)
        self._waiting = future
        try:
            return future.result()
        except LoopWedgedError as exc:
            log.error("embedded_loop_wedged_replaced", blocked_s=round(exc.blocked_s, 1))
            if self.watchdog is not None:
                self.watchdog.stop()
            self._start()  # the stuck thread is left to itself: a daemon, it ends with the process
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            self._waiting = None

    def settle(self) -> None:
        """Let what still runs on the loop end (see ``LoopThread.settle``)."""
        self.loop_thread.settle(self.grace_s)

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.loop_thread.stop()


_Job = tuple[Scorer, Mapping[str, Any]]  # a scorer and the keyword arguments of its run


class _Try(NamedTuple):
    """One try of ``score_runs``' jobs: what it fills in, and what it leaves for the next try."""

    call: str  # the ``score_runs`` call: its jobs' failed judge calls are counted under it
    results: dict[int, ScoreResult | ScorerError]
    # Each job's result after its last answered step: a retry resumes after it (not paying
    # for those judge calls twice), as a batch's retry resumes after its checkpoints.
    checkpoints: dict[int, ScoreResult]
    transient: set[int]  # failed transiently, on a try that is not the last: tried again
    final: bool


async def _score_jobs(jobs: Sequence[_Job], todo: list[int], attempt: _Try, deps: ScoringDeps) -> None:
    gate = asyncio.Semaphore(max(1, deps.run_concurrency))

    async def one(index: int) -> None:
        scorer, run = jobs[index]
        # The job's judge calls are its own (a task of its own): their failures across its tries
        # count against TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN, as a batch's runs' do.
        enter_run(
            run_key(attempt.call, str(index), scorer.id),
            scorer.id,
            None,
            deps.judge_call_cap or default_attempt_cap(scorer, deps.retry_budget),
            version=scorer.version,
        )

        async def on_step(partial: ScoreResult) -> None:
            attempt.checkpoints[index] = partial.model_copy(deep=True)

        async with gate:
            try:
                attempt.results[index] = await run_limited(
                    scorer,
                    deps.run_timeout_s,
                    label=index,
                    resume=attempt.checkpoints.get(index),
                    # (only judge steps are kept, as a batch's checkpoint="judge" keeps them)
                    on_step=on_step if scorer.has_judge_steps else None,
                    **run,
                )
            except ScorerError as exc:
                if attempt.final or not transient_failure(exc):
                    attempt.results[index] = exc
                else:
                    attempt.transient.add(index)

    timeout_s = deps.run_timeout_s
    expiry = asyncio.ensure_future(expire_runs(min(1.0, timeout_s / 4))) if timeout_s else None
    try:
        await asyncio.gather(*(one(i) for i in todo))
    finally:
        if expiry is not None:
            expiry.cancel()


def _tries(
    settings: Settings, attempt: Callable[[bool, int], T], again: Callable[[T], bool], stopping: Callable[[], bool]
) -> T:
    """``attempt(final, number)`` until ``again`` of its result is false or it was the final try:
    1 + ``TRACESCORE_RETRY_BUDGET`` tries, ``TRACESCORE_RETRY_BACKOFF_SECONDS`` apart doubling (at
    most ``TRACESCORE_MAX_ETA_SECONDS``), as a worker tries a message (``_task``). A batch
    (``score``) and ``score_runs``' runs are retried by this, the same settings the same way.
    Once ``stopping()`` (a first Ctrl-C) no try starts and a backoff under way ends: the last
    try's result is returned as it stands, what it left for a retry unscored, not failed."""
    number = 0
    while True:
        final = number >= settings.retry_budget
        result = attempt(final, number)
        if final or not again(result):
            return result
        if not _backoff(settings.retry_delay(number), stopping):
            return result
        number += 1


_STOP_CHECK_S = 0.1


def _backoff(seconds: float, stopping: Callable[[], bool]) -> bool:
    """Wait ``seconds`` unless ``stopping()`` comes true first (it was up to 14 s of a first
    Ctrl-C's wait, with the workers' defaults); True if the wait ran out. Polled: a signal's
    handler sets a flag, and waking a lock from it could wait on this very thread."""
    end = time.monotonic() + seconds
    while not stopping():
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(_STOP_CHECK_S, left))
    return False


class _Both:
    """The caller's writer, then the drainers' wake-up."""

    def __init__(self, writer: ScoreWriter | None, waker: DrainerWaker) -> None:
        self.writer, self.waker = writer, waker

    def write(self, records: Sequence[ScoreRecord]) -> None:
        if self.writer is not None:
            self.writer.write(records)
        self.waker.write(records)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.writer.flush(timeout_s) if self.writer is not None else True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Scored(NamedTuple):
    """A (run, scorer) pair scored by ``EmbeddedScorer.score_runs``: the run's index, what the
    scorer returned (None: not scored, a stop came while it waited for a retry), and its
    outcome for the summary and the table."""

    run: int
    result: ScoreResult | ScorerError | None
    outcome: Outcome


class EmbeddedScorer:
    """A backfill submitter (and a building block for the exporter's in-process sink) that
    scores each batch right here, on one event loop of its own (a ``GuardedLoop``).

    ``settings``: the worker's (None → the environment's, ``load_settings``): its retry budget,
    backoff and judge-call cap hold here as in a worker. ``run_timeout_s``: None → its
    ``run_timeout``; 0 → no limit.
    ``sinks`` get every stored score through the in-memory outbox, as the workers' sinks do
    from Redis: drainer threads deliver while scoring goes on, and ``close`` waits up to
    ``drain_timeout_s`` for what is left (``sink_counts`` / ``sink_dead_letters`` then say how
    it went). ``should_stop`` (a command's first Ctrl-C) ends a retry's backoff and starts no
    retry: the pairs left for it are not scored (``interrupted_pairs``, ``Scored.result`` None)."""

    mode = "embedded"

    def __init__(
        self,
        registry: Mapping[str, Scorer],
        writer: ScoreWriter | None = None,
        *,
        store: ScoreStore | None = None,
        model_concurrency: int = 64,
        run_concurrency: int = 256,
        settings: Settings | None = None,
        agents: dict[str, str] | None = None,
        run_timeout_s: float | None = None,
        sinks: Sequence[ScoreSink] = (),
        drain_policy: DrainPolicy | None = None,
        drain_timeout_s: float = 30.0,
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        self.settings = settings if settings is not None else load_settings()
        if run_timeout_s is None:
            run_timeout_s = self.settings.run_timeout
        names = [s.name for s in sinks]
        if store is None:
            store = MemoryScoreStore(sinks=names, max_dead_letters=self.settings.sink_max_dead_letters)
        elif sinks and not isinstance(store, MemoryScoreStore):
            raise ValueError("EmbeddedScorer delivers to sinks from a MemoryScoreStore's outbox only")
        self.store: ScoreStore = store
        self.writer = writer
        self.deliveries: Deliveries | None = None
        self.drain_timeout_s = drain_timeout_s
        self.sink_counts: dict[str, SinkCounts] = {}
        self.sink_dead_letters: dict[str, list[SinkDeadLetter]] = {}
        hook: ScoreWriter | None = writer
        if sinks:
            assert isinstance(store, MemoryScoreStore)
            store.outbox.register(names)
            outbox = store.outbox
            self.deliveries = Deliveries(sinks, lambda: outbox, drain_policy).start()
            hook = _Both(writer, DrainerWaker(self.deliveries))
        self.deps = ScoringDeps(
            registry=registry,
            store=self.store,
            writer=hook,
            model_concurrency=model_concurrency,
            run_concurrency=run_concurrency,
            # A retry of a batch (or of its rest on a fresh loop) resumes after the judge steps
            # answered, as a worker's does: without them it paid for those steps again.
            checkpoint="judge",
            run_timeout_s=run_timeout_s or None,
            judge_call_cap=self.settings.max_judge_attempts_per_run,
            retry_budget=self.settings.retry_budget,
            prices=price_table() if prices is None else prices,
        )
        self.agents = agents
        self.totals = BatchReport(batch_id="*")
        self.should_stop: Callable[[], bool] = lambda: False
        # Batches handed over and not scored through (by id): their retry not started, cut by a
        # second Ctrl-C, or still being scored. ``interrupted_pairs`` names only pairs without a
        # record, so a batch held here that did finish names nothing.
        self._unfinished: dict[int, ScoreBatch] = {}
        self._loop = GuardedLoop(run_timeout_s)
        self._lock = threading.Lock()
        self._closed = False  # (``stop_taking``: new work is refused, ScorerClosedError)

    max_payload_bytes: int | None = None  # in process: no message, no cap
    max_batch_bytes: int = MAX_BATCH_BYTES  # a batch handed over ends once it holds this much

    def hold(self, batch: ScoreBatch) -> None:
        """Take ``batch`` on: held as unfinished until it is scored through, its pairs named by
        ``interrupted_pairs`` if a stop leaves them without a record. Refused once this scorer
        stopped taking work (``ScorerClosedError``): the caller names it."""
        with self._lock:
            self._refuse_if_closed()
            self._unfinished[id(batch)] = batch

    def stop_taking(self) -> None:
        """Take no new work from now on: ``hold``, ``submit``, ``score`` and ``score_runs`` raise
        ``ScorerClosedError``. A batch held and not begun is then never begun, so what
        ``interrupted_pairs`` names next stays unscored (an app's sink, closed as its exporter's
        shutdown deadline passed mid-hand-over, named such a batch and then scored it on the
        closed scorer); one being scored is waited for."""
        with self._lock:
            self._closed = True

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ScorerClosedError

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        """Score ``batch`` now (``requests_json`` is unused: nothing is sent)."""
        # Held as unfinished first (the backfill's driver holds it before, in the hand-over a
        # second Ctrl-C waits for), let go once scored through: a second Ctrl-C landing before
        # its scoring began left its pairs (counted as enqueued) unnamed, uncounted.
        self.hold(batch)
        report = self.score(batch)
        if not report.retry:
            del self._unfinished[id(batch)]
        totals = self.totals
        totals.requests += report.requests
        totals.pairs += report.pairs
        totals.scored += report.scored
        totals.not_scorable += report.not_scorable
        totals.failed.update(report.failed)
        totals.failed.update(report.kept)  # (recorded by an earlier try of the same batch)
        totals.skipped.update(report.skipped)
        totals.written += report.written
        totals.write_failed += report.write_failed

    def score(self, batch: ScoreBatch) -> BatchReport:
        """Score one batch now; transient judge failures are retried as a worker retries a
        message (``_task``: ``TRACESCORE_RETRY_BUDGET`` retries, the backoff doubling), unless
        ``should_stop``: then what is left for a retry stays unscored (``report.retry``; through
        ``submit``, named by ``interrupted_pairs``)."""
        with self._lock:
            self._refuse_if_closed()
            if self.agents is not None:
                for request in batch.requests:
                    self.agents.update(request.agent_labels())
            try:
                return _tries(
                    self.settings,
                    lambda final, number: self._score_once(batch, final, retried=number > 0),
                    lambda report: bool(report.retry),
                    self.should_stop,
                )
            finally:
                if self.agents is not None:
                    for request in batch.requests:
                        for span_id in request.target_span_ids:
                            self.agents.pop(span_id, None)

    def _score_once(self, batch: ScoreBatch, final: bool, *, retried: bool) -> BatchReport:
        ids = batch_score_ids(batch, self.deps.registry)
        before = set(self._loop.run(self.store.existing(ids)))
        stuck_done: dict[str, ScoreRecord] = {}
        while True:
            try:
                # A retry (the batch's, or its rest's on a fresh loop) leaves the retryable
                # failures an earlier try recorded, as a message's retry does: scored again, each
                # was written again (a second line in the summary and --out for one score).
                report = self._loop.run(score_batch(batch, self.deps, final_attempt=final, retried=retried))
                break
            except LoopWedgedError as exc:
                # A run stuck where the watchdog could not interrupt it: record it as a
                # timeout, free the stuck delivery's claims, and score the rest again on the
                # fresh loop (what the stuck delivery recorded is skipped, not scored twice).
                found = wedged_record(exc.task, exc.blocked_s, outcome=_WEDGED_OUTCOME)
                if found is None:
                    raise
                record, deps = found
                fresh = self._loop.run(self.store.put_records([record], deps.owner, deps.score_ttl_s))[0]
                if fresh and self.deps.writer is not None:
                    self.deps.writer.write([record])
                self._loop.run(self.store.release(ids, deps.owner))
                stuck_done = self._loop.run(self.store.existing([i for i in ids if i not in before]))
                retried = True
        # What the stuck attempts recorded (and wrote) is this batch's work, not a skip (nor a
        # failure an earlier try left, for a retryable one).
        if stuck_done:
            report.written += len(stuck_done)
            for record in stuck_done.values():
                if record.retryable:
                    report.kept[record.error_type or "error"] -= 1
                else:
                    report.skipped["already_scored"] -= 1
                if record.error_type:
                    report.failed[record.error_type] += 1
                elif record.score is None:
                    report.not_scorable += 1
                else:
                    report.scored += 1
            report.kept, report.skipped = +report.kept, +report.skipped  # (the counts left at 0 go)
        return report

    def score_runs(self, runs: Sequence[Mapping[str, Any]]) -> Iterator[Scored]:
        """Score each run (``run_limited``'s keyword arguments, ``run_id`` set) with every scorer
        here, ``run_concurrency`` at once, under the run timeout: a run hitting a limit gives a
        ``RunLimitError`` (``error_type`` timeout/memory), a failed run its ``ScorerError``; the
        other runs are scored. The (run, scorer) pairs that failed transiently are tried again as
        ``score`` tries a batch (``_tries``), each resuming after its answered judge steps; a pair
        gives what its last try gave. One ``Scored`` per (run, scorer), in the order of ``runs``,
        each run's scorers in registry order. Nothing is stored: ``tracescore score`` keeps no state."""
        jobs: list[_Job] = [(scorer, run) for run in runs for scorer in self.deps.registry.values()]
        results: dict[int, ScoreResult | ScorerError] = {}
        checkpoints: dict[int, ScoreResult] = {}
        call = uuid.uuid4().hex
        with self._lock:
            self._refuse_if_closed()
            _tries(
                self.settings,
                lambda final, _: self._score_jobs_once(jobs, _Try(call, results, checkpoints, set(), final)),
                bool,
                self.should_stop,
            )
        for i, (scorer, run) in enumerate(jobs):
            result = results.get(i)  # (none: its retry was not started, a stop came first)
            outcome = (
                Outcome(run["run_id"], scorer.id, scorer_version=scorer.version)
                if result is None
                else Outcome.of_result(run["run_id"], scorer, result, self.deps.prices)
            )
            yield Scored(i // len(self.deps.registry), result, outcome)

    def _score_jobs_once(self, jobs: Sequence[_Job], attempt: _Try) -> set[int]:
        """One try of the jobs without a result; the jobs it left for another try."""
        results = attempt.results
        while todo := [i for i in range(len(jobs)) if i not in results and i not in attempt.transient]:
            try:
                self._loop.run(_score_jobs(jobs, todo, attempt, self.deps))
            except LoopWedgedError as wedged:
                index = running_label(wedged.task)
                if not isinstance(index, int) or index in results:
                    raise
                stuck = RunLimitError(
                    f"scorer {jobs[index][0].id!r} blocked the event loop for {wedged.blocked_s:.0f} s "
                    f"(TRACESCORE_RUN_TIMEOUT_SECONDS is {self._loop.run_timeout_s}) in code that could not "
                    f"be interrupted; {_WEDGED_OUTCOME}",
                    error_type="timeout",
                )
                # What its answered judge steps spent, as a batch's wedged record keeps it.
                stuck.partial = attempt.checkpoints.get(index)
                results[index] = stuck
        return attempt.transient

    def progress(self, job_id: str) -> dict[str, int]:
        with self._lock:
            return self._loop.run(self.store.jobs.progress(job_id))

    def interrupted_pairs(self) -> list[tuple[str, str, str]]:
        """The pairs a stop left unscored — the batch's retry not started (a first Ctrl-C), or
        the batch cut short, or not yet begun (a second) — each counted once as its job's ``skipped:interrupted``
        (never a failure: nothing failed for good); their (trace id, span id, scorer id). After
        ``settle``: a cut batch's runs that finished recording are scored, not left."""
        with self._lock:
            pairs: dict[str, tuple[str, str, str, str | None]] = {}
            for batch in list(self._unfinished.values()):  # (a copy: the sink's thread may add one)
                pairs.update(batch_pairs(batch, self.deps.registry))
            recorded = self._loop.run(self.store.existing(list(pairs)))
            left = {score_id: pair for score_id, pair in pairs.items() if score_id not in recorded}
            by_job: dict[str, list[str]] = {}
            for score_id, (_, _, _, job_id) in left.items():
                if job_id is not None:
                    by_job.setdefault(job_id, []).append(score_id)
            for job_id, score_ids in by_job.items():
                self._loop.run(self.store.jobs.count_skipped_once(job_id, "interrupted", score_ids))
            return [(trace_id, span_id, scorer_id) for trace_id, span_id, scorer_id, _ in left.values()]

    def pending(self) -> int:
        return 0

    def settle(self) -> None:
        """Wait for a batch cancelled by a second Ctrl-C to finish recording the runs it
        finished, before the counts are read and the writer closed: it went on writing into a
        closed ``--out`` and past the summary's counts."""
        with self._lock:
            self._loop.settle()

    def close(self) -> None:
        self.settle()
        with self._lock:
            self._closed = True
            if self.writer is not None:
                self.writer.flush(10.0)
                self.writer.close()
            self._loop.close()
            if self.deliveries is not None:
                deliveries, self.deliveries = self.deliveries, None
                assert isinstance(self.store, MemoryScoreStore)
                outbox = self.store.outbox
                self.sink_counts = deliveries.finish(outbox, self.drain_timeout_s)
                self.sink_dead_letters = {s: outbox.dead_letters(s, 5) for s in self.sink_counts}


class EmbeddedSink(CallbackSink):
    """A ``CallbackSink`` that scores in process; the exporter's shutdown closes it. Each pair
    handed to it is scored or named as not scored (``embedded_sink_not_scored``), never both:
    closing, it stops taking batches first (one handed over from then on is refused,
    ``ScorerClosedError``, and named by its send), then names what it held and did not score.
    Closed by the app's own hand while its exporter runs, it refuses each batch handed over for
    good: named once, counted by the exporter as ``send_failed`` (it was retried, and named
    again, on every try for as long as the exporter lived).

    It scores in the process that built it only: a process forked from that one (gunicorn
    ``--preload``, ``multiprocessing``) has none of its event loop's thread, and its locks may
    have been held mid-fork. There each batch is refused at once (the exporter counts its runs
    as ``send_failed`` and logs why) and closing leaves the parent's resources alone, where a
    send waited for good and the app's shutdown with it."""

    def __init__(self, scorer: EmbeddedScorer) -> None:
        super().__init__(scorer.submit)
        self.scorer = scorer
        self._pid = os.getpid()
        self._said = False
        self._closed = False
        self._stopping = threading.Event()
        scorer.should_stop = self._stopping.is_set

    def stop_retrying(self) -> None:
        """The exporter is shutting down: as a command's first Ctrl-C, a retry's backoff under
        way ends and no retry starts (the app's exit waited it out); a batch still gets its
        first try. ``close`` says what was left unscored."""
        self._stopping.set()

    def send(self, batch: ScoreBatch) -> None:
        if os.getpid() != self._pid:
            if not self._said:  # (the exporter logs each refusal by its type alone)
                self._said = True
                log.error(
                    "embedded_sink_in_forked_process",
                    advice="build the exporter after the fork (e.g. gunicorn's post_fork), or use CelerySink",
                )
            raise ValueError(
                "embedded_sink scores only in the process that built it, not in one forked from it:"
                " build the exporter after the fork (e.g. gunicorn's post_fork hook), or send to a"
                " broker with CelerySink"
            )
        try:
            self.scorer.hold(batch)
        except ScorerClosedError:
            # Handed over as the exporter's shutdown closed the sink (its deadline passed): not
            # scored, and not among what ``close`` named, so named here.
            registry = self.scorer.deps.registry
            self._not_scored(
                [(t, s, c) for t, s, c, _ in batch_pairs(batch, registry).values()],
                "handed over after the sink was closed (by the exporter's shutdown deadline, or by hand)",
            )
            raise  # (a ValueError: the exporter counts it as send_failed, never tries it again)
        super().send(batch)  # (held: scored now, or, should the sink close first, named by close)

    def close(self) -> None:
        # Once only: an app that closed the sink itself has its exporter's shutdown close it again
        # (the second ran the closed scorer's loop: RuntimeError, logged as a failed close).
        if os.getpid() != self._pid or self._closed:
            return
        self._closed = True
        self._stopping.set()
        # First: a batch handed over from now on is refused (its send names it), and one held
        # and not begun is not begun, so what is named here is never scored after.
        self.scorer.stop_taking()
        self._not_scored(
            self.scorer.interrupted_pairs(),
            "shut down before they were scored: they waited for a retry after a transient failure,"
            " or were handed over as the shutdown deadline passed",
        )
        self.scorer.close()

    def _not_scored(self, left: list[tuple[str, str, str]], reason: str) -> None:
        if left:
            # Not recorded, nor failed: nothing says they were not scored but this (the exporter
            # counted their runs as sent, or as dropped: shutdown_unsent). Ids and counts only,
            # never the runs' content.
            log.warning(
                "embedded_sink_not_scored",
                reason=reason,
                pairs=len(left),
                traces=len({trace_id for trace_id, _, _ in left}),
                by_scorer=dict(Counter(scorer_id for _, _, scorer_id in left)),
                trace_ids=sorted({trace_id for trace_id, _, _ in left})[:20],
            )


def embedded_sink(
    scorers: str | Mapping[str, Scorer],
    writer: ScoreWriter | None = None,
    *,
    store: ScoreStore | None = None,
    run_timeout_s: float = 180.0,
    sinks: Sequence[ScoreSink] = (),
) -> EmbeddedSink:
    """The exporter's in-process sink: each batch is scored right away in this process.

    ``scorers`` is a registry module name (``"my_app.scorers"``) or a mapping id → scorer.
    Use it when there is no broker::

        exporter = ScoringSpanExporter(rules=[ScoringRule(scorers=["relevancy"])],
                                       sink=embedded_sink("my_app.scorers", ConsoleScoreWriter()))

    The exporter calls the sink from its own sender thread, so scoring never runs inside the
    application's ``export()`` call. ``run_timeout_s`` (default: the workers' default, 180 s; 0 for
    none) bounds each run; it is an argument, not a ``TRACESCORE_*`` variable, because this runs
    inside the application, whose environment is not the workers' (a batch's transient failures
    are tried twice more, 1 and 2 s apart; the workers' other defaults hold). The exporter's
    shutdown ends a wait for a retry and starts none (``EmbeddedSink.stop_retrying``): the pairs
    that waited are not scored, logged by count as ``embedded_sink_not_scored``, as are those of
    a batch its deadline caught being handed over (not begun, then never begun). ``sinks`` (e.g.
    ``[OtlpSink()]``) get every score at least once while the process lives, from an in-memory
    outbox (what is still queued when the exporter shuts down gets the drain time of
    ``EmbeddedScorer``; a crash loses it, as it loses the scores). The store keeps the newest
    ``EMBEDDED_RECORDS_KEPT`` scores (a few KB each), enough to know a run sent again soon after
    (a retried send) as scored: memory stays flat however long the app runs, while its
    ``sinks`` keep up (a score still owed to one is kept until delivered or dead-lettered).
    """
    registry = load_registry(scorers) if isinstance(scorers, str) else scorers
    if store is None:  # the app lives for weeks: its store keeps the newest scores only
        store = MemoryScoreStore(max_records=EMBEDDED_RECORDS_KEPT)
    # Not TRACESCORE_* of the app's environment; the workers' defaults but for the retries: an
    # app's batch waits for them on the exporter's one sending thread, the batches behind it
    # too, so 2 more tries 1 and 2 s apart (the workers' 3 more, 2, 4 and 8 s apart, took 14 s).
    defaults = Settings.model_construct(retry_budget=2, retry_backoff_seconds=1.0)
    return EmbeddedSink(
        EmbeddedScorer(registry, writer, store=store, settings=defaults, run_timeout_s=run_timeout_s, sinks=sinks)
    )
