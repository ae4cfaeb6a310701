"""The backfill driver: stored traces → span records → planned runs → score requests in batches.

    source ─read─▶ TraceAssembler ─traces─▶ filter (--since/--until, --sample) ─▶ loop guard
           ─▶ plan_runs ─runs─▶ ScoreRequest batches ─▶ Submitter (Redis queue with
           backpressure, or embedded)

The backfill ships span records, as the exporter does, one request per trace (its spans once,
each planned run's target in it): the worker alone reads runs (an unreadable run becomes the
worker's error record, counted as ``failed:<reason>``). A trace
with nothing to score (no agent and no LLM span) is counted here (``no_target``) and reported
(taken back when a late part of it brings a run).

Streaming: the source is read one record at a time and the assembler's memory is bounded, so
a source of any size runs in bounded memory; a malformed input line is counted and reported,
and the job goes on.

Batches are cut by count (``batch_size``) and, in broker mode, by bytes and by (run, scorer id)
pairs (``tracing.queue.RequestCutter``): a batch never grows past the workers' message cap
(``TRACESCORE_MAX_PAYLOAD_BYTES``), so one big run cannot make its neighbours' message too
large, nor asks for more than ``MAX_BATCH_PAIRS`` (a trace's runs that ask for more alone are
split by runs); a trace's request over the cap is split run by run (each with its own spans, as
``plan_runs`` gives them), and a run over the cap on its own is counted (``runs_rejected``) and
reported, and the rest go on. Each request is serialized once, to size it and to send it (a
second time only when some of its runs were enqueued already and it goes without them).

Resumable: after each batch is handed over, the job state (checkpoint = the earliest input
position not fully enqueued, the counters) and the enqueued runs (trace id, target span id) are
saved together, so an interrupted job (Ctrl-C, crash, SIGKILL) resumes from there without
re-enqueuing finished work. The saved counters count the input before the checkpoint alone
(a trace by its first span, a malformed line by its own): what lies past it is counted by the
run that reads it again, so a stopped and resumed job counts its input once. A run read past it
counts as read in the saved state only once sent (the store's set has it: a resume reads it
again and counts it read again too); one not sent (in the chunk, or rejected) the resume reads as
new, and counts then. A trace handed
over that began before the checkpoint and reaches it (lines shared by several traces) is saved
with the position of its last span (``read_through``): a resume skips its spans up to there,
which it would read as a fragment of its own, counted again and planned as a run of its own.
A trace released before the checkpoint is kept by id, with whether it had its root and whether
the memory bound released it (the job store's list, as many as the assembler remembers): the
resume's assembler starts knowing them, so a span of one that comes past the checkpoint is a late
span (a root of one read without it, a late root), as without the stop, not a new trace.

Late spans: a span read after its trace was released (the window passed, or memory evicted it)
is counted (``late_spans``) and reported by trace id, never read as a trace of its own (its
fragment planned as a run: a second score of the trace, or a score of a part of it). But late
spans that make a whole run no part read before held (``plan_part``: a trace without an agent,
one of its top-level LLM calls late) are that run, scored as a read of the whole trace scores
it (``late_runs``, counted with the batch that enqueues it: a resume reading it again counts it
read again alone); the assembler keeps, with the trace's id, what the planner needs of the
parts read (``note_runs``). A late span or root is counted, and reported, by why its trace was
read (``late_cause``), as the option that would have kept the trace open: ``--window-spans``
when its window passed, ``--max-open-spans`` when the memory bound released it early (neither:
an earlier release's list kept no cause). The job store's list keeps why, and what a late run
needs (``RedisJobStore.released``), so a resume says and scores the same.

Each run once: a run (trace id, target span id) the job already enqueued is not enqueued again
(counted ``runs_read_again``), whether it is read again after a resume, from a file given twice,
or from spans a collector wrote twice. The workers count a job's run scored once, so a run sent
twice would leave the job's expected scores out of reach.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import structlog

from tracing import SpanRecord, sampled
from tracing.queue import RequestCutter, RunTooLarge, ScoreBatch, ScoreRequest, request_json, spans_request
from tracing.read import PartPlan, Run, has_parent_cycle, loop_guard, plan_part
from tracing.sources import (
    AssembledTrace,
    Malformed,
    Position,
    Released,
    SourceError,
    SpanBatch,
    TraceAssembler,
    TraceSource,
    UnitEnd,
)
from worker._errors import crash_fields
from worker._progress import ProgressReporter
from worker.backfill._state import BackfillState, JobCounters, LateCause, RedisJobStore, late_cause, run_id

__all__ = ["Backfill", "Submitter", "trace_start_ns"]

log = structlog.get_logger("tracescore.backfill")

# Malformed lines and unreadable traces printed one by one; past this only counted.
MAX_REPORTED = 20


def trace_start_ns(records: Sequence[SpanRecord]) -> int | None:
    starts = [r.start_time_ns for r in records if r.start_time_ns]
    return min(starts) if starts else None


class Submitter(Protocol):
    """Where batches go: the Redis queue (workers score them) or an embedded scorer.

    A submitter with a message cap has ``max_payload_bytes`` (the workers'
    ``TRACESCORE_MAX_PAYLOAD_BYTES``; None: no cap): the driver then cuts batches by bytes and
    hands over the requests' JSON it measured.
    """

    mode: str

    @property
    def max_payload_bytes(self) -> int | None:
        """The workers' message cap (None: no cap, batches are cut by count only)."""
        ...

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        """Hand over one batch (its requests' JSON when the driver has it); may block
        (backpressure, or scoring in place)."""
        ...

    def progress(self, job_id: str) -> dict[str, int]:
        """The job's counters: scored, failed, failed:<reason>, skipped, skipped:<reason>."""
        ...

    def pending(self) -> int:
        """Batches waiting in the queue (0 when there is no queue)."""
        ...

    def close(self) -> None: ...


class Backfill:
    """One run of a job: reads the source from the state's checkpoint to the end."""

    def __init__(
        self,
        source: TraceSource,
        state: BackfillState,
        submitter: Submitter | None,
        *,
        job_store: RedisJobStore | None = None,
        reporter: ProgressReporter | None = None,
        on_batch: Callable[[ScoreBatch], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        hand_over: Callable[[], AbstractContextManager[None]] = nullcontext,
        on_dry_run: Callable[[list[SpanRecord], str], None] | None = None,
    ) -> None:
        self.source = source
        # Dry run: each planned run's spans and target span id (the cost estimate reads them).
        self.on_dry_run = on_dry_run
        self.state = state
        self.submitter = submitter  # None: dry run
        self.job_store = job_store
        self.reporter = reporter or ProgressReporter()
        self.on_batch = on_batch
        # Checked between input records: a requested stop raises KeyboardInterrupt there.
        self.should_stop = should_stop
        # What a batch is handed over in, from the chunk taken to the submitter holding the
        # batch (an embedded job's: ``StopSignal.deferred``; see ``_flush``).
        self.hand_over = hand_over
        options = state.options
        self.assembler = TraceAssembler(
            window_spans=options.window_spans,
            window_files=options.window_files,
            max_open_spans=options.max_open_spans,
            max_open_bytes=options.max_open_mb * 2**20,
        )
        self._chunk: list[ScoreRequest] = []
        self._chunk_runs = 0  # runs (targets) in _chunk: batch_size counts runs
        # In process (no cutter), the span text the chunk holds, which the submitter's
        # ``max_batch_bytes`` bounds as ``batch_size`` bounds its runs.
        self._chunk_bytes = 0
        self._max_chunk_bytes: int | None = getattr(submitter, "max_batch_bytes", None)
        # Run ids (``run_id``) planned and not yet in the job store: with a store, the chunk's
        # (each batch is checked against the store's set); without one (embedded, dry run), every
        # run of the job: about 150 bytes a run, 150 MB for a million, which an embedded job
        # scoring each run in this process takes far longer to reach than memory does.
        self._planned: set[str] = set()
        # Counted when their batch is handed over (``_flush``), each once: the traces whose first
        # runs are planned and not yet in a batch (a trace all of whose runs were rejected stays,
        # for a late run of it), and the chunk's late runs (run ids).
        self._first_runs_of: set[str] = set()
        self._late_runs: set[str] = set()
        cap = getattr(submitter, "max_payload_bytes", None)
        # Batches cut by bytes, each request's JSON kept for the submitter (broker mode).
        self._cutter = RequestCutter(cap) if cap else None
        self._handling: Position | None = None  # first position of the trace being turned into requests
        self._waiting: deque[AssembledTrace] = deque()
        self._current = Position(0)
        self._started = time.monotonic()
        self._reported = 0
        self._saved: BackfillState | None = None
        # With a store (a resumable job): the traces handed over whose spans lie on more than one
        # line, the last not before the last checkpoint (first, last, trace id); what the counters
        # took from input not before it (its position, the counter, the reason or where, how
        # many); the traces an earlier run handed over, which this one skips up to their last span.
        self._handed: list[tuple[Position, Position, str]] = []
        self._unsaved: list[tuple[Position, str, str, int]] = []
        # With a store: each run read not before the last checkpoint (where its trace was read,
        # its run id, whether it was counted read again). One not sent when the state is saved (in
        # the chunk: the cutter closed a batch while its trace was added; or rejected) is read
        # again by a resume as a run the job never had: the save counts neither read.
        self._runs_read: list[tuple[Position, str, bool]] = []
        # (first position, the trace as remembered) of the traces released not yet in the job
        # store's list: saved once before the checkpoint (past it, a resume reads them again).
        self._released: list[tuple[Position, Released]] = []
        self._read_through = {trace_id: Position(*at) for trace_id, at in state.read_through.items()}
        # The share of the input read when reading ended (None: the source cannot say).
        self.input_read: float | None = None

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> BackfillState:
        """Read, transform and submit everything; returns the state (status ``enqueued``)."""
        self._current = self.state.position
        self._saved = self.state.model_copy(deep=True)  # what an interrupt before any batch keeps
        if self.job_store is not None:
            # The traces read before: a span of one past the checkpoint is late, as it was to the
            # run before the stop, not a new trace scored a second time.
            released, unsent = self.job_store.released(self.state.job_id)
            self.assembler.remember_released(released)
            # (those whose runs were all rejected: counted in traces_enqueued with a late run's
            # batch, as without the stop)
            self._first_runs_of.update(unsent)
        self.reporter.start("reading")
        items = self.source.read(self.state.position)
        try:
            for item in items:
                if isinstance(item, SpanBatch):
                    self._current = item.position
                    spans = self._unread(item.spans, item.position) if self._read_through else item.spans
                    self._waiting.extend(self.assembler.add(spans, item.position))
                elif isinstance(item, Malformed):
                    self._current = item.position
                    self._count(item.position, "malformed", item.where)
                    self._report(f"{item.where}: skipped: {item.reason}")
                elif isinstance(item, UnitEnd):
                    self._current = item.next
                    self._waiting.extend(self.assembler.end_unit(item.unit))
                self._drain()
                self._show()
                if self.should_stop():
                    raise KeyboardInterrupt
        except SourceError:
            # The source stopped mid-read (Tempo down). A job with a store resumes from its
            # checkpoint, which is before every trace still assembling, so they are read again
            # then. Without one (embedded, dry run) there is no resume: the stop ends this job's
            # input, and what the assembler holds (whole traces: Tempo fetches a trace at once)
            # is released as at the end of the input; it was dropped unscored, uncounted.
            if self.job_store is None:
                self._release_held()
            raise
        finally:
            # (while ``items`` holds the source's file open: once it closes, the share says 0)
            self.input_read = self._fraction()
        self._current = Position(2**62)
        self._release_held()
        self.state.status = "enqueued"
        self.state.elapsed_s += time.monotonic() - self._started
        self._save([])
        self._show(force=True)
        return self.state

    def not_handed_over(self) -> None:
        """After a stop of a job without a resume (in process: a job with a store reads again on
        resume what it had not handed over, its checkpoint being before it): each trace read and
        not handed over to scoring (in the batch being filled, released and waiting, or still
        assembling) read as any other (counted, sampled, planned: one sampled out is counted
        so), and those it would have scored skipped (``interrupted``) and named; their runs were
        never sent, so not counted as read. (In process there is no cutter: handling a trace only
        adds it to the chunk.) They were gone from the summary, counted neither read nor scored.
        Called once the work is over, where a signal only asks (``StopSignal.finishing``): a
        second Ctrl-C in it left the counts half made. In a dry run (no submitter) the traces
        still assembling are read as at the end of the input: counted and estimated."""
        self._waiting.extend(self.assembler.finish())
        while self._waiting:
            self._handle(self._waiting.popleft())
        counters = self.state.counters
        chunk, self._chunk, self._chunk_runs, self._chunk_bytes = self._chunk, [], 0, 0
        for request in chunk:
            counters.runs_read -= len(request.target_span_ids)
        for trace_id in dict.fromkeys(r.trace_id for r in chunk):
            self._interrupted(trace_id)

    def _interrupted(self, trace_id: str) -> None:
        counters = self.state.counters
        counters.skipped["interrupted"] = counters.skipped.get("interrupted", 0) + 1
        self._report(f"trace {trace_id}: not scored (interrupted): read when the backfill was stopped")

    def _release_held(self) -> None:
        """Every trace the assembler still holds released, handled and handed over."""
        self._waiting.extend(self.assembler.finish())
        self._drain()
        self._flush()

    def _drain(self) -> None:
        while self._waiting:
            trace = self._waiting.popleft()
            if self.job_store is not None and trace.first != trace.last:
                self._handed.append((trace.first, trace.last, trace.trace_id))
            runs = self._handle(trace)
            # What a late part of it needs to tell a run of its own from spans of a run read.
            self.assembler.note_runs(trace.trace_id, runs)
            if self.job_store is not None:
                self._released.append((trace.first, trace.released(runs)))
            if self._chunk_runs >= self.state.options.batch_size or (
                self._max_chunk_bytes is not None and self._chunk_bytes >= self._max_chunk_bytes
            ):
                self._flush()
                self._show()  # (the traces the end of the input hands over at once take a while)
                if self.should_stop():  # (a file's traces come at its end: a stop waited for all)
                    raise KeyboardInterrupt

    def _handle(self, trace: AssembledTrace) -> str | None:
        """Count, plan and hand over ``trace``; returns what a later part of it needs to find a
        run of its own (``plan_part``'s summary; None: it can hold none)."""
        options = self.state.options
        at = trace.first
        if trace.completion == "evicted" and not trace.late:  # (a trace once, not each part)
            self._count(at, "evicted_traces")
        if trace.late:
            return self._handle_late(trace)
        self._count(at, "traces_read")
        if trace.dropped_spans:
            self._count(at, "spans_dropped", n=trace.dropped_spans)
            self._report(
                f"trace {trace.trace_id}: {trace.dropped_spans:,} spans past the first "
                f"{self.assembler.max_spans_per_trace:,} dropped; the trace was read without them"
            )
        records = trace.spans
        start = trace_start_ns(records)
        if options.since_ns is not None and (start is None or start < options.since_ns):
            self._count(at, "skipped", "before_since")
            return None
        if options.until_ns is not None and (start is None or start >= options.until_ns):
            self._count(at, "skipped", "after_until")
            return None
        if not sampled(trace.trace_id, options.sample_rate):  # the exporter's rule
            self._count(at, "skipped", "sampled_out")
            return None
        judge_ids = loop_guard(records)
        if judge_ids is None:  # tracescore's own traffic (the exporter's loop guard)
            self._count(at, "skipped", "loop_guard")
            return None
        if has_parent_cycle(records):  # the planner would ship it whole; said here, as before
            self._count(at, "unreadable", "parent_cycle")
            self._report(
                f"trace {trace.trace_id}: not scored (parent_cycle): its span parent ids form a cycle,"
                " so it has no root to read from"
            )
            return None
        plan = self._plan(trace, None, judge_ids)
        if plan is None:
            return None
        if plan.runs:
            self._enqueue(trace, plan.runs, first=True)
        else:  # (a late part may still bring a run: the trace is then no longer counted so)
            self._count(at, "unreadable", "no_target")
            self._report(f"trace {trace.trace_id}: not scored (no_target): the trace has no agent span and no LLM span")
        return plan.after

    def _plan(self, trace: AssembledTrace, before: str | None, judge_ids: Collection[str]) -> PartPlan | None:
        try:
            return plan_part(trace.spans, before, exclude_under=judge_ids)
        except Exception as exc:  # a planner bug must not end a long job: count it, say it
            self._count(trace.first, "unreadable", type(exc).__name__)
            self._report(f"trace {trace.trace_id}: not scored ({type(exc).__name__})")
            log.warning("backfill_plan_failed", trace_id=trace.trace_id, **crash_fields(exc))
            return None

    def _handle_late(self, trace: AssembledTrace) -> str | None:
        """The rest of a trace already read (and counted): not a trace of its own. Reading it
        would score a part of the trace, or its root span a second time with no content. But a
        run of its own that no part read before held (a trace without an agent, whose runs are
        its top-level LLM calls: one of them late) is scored as a read of the whole trace would
        score it, the trace counted once."""
        options = self.state.options
        if not sampled(trace.trace_id, options.sample_rate):
            return None  # its first part was sampled out (and counted) too
        at = trace.first
        plan = None
        if trace.runs_before is not None:  # (else the parts before left no run to find)
            judge_ids = loop_guard(trace.spans)
            if judge_ids is not None:
                plan = self._plan(trace, trace.runs_before, judge_ids)
        runs, split = (plan.runs, plan.split) if plan is not None else ([], [])
        scored = {m.span_id for _, members in runs for m in members}
        cause = late_cause(trace.late_evicted)
        unplaced = len(trace.spans) - len(scored) + trace.dropped_spans
        if trace.late_root:  # (once, as the assembler counts it, though a late run holds it)
            if any(s.parent_span_id is None and s.span_id not in scored for s in trace.spans):
                unplaced -= 1  # (the late root, not a late span too)
            self._count_late(at, "late_roots", 1, cause)
            self._report(
                f"trace {trace.trace_id}: its root span arrived after the trace was read without it"
                f" ({cause.released}; {cause.raise_now(options)})"
            )
        if unplaced:
            self._count_late(at, "late_spans", unplaced, cause)
            lost = ", ".join(t.span_id for t, _ in split)
            self._report(
                f"trace {trace.trace_id}: {unplaced:,} span{'s' if unplaced > 1 else ''} arrived after the trace"
                f" was read ({cause.released}); not read"
                + (f", a run of its own lost among them (span {lost}: spans read before are under it)" if split else "")
                + f" ({cause.raise_now(options)})"
            )
        first = plan is not None and plan.first  # the trace's first run: it has something to score
        fresh = self._enqueue(trace, runs, first=first, late=True)  # (one planned already is read again)
        if fresh:
            if first:
                self._count(at, "unreadable", "no_target", n=-1)
            # (a resume reading again one sent before the stop: the store's set has it, it goes
            # no further than ``_flush``)
            sent = (
                self.job_store.already_enqueued(
                    self.state.job_id, [run_id(trace.trace_id, t.span_id) for t, _ in fresh]
                )
                if self.job_store is not None
                else set()
            )
            for again, said in ((False, "scored as a run of its own"), (True, "a run of its own")):
                these = [(t, m) for t, m in fresh if (run_id(trace.trace_id, t.span_id) in sent) == again]
                if not these:
                    continue
                spans = sum(len(members) for _, members in these)
                self._report(
                    f"trace {trace.trace_id}: {spans:,} span{'s' if spans > 1 else ''} arrived after the"
                    f" trace was read ({cause.released}), {said} (span {', '.join(t.span_id for t, _ in these)})"
                    + (
                        " this job enqueued before: read again, not sent again"
                        if again
                        else ", as a read of the whole trace scores it"
                    )
                )
        return plan.after if plan is not None else None

    def _enqueue(self, trace: AssembledTrace, plans: list[Run], *, first: bool, late: bool = False) -> list[Run]:
        """Hand ``plans``, runs of ``trace`` (its ``first`` planned; ``late``: of a late part),
        over to scoring (but the runs the job planned already); returns those handed over."""
        counters = self.state.counters
        records = trace.spans
        counters.runs_read += len(plans)
        if self.job_store is not None:
            self._runs_read.extend(
                (trace.first, ran, ran in self._planned)
                for ran in (run_id(trace.trace_id, t.span_id) for t, _ in plans)
            )
        fresh = [(t, m) for t, m in plans if run_id(trace.trace_id, t.span_id) not in self._planned]
        if len(fresh) < len(plans):
            counters.runs_read_again += len(plans) - len(fresh)
            plans = fresh
        if not plans:
            return plans
        self._planned.update(run_id(trace.trace_id, t.span_id) for t, _ in plans)
        if self.submitter is None:
            if late:  # (a dry run hands nothing over: its late runs are those it would score)
                counters.late_runs += len(plans)
            if self.on_dry_run is not None:
                for target, members in plans:
                    self.on_dry_run(members, target.span_id)
            return plans
        # (before the cutter, which may hand a batch holding some of them over)
        if first:
            self._first_runs_of.add(trace.trace_id)
        if late:
            self._late_runs.update(run_id(trace.trace_id, t.span_id) for t, _ in plans)
        now = time.time()
        options = self.state.options
        if len(plans) == 1:
            spans = plans[0][1]
        else:
            # The runs' records are disjoint: all of the trace's when they add up to it.
            owned = sum(len(members) for _, members in plans)
            spans = records if owned == len(records) else [r for _, members in plans for r in members]
        request = spans_request(
            spans, [t.span_id for t, _ in plans], options.scorer_ids, now, source="backfill", job_id=self.state.job_id
        )
        if self._cutter is None:
            self._chunk.append(request)
            self._chunk_runs += len(plans)
            # (the trace's, whose records the runs share: at most the trace's spans, at least theirs)
            self._chunk_bytes += trace.size
        else:
            self._handling = trace.first
            self._add_sized(request, self._cutter, trace.first)
            self._handling = None
        return plans

    def _add_sized(self, request: ScoreRequest, cutter: RequestCutter, at: Position) -> bool:
        """Add ``request`` to the chunk, cutting a batch first when it would not fit; False when
        none of its runs was added (each over the cap on its own: rejected). A request of
        several runs over the cap is added run by run."""
        replaced = cutter.runs_text_replaced
        try:
            closed = cutter.add(request)
        except RunTooLarge as exc:
            if len(request.target_span_ids) > 1:
                added = [self._add_sized(one, cutter, at) for one in request.per_target()]
                return any(added)
            self._count(at, "runs_rejected", "too_large")
            self._report(
                f"trace {exc.trace_id} span {exc.span_id}: run not enqueued (too_large): its message would be"
                f" {exc.size:,} bytes, over TRACESCORE_MAX_PAYLOAD_BYTES ({exc.max_payload_bytes:,} with the"
                " message envelope); raise it on the workers and here"
            )
            log.warning("backfill_run_too_large", trace_id=exc.trace_id, bytes=exc.size, cap=exc.max_payload_bytes)
            return False
        if cutter.runs_text_replaced > replaced:
            self._count(at, "runs_text_replaced", n=cutter.runs_text_replaced - replaced)
            self._report(
                f"trace {request.trace_id}: a value no queue message can carry as it is, sent replaced"
                " (text not valid UTF-8, bytes or lone surrogates, with U+FFFD; an object of exactly"
                " __type__ and __value__ as its JSON text)"
            )
        for chunk in closed:
            # Cut here: the batch so far fits one message. The trace being read may span two
            # batches or more (its request split by pairs), each recording its own runs as
            # enqueued. The chunk being filled is the cutter's (the request's runs, or the last
            # part of them, start it or join it).
            self._chunk, self._chunk_runs = list(chunk.requests), chunk.runs
            self._flush(chunk.requests, chunk.encoded)
        self._chunk, self._chunk_runs = list(cutter.chunk.requests), cutter.chunk.runs
        return True

    def _count(self, at: Position, counter: str, reason: str = "", n: int = 1) -> None:
        """Add ``n`` to the job's ``counter`` (by ``reason`` for the counts by reason; where, for
        a malformed line) for the input at ``at``."""
        counters = self.state.counters
        if counter == "malformed":
            counters.bad_line(reason)
        elif reason:
            by_reason: dict[str, int] = getattr(counters, counter)
            by_reason[reason] = by_reason.get(reason, 0) + n
            if not by_reason[reason]:  # (taken back: a trace counted no_target whose late part held a run)
                del by_reason[reason]
        else:
            setattr(counters, counter, getattr(counters, counter) + n)
        if self.job_store is not None:
            self._unsaved.append((at, counter, reason, n))

    def _count_late(self, at: Position, counter: str, n: int, cause: LateCause) -> None:
        self._count(at, counter, n=n)
        if cause.counter:  # (and by the cause: the summary names the option that would have kept it)
            self._count(at, counter + cause.counter, n=n)

    def _checkpoint(self) -> Position:
        candidates = [self._current]
        low = self.assembler.low_watermark()
        if low is not None:
            candidates.append(low)
        candidates.extend(t.first for t in self._waiting)
        if self._handling is not None:
            candidates.append(self._handling)
        return min(candidates)

    def _unread(self, spans: list[SpanRecord], at: Position) -> list[SpanRecord]:
        """``spans`` without those of traces an earlier run handed over up to ``at`` or past it."""
        through = self._read_through
        return [s for s in spans if s.trace_id not in through or at > through[s.trace_id]]

    def _handed_through(self, checkpoint: Position) -> dict[str, tuple[int, int, int]]:
        """The traces handed over (by this run or an earlier one) that began before ``checkpoint``
        and reach it: the position of each one's last span."""
        self._handed = [entry for entry in self._handed if entry[1] >= checkpoint]
        self._read_through = {t: at for t, at in self._read_through.items() if at >= checkpoint}
        through = dict(self._read_through)
        for first, last, trace_id in self._handed:
            if first < checkpoint:
                through[trace_id] = max(through.get(trace_id, last), last)
        return {trace_id: (at.unit, at.line, at.offset) for trace_id, at in through.items()}

    def _saved_counters(self, checkpoint: Position) -> JobCounters:
        """The counters without what they took from input at or past ``checkpoint``, which a
        resume reads again and counts then."""
        self._unsaved = [entry for entry in self._unsaved if entry[0] >= checkpoint]
        saved = self.state.counters.model_copy(deep=True)
        for _, counter, reason, n in self._unsaved:
            if counter == "malformed":
                saved.malformed -= 1
                if reason in saved.malformed_where:
                    saved.malformed_where.remove(reason)
            elif reason:
                by_reason: dict[str, int] = getattr(saved, counter)
                by_reason[reason] = by_reason.get(reason, 0) - n
                if not by_reason[reason]:
                    del by_reason[reason]
            else:
                setattr(saved, counter, getattr(saved, counter) - n)
        self._runs_read = [entry for entry in self._runs_read if entry[0] >= checkpoint]
        for _, ran, again in self._runs_read:
            if ran in self._planned:  # (not sent: the store's set has the runs sent)
                saved.runs_read -= 1
                saved.runs_read_again -= again
        return saved

    def _flush(self, closed: list[ScoreRequest] | None = None, closed_json: list[str] | None = None) -> None:
        """Submit the chunk (``closed``: the cutter's chunk, whose requests are all of the chunk
        but the one being added) and save the state.

        Taking the chunk and handing its batch to a submitter that holds what it is given
        (``hold``: the in-process scorer, which then names the pairs it leaves unscored) is one
        step, run in ``hand_over``: an embedded job's defers a second Ctrl-C to the step's end.
        Landing between the two, it left the batch's traces neither in the chunk (named by
        ``not_handed_over``) nor held: not named, not counted. The scoring is outside it (a
        second Ctrl-C cuts it at once)."""
        with self.hand_over():
            encoded: list[str] = []
            if closed is not None:
                requests, encoded = closed, closed_json or []
                self._chunk = self._chunk[len(closed) :]
                self._chunk_runs -= sum(len(r.target_span_ids) for r in closed)
            else:
                requests = self._chunk
                self._chunk = []
                self._chunk_runs = self._chunk_bytes = 0
                if self._cutter is not None:
                    encoded = self._cutter.take().encoded
            planned = sent = [run_id(r.trace_id, s) for r in requests for s in r.target_span_ids]
            traces = {r.trace_id for r in requests}
            done: set[str] = set()
            if requests and self.job_store is not None:
                # Runs an earlier batch (or a run of the job before a resume) enqueued are not sent again.
                done = self.job_store.already_enqueued(self.state.job_id, planned)
                if done:
                    self.state.counters.runs_read_again += len(done)
                    requests, encoded = _without(requests, encoded, done)
                    sent = [r for r in planned if r not in done]
            batch: ScoreBatch | None = None
            if requests and self.submitter is not None:
                if self.job_store is not None and not self.job_store.still_held():
                    raise KeyboardInterrupt  # another process runs the job now: stop as on a signal
                counters = self.state.counters
                batch_id = f"{self.state.job_id}-{counters.batches:06d}"
                # Validated when it is a message (cut under MAX_BATCH_PAIRS); in process, a batch
                # of --batch-size runs x every scorer, which no worker reads.
                batch = (
                    ScoreBatch(batch_id=batch_id, requests=requests)
                    if self._cutter is not None
                    else ScoreBatch.model_construct(batch_id=batch_id, requests=requests)
                )
                # Counted before the hand-over: a second Ctrl-C inside it (scoring in place) leaves
                # its runs handed over, some scored, and the summary's expected scores must cover
                # them (it showed more scored than expected). A resume reads the saved state, which
                # _save updates only after the hand-over.
                counters.batches += 1
                counters.runs_enqueued += batch.runs()
                # Each trace once, with the batch holding its first runs (not again for the rest of a
                # trace cut across batches, or a late run of it), unless the job enqueued a run of
                # it before (a resume reading it again); each late run with the batch that sends
                # it, so one a resume reads again is only read again.
                had = {r.partition(":")[0] for r in done}
                counters.traces_enqueued += len(traces.intersection(self._first_runs_of).difference(had))
                counters.late_runs += len(self._late_runs.intersection(sent))
                hold = getattr(self.submitter, "hold", None)  # (not the Redis queue's: a job resumes)
                if hold is not None:
                    hold(batch)
        if batch is not None and self.submitter is not None:
            self.submitter.submit(batch, encoded or None)
            if self.on_batch is not None:
                self.on_batch(batch)
        self._first_runs_of.difference_update(traces)
        self._late_runs.difference_update(planned)
        if self.job_store is not None:
            self._planned.difference_update(planned)  # the store's set has them once saved
        self._save(sent)

    def _save(self, run_ids: Sequence[str]) -> None:
        checkpoint = self._checkpoint()
        self.state.checkpoint = tuple(checkpoint)  # type: ignore[assignment]
        if self.job_store is not None and self.submitter is not None:
            self.state.read_through = self._handed_through(checkpoint)
            saved = self.state.model_copy(update={"counters": self._saved_counters(checkpoint)}, deep=True)
            released = [trace for first, trace in self._released if first < checkpoint]
            # Of those, the ones still waiting for a batch to send their first runs: none is in the
            # chunk (it holds the trace being handled alone, not before the checkpoint), so each
            # had its runs all rejected.
            unsent = {trace.trace_id for trace in released if trace.trace_id in self._first_runs_of}
            if not self.job_store.save(saved, run_ids, released, self.assembler.released_kept, unsent):
                raise KeyboardInterrupt  # the hold is another's: nothing was written, stop
            self._released = [entry for entry in self._released if entry[0] >= checkpoint]
            self._saved = saved

    @property
    def saved(self) -> BackfillState:
        """A copy of the job's state as last saved (as loaded, before the first batch): what a
        resume goes on from, its counts of the input before its checkpoint."""
        return (self._saved or self.state).model_copy(deep=True)

    def interrupted(self) -> BackfillState:
        """Mark the job resumable, as of the last saved batch (work after it is read again);
        returns the state so marked, whose counts the job keeps."""
        saved = self.saved
        if self.job_store is None or self.submitter is None:
            return saved
        if saved.status == "reading":
            saved.status = "interrupted"
        saved.elapsed_s += time.monotonic() - self._started
        self.job_store.save(saved)  # (not written when the hold is another's)
        return saved

    # --- output ---------------------------------------------------------------------------

    def _report(self, text: str) -> None:
        self._reported += 1
        if self._reported <= MAX_REPORTED:
            self.reporter.message(text)
        elif self._reported == MAX_REPORTED + 1:
            self.reporter.message("(more problems are only counted; see the summary)")

    def _fraction(self) -> float | None:
        """The share of the input read so far, when the source can say."""
        fraction_done = getattr(self.source, "fraction_done", None)
        return fraction_done() if callable(fraction_done) else None

    def show_waiting(self, pending: int) -> None:
        """The progress line while enqueuing waits for the workers (``pending`` batches queued)."""
        self._show(waiting=f"; waiting for the workers: {pending:,} batches queued")

    def _show(self, *, force: bool = False, waiting: str = "") -> None:
        if not force and not self.reporter.due():
            return
        fraction = self._fraction()
        counters = self.state.counters
        verb = (
            "would score" if self.submitter is None else ("scored" if self.submitter.mode == "embedded" else "enqueued")
        )
        self.reporter.update(
            "reading",
            counters.traces_read,
            "traces",
            fraction,
            extra=f"{counters.runs_enqueued if self.submitter else counters.runs_read:,} runs {verb}{waiting}",
            force=force,
        )


def _without(requests: list[ScoreRequest], encoded: list[str], done: set[str]) -> tuple[list[ScoreRequest], list[str]]:
    """``requests`` (and their JSON, when given) without the runs in ``done``. A request keeps its
    spans when only some of its runs go: it is no larger than it was, so it still fits the batch."""
    kept: list[ScoreRequest] = []
    kept_json: list[str] = []
    for n, request in enumerate(requests):
        targets = [s for s in request.target_span_ids if run_id(request.trace_id, s) not in done]
        if not targets:
            continue
        if len(targets) < len(request.target_span_ids):
            request = spans_request(
                request.spans,
                targets,
                request.scorer_ids,
                request.enqueued_at,
                source=request.source,
                job_id=request.job_id,
            )
            if encoded:
                kept_json.append(request_json(request))
        elif encoded:
            kept_json.append(encoded[n])
        kept.append(request)
    return kept, kept_json
