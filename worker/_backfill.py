"""The backfill driver: stored traces → runs → score requests in batches → a scorer.

    source ─read─▶ TraceAssembler ─traces─▶ filter (--since/--until, --sample) ─▶ trace_to_runs
           ─runs─▶ ScoreRequest batches ─▶ Submitter (Redis queue with backpressure, or embedded)

Streaming: the source is read one record at a time and the assembler's memory is bounded, so
a source of any size runs in bounded memory. A trace that cannot be read into a run is counted
by reason and reported, and the job goes on; so does a malformed input line.

Batches are cut by count (``batch_size``) and, in broker mode, by bytes: a batch never grows
past the workers' message cap (``TRACESCORE_MAX_PAYLOAD_BYTES``), so one big run cannot make
its neighbours' message too large; a run over the cap on its own is counted (``runs_rejected``)
and reported, and the rest go on. Each request is serialized once, to size it and to send it.

Resumable: after each batch is handed over, the job state (checkpoint = the earliest input
position not fully enqueued, the counters) and the enqueued trace ids are saved together, so an
interrupted job (Ctrl-C, crash, SIGKILL) resumes from there without re-enqueuing finished work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog
from opentelemetry.sdk.trace import ReadableSpan

from tracing._errors import TraceReadError
from tracing._markers import is_judge_span, is_own_span
from tracing._rules import sampled
from tracing._run import ScoreBatch, ScoreRequest, TracedRun
from tracing._transform import read_trace
from tracing.sources import (
    AssembledTrace,
    Malformed,
    Position,
    SpanBatch,
    TraceAssembler,
    TraceSource,
    UnitEnd,
)
from worker._backfill_progress import ProgressReporter
from worker._backfill_state import BackfillState, RedisJobStore
from worker._backfill_submit import MESSAGE_ENVELOPE_BYTES, wire_size

__all__ = ["Backfill", "Submitter", "trace_start_ns"]

log = structlog.get_logger("tracescore.backfill")

# Malformed lines and unreadable traces printed one by one; past this only counted.
MAX_REPORTED = 20


def trace_start_ns(spans: Sequence[ReadableSpan]) -> int | None:
    starts = [s.start_time for s in spans if s.start_time]
    return min(starts) if starts else None


class Submitter(Protocol):
    """Where batches go: the Redis queue (workers score them) or an embedded scorer.

    A submitter with a message cap also has ``max_batch_bytes`` (the room for the requests'
    JSON in one message) and ``submit_encoded(batch, requests_json)``: the driver then cuts
    batches by bytes and hands over the JSON it measured.
    """

    mode: str

    def submit(self, batch: ScoreBatch) -> None:
        """Hand over one batch; may block (backpressure, or scoring in place)."""
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
        resumed: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.source = source
        self.state = state
        self.submitter = submitter  # None: dry run
        self.job_store = job_store
        self.reporter = reporter or ProgressReporter()
        self.on_batch = on_batch
        # Checked between input records: a requested stop raises KeyboardInterrupt there.
        self.should_stop = should_stop
        options = state.options
        self.assembler = TraceAssembler(
            window_spans=options.window_spans,
            window_files=options.window_files,
            max_open_spans=options.max_open_spans,
        )
        # A resumed job checks each batch against the traces it already enqueued.
        self.resumed = resumed or state.checkpoint != (0, 0, 0)
        self._chunk: list[ScoreRequest] = []
        self._chunk_traces: list[str] = []
        self._submit_encoded: Callable[[ScoreBatch, Sequence[str]], None] | None = getattr(
            submitter, "submit_encoded", None
        )
        self._max_bytes: int | None = getattr(submitter, "max_batch_bytes", None) if self._submit_encoded else None
        self._chunk_json: list[str] = []  # the chunk's requests as JSON, when batches are cut by bytes
        self._chunk_bytes = 0
        self._handling: Position | None = None  # first position of the trace being turned into requests
        self._waiting: deque[AssembledTrace] = deque()
        self._current = Position(0)
        self._started = time.monotonic()
        self._reported = 0
        self._saved: BackfillState | None = None

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> BackfillState:
        """Read, transform and submit everything; returns the state (status ``enqueued``)."""
        counters = self.state.counters
        self._current = self.state.position
        self._saved = self.state.model_copy(deep=True)  # what an interrupt before any batch keeps
        self.reporter.start("reading")
        for item in self.source.read(self.state.position):
            if isinstance(item, SpanBatch):
                self._current = item.position
                self._waiting.extend(self.assembler.add(item.spans, item.position))
            elif isinstance(item, Malformed):
                self._current = item.position
                counters.bad_line(item.where)
                self._report(f"{item.where}: skipped: {item.reason}")
            elif isinstance(item, UnitEnd):
                self._current = item.next
                self._waiting.extend(self.assembler.end_unit(item.unit))
            self._drain()
            self._show()
            if self.should_stop():
                raise KeyboardInterrupt
        self._waiting.extend(self.assembler.finish())
        self._current = Position(2**62)
        self._drain()
        self._flush()
        counters.evicted_traces = self.assembler.stats.evicted
        self.state.status = "enqueued"
        self.state.elapsed_s += time.monotonic() - self._started
        self._save([])
        self._show(force=True)
        return self.state

    def _drain(self) -> None:
        while self._waiting:
            trace = self._waiting.popleft()
            self._handle(trace)
            if len(self._chunk) >= self.state.options.batch_size:
                self._flush()

    def _handle(self, trace: AssembledTrace) -> None:
        counters = self.state.counters
        options = self.state.options
        if trace.late_root:
            # The rest of a trace already read (and counted) without its root: not a trace of
            # its own. Reading it would score its root span a second time, with no content.
            if not sampled(trace.trace_id, options.sample_rate):
                return  # its first part was sampled out (and counted) too
            counters.late_roots += 1
            self._report(
                f"trace {trace.trace_id}: its root span arrived after the assembly window; the trace was "
                f"read without it (raise --window-spans, now {options.window_spans:,})"
            )
            return
        counters.traces_read += 1
        start = trace_start_ns(trace.spans)
        if options.since_ns is not None and (start is None or start < options.since_ns):
            counters.skip("before_since")
            return
        if options.until_ns is not None and (start is None or start >= options.until_ns):
            counters.skip("after_until")
            return
        if not sampled(trace.trace_id, options.sample_rate):  # the exporter's rule
            counters.skip("sampled_out")
            return
        # The exporter's loop guard: tracescore's own spans (score carriers, the worker's
        # tracers) exclude their trace; judge-call spans exclude what is under them.
        judge_ids: list[str] = []
        for span in trace.spans:
            if is_own_span(span) or (span.parent is None and is_judge_span(span)):
                counters.skip("loop_guard")
                return
            if is_judge_span(span) and span.context is not None:
                judge_ids.append(f"{span.context.span_id:016x}")
        try:
            found = read_trace(trace.spans, exclude_under=judge_ids)
            if not found:
                found = [TraceReadError("no_target", "the trace has no agent span and no LLM span")]
        except Exception as exc:  # a transform bug must not end a long job: count it, say it
            counters.unread(type(exc).__name__)
            self._report(f"trace {trace.trace_id}: not scored ({type(exc).__name__}): {exc}")
            log.warning("backfill_transform_failed", trace_id=trace.trace_id, exc_info=True)
            return
        runs: list[TracedRun] = []
        for item in found:
            if isinstance(item, TraceReadError):
                counters.unread(item.reason)
                self._report(f"trace {trace.trace_id}: not scored ({item.reason}): {item}")
            else:
                runs.append(item)
        if not runs:
            return
        counters.runs_read += len(runs)
        if self.submitter is None:
            return
        now = time.time()
        if self._max_bytes is None:
            for run in runs:
                self._chunk.append(self._request(run, now))
        else:
            self._handling = trace.first
            added = [self._add_sized(self._request(run, now), self._max_bytes) for run in runs]
            self._handling = None
            if not any(added):
                return  # every run was over the cap (counted and reported)
        self._chunk_traces.append(trace.trace_id)

    def _add_sized(self, request: ScoreRequest, cap: int) -> bool:
        """Add ``request`` to the chunk, cutting a batch first when it would not fit; False when
        it is over the cap on its own (rejected)."""
        encoded = request.model_dump_json()
        size = wire_size(encoded) + 1  # the comma between requests
        if size > cap:
            identity = request.run.identity if request.run is not None else None
            self.state.counters.reject("too_large")
            self._report(
                f"trace {request.trace_id} span {identity.span_id if identity else '?'}: run not enqueued "
                f"(too_large): its message would be {size:,} bytes, over TRACESCORE_MAX_PAYLOAD_BYTES "
                f"({cap + MESSAGE_ENVELOPE_BYTES:,} with the message envelope); raise it on the workers and here"
            )
            log.warning("backfill_run_too_large", trace_id=request.trace_id, bytes=size, cap=cap)
            return False
        if self._chunk and self._chunk_bytes + size > cap:
            # Cut here: the batch so far fits one message. The trace being read may span two
            # batches; it is recorded as enqueued with the second (a resume re-reads it whole,
            # and the workers' deterministic score ids keep its first runs from counting twice).
            self._flush()
        self._chunk.append(request)
        self._chunk_json.append(encoded)
        self._chunk_bytes += size
        return True

    def _request(self, run: TracedRun, now: float) -> ScoreRequest:
        return ScoreRequest(
            run=run,
            scorer_ids=self.state.options.scorer_ids,
            source="backfill",
            job_id=self.state.job_id,
            enqueued_at=now,
        )

    def _checkpoint(self) -> Position:
        candidates = [self._current]
        low = self.assembler.low_watermark()
        if low is not None:
            candidates.append(low)
        candidates.extend(t.first for t in self._waiting)
        if self._handling is not None:
            candidates.append(self._handling)
        return min(candidates)

    def _flush(self) -> None:
        requests, trace_ids, encoded = self._chunk, self._chunk_traces, self._chunk_json
        self._chunk, self._chunk_traces, self._chunk_json, self._chunk_bytes = [], [], [], 0
        if requests and self.resumed and self.job_store is not None:
            # Read again after a resume: some of these traces were enqueued before the stop.
            done = self.job_store.already_enqueued(self.state.job_id, trace_ids)
            if done:
                self.state.counters.skip("already_enqueued", len(done))
                keep = [r.run is None or r.run.identity.trace_id not in done for r in requests]
                requests = [r for r, k in zip(requests, keep, strict=True) if k]
                if encoded:
                    encoded = [e for e, k in zip(encoded, keep, strict=True) if k]
                trace_ids = [t for t in trace_ids if t not in done]
        if requests and self.submitter is not None:
            counters = self.state.counters
            batch = ScoreBatch(batch_id=f"{self.state.job_id}-{counters.batches:06d}", requests=requests)
            if encoded and self._submit_encoded is not None:
                self._submit_encoded(batch, encoded)
            else:
                self.submitter.submit(batch)
            if self.on_batch is not None:
                self.on_batch(batch)
            counters.batches += 1
            counters.runs_enqueued += len(requests)
            counters.traces_enqueued += len(trace_ids)
        self._save(trace_ids)

    def _save(self, trace_ids: Sequence[str]) -> None:
        self.state.checkpoint = tuple(self._checkpoint())  # type: ignore[assignment]
        if self.job_store is not None and self.submitter is not None:
            self.job_store.save(self.state, trace_ids)
            self._saved = self.state.model_copy(deep=True)

    def interrupted(self) -> None:
        """Mark the job resumable, as of the last saved batch (work after it is read again)."""
        if self.job_store is None or self.submitter is None:
            return
        saved = (self._saved or self.state).model_copy(deep=True)
        if saved.status == "reading":
            saved.status = "interrupted"
        saved.elapsed_s += time.monotonic() - self._started
        self.job_store.save(saved)

    # --- output ---------------------------------------------------------------------------

    def _report(self, text: str) -> None:
        self._reported += 1
        if self._reported <= MAX_REPORTED:
            self.reporter.message(text)
        elif self._reported == MAX_REPORTED + 1:
            self.reporter.message("(more problems are only counted; see the summary)")

    def _show(self, *, force: bool = False) -> None:
        if not force and not self.reporter.due():
            return
        fraction_done = getattr(self.source, "fraction_done", None)
        fraction = fraction_done() if callable(fraction_done) else None
        counters = self.state.counters
        verb = (
            "would score" if self.submitter is None else ("scored" if self.submitter.mode == "embedded" else "enqueued")
        )
        self.reporter.update(
            "reading",
            counters.traces_read,
            "traces",
            fraction,
            extra=f"{counters.runs_enqueued if self.submitter else counters.runs_read:,} runs {verb}",
            force=force,
        )
