"""``ScoringSpanExporter``: an OTel ``SpanExporter`` that turns finished agent traces into
score requests, without ever slowing down or breaking the application.

Flow: ``export()`` only files spans by trace id (O(spans), under one lock), drops traces no
rule's sample takes (decided on their first span: the sample is a function of the trace id)
and those of tracescore itself (loop guard), and notes when an agent span or a trace's local
root ended. A flusher thread completes a trace ``grace_s`` after that (children that end
after their root still make it), reads its runs with ``read_trace``, applies the rules'
filters and puts ``ScoreRequest``s on a bounded hand-off queue. A sender thread drains that
queue in batches into the sink, retrying with capped exponential backoff. Every bound drops
the oldest (or the newest, for the hand-off queue) and counts it under ``stats()["dropped"]``.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import random
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracing._errors import TraceReadError
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE, is_own_span
from tracing._rules import ScoringRule, sampled
from tracing._run import ScoreBatch, ScoreRequest, TracedRun
from tracing._sinks import Sink
from tracing._span import plain_attributes
from tracing._transform import read_trace

__all__ = ["ScoringSpanExporter"]

log = structlog.get_logger("tracescore.exporter")

Clock = Callable[[], float]


def _is_agent_span(span: ReadableSpan, attrs: Mapping[str, Any]) -> bool:
    return (
        attrs.get("gen_ai.operation.name") == "invoke_agent"
        or attrs.get("openinference.span.kind") == "AGENT"
        or attrs.get("mastra.span.type") == "agent_run"
        or span.name.startswith("invoke_agent")
    )


@dataclass(slots=True)
class _Trace:
    first_seen: float
    spans: deque[ReadableSpan] = field(default_factory=deque)
    due: float | None = None
    judge_ids: set[str] = field(default_factory=set)
    rules: list[ScoringRule] = field(default_factory=list)  # the rules whose sample took it


class _Counter(dict[str, int]):
    def add(self, key: str, n: int = 1) -> int:
        value = self.get(key, 0) + n
        self[key] = value
        return value


class ScoringSpanExporter(SpanExporter):
    """Put behind ``BatchSpanProcessor``: ``provider.add_span_processor(BatchSpanProcessor(
    ScoringSpanExporter(rules=[ScoringRule(["helpfulness"])], sink=CelerySink(url))))``.

    Bounds: ``max_traces`` buffered traces, ``max_spans_per_trace`` spans each, traces older
    than ``max_trace_age_s`` without an ended agent/root span are dropped; ``queue_size``
    requests wait for the sink (plus those held back by a rule's ``delay_s``). ``clock``
    (monotonic seconds) is injectable so tests drive the grace window without sleeping.
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
        batch_size: int = 50,
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
            ("batch_size", batch_size),
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
        self._max_traces = max_traces
        self._max_spans = max_spans_per_trace
        self._max_age = max_trace_age_s
        self._grace = grace_s
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._shutdown_timeout = shutdown_timeout_s
        self._clock = clock

        self._lock = threading.Lock()
        self._traces: OrderedDict[int, _Trace] = OrderedDict()
        # Traces the loop guard excluded whole: their later spans are ignored at once.
        self._guarded: OrderedDict[int, None] = OrderedDict()
        # Traces no rule's sample takes: decided on their first span (the sample is a function
        # of the trace id), so their spans are never buffered.
        self._unsampled: OrderedDict[int, None] = OrderedDict()
        self._all_sampled = all(r.sample_rate >= 1.0 for r in rules)
        self._delayed: list[tuple[float, int, ScoreRequest]] = []
        self._seq = itertools.count()
        self._queue: queue.Queue[ScoreRequest] = queue.Queue(maxsize=queue_size)
        self._inflight = 0
        self._idle = threading.Condition(self._lock)
        self._process_lock = threading.Lock()

        self._spans_seen = 0
        self._traces_completed = 0
        self._runs_read = 0
        self._runs_enqueued = 0
        self._runs_sent = 0
        self._batches_sent = 0
        self._send_failures = 0
        self._dropped = _Counter()
        self._skipped = _Counter()
        self._errors = _Counter()

        self._closed = False
        self._stop = threading.Event()
        # Set when a trace is due at once (grace_s == 0): the flusher reads it right away, so
        # its spans do not stay alive (and keep the GC busy) until the next interval.
        self._wake = threading.Event()
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
                for span in spans:
                    self._spans_seen += 1
                    try:
                        self._file(span, now)
                    except Exception as exc:  # one bad span must not lose the rest of the batch
                        bad += 1
                        error = exc
                if bad:
                    self._errors.add("export", bad)
        except Exception as exc:  # the application must never see our failure
            with self._lock:
                self._errors.add("export")
            bad, error = bad + 1, exc
        if bad:
            log.error("exporter_export_failed", spans=bad, error=repr(error))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _file(self, span: ReadableSpan, now: float) -> None:
        ctx = span.context
        if ctx is None:
            self._dropped.add("no_context")
            return
        tid = ctx.trace_id
        if tid in self._guarded or tid in self._unsampled:
            return
        parent = span.parent
        is_root = parent is None or parent.is_remote
        attrs = plain_attributes(span)
        is_judge = attrs.get(ROLE_ATTRIBUTE) == JUDGE_ROLE
        if (is_root and is_judge) or is_own_span(span):
            self._guard(tid)
            return
        entry = self._traces.get(tid)
        if entry is None:
            if self._all_sampled:
                rules = self._rules
            else:
                trace_id = format(tid, "032x")
                rules = [r for r in self._rules if sampled(trace_id, r.sample_rate)]
                if not rules:
                    self._skipped.add("sampled_out")
                    self._unsampled[tid] = None
                    if len(self._unsampled) > self._max_traces:
                        self._unsampled.popitem(last=False)
                    return
            if len(self._traces) >= self._max_traces:
                self._traces.popitem(last=False)
                self._drop("max_traces")
            entry = self._traces[tid] = _Trace(first_seen=now, rules=rules)
        if len(entry.spans) >= self._max_spans:
            entry.spans.popleft()
            self._drop("max_spans_per_trace")
        entry.spans.append(span)
        if is_judge:
            entry.judge_ids.add(format(ctx.span_id, "016x"))
        if is_root or _is_agent_span(span, attrs):
            entry.due = now + self._grace
            if not self._grace:
                self._wake.set()

    def _guard(self, tid: int) -> None:
        if self._traces.pop(tid, None) is not None or tid not in self._guarded:
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
            log.error("exporter_flush_failed", error=repr(exc))
            return False

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Flush what can be flushed within the deadline (default ``shutdown_timeout_s``: the
        SDK calls this without one, and a down broker must not hold the app's exit), then stop;
        what is left is counted as dropped."""
        timeout_s = self._shutdown_timeout if timeout_millis is None else timeout_millis / 1000
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
                delayed = [r for _, _, r in sorted(self._delayed)]
                self._delayed.clear()
                if left:
                    self._drop("shutdown_incomplete_trace", left)
            for request in delayed:  # held back by delay_s: better early than never
                self._enqueue(request)
            self._wait_idle(deadline)
        finally:
            self._stop.set()
            self._wake.set()
            self._flusher.join(max(0.0, deadline - time.monotonic()) + 0.1)
            self._sender.join(max(0.0, deadline - time.monotonic()) + 0.1)
            with self._lock:
                dropped = self._queue.qsize() + self._inflight  # in flight: a sink still stuck
            if dropped:
                with self._lock:
                    self._drop("shutdown_unsent", dropped)
            close = getattr(self._sink, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:
                    log.warning("exporter_sink_close_failed", error=repr(exc))

    # --- completion -----------------------------------------------------------------------

    def tick(self) -> int:
        """Complete the traces that are due at the clock's current time; returns how many.

        The flusher thread calls this every ``flush_interval_s``; tests call it after moving
        an injected clock."""
        return self._process(force=False)

    def _process(self, *, force: bool) -> int:
        with self._process_lock:
            now = self._clock()
            due: list[int] = []
            ready: list[ScoreRequest] = []
            with self._lock:
                for tid, entry in self._traces.items():
                    if entry.due is not None and (force or entry.due <= now):
                        due.append(tid)
                    elif entry.due is None and now - entry.first_seen >= self._max_age:
                        due.append(-tid - 1)  # expired: marked by sign, dropped below
                while self._delayed and ((force and self._closed) or self._delayed[0][0] <= now):
                    ready.append(heapq.heappop(self._delayed)[2])
            for request in ready:
                self._enqueue(request)
            done = 0
            for tid in due:
                # Take traces out one at a time: a trace's spans become garbage as soon as it
                # is read, instead of surviving (and being promoted by the GC) until the end.
                with self._lock:
                    if tid < 0:
                        if self._traces.pop(-tid - 1, None) is not None:
                            self._drop("max_trace_age")
                        continue
                    taken = self._traces.pop(tid, None)
                if taken is None:
                    continue
                done += 1
                trace_id = format(tid, "032x")
                try:
                    self._complete(trace_id, taken, now)
                except Exception as exc:  # one bad trace must not stop the others
                    with self._lock:
                        self._errors.add("internal")
                    log.error("exporter_trace_failed", trace_id=trace_id, error=repr(exc))
                del taken
            return done

    def _complete(self, trace_id: str, entry: _Trace, now: float) -> None:
        with self._lock:
            self._traces_completed += 1
        rules = entry.rules
        results = read_trace(list(entry.spans), exclude_under=entry.judge_ids)
        if not results:
            with self._lock:
                self._skipped.add("no_target")
            return
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
                    error=str(result),
                )
                continue
            with self._lock:
                self._runs_read += 1
            self._route(result, rules, now)

    def _route(self, run: TracedRun, rules: Sequence[ScoringRule], now: float) -> None:
        by_delay: dict[float, list[str]] = {}
        for rule in rules:
            if rule.filter is not None:
                try:
                    keep = bool(rule.filter(run))
                except Exception as exc:
                    with self._lock:
                        self._errors.add("filter")
                    log.warning("rule_filter_failed", span_id=run.identity.span_id, error=repr(exc))
                    continue
                if not keep:
                    continue
            ids = by_delay.setdefault(rule.delay_s, [])
            ids.extend(i for i in rule.scorer_ids if i not in ids)
        if not by_delay:
            with self._lock:
                self._skipped.add("filtered_out")
            return
        for delay, ids in sorted(by_delay.items()):
            request = ScoreRequest(run=run, scorer_ids=ids)
            if delay > 0:
                with self._lock:
                    if len(self._delayed) >= self._queue.maxsize:
                        self._drop("delay_queue_full")
                        continue
                    heapq.heappush(self._delayed, (now + delay, next(self._seq), request))
            else:
                self._enqueue(request)

    def _enqueue(self, request: ScoreRequest) -> None:
        request.enqueued_at = time.time()
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            with self._lock:
                self._drop("queue_full")
            return
        with self._lock:
            self._runs_enqueued += 1

    # --- threads --------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._process(force=False)
            except Exception as exc:
                log.error("exporter_flusher_failed", error=repr(exc))

    def _take_batch(self) -> list[ScoreRequest]:
        try:
            first = self._queue.get(timeout=0.05)
        except queue.Empty:
            return []
        batch = [first]
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            self._inflight += len(batch)
        return batch

    def _send_loop(self) -> None:
        while True:
            if self._stop.is_set() and self._queue.empty():
                return
            requests = self._take_batch()
            if not requests:
                continue
            try:
                self._deliver(requests)
            finally:
                with self._lock:
                    self._inflight -= len(requests)
                    self._idle.notify_all()

    def _deliver(self, requests: list[ScoreRequest]) -> None:
        batch = ScoreBatch(batch_id=uuid.uuid4().hex, requests=requests)
        delay = self._retry_initial
        while True:
            try:
                self._sink.send(batch)
            except Exception as exc:
                with self._lock:
                    self._send_failures += 1
                    failures = self._send_failures
                if failures == 1 or failures % 100 == 0:
                    log.warning("sink_send_failed", error=repr(exc), runs=len(requests), failures=failures)
                if self._stop.is_set():
                    with self._lock:
                        self._drop("shutdown_unsent", len(requests))
                    return
                # Jitter so several exporters do not hammer a recovering broker in step.
                self._stop.wait(delay * (0.5 + random.random() / 2))
                delay = min(self._retry_max, delay * 2)
                continue
            with self._lock:
                self._runs_sent += len(requests)
                self._batches_sent += 1
            return

    def _wait_idle(self, deadline: float) -> bool:
        with self._idle:
            while self._queue.qsize() or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    # --- observability --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters since start.

        ``spans_seen``; ``traces_buffered`` (now); ``traces_completed`` (read after their
        agent/root span ended, sampled-in only); ``runs_read``; ``runs_enqueued``; ``runs_sent``;
        ``batches_sent``; ``send_failures`` (sink attempts that raised, each retried);
        ``queue_depth`` (waiting for or in the sink); ``delayed`` (held by ``delay_s``);
        ``dropped`` by reason (``max_traces``, ``max_spans_per_trace``, ``max_trace_age``,
        ``queue_full``, ``delay_queue_full``, ``shutdown_incomplete_trace``, ``shutdown_unsent``,
        ``no_context``); ``skipped`` by reason (``sampled_out``, ``loop_guard``, ``no_target``,
        ``filtered_out``); ``errors`` by reason (``TraceReadError.reason`` values such as
        ``bad_json`` / ``bad_message`` / ``unknown_role`` / ``no_content``, and ``filter``,
        ``export``, ``internal``)."""
        with self._lock:
            return {
                "spans_seen": self._spans_seen,
                "traces_buffered": len(self._traces),
                "traces_completed": self._traces_completed,
                "runs_read": self._runs_read,
                "runs_enqueued": self._runs_enqueued,
                "runs_sent": self._runs_sent,
                "batches_sent": self._batches_sent,
                "send_failures": self._send_failures,
                "queue_depth": self._queue.qsize() + self._inflight,
                "delayed": len(self._delayed),
                "dropped": dict(self._dropped),
                "skipped": dict(self._skipped),
                "errors": dict(self._errors),
            }
