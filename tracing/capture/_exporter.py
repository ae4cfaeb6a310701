"""``ScoringSpanExporter``: an OTel ``SpanExporter`` that turns finished agent traces into
score requests, without ever slowing down or breaking the application.

It wires three parts: ``export()`` files spans into the ``TraceBuffer`` (pure, under one lock);
a flusher thread polls it every ``flush_interval_s`` and completes each trace it hands over
(plans the trace's runs from span names and kinds alone: no message parsed, nothing validated
in the application; a rule with a ``filter`` reads the run here to ask it, which costs the
application that reading); the ``Sender`` queues each run's span records and ships them to the
sink in batches, with retries (a trace's runs as one request: its spans once, each run's
target named). A rule's ``delay_s`` holds a run back that long first. Every drop
is counted by reason under ``stats()["dropped"]``; after ``shutdown()`` nothing is sent.
"""

from __future__ import annotations

import heapq
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracing._errors import TraceReadError
from tracing._fork import after_fork_in_child
from tracing._formats import SpanKind
from tracing._rules import ScoringRule
from tracing._run import SpanRecord
from tracing._transform import trace_to_run
from tracing.capture._buffer import BufferedTrace, BufferLimits, TraceBuffer
from tracing.capture._sender import (
    APP_CODE_ERRORS,
    Sender,
    SenderLimits,
    Shipment,
    call_optional,
    describe,
    shipment_size,
)
from tracing.capture._sinks import Sink
from tracing.capture._tally import Tally
from tracing.queue import MAX_SCORER_IDS, shown_id
from tracing.read import plan_runs

__all__ = ["ScoringSpanExporter"]

log = structlog.get_logger("tracescore.exporter")

Clock = Callable[[], float]


def _processor_delay_s() -> float:
    """The ``BatchSpanProcessor``'s schedule delay as the SDK reads it from the environment:
    whole milliseconds, 5,000 when unset or not an integer ("1500.0" too)."""
    try:
        millis = int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", 5000))
    except ValueError:
        millis = 5000
    return millis / 1000 if millis >= 0 else 5.0


def _scorer_groups(rules: Sequence[ScoringRule]) -> list[tuple[float, list[str]]]:
    """Scorer ids by ``delay_s``: one request per delay, ids merged in rule order."""
    by_delay: dict[float, list[str]] = {}
    for rule in rules:
        ids = by_delay.setdefault(rule.delay_s, [])
        ids.extend(i for i in rule.scorer_ids if i not in ids)
    return sorted(by_delay.items())


@dataclass(slots=True)
class _Pass:
    """A completion pass's traces still to read, shared with a shutdown that may abandon it."""

    traces: list[BufferedTrace]
    out: list[Shipment] = field(default_factory=list)  # read, not yet queued (a batch at a time)
    busy: bool = False  # reading one (a rule's filter may be running)
    abandoned: bool = False

    def done(self) -> bool:
        return self.abandoned or not self.traces


class ScoringSpanExporter(SpanExporter):
    """Put behind ``BatchSpanProcessor``: ``provider.add_span_processor(BatchSpanProcessor(
    ScoringSpanExporter(rules=[ScoringRule(["helpfulness"])], sink=CelerySink(url))))``.

    Bounds: ``max_traces`` buffered traces and ``max_buffer_bytes`` of their span records
    (approximate JSON size), ``max_spans_per_trace`` spans each. A trace is complete once the
    spans that ended within ``grace_s`` after its root span have arrived, and never sooner than
    ``grace_s`` after the root arrived: once the processor hands over a span that ended later
    (it hands them over in the order they ended), or, in a quiet app, ``grace_s +
    processor_delay_s`` after the root arrived. ``processor_delay_s`` is how long the processor
    holds an ended span: by default the ``BatchSpanProcessor``'s, read from
    ``OTEL_BSP_SCHEDULE_DELAY`` as it reads it (5 s unless set); pass it when you give the
    processor a ``schedule_delay_millis``, and 0 behind a ``SimpleSpanProcessor``. Put one
    exporter behind one processor: another one feeding it may hand over spans out of that order,
    and a trace then goes ``grace_s`` after its root arrived.
    A trace ``max_trace_age_s`` old without an ended root is completed if an agent span of it
    ended, else dropped. When the buffer is full the oldest trace whose root ended is completed
    early, else the oldest with an ended agent span, else the oldest trace is dropped.
    ``queue_size`` runs wait for the sink (plus those held back by a rule's ``delay_s``),
    together no more than ``max_queue_bytes`` of span records. A batch holds up to
    ``batch_size`` runs and, roughly, ``max_batch_bytes``; a sink with a message cap
    (``CelerySink(max_payload_bytes=...)``) gets each message cut under it, and a run over it
    alone is dropped (``dropped.too_large``) while its neighbours are sent. ``shutdown()`` takes
    at most ``shutdown_timeout_s`` (whatever timeout the SDK passes), plus one sink attempt under
    way. ``clock`` (monotonic seconds) is injectable so tests drive the timing without sleeping
    (what the spans' own end times say is read from them, against the wall clock).
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
        processor_delay_s: float | None = None,
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
        for name, fvalue in (("flush_interval_s", flush_interval_s), ("shutdown_timeout_s", shutdown_timeout_s)):
            if fvalue <= 0:
                raise ValueError(f"{name} must be > 0, got {fvalue}")
        self._sink = sink
        self._sender_limits = SenderLimits(
            queue_size=queue_size,
            max_queue_bytes=max_queue_bytes,
            batch_size=batch_size,
            max_batch_bytes=max_batch_bytes,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
        )
        self._buffer_limits = BufferLimits(
            max_traces=max_traces,
            max_spans_per_trace=max_spans_per_trace,
            max_buffer_bytes=max_buffer_bytes,
            max_trace_age_s=max_trace_age_s,
            grace_s=grace_s,
            processor_delay_s=_processor_delay_s() if processor_delay_s is None else processor_delay_s,
        )
        self._rules = rules
        self._all_groups = _scorer_groups(rules)
        for delay, ids in self._all_groups:
            # The ids of one delay travel in one request, which the workers refuse past the bound.
            if len(ids) > MAX_SCORER_IDS:
                raise ValueError(
                    f"the rules name {len(ids)} scorer ids for delay_s={delay:g}; a request carries at most"
                    f" {MAX_SCORER_IDS} (tracing.queue.MAX_SCORER_IDS): split them over rules of different delay_s"
                )
        self._filtered = any(rule.filter is not None for rule in rules)
        self._batch_size = batch_size
        self._queue_size = queue_size
        self._interval = flush_interval_s
        self._shutdown_timeout = shutdown_timeout_s
        self._clock = clock
        self._closed = False
        self._begin()
        # A process forked from this one (gunicorn --preload, multiprocessing) has none of its
        # threads: the SDK's BatchSpanProcessor starts again there, so must this exporter.
        after_fork_in_child(self._after_fork)

    def _begin(self) -> None:
        """This process's state and threads: counters, buffer, sender, locks."""
        self._tally = Tally()
        self._sender = Sender(self._sink, self._sender_limits, self._tally)
        self._buffer = TraceBuffer(self._rules, self._buffer_limits, self._tally, reserve=self._sender.reserve)

        # Guards the buffer, the delayed heap and the counters below.
        self._lock = threading.Lock()
        # One completion pass at a time (flusher, tick, force_flush, shutdown).
        self._process_lock = threading.Lock()
        self._pass: _Pass | None = None  # the completion pass under way (under _lock)
        # Runs held back by a rule's delay_s: (due, sequence, shipment).
        self._delayed: list[tuple[float, int, Shipment]] = []
        self._seq = itertools.count()
        self._traces_completed = 0
        self._runs_found = 0
        self._runs_read_in_app = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        # force_flush asks the flusher for a forced pass (tickets) and waits for it with its
        # deadline: a rule's filter never runs in the app's thread, and a slow one cannot hold
        # force_flush past its timeout.
        self._forced = threading.Condition(self._lock)
        self._force_asked = 0
        self._force_done = 0
        self._flusher_ended = False
        # Set in the thread running a completion pass (the flusher's, or shutdown's in the app's
        # thread): a rule's filter calling force_flush there would wait on its own pass.
        self._in_pass = threading.local()
        self._flusher = threading.Thread(target=self._flush_loop, name="tracescore-flusher", daemon=True)
        if not self._closed:
            self._flusher.start()
            self._sender.start()

    def _after_fork(self) -> None:
        """In a forked child: the parent's traces stay the parent's (sent and counted there,
        never twice), its locks may have been held mid-fork, and its threads are gone. The child
        starts empty, with counts of its own; the sink reconnects on its first send."""
        self._begin()
        if "multiprocessing" in sys.modules or "billiard" in sys.modules:
            import multiprocessing.util as util  # a child's start may import it only after the fork

            # multiprocessing's children (and billiard's: Celery's prefork pool, which shares
            # these registries) leave by os._exit: no atexit, so no provider shutdown, and every
            # trace still held was lost. Their exit runs multiprocessing's finalizers, cleared
            # after the fork and then set up by the after-fork callbacks: ours registers one.
            util.register_after_fork(self, _finalize_at_child_exit)

    def _at_child_exit(self) -> None:
        """A multiprocessing child's exit: what the app's span processors still hold is handed
        over (the global provider's ``force_flush``), then this shuts down as at the app's exit,
        within ``shutdown_timeout_s`` in all."""
        if self._closed:  # a grandchild inherits its parent's registration too: once is enough
            return
        deadline = time.monotonic() + self._shutdown_timeout
        flush = getattr(otel_trace.get_tracer_provider(), "force_flush", None)
        if callable(flush):
            try:
                flush(int(self._shutdown_timeout * 500))
            except Exception as exc:
                log.warning("exporter_child_flush_failed", error=describe(exc))
        self.shutdown(max(100, int((deadline - time.monotonic()) * 1000)))

    # --- SpanExporter ----------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """File spans by trace; never raises, never waits on the sink."""
        bad = 0
        error: Exception | None = None
        try:
            now = self._clock()
            buffer = self._buffer
            with self._lock:
                if self._closed:
                    # Shut down before its provider (an app reading the final stats): the spans
                    # the processor still hands over are counted, never lost without a word.
                    self._tally.drop("after_shutdown", len(spans))
                    return SpanExportResult.FAILURE
                for span in spans:
                    try:
                        buffer.add(span, now)
                    except Exception as exc:  # one bad span must not lose the rest of the batch
                        bad += 1
                        error = exc
                if spans:
                    # The processor hands spans over in the order they ended: the batch's last
                    # says which traces now have every child that ended within their grace.
                    try:
                        end = spans[-1].end_time
                    except Exception:  # counted by add() already, if it is a bad span
                        end = None
                    if isinstance(end, int) and end <= time.time_ns():
                        buffer.delivered(end)
                wake, buffer.wake = buffer.wake, False
            if bad:
                self._tally.error("export", bad)
            if wake:  # once per batch, not per trace
                self._wake.set()
        except Exception as exc:  # the application must never see our failure
            self._tally.error("export")
            bad, error = bad + 1, exc
        if bad:
            log.error("exporter_export_failed", spans=bad, error=describe(error) if error else None)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Complete every trace whose root span ended (skipping the grace window), then
        wait until the sink has everything queued. False when the deadline passed first (the
        flusher's pass goes on: what it completes is sent as usual)."""
        deadline = time.monotonic() + timeout_millis / 1000
        if getattr(self._in_pass, "active", False):  # a rule's filter flushing: it holds the pass
            return False
        try:
            served = False
            with self._forced:
                if not self._flusher_ended and self._flusher.is_alive():
                    self._force_asked += 1
                    ticket = self._force_asked
                    self._wake.set()
                    left = max(0.0, deadline - time.monotonic())
                    ended = self._forced.wait_for(
                        lambda: self._force_done >= ticket or self._flusher_ended, timeout=left
                    )
                    if not ended:
                        return False  # a slow filter, or a pass under way that holds on
                    served = self._force_done >= ticket
            # No flusher (shut down, or it ended before taking the ticket): this thread's pass.
            if not served and self._process(force=True, deadline=deadline) is None:
                return False
            return self._sender.wait_idle(deadline)
        except Exception as exc:
            self._tally.error("flush")
            log.error("exporter_flush_failed", error=describe(exc))
            return False

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Flush what can be flushed within the deadline (default ``shutdown_timeout_s``: the
        SDK calls this without one, and a down broker must not hold the app's exit), then stop
        both threads and close the sink; what is left is counted as dropped. A sink with a
        ``stop_retrying()`` (``embedded_sink``) is told first: it starts no retry of its own.

        From the deadline on nothing new is sent: the sender starts no send attempt (nor retry)
        once stopped, and a ``CelerySink`` refuses sends once closed. Closing waits for a send
        already under way, a ``CelerySink``'s for at most its connect plus publish timeouts; one
        that outlasts that (a broker answering each command slowly, a ``CallbackSink``) may land
        after this returns, and its runs then move from ``shutdown_unsent`` to sent.
        """
        timeout_s = self._shutdown_timeout
        if timeout_millis is not None:
            timeout_s = min(timeout_s, timeout_millis / 1000)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # A sink that retries inside its send (embedded_sink: a batch's transient failures, a
        # backoff apart) starts no retry from now on and ends a wait for one: the exit waited it out.
        call_optional(self._sink, "stop_retrying")
        try:
            self._process(force=True, deadline=deadline, closing=True)
            with self._lock:
                left, early = self._buffer.drain()
                # Held back by delay_s (also those the pass just completed): better early than never.
                delayed = [s for _, _, s in sorted(self._delayed, key=lambda d: d[:2])]
                self._delayed.clear()
            self._tally.drop("shutdown_incomplete_trace", left)
            self._tally.drop("shutdown_deadline", early)
            self._sender.release(sum(s.size for s in delayed))
            self._sender.put(delayed)
            self._sender.wait_idle(deadline)
        finally:
            self._stop.set()
            self._sender.stop()
            self._wake.set()
            self._flusher.join(max(0.0, deadline - time.monotonic()) + 0.1)
            self._sender.close(deadline)

    # --- completion -----------------------------------------------------------------------

    def tick(self) -> int:
        """Complete the traces that are due at the clock's current time; returns how many.

        The flusher thread calls this every ``flush_interval_s``; tests call it after moving
        an injected clock."""
        return self._process(force=False) or 0

    def _process(self, *, force: bool, deadline: float | None = None, closing: bool = False) -> int | None:
        """One completion pass; None when ``deadline`` passed before the flusher's own pass
        (a rule's filter may be slow, or never return) let this one start. ``closing``: the
        traces not completed by the deadline are dropped (``shutdown_deadline``)."""
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._process_lock.acquire(timeout=wait):
            if closing:
                self._abandon_pass()
            return None
        self._in_pass.active = True
        try:
            return self._process_pass(force, deadline if closing else None)
        finally:
            self._in_pass.active = False
            self._process_lock.release()

    def _process_pass(self, force: bool, stop_at: float | None = None) -> int:
        now = self._clock()
        delayed: list[Shipment] = []
        with self._lock:
            polled = self._buffer.poll(now, force=force)
            heap = self._delayed
            while heap and ((force and self._closed) or heap[0][0] <= now):
                delayed.append(heapq.heappop(heap)[2])
        sender = self._sender
        if polled.early:
            sender.release(polled.early_bytes, polled.early)
        if delayed:
            sender.release(sum(s.size for s in delayed))
            sender.put(delayed)
        # Completed one at a time, each dropped when done: its records become garbage at once
        # instead of surviving (and being promoted by the GC) until the end. What they ship is
        # queued a batch at a time: one lock and one wake of the sender per batch.
        # (Reversed in place, not copied: a copy left ``polled`` holding every trace of the
        # pass, all freed at its end, cold in the caches, and promoted by the GC meanwhile.)
        polled.traces.reverse()
        work = _Pass(polled.traces)
        del polled
        done = len(work.traces)
        with self._lock:
            self._pass = work
        try:
            while True:
                with self._lock:  # shutdown may abandon this pass (see _abandon_pass)
                    if work.done():
                        break
                    if stop_at is not None and time.monotonic() >= stop_at:
                        self._tally.drop("shutdown_deadline", len(work.traces))
                        done -= len(work.traces)
                        work.traces.clear()
                        break
                    entry = work.traces.pop()
                    work.busy = True
                fresh: list[Shipment] = []
                try:
                    self._complete(entry, now, fresh)
                except Exception as exc:  # one bad trace must not stop the others
                    self._tally.error("internal")
                    log.error("exporter_trace_failed", trace_id=entry.trace_id, error=describe(exc))
                del entry
                with self._lock:
                    work.busy = False
                    if work.abandoned:  # counted as dropped by the shutdown that gave up on it
                        continue
                    work.out += fresh
                    ready, work.out = (work.out, []) if len(work.out) >= self._batch_size else ([], work.out)
                sender.put(ready)
        finally:
            with self._lock:
                self._pass = None
                ready, work.out = work.out, []
        sender.put(ready)
        return done

    def _abandon_pass(self) -> None:
        """Shutdown's deadline came while the flusher's pass held on (a filter that does not
        return): the traces that pass still holds, the one in its hands included, are dropped
        now as ``shutdown_deadline``, the runs it read but did not queue as ``shutdown_unsent``,
        and it queues nothing more if it ever goes on."""
        with self._lock:
            work = self._pass
            if work is None or work.abandoned:
                return
            work.abandoned = True
            self._tally.drop("shutdown_deadline", len(work.traces) + work.busy)
            self._tally.drop("shutdown_unsent", len(work.out))
            work.traces.clear()
            work.out.clear()

    def _complete(self, entry: BufferedTrace, now: float, out: list[Shipment]) -> None:
        records, kinds = entry.spans, entry.kinds
        span_ids = {r.span_id for r in records}  # (the planner's too: built once)
        if len(span_ids) < len(records):
            records, kinds = self._first_of_each_id(records, kinds)
        runs = planned = plan_runs(records, kinds=kinds, exclude_under=entry.judge_ids or (), span_ids=span_ids)
        if entry.above_sent:  # a later part of a trace: a run that began in an earlier part is not whole
            runs = [run for run in planned if run[0].span_id not in entry.above_sent]
            if len(runs) < len(planned):
                self._tally.skip("partial_run", len(planned) - len(runs))
        with self._lock:
            self._traces_completed += 1
            self._runs_found += len(runs)
        if not runs:
            if not planned:
                self._tally.skip("no_target")
            return
        rules = entry.rules
        if rules is self._buffer.rules:  # every rule sampled it in (the common case): known already
            all_groups, filtered = self._all_groups, self._filtered
        else:
            all_groups, filtered = _scorer_groups(rules), any(rule.filter is not None for rule in rules)
        if len(runs) == 1 and not filtered:  # the common case: one run, one request per delay
            target, spans = runs[0]
            # A run is a subset of the trace: as many spans means all of them.
            size = entry.size if len(spans) == len(records) else shipment_size(spans)
            for delay, ids in all_groups:
                self._ship(Shipment(spans, target.span_id, ids, size), delay, now, out)
            return
        # Several runs: those bound for the same scorers (and delay) queue side by side sharing
        # the trace's spans, so the sender ships them as one request (the spans once).
        together: dict[tuple[float, tuple[str, ...]], list[Shipment]] = {}
        for target, spans in runs:
            if filtered:
                kept = self._filter(target.span_id, spans, rules, entry.trace_id)
                if not kept:
                    continue
                groups = _scorer_groups(kept)
            else:
                groups = all_groups
            size = entry.size if len(spans) == len(records) else shipment_size(spans)
            for delay, ids in groups:
                together.setdefault((delay, tuple(ids)), []).append(Shipment(spans, target.span_id, ids, size))
        for (delay, _), shipments in together.items():
            if len(shipments) > 1:
                # The runs' spans are disjoint: all of the trace's when they add up to it. A list
                # of the group's own either way: the sender tells groups apart by its identity
                # (two groups, e.g. the same scorers at two delays, may meet in one batch).
                owned = sum(len(s.spans) for s in shipments)
                trace = list(records) if owned == len(records) else [r for s in shipments for r in s.spans]
                for s in shipments:
                    s.trace, s.runs = trace, len(shipments)
            for s in shipments:
                self._ship(s, delay, now, out)

    def _first_of_each_id(
        self, records: list[SpanRecord], kinds: list[SpanKind]
    ) -> tuple[list[SpanRecord], list[SpanKind]]:
        """A trace's spans with each span id once, the first that came (as backfill reads them):
        spans sharing an id (an app's own IdGenerator, a span exported twice) made one target
        several runs, a request naming it twice, which the workers refused with every run of
        its message. The others are dropped as ``duplicate_span``."""
        seen: set[str] = set()
        kept: list[SpanRecord] = []
        kept_kinds: list[SpanKind] = []
        for record, kind in zip(records, kinds, strict=True):
            if record.span_id not in seen:
                seen.add(record.span_id)
                kept.append(record)
                kept_kinds.append(kind)
        self._tally.drop("duplicate_span", len(records) - len(kept))
        return kept, kept_kinds

    def _ship(self, shipment: Shipment, delay: float, now: float, out: list[Shipment]) -> None:
        if delay > 0:
            self._hold(shipment, now + delay)
        else:
            out.append(shipment)

    def _filter(
        self, target_span_id: str, spans: list[SpanRecord], rules: Sequence[ScoringRule], trace_id: str
    ) -> list[ScoringRule]:
        """The rules that keep this run: a rule's filter needs the run, read here (the
        application pays for it) as the worker will read it."""
        try:
            run = trace_to_run(spans, target_span_id)
        except TraceReadError as error:
            self._tally.error(error.reason)
            log.warning(
                "trace_unreadable",
                trace_id=trace_id,
                span_id=error.span_id,
                span_name=shown_id(error.span_name),
                attribute=shown_id(error.attribute),
                reason=error.reason,
            )
            return []
        except Exception as exc:  # a reader bug on content it did not foresee: this run only
            self._tally.error("read_failed")
            log.error("trace_read_crashed", trace_id=trace_id, span_id=target_span_id, error=describe(exc))
            return []
        with self._lock:
            self._runs_read_in_app += 1
        kept: list[ScoringRule] = []
        for rule in rules:
            if rule.filter is not None:
                try:
                    keep = bool(rule.filter(run))
                except APP_CODE_ERRORS as exc:
                    self._tally.error("filter")
                    # (the type only: the text of the app's own code may quote the run, even a
                    # network error's, as a moderation service's client failing on it)
                    log.warning("rule_filter_failed", span_id=target_span_id, error=type(exc).__name__)
                    continue
                if not keep:
                    continue
            kept.append(rule)
        if not kept:
            self._tally.skip("filtered_out")
        return kept

    def _hold(self, shipment: Shipment, due: float) -> None:
        with self._lock:
            if len(self._delayed) >= self._queue_size:
                self._tally.drop("delay_queue_full")
                return
            if not self._sender.hold_bytes(shipment.size):
                self._tally.drop("queue_bytes")
                return
            heapq.heappush(self._delayed, (due, next(self._seq), shipment))

    def _flush_loop(self) -> None:
        try:
            self._flush_passes()
        finally:
            with self._forced:  # a force_flush waiting on a ticket this thread will not take
                self._flusher_ended = True
                self._forced.notify_all()

    def _flush_passes(self) -> None:
        while not self._stop.is_set():
            # Not during a pass (tick/force_flush in another thread): one may have taken the
            # last traces and not yet queued their delayed runs.
            with self._process_lock, self._lock:
                idle = self._buffer.empty and not self._delayed
                self._buffer.sleeping = idle
            # Idle: nothing can become due or expire until export() files a trace (and wakes
            # us); a wake between the check and the wait leaves the event set.
            self._wake.wait(None if idle else self._interval)
            self._wake.clear()  # before the pass: a wake after this is seen by the next one
            if self._stop.is_set():
                return
            with self._lock:
                asked = self._force_asked
            try:
                self._process(force=asked > self._force_done)
            except Exception as exc:
                log.error("exporter_flusher_failed", error=describe(exc))
            finally:
                if asked > self._force_done:
                    with self._forced:
                        self._force_done = asked
                        self._forced.notify_all()

    # --- observability --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters since start.

        ``spans_seen``; ``traces_buffered`` and ``buffer_bytes`` (now; the records' approximate
        JSON size, bounded by ``max_buffer_bytes``); ``traces_completed`` (taken after their
        root span ended, or at ``max_trace_age_s`` with an ended agent span; sampled-in only);
        ``runs_found`` (runs to score found in them);
        ``runs_read_in_app`` (of those, read into a ``TracedRun`` here because a rule has a
        filter; every run travels as span records and the worker reads it); ``runs_enqueued``
        and ``runs_sent`` (one per run and distinct ``delay_s``); ``batches_sent``;
        ``send_failures`` (sink attempts that raised, each retried); ``queue_depth`` (waiting
        for or in the sink); ``queue_bytes`` (approximate JSON size of what waits, bounded by
        ``max_queue_bytes``); ``delayed`` (held by ``delay_s``); ``dropped`` by reason: traces
        (``max_traces`` and ``max_buffer_bytes``: the buffer was full of unfinished traces, or
        full and the hand-off queue too,
        ``max_trace_age``, ``shutdown_incomplete_trace``, ``shutdown_deadline``: complete but
        not yet read when shutdown's deadline came, e.g. behind a slow filter), spans
        (``max_spans_per_trace``, ``no_context``: none, or an invalid one, an id of 0 or too
        wide, ``duplicate_span``: its id already in its trace) and runs (``queue_full`` and
        ``queue_bytes``: the hand-off queue's run and byte bounds, ``delay_queue_full``,
        ``shutdown_unsent``, ``send_failed``, ``too_large``: alone over the sink's
        ``max_payload_bytes``); ``skipped`` by reason (``sampled_out``, ``loop_guard``,
        ``no_target``, ``filtered_out``, ``partial_run``: a run that began in a part of its
        trace handed over before); ``errors`` by reason
        (``TraceReadError.reason`` values for runs read here — a run the worker cannot read
        becomes error score records there — ``read_failed`` for a run whose reading crashed
        (a bug in a reader: the worker names it alike), and ``filter``, ``export``, ``flush``, ``send``,
        ``internal``; ``text_replaced``: runs sent with U+FFFD in place of text no JSON can
        hold, a lone surrogate in an attribute, or an object kombu decodes as its JSON text)."""
        depth, queued = self._sender.depth()
        dropped, skipped, errors = self._tally.snapshot()
        with self._lock:
            out: dict[str, Any] = {
                "spans_seen": self._buffer.spans_seen,
                "traces_buffered": len(self._buffer),
                "buffer_bytes": self._buffer.bytes,
                "traces_completed": self._traces_completed,
                "runs_found": self._runs_found,
                "runs_read_in_app": self._runs_read_in_app,
            }
            delayed = len(self._delayed)
        counters = self._sender.counters()
        out.update(
            runs_enqueued=counters["runs_enqueued"],
            runs_sent=counters["runs_sent"],
            batches_sent=counters["batches_sent"],
            send_failures=counters["send_failures"],
            queue_depth=depth,
            queue_bytes=queued,
            delayed=delayed,
            dropped=dropped,
            skipped=skipped,
            errors=errors,
        )
        return out


def _finalize_at_child_exit(exporter: ScoringSpanExporter) -> None:
    """multiprocessing's after-fork callback, in the child: flush at its exit (a finalizer)."""
    import multiprocessing.util as util

    util.Finalize(exporter, exporter._at_child_exit, exitpriority=10)
