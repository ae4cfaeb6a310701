"""``ScoringSpanExporter``: an OTel ``SpanExporter`` that turns finished agent traces into
score requests, without ever slowing down or breaking the application.

Flow: ``export()`` only files each span by trace id as a compacted ``SpanRecord`` (O(spans),
under one lock; the SDK span is not kept), drops traces no rule's sample takes (decided on their first
span: the sample is a function of the trace id) and those of tracescore itself (loop guard),
and notes when an agent span or a trace's local root ended. A flusher thread completes a
trace ``grace_s`` after that (children that end after their root still make it) and puts
``ScoreRequest``s on a bounded hand-off queue:

- by default it finds the trace's runs from span names and kind attributes alone
  (``plan_runs``: top-level agent spans, else top-level LLM spans, none under a judge span)
  and ships each run's spans (its target and the target's descendants) as records: no message
  is parsed and nothing validated in the application. The worker reads the run
  (``trace_to_run(spans, target_span_id)``) and turns an unreadable trace into visible error
  score records, so ``stats()["errors"]`` does not see those;
- when one of the trace's rules has a ``filter`` (a function of the ``TracedRun``, which cannot
  travel to the worker) the trace is read here with ``read_trace`` as before and the runs the
  filters keep are shipped as ``run``: a filter costs the application that reading, several
  times the default path's CPU (see bench/results/exporter.json, ``ours_filter``).

A sender thread drains the queue in batches into the sink (keeping only the span attributes
the transform reads), retrying with capped exponential backoff. When the trace buffer is full a
trace whose root already ended is completed early (it is deliverable) rather than dropped; only
when none has, the oldest unfinished trace is dropped. The hand-off queue is bounded in runs and
in bytes and drops the newest. Every drop is counted by reason under ``stats()["dropped"]``.
After ``shutdown()`` nothing is sent any more.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracing._errors import TraceReadError
from tracing._formats import SpanKind, classify
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE, is_own_span
from tracing._records import build_record, compact, plan_runs, service_name
from tracing._rules import ScoringRule, sampled
from tracing._run import ScoreBatch, ScoreRequest, SpanRecord, TracedRun
from tracing._sinks import EncodedSink, Sink
from tracing._span import span_fields
from tracing._task_message import MESSAGE_ENVELOPE_BYTES, wire_size
from tracing._transform import read_trace

__all__ = ["ScoringSpanExporter"]

log = structlog.get_logger("tracescore.exporter")

Clock = Callable[[], float]


def _describe(exc: BaseException) -> str:
    """An error for the application's log, without agent content: the exception's type only,
    as its text may quote span attributes (a TraceReadError quotes the bad JSON, a pydantic
    error its input, a filter's error the run) — except network errors, whose text says which
    broker address failed and how."""
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("kombu", "redis", "amqp"):
        return repr(exc)
    return type(exc).__name__


def _scorer_groups(rules: Sequence[ScoringRule]) -> list[tuple[float, list[str]]]:
    """Scorer ids by ``delay_s``: one request per delay, ids merged in rule order."""
    by_delay: dict[float, list[str]] = {}
    for rule in rules:
        ids = by_delay.setdefault(rule.delay_s, [])
        ids.extend(i for i in rule.scorer_ids if i not in ids)
    return sorted(by_delay.items())


_setattr = object.__setattr__
_SPANS_REQUEST_SET = ("spans", "target_span_id", "scorer_ids")


def spans_request(
    spans: list[SpanRecord], target_span_id: str, scorer_ids: list[str], enqueued_at: float | None = None
) -> ScoreRequest:
    """``ScoreRequest.model_construct(spans=, target_span_id=, scorer_ids=)``, not validated
    (the worker validates every message), minus model_construct's per-field default and alias
    handling: ~0.6 instead of ~3 µs a run on the hot path. It sets what model_construct sets;
    tests/tracing/test_span_record.py compares the two, so a pydantic change shows there."""
    request = ScoreRequest.__new__(ScoreRequest)
    _setattr(
        request,
        "__dict__",
        {
            "run": None,
            "spans": spans,
            "target_span_id": target_span_id,
            "scorer_ids": list(scorer_ids),
            "source": "live",
            "job_id": None,
            "enqueued_at": enqueued_at,
        },
    )
    fields_set = set(_SPANS_REQUEST_SET)
    if enqueued_at is not None:
        fields_set.add("enqueued_at")
    _setattr(request, "__pydantic_fields_set__", fields_set)
    _setattr(request, "__pydantic_extra__", None)
    _setattr(request, "__pydantic_private__", None)
    return request


# A run to ship as spans, waiting in the hand-off queue: (spans, target span id, scorer ids,
# enqueued at, approximate JSON size of the spans). The sender builds its ScoreRequest: one
# object queued instead of four.
_Shipment = tuple[list[SpanRecord], str, list[str], float, int]
# A built request (a rule's filter or delay_s made it) and its approximate JSON size. Both forms
# end with the size, which the byte bound of the hand-off queue reads.
_Built = tuple[ScoreRequest, int]
_Queued = _Shipment | _Built
# What the sender hands the sink at once: requests, their JSON when the sink takes it encoded
# (None otherwise), and how many requests before them were dropped as too large.
_Chunk = tuple[list[ScoreRequest], list[str] | None, int]


@dataclass(slots=True)
class _Trace:
    trace_id: str  # hex
    first_seen: float
    # Spans are kept as records from the moment they are filed: the SDK span objects are then
    # freed with the processor's batch instead of living on in the buffer (and being promoted
    # by the cyclic GC, which cost the application more than building the records).
    spans: list[SpanRecord] = field(default_factory=list)
    kinds: list[SpanKind] = field(default_factory=list)  # each span's, classified when filed
    size: int = 0  # the records' approximate JSON size (batches are cut by it)
    due: float | None = None
    judge_ids: set[str] | None = None
    rules: list[ScoringRule] = field(default_factory=list)  # the rules whose sample took it


class _Counter(dict[str, int]):
    def add(self, key: str, n: int = 1) -> int:
        value = self.get(key, 0) + n
        self[key] = value
        return value


class ScoringSpanExporter(SpanExporter):
    """Put behind ``BatchSpanProcessor``: ``provider.add_span_processor(BatchSpanProcessor(
    ScoringSpanExporter(rules=[ScoringRule(["helpfulness"])], sink=CelerySink(url))))``.

    Bounds: ``max_traces`` buffered traces and ``max_buffer_bytes`` of their span records
    (approximate JSON size), ``max_spans_per_trace`` spans each; traces older than
    ``max_trace_age_s`` without an ended agent/root span are dropped. When the buffer is full
    the oldest trace whose agent/root span ended is completed early, else the oldest trace is
    dropped. ``queue_size`` requests wait for the sink (plus those held back by a rule's
    ``delay_s``), together no more than ``max_queue_bytes`` of span records (with the broker
    down, large traces cannot grow the application past it). A batch holds up to ``batch_size``
    requests and, roughly, ``max_batch_bytes`` of span records; a sink with a message cap
    (``CelerySink(max_payload_bytes=...)``, the workers' ``TRACESCORE_MAX_PAYLOAD_BYTES``) gets
    each message cut under it by the requests' encoded size, and a run over it alone is dropped
    (``dropped.too_large``) while its neighbours are sent. ``shutdown()`` takes at most
    ``shutdown_timeout_s`` (whatever timeout the SDK passes), plus one sink attempt under way.
    ``clock`` (monotonic seconds) is injectable so tests drive the grace window without sleeping.
    """

    def __init__(
        self,
        rules: Sequence[ScoringRule],
        sink: Sink,
        *,
        max_traces: int = 2048,
        max_spans_per_trace: int = 512,
        max_trace_age_s: float = 300.0,
        grace_s: float = 2.0,
        queue_size: int = 10_000,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        max_queue_bytes: int = 64 * 1024 * 1024,
        batch_size: int = 50,
        max_batch_bytes: int = 4 * 1024 * 1024,
        flush_interval_s: float = 0.5,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        shutdown_timeout_s: float = 5.0,
        clock: Clock = time.monotonic,
    ) -> None:
        rules = list(rules)
        if not rules or not all(isinstance(r, ScoringRule) for r in rules):
            raise ValueError("ScoringSpanExporter needs at least one ScoringRule in rules=[...]")
        if not callable(getattr(sink, "send", None)):
            raise TypeError("sink must have a send(batch) method (CelerySink, CallbackSink, ...)")
        for name, value in (
            ("max_traces", max_traces),
            ("max_spans_per_trace", max_spans_per_trace),
            ("queue_size", queue_size),
            ("max_buffer_bytes", max_buffer_bytes),
            ("max_queue_bytes", max_queue_bytes),
            ("batch_size", batch_size),
            ("max_batch_bytes", max_batch_bytes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, fvalue in (
            ("max_trace_age_s", max_trace_age_s),
            ("flush_interval_s", flush_interval_s),
            ("retry_initial_s", retry_initial_s),
            ("retry_max_s", retry_max_s),
            ("shutdown_timeout_s", shutdown_timeout_s),
        ):
            if fvalue <= 0:
                raise ValueError(f"{name} must be > 0, got {fvalue}")
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self._rules = rules
        self._sink = sink
        # Room for the requests' JSON in one message when the sink has a cap, else None (an
        # in-process sink: nothing is encoded, batches are cut by approximate size only).
        self._payload_room: int | None = None
        if isinstance(sink, EncodedSink):
            self._payload_room = max(1, sink.max_payload_bytes - MESSAGE_ENVELOPE_BYTES)
        self._max_traces = max_traces
        self._max_spans = max_spans_per_trace
        self._max_age = max_trace_age_s
        self._grace = grace_s
        self._batch_size = batch_size
        self._max_batch_bytes = max_batch_bytes
        self._interval = flush_interval_s
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._shutdown_timeout = shutdown_timeout_s
        self._clock = clock

        self._lock = threading.Lock()
        self._traces: OrderedDict[int, _Trace] = OrderedDict()
        # Traces the loop guard excluded whole: their later spans are ignored at once.
        self._guarded: OrderedDict[int, None] = OrderedDict()
        # Traces whose spans are ignored: no rule's sample takes them (decided on their first
        # span: the sample is a function of the trace id), or they were dropped whole (a later
        # span, e.g. the root, must not start a fragment that would be scored as the run).
        self._ignored: OrderedDict[int, None] = OrderedDict()
        self._all_sampled = all(r.sample_rate >= 1.0 for r in rules)
        self._all_groups = _scorer_groups(rules)
        self._delayed: list[tuple[float, int, ScoreRequest, int]] = []
        self._seq = itertools.count()
        # Buffered traces whose agent/root span ended, oldest first: when the buffer is full
        # the oldest of these is completed early instead of an unfinished trace being dropped.
        self._due_order: OrderedDict[int, None] = OrderedDict()
        # Traces taken from a full buffer that way, waiting for the flusher to complete them.
        self._ready: list[_Trace] = []
        # The hand-off queue, guarded by _lock: the sender waits on _has_work (no polling) and
        # takes a batch and counts it in flight in one step (so _wait_idle never sees neither).
        self._pending: deque[_Queued] = deque()
        self._queue_size = queue_size
        self._max_queue_bytes = max_queue_bytes
        self._max_buffer_bytes = max_buffer_bytes
        # Approximate JSON size of the records in _traces.
        self._buffered_bytes = 0
        # Approximate JSON size of the records in _ready, _pending and _delayed.
        self._queued_bytes = 0
        self._has_work = threading.Condition(self._lock)
        self._inflight = 0
        self._idle = threading.Condition(self._lock)
        self._process_lock = threading.Lock()

        self._spans_seen = 0
        self._traces_completed = 0
        self._runs_found = 0
        self._runs_read_in_app = 0
        self._runs_enqueued = 0
        self._runs_sent = 0
        self._batches_sent = 0
        self._send_failures = 0
        self._dropped = _Counter()
        self._skipped = _Counter()
        self._errors = _Counter()

        # The last (scope, resource) pair seen by export() and whether it is tracescore's own.
        self._seen_scope: object = None
        self._seen_resource: object = None
        self._seen_own = False
        self._seen_service: str | None = None
        self._seen_scope_name: str | None = None
        self._closed = False
        # Set by shutdown() once it counted what is left as dropped (the sender must not again).
        self._gave_up = False
        self._stop = threading.Event()
        # Set when the flusher has work at once (a trace due with grace_s == 0, a new trace while
        # it sleeps idle, a trace taken from a full buffer): export() wakes it once per batch.
        self._wake = threading.Event()
        self._due_now = False
        # Set (under _lock) while the flusher sleeps with nothing buffered or delayed: it then
        # waits for export() to file a new trace instead of waking every interval for nothing.
        self._flusher_idle = False
        self._flusher = threading.Thread(target=self._flush_loop, name="tracescore-flusher", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="tracescore-sender", daemon=True)
        self._flusher.start()
        self._sender.start()

    # --- SpanExporter ----------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """File spans by trace; never raises, never waits on the sink."""
        bad = 0
        error: Exception | None = None
        try:
            now = self._clock()
            with self._lock:
                if self._closed:
                    return SpanExportResult.FAILURE
                self._spans_seen += len(spans)
                for span in spans:
                    try:
                        self._file(span, now)
                    except Exception as exc:  # one bad span must not lose the rest of the batch
                        bad += 1
                        error = exc
                if bad:
                    self._errors.add("export", bad)
                due_now, self._due_now = self._due_now, False
            if due_now:  # once per batch, not per trace
                self._wake.set()
        except Exception as exc:  # the application must never see our failure
            with self._lock:
                self._errors.add("export")
            bad, error = bad + 1, exc
        if bad:
            log.error("exporter_export_failed", spans=bad, error=_describe(error) if error else None)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _file(self, span: ReadableSpan, now: float) -> None:
        # The context alone first: a span of a trace that is not kept costs one field read (a
        # span's other fields are cold in the CPU's caches by the time the batch comes here).
        ctx = span._context if type(span) is ReadableSpan else span.context
        if ctx is None:
            self._dropped.add("no_context")
            return
        tid = ctx[0]  # SpanContext is a tuple (trace_id, span_id, is_remote, ...): no property call
        if tid in self._guarded or tid in self._ignored:
            return
        _, parent, attrs, name, okind, start, end, status, events, scope, resource = span_fields(span)
        is_root = parent is None or parent[2]
        is_judge = ROLE_ATTRIBUTE in attrs and attrs[ROLE_ATTRIBUTE] == JUDGE_ROLE
        if scope is not self._seen_scope or resource is not self._seen_resource:
            # The spans of one tracer share scope and resource objects: read each pair once.
            self._seen_scope, self._seen_resource = scope, resource
            self._seen_own = is_own_span(span)
            self._seen_service = service_name(resource)
            self._seen_scope_name = scope.name if scope is not None else None
        if (is_root and is_judge) or self._seen_own:
            self._guard(tid)
            return
        entry = self._traces.get(tid)
        if entry is None:
            trace_id = format(tid, "032x")
            if self._all_sampled:
                rules = self._rules
            else:
                rules = [r for r in self._rules if sampled(trace_id, r.sample_rate)]
                if not rules:
                    self._skipped.add("sampled_out")
                    self._ignore(tid)
                    return
            if len(self._traces) >= self._max_traces:
                self._make_room("max_traces")
            entry = self._traces[tid] = _Trace(trace_id=trace_id, first_seen=now, rules=rules)
            if self._flusher_idle:  # woken once per batch, by export()
                self._flusher_idle = False
                self._due_now = True
        if len(entry.spans) >= self._max_spans:
            dropped = compact(entry.spans[0])  # its size (compacted already: nothing changes)
            entry.size -= dropped
            self._buffered_bytes -= dropped
            del entry.spans[0], entry.kinds[0]  # O(n), but only over a bound (rare, n small)
            self._drop("max_spans_per_trace")
        kind = classify(name, attrs)
        # Compacted now, while the span's fields are at hand; the record keeps the span's own
        # attribute dict when the transform reads all of it (nothing copied, nothing compacted
        # again at the hand-off).
        record, size = build_record(
            ctx,
            parent,
            name,
            entry.trace_id,
            attrs,
            okind,
            start,
            end,
            status,
            events,
            self._seen_service,
            self._seen_scope_name,
        )
        entry.spans.append(record)
        entry.kinds.append(kind)
        entry.size += size
        self._buffered_bytes += size
        if is_judge:
            if entry.judge_ids is None:
                entry.judge_ids = set()
            entry.judge_ids.add(record.span_id)
        if is_root or kind == "agent":
            if entry.due is None:
                self._due_order[tid] = None
            entry.due = now + self._grace
            if not self._grace:  # never cleared here: that lost the wake of an idle flusher
                self._due_now = True
        if self._buffered_bytes > self._max_buffer_bytes:  # last: this trace may be the one to go
            if entry.size > self._max_buffer_bytes:  # alone over the bound: it goes, not the others
                self._pop_trace(tid)
                self._ignore(tid)
                self._drop("max_buffer_bytes")
            while self._buffered_bytes > self._max_buffer_bytes and self._traces:
                self._make_room("max_buffer_bytes")

    def _make_room(self, reason: str) -> None:
        """The buffer is full (``reason``): hand the oldest trace whose root ended to the flusher
        (it is complete but for late children), else drop the oldest unfinished trace."""
        while self._due_order:
            tid = next(iter(self._due_order))
            entry = self._pop_trace(tid)
            if entry is not None:
                full = self._queue_reason(entry.size)
                if full:
                    self._ignore(tid)
                    self._drop(full)
                else:
                    self._ready.append(entry)
                    self._queued_bytes += entry.size
                    self._due_now = True
                return
        tid = next(iter(self._traces))
        self._pop_trace(tid)
        self._ignore(tid)
        self._drop(reason)

    def _ignore(self, tid: int) -> None:
        self._ignored[tid] = None
        # Remembered well beyond the buffer: in a flood, a dropped trace's root may come a few
        # thousand traces later (~100 bytes an entry).
        if len(self._ignored) > max(4 * self._max_traces, 16_384):
            self._ignored.popitem(last=False)

    def _pop_trace(self, tid: int) -> _Trace | None:
        """Take a trace out of the buffer (and its byte count); None if it is not there."""
        self._due_order.pop(tid, None)
        entry = self._traces.pop(tid, None)
        if entry is not None:
            self._buffered_bytes -= entry.size
        return entry

    def _queue_reason(self, size: int) -> str | None:
        """Why one more item of ``size`` bytes does not fit the hand-off queue, or None."""
        if len(self._pending) + len(self._ready) >= self._queue_size:
            return "queue_full"
        if self._queued_bytes + size > self._max_queue_bytes:
            return "queue_bytes"
        return None

    def _guard(self, tid: int) -> None:
        if self._pop_trace(tid) is not None or tid not in self._guarded:
            self._skipped.add("loop_guard")
        self._guarded[tid] = None
        if len(self._guarded) > self._max_traces:
            self._guarded.popitem(last=False)

    def _drop(self, reason: str, n: int = 1) -> None:
        total = self._dropped.add(reason, n)
        if total == n or total % 1000 < n:  # first time, then every 1000th: no log flood
            log.warning("exporter_dropped", reason=reason, total=total)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Complete every trace whose agent/root span ended (skipping the grace window), then
        wait until the sink has everything queued. False when the deadline passed first."""
        deadline = time.monotonic() + timeout_millis / 1000
        try:
            self._process(force=True)
            return self._wait_idle(deadline)
        except Exception as exc:
            with self._lock:
                self._errors.add("flush")
            log.error("exporter_flush_failed", error=_describe(exc))
            return False

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Flush what can be flushed within the deadline (default ``shutdown_timeout_s``: the
        SDK calls this without one, and a down broker must not hold the app's exit), then stop
        both threads and close the sink; what is left is counted as dropped.

        From the deadline on nothing new is sent: the sender starts no send attempt (nor retry)
        once stopped, and a ``CelerySink`` refuses sends once closed. Closing waits for a send
        already under way (bounded by the sink's own timeouts), so none lands after this returns.
        """
        # The SDK passes what is left of its own 30 s: a down broker must not hold the app that long.
        timeout_s = self._shutdown_timeout
        if timeout_millis is not None:
            timeout_s = min(timeout_s, timeout_millis / 1000)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._process(force=True)
            with self._lock:
                left = len(self._traces)
                self._traces.clear()
                self._due_order.clear()
                self._buffered_bytes = 0
                delayed = [(r, n) for _, _, r, n in sorted(self._delayed, key=lambda d: d[:2])]
                self._delayed.clear()
                self._queued_bytes -= sum(n for _, n in delayed)
                if left:
                    self._drop("shutdown_incomplete_trace", left)
            for request, size in delayed:  # held back by delay_s: better early than never
                self._enqueue(request, size)
            self._wait_idle(deadline)
        finally:
            with self._lock:
                self._stop.set()
                self._has_work.notify_all()
            self._wake.set()
            self._flusher.join(max(0.0, deadline - time.monotonic()) + 0.1)
            self._sender.join(max(0.0, deadline - time.monotonic()) + 0.1)
            close = getattr(self._sink, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:
                    log.warning("exporter_sink_close_failed", error=_describe(exc))
            self._sender.join(0.1)  # a send the close just ended: let the sender count it
            with self._lock:
                # Still queued, or still in the sink (a stuck callback): given up on, counted
                # here once (the sender no longer counts what it finishes after this).
                unsent = len(self._pending) + self._inflight
                self._pending.clear()
                self._queued_bytes = 0
                self._gave_up = True
                if unsent:
                    self._drop("shutdown_unsent", unsent)
            if self._sender.is_alive():
                log.warning("exporter_sink_still_busy", runs=self._inflight)

    # --- completion -----------------------------------------------------------------------

    def tick(self) -> int:
        """Complete the traces that are due at the clock's current time; returns how many.

        The flusher thread calls this every ``flush_interval_s``; tests call it after moving
        an injected clock."""
        return self._process(force=False)

    def _process(self, *, force: bool) -> int:
        with self._process_lock:
            return self._process_pass(force)

    def _process_pass(self, force: bool) -> int:
        now = self._clock()
        due: list[int] = []
        ready: list[tuple[ScoreRequest, int]] = []
        with self._lock:
            # Taken from a full buffer: the oldest, completed first.
            taken, self._ready = self._ready, []
            self._queued_bytes -= sum(entry.size for entry in taken)
            for tid, entry in self._traces.items():
                if entry.due is not None and (force or entry.due <= now):
                    due.append(tid)
                elif entry.due is None and now - entry.first_seen >= self._max_age:
                    due.append(-tid - 1)  # expired: marked by sign, dropped below
            while self._delayed and ((force and self._closed) or self._delayed[0][0] <= now):
                _, _, request, size = heapq.heappop(self._delayed)
                self._queued_bytes -= size
                ready.append((request, size))
        for request, size in ready:
            self._enqueue(request, size)
        with self._lock:
            for tid in due:
                if tid < 0:
                    if self._pop_trace(-tid - 1) is not None:
                        self._ignore(-tid - 1)
                        self._drop("max_trace_age")
                    continue
                found = self._pop_trace(tid)
                if found is not None:
                    taken.append(found)
        # Completed one at a time, each dropped when done: its records become garbage at
        # once instead of surviving (and being promoted by the GC) until the end. What they
        # ship is handed off (and counted) a batch at a time: one lock and one wake of the
        # sender per batch, not per trace.
        taken.reverse()
        done = len(taken)
        out: list[_Shipment] = []
        tally = [0, 0, 0]  # traces completed (default path), runs found, traces without one
        while taken:
            entry = taken.pop()
            try:
                self._complete(entry, now, out, tally)
            except Exception as exc:  # one bad trace must not stop the others
                with self._lock:
                    self._errors.add("internal")
                log.error("exporter_trace_failed", trace_id=entry.trace_id, error=_describe(exc))
            del entry
            if len(out) >= self._batch_size:
                self._hand_off(out, tally)
                out, tally = [], [0, 0, 0]
        if out or tally[0]:
            self._hand_off(out, tally)
        return done

    def _complete(self, entry: _Trace, now: float, out: list[_Shipment], tally: list[int]) -> None:
        rules = entry.rules
        if any(rule.filter is not None for rule in rules):
            with self._lock:
                self._traces_completed += 1
            self._complete_in_app(entry, now)
            return
        # The default path: no transform here, the worker reads each run from its spans.
        records = entry.spans
        runs = plan_runs(records, kinds=entry.kinds, exclude_under=entry.judge_ids or ())
        tally[0] += 1
        tally[1] += len(runs)
        if not runs:
            tally[2] += 1
        groups = self._all_groups if rules is self._rules else _scorer_groups(rules)
        stamp = time.time()
        for target, spans in runs:
            # A run is a subset of the trace: as many spans means all of them.
            size = entry.size if len(spans) == len(records) else sum(compact(r) for r in spans)
            for delay, ids in groups:
                if delay > 0:
                    self._submit(spans_request(spans, target.span_id, ids), size, delay, now)
                else:  # the request is built by the sender: fewer objects live in the queue
                    out.append((spans, target.span_id, ids, stamp, size))

    def _hand_off(self, shipments: list[_Shipment], tally: list[int]) -> None:
        """Count a pass's completed traces and queue what they ship: one lock, one wake."""
        with self._lock:
            self._traces_completed += tally[0]
            self._runs_found += tally[1]
            if tally[2]:
                self._skipped.add("no_target", tally[2])
            if not shipments:
                return
            if self._stop.is_set():  # shut down: the sender is gone, nothing may be sent any more
                self._drop("shutdown_unsent", len(shipments))
                return
            room = self._queue_size - len(self._pending) - len(self._ready)
            if room < len(shipments):  # the newest are dropped, as _enqueue drops them
                self._drop("queue_full", len(shipments) - max(room, 0))
                shipments = shipments[: max(room, 0)]
            kept = 0
            for shipment in shipments:
                size = shipment[4]
                if self._queued_bytes + size > self._max_queue_bytes:
                    self._drop("queue_bytes")  # a smaller one after it may still fit
                    continue
                self._pending.append(shipment)
                self._queued_bytes += size
                kept += 1
            if kept:
                self._runs_enqueued += kept
                self._has_work.notify()

    def _complete_in_app(self, entry: _Trace, now: float) -> None:
        """A rule's filter needs the run: read the trace here (the application pays for it)."""
        trace_id = entry.trace_id
        results = read_trace(entry.spans, exclude_under=entry.judge_ids or ())
        if not results:
            with self._lock:
                self._skipped.add("no_target")
            return
        with self._lock:
            self._runs_found += len(results)
        for result in results:
            if isinstance(result, TraceReadError):
                with self._lock:
                    self._errors.add(result.reason)
                log.warning(
                    "trace_unreadable",
                    trace_id=trace_id,
                    span_id=result.span_id,
                    span_name=result.span_name,
                    attribute=result.attribute,
                    reason=result.reason,
                )
                continue
            with self._lock:
                self._runs_read_in_app += 1
            # The run is read from the trace's records: their size bounds its own, roughly.
            self._route(result, entry.rules, now, entry.size)

    def _route(self, run: TracedRun, rules: Sequence[ScoringRule], now: float, size: int) -> None:
        kept: list[ScoringRule] = []
        for rule in rules:
            if rule.filter is not None:
                try:
                    keep = bool(rule.filter(run))
                except Exception as exc:
                    with self._lock:
                        self._errors.add("filter")
                    log.warning("rule_filter_failed", span_id=run.identity.span_id, error=_describe(exc))
                    continue
                if not keep:
                    continue
            kept.append(rule)
        if not kept:
            with self._lock:
                self._skipped.add("filtered_out")
            return
        for delay, ids in _scorer_groups(kept):
            self._submit(ScoreRequest(run=run, scorer_ids=ids), size, delay, now)

    def _submit(self, request: ScoreRequest, size: int, delay: float, now: float) -> None:
        if delay > 0:
            with self._lock:
                if len(self._delayed) >= self._queue_size:
                    self._drop("delay_queue_full")
                    return
                if self._queued_bytes + size > self._max_queue_bytes:
                    self._drop("queue_bytes")
                    return
                heapq.heappush(self._delayed, (now + delay, next(self._seq), request, size))
                self._queued_bytes += size
        else:
            self._enqueue(request, size)

    def _enqueue(self, request: ScoreRequest, size: int) -> None:
        request.enqueued_at = time.time()
        with self._lock:
            reason = "shutdown_unsent" if self._stop.is_set() else self._queue_reason(size)
            if reason:  # after shutdown the sender is gone: nothing may be sent any more
                self._drop(reason)
            else:
                self._pending.append((request, size))
                self._queued_bytes += size
                self._runs_enqueued += 1
                self._has_work.notify()

    # --- threads --------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            # Not during a pass (tick/force_flush in another thread): one may have taken the
            # last traces and not yet queued their delayed requests.
            with self._process_lock, self._lock:
                self._flusher_idle = idle = not self._traces and not self._delayed and not self._ready
            # Idle: nothing can become due or expire until export() files a trace (and wakes
            # us); a wake between the check and the wait leaves the event set.
            self._wake.wait(None if idle else self._interval)
            self._wake.clear()  # before the pass: a wake after this is seen by the next one
            if self._stop.is_set():
                return
            try:
                self._process(force=False)
            except Exception as exc:
                log.error("exporter_flusher_failed", error=_describe(exc))

    def _take_batch(self) -> list[_Queued]:
        """Up to ``batch_size`` items and about ``max_batch_bytes``: what is in flight (outside
        the queue's byte bound while the sink is down) stays one batch's worth."""
        with self._lock:
            while not self._pending and not self._stop.is_set():
                self._has_work.wait()
            if self._stop.is_set():
                return []
            pending = self._pending
            batch: list[_Queued] = []
            size = 0
            while pending and len(batch) < self._batch_size:
                n = pending[0][-1]
                if batch and size + n > self._max_batch_bytes:
                    break
                batch.append(pending.popleft())
                size += n
            self._queued_bytes -= size
            self._inflight += len(batch)
            return batch

    def _send_loop(self) -> None:
        # Stops taking batches at once when stopped: shutdown() drops what is still queued.
        while not self._stop.is_set():
            requests = self._take_batch()
            settled = 0
            try:
                for chunk, encoded, rejected in self._chunks(requests):
                    if rejected:
                        settled += rejected
                        with self._lock:
                            self._inflight -= rejected
                            if not self._gave_up:
                                self._drop("too_large", rejected)
                            self._idle.notify_all()
                    if not chunk:
                        continue
                    sent = False
                    try:
                        sent = self._deliver(chunk, encoded)
                    finally:
                        settled += len(chunk)
                        with self._lock:
                            self._inflight -= len(chunk)
                            if sent:
                                self._runs_sent += len(chunk)
                                self._batches_sent += 1
                            elif not self._gave_up:
                                self._drop("shutdown_unsent", len(chunk))
                            self._idle.notify_all()
            except Exception as exc:  # a request that cannot be built: the sender must live on
                log.error("exporter_sender_failed", error=_describe(exc))
                with self._lock:
                    left = len(requests) - settled
                    self._inflight -= left
                    self._errors.add("send")
                    if not self._gave_up:
                        self._drop("send_failed", left)
                    self._idle.notify_all()

    def _chunks(self, items: list[_Queued]) -> Iterator[_Chunk]:
        """Requests of the taken items, their span records compacted (the hand-off carries only
        what the worker's transform reads; shipments were compacted when filed and carry their
        size), in batches of at most ``max_batch_bytes`` (roughly:
        spans travel with every message the model saw, which a worker's payload limit caps).

        For a sink with a cap each request is encoded here, once: the batch is cut by that
        size too, so no message exceeds the cap, and the JSON goes to the sink as is. A request
        over the cap alone is counted in the next chunk's ``rejected``; its neighbours go on."""
        room = self._payload_room
        chunk: list[ScoreRequest] = []
        encoded: list[str] | None = None if room is None else []
        rejected = 0
        size = 0
        limit = self._max_batch_bytes if room is None else min(self._max_batch_bytes, room)
        for item in items:
            if len(item) == 2:
                request, n = item
                if request.spans:  # compacted now: only what the worker reads travels
                    n = sum(compact(record) for record in request.spans)
            else:  # filed compacted: its size is known
                spans, target_span_id, scorer_ids, enqueued_at, n = item
                request = spans_request(spans, target_span_id, scorer_ids, enqueued_at)
            text = ""
            if room is not None:
                text = request.model_dump_json()
                n = wire_size(text) + 1  # and the comma between requests
                if n - 1 > room:
                    # Only ids and sizes: the spans are the agent's content.
                    log.warning(
                        "exporter_run_too_large",
                        trace_id=request.trace_id,
                        span_id=request.span_id,
                        bytes=n - 1,
                        max_payload_bytes=room + MESSAGE_ENVELOPE_BYTES,
                    )
                    rejected += 1
                    continue
            if chunk and size + n > limit:
                yield chunk, encoded, rejected
                chunk, size, rejected = [], 0, 0
                encoded = None if room is None else []
            chunk.append(request)
            if encoded is not None:
                encoded.append(text)
            size += n
        if chunk or rejected:
            yield chunk, encoded, rejected

    def _deliver(self, requests: list[ScoreRequest], encoded: list[str] | None) -> bool:
        """Send one batch, retrying until it is sent (True) or the exporter stops (False)."""
        batch = ScoreBatch.model_construct(batch_id=uuid.uuid4().hex, requests=requests)
        sink = self._sink
        delay = self._retry_initial
        while not self._stop.is_set():  # checked before every attempt: no send after shutdown
            try:
                if encoded is not None and isinstance(sink, EncodedSink):
                    sink.send_encoded(batch, encoded)
                else:
                    sink.send(batch)
            except Exception as exc:
                with self._lock:
                    self._send_failures += 1
                    failures = self._send_failures
                if failures == 1 or failures % 100 == 0:
                    log.warning("sink_send_failed", error=_describe(exc), runs=len(requests), failures=failures)
                # Jitter so several exporters do not hammer a recovering broker in step.
                self._stop.wait(delay * (0.5 + random.random() / 2))
                delay = min(self._retry_max, delay * 2)
                continue
            return True
        return False

    def _wait_idle(self, deadline: float) -> bool:
        with self._idle:
            while self._pending or self._ready or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    # --- observability --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters since start.

        ``spans_seen``; ``traces_buffered`` and ``buffer_bytes`` (now; the records' approximate
        JSON size, bounded by ``max_buffer_bytes``); ``traces_completed`` (taken after their
        agent/root span ended, sampled-in only); ``runs_found`` (runs to score found in them);
        ``runs_read_in_app`` (of those, read into a ``TracedRun`` here because a rule has a
        filter; the others travel as spans and the worker reads them); ``runs_enqueued`` and
        ``runs_sent`` (score requests: one per run and distinct ``delay_s``);
        ``batches_sent``; ``send_failures`` (sink attempts that raised, each retried);
        ``queue_depth`` (waiting for or in the sink); ``queue_bytes`` (approximate JSON size of
        what waits, bounded by ``max_queue_bytes``); ``delayed`` (held by ``delay_s``);
        ``dropped`` by reason: traces (``max_traces`` and ``max_buffer_bytes``: the buffer was
        full of unfinished traces, ``max_trace_age``, ``shutdown_incomplete_trace``), spans (``max_spans_per_trace``,
        ``no_context``) and runs (``queue_full`` and ``queue_bytes``: the hand-off queue's run and
        byte bounds, ``delay_queue_full``, ``shutdown_unsent``, ``send_failed``, ``too_large``: alone
        over the sink's ``max_payload_bytes``); ``skipped`` by
        reason (``sampled_out``, ``loop_guard``, ``no_target``, ``filtered_out``); ``errors`` by
        reason (``TraceReadError.reason`` values such as
        ``bad_json`` / ``bad_message`` / ``unknown_role`` / ``no_content`` for runs read here
        — a trace shipped as spans that the worker cannot read becomes error score records
        there — and ``filter``, ``export``, ``flush``, ``send``, ``internal``)."""
        with self._lock:
            return {
                "spans_seen": self._spans_seen,
                "traces_buffered": len(self._traces),
                "buffer_bytes": self._buffered_bytes,
                "traces_completed": self._traces_completed,
                "runs_found": self._runs_found,
                "runs_read_in_app": self._runs_read_in_app,
                "runs_enqueued": self._runs_enqueued,
                "runs_sent": self._runs_sent,
                "batches_sent": self._batches_sent,
                "send_failures": self._send_failures,
                "queue_depth": len(self._pending) + len(self._ready) + self._inflight,
                "queue_bytes": self._queued_bytes,
                "delayed": len(self._delayed),
                "dropped": dict(self._dropped),
                "skipped": dict(self._skipped),
                "errors": dict(self._errors),
            }
