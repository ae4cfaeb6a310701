"""``Sender``: the hand-off queue between completed traces and the sink, and the thread that
drains it.

The queue is bounded in runs (``queue_size``) and in bytes (``max_queue_bytes``, the records'
approximate JSON size; with the broker down, large traces cannot grow the application past it)
and drops the newest. The sender takes up to ``batch_size`` runs and about ``max_batch_bytes``
at once (what is in flight stays one batch's worth), builds their requests — the runs of one
trace that queue side by side for the same scorers become one request, the trace's spans
shipped once with every run's target — and hands them to the sink; a sink with a message cap
(``EncodedSink``, the workers' ``TRACESCORE_MAX_PAYLOAD_BYTES``) gets each message cut under it
by the requests' encoded size (``tracing.queue.RequestCutter``): a request over it is split run
by run, each with its own spans only, and a run over it alone is dropped (``too_large``) while
its neighbours go on. A failed send is
retried with jittered exponential backoff until it succeeds or the sender stops; after ``stop``
no attempt (nor retry) starts, and ``close`` counts what is left as dropped.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from tracing._errors import QueueKeyError
from tracing._records import compact
from tracing._run import SpanRecord
from tracing.capture._sinks import EncodedSink, Sink
from tracing.capture._tally import Tally
from tracing.queue import RequestCutter, RunTooLarge, ScoreBatch, ScoreRequest, spans_request

__all__ = ["APP_CODE_ERRORS", "Sender", "SenderLimits", "Shipment", "call_optional", "describe", "shipment_size"]

log = structlog.get_logger("tracescore.exporter")

# What the app's own code run on the exporter's threads (a CallbackSink's function, a rule's
# filter) may raise and the thread lives on: a SystemExit (a library's command-line error path)
# ended the thread without a word, and nothing was sent, or handed off, again.
APP_CODE_ERRORS = (Exception, SystemExit)

# While sends keep failing with the same error, how often that is logged again.
_FAILURE_LOG_INTERVAL_S = 60.0


def call_optional(sink: object, method: str) -> None:
    """``sink.<method>()`` when the sink has it (``close``, ``stop_retrying``: neither is part of
    ``Sink``); a failure is logged (``exporter_sink_<method>_failed``), never raised: the
    exporter is shutting down and goes on."""
    call = getattr(sink, method, None)
    if callable(call):
        try:
            call()
        except Exception as exc:
            log.warning(f"exporter_sink_{method}_failed", error=describe(exc))


def describe(exc: BaseException) -> str:
    """An error for the application's log, without agent content: the exception's type only,
    as its text may quote span attributes (a TraceReadError quotes the bad JSON, a pydantic
    error its input) — except network errors, whose text says which broker address failed and
    how, and a misplaced queue key, named by its text. Only for errors of the send: a rule's
    filter, the app's own code, is logged by its type alone."""
    if isinstance(exc, QueueKeyError):
        return str(exc)
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("kombu", "redis", "amqp"):
        return repr(exc)
    return type(exc).__name__


@dataclass(slots=True)
class Shipment:
    """One run waiting in the queue: the sender builds its request (fewer objects queued).

    The runs of one trace bound for the same scorers are queued side by side, sharing one
    ``trace`` list (their spans together; None for a run alone) and knowing how many they are
    (``runs``): the sender ships them as one request when they are taken together."""

    spans: list[SpanRecord]  # the run's own records
    target_span_id: str
    scorer_ids: list[str]
    size: int  # the run's spans' approximate JSON size (compacted records)
    enqueued_at: float | None = None
    trace: list[SpanRecord] | None = None
    runs: int = 1


@dataclass(frozen=True, slots=True)
class SenderLimits:
    queue_size: int = 10_000
    max_queue_bytes: int = 64 * 1024 * 1024
    batch_size: int = 50
    max_batch_bytes: int = 4 * 1024 * 1024
    retry_initial_s: float = 0.1
    retry_max_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("queue_size", "max_queue_bytes", "batch_size", "max_batch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("retry_initial_s", "retry_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(slots=True)
class _Chunk:
    """What the sink gets at once: requests, their JSON when the sink takes it encoded, how many
    runs they carry, and the runs before them that were dropped, by reason."""

    requests: list[ScoreRequest]
    encoded: list[str] | None
    rejected: Counter[str]
    runs: int = 0


class Sender:
    def __init__(self, sink: Sink, limits: SenderLimits, tally: Tally) -> None:
        self._sink = sink
        self.limits = limits
        self._tally = tally
        # Room for one message when the sink has a cap, else None (an in-process sink: nothing
        # is encoded, batches are cut by approximate size only).
        self._max_payload: int | None = sink.max_payload_bytes if isinstance(sink, EncodedSink) else None
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._pending: deque[Shipment] = deque()
        # Approximate JSON size of what waits: pending, plus what the owner holds against the
        # bound (traces completed early, runs held back by delay_s).
        self._queued_bytes = 0
        self._held = 0  # runs held by the owner that count against queue_size
        self._inflight = 0
        self._stop = threading.Event()
        self._gave_up = False  # close() counted what is left: the thread no longer does
        self.runs_enqueued = 0
        self.runs_sent = 0
        self.batches_sent = 0
        self.send_failures = 0
        # The failures since the last send that went through, the last error logged of them and
        # when: each new fault is logged when it starts, not at the process's 100th failure.
        self._streak = 0
        self._streak_error: str | None = None
        self._streak_logged = 0.0
        self._thread = threading.Thread(target=self._run, name="tracescore-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # --- the queue -------------------------------------------------------------------------

    def _full(self, size: int, runs: int = 1) -> str | None:
        if len(self._pending) + self._held + runs > self.limits.queue_size:
            return "queue_full"
        if self._queued_bytes + size > self.limits.max_queue_bytes:
            return "queue_bytes"
        return None

    def reserve(self, size: int) -> str | None:
        """Hold room for one run of ``size`` bytes (a trace completed early, queued later);
        returns why there is none, or None."""
        with self._lock:
            reason = self._full(size)
            if reason is None:
                self._held += 1
                self._queued_bytes += size
            return reason

    def hold_bytes(self, size: int) -> bool:
        """Hold ``size`` bytes against the byte bound only (a run held back by ``delay_s``)."""
        with self._lock:
            if self._queued_bytes + size > self.limits.max_queue_bytes:
                return False
            self._queued_bytes += size
            return True

    def release(self, size: int, runs: int = 0) -> None:
        with self._lock:
            self._queued_bytes -= size
            self._held -= runs

    def put(self, shipments: Sequence[Shipment]) -> None:
        """Queue ``shipments`` (stamped now); what does not fit is dropped and counted: the
        newest first by count, then each one over the byte bound (a smaller one after it may
        still fit)."""
        if not shipments:
            return
        stamp = time.time()
        with self._lock:
            if self._stop.is_set():  # stopped: nothing may be sent any more
                self._tally.drop("shutdown_unsent", len(shipments))
                return
            room = self.limits.queue_size - len(self._pending) - self._held
            if room < len(shipments):
                self._tally.drop("queue_full", len(shipments) - max(room, 0))
                shipments = shipments[: max(room, 0)]
            kept = 0
            for shipment in shipments:
                if self._queued_bytes + shipment.size > self.limits.max_queue_bytes:
                    self._tally.drop("queue_bytes")
                    continue
                if shipment.enqueued_at is None:
                    shipment.enqueued_at = stamp
                self._pending.append(shipment)
                self._queued_bytes += shipment.size
                kept += 1
            if kept:
                self.runs_enqueued += kept
                self._has_work.notify()

    def is_alive(self) -> bool:
        """Whether the sending thread still runs (the only thread that calls the sink)."""
        return self._thread.is_alive()

    def depth(self) -> tuple[int, int]:
        """(runs waiting for or in the sink, approximate bytes held against the bound)."""
        with self._lock:
            return len(self._pending) + self._held + self._inflight, self._queued_bytes

    def wait_idle(self, deadline: float) -> bool:
        """Wait until nothing waits or is in the sink (True), or ``deadline`` (monotonic) passed."""
        with self._idle:
            while self._pending or self._held or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    def stop(self) -> None:
        """No new send attempt (nor retry) starts from now on."""
        with self._lock:
            self._stop.set()
            self._has_work.notify_all()

    def close(self, deadline: float) -> None:
        """After ``stop``: wait for the thread until ``deadline``, close the sink (which ends a
        send under way), and count what is still queued or in the sink as dropped."""
        self._thread.join(max(0.0, deadline - time.monotonic()) + 0.1)
        call_optional(self._sink, "close")
        self._thread.join(0.1)  # a send the close just ended: let the thread count it
        with self._lock:
            unsent = len(self._pending) + self._inflight
            self._pending.clear()
            self._queued_bytes = 0
            self._held = 0
            self._gave_up = True
            self._tally.drop("shutdown_unsent", unsent)
        if self._thread.is_alive():
            log.warning("exporter_sink_still_busy", runs=self._inflight)

    # --- the thread ------------------------------------------------------------------------

    def _take(self) -> list[Shipment]:
        with self._lock:
            while not self._pending and not self._stop.is_set():
                self._has_work.wait()
            if self._stop.is_set():
                return []
            pending = self._pending
            batch: list[Shipment] = []
            size = 0
            while pending and len(batch) < self.limits.batch_size:
                n = pending[0].size
                if batch and size + n > self.limits.max_batch_bytes:
                    break
                batch.append(pending.popleft())
                size += n
            self._queued_bytes -= size
            self._inflight += len(batch)  # in the same step: wait_idle never sees neither
            return batch

    def _settle(self, runs: int, *, sent: bool = False, reason: str = "shutdown_unsent") -> None:
        with self._lock:
            self._inflight -= runs
            if sent:
                self.runs_sent += runs
                self.batches_sent += 1
                if self._gave_up:  # counted as unsent when shutdown gave up on it: it landed
                    self._tally.undrop("shutdown_unsent", runs)
            elif not self._gave_up:
                self._tally.drop(reason, runs)
            self._idle.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._take()
            settled = 0
            try:
                for chunk in self._chunks(batch):
                    for reason, runs in chunk.rejected.items():
                        settled += runs
                        self._settle(runs, reason=reason)
                    if not chunk.requests:
                        continue
                    sent, reason = False, "shutdown_unsent"
                    try:
                        sent = self._deliver(chunk)
                    except _Refused:
                        reason = "send_failed"
                    finally:
                        settled += chunk.runs
                        self._settle(chunk.runs, sent=sent, reason=reason)
            except Exception as exc:  # a request that cannot be built: the sender must live on
                log.error("exporter_sender_failed", error=describe(exc))
                self._tally.error("send")
                self._settle(len(batch) - settled, reason="send_failed")

    def _chunks(self, batch: list[Shipment]) -> Iterator[_Chunk]:
        """The batch's requests in chunks of about ``max_batch_bytes`` (spans travel with every
        message the model saw, which a worker's payload limit caps), and under the sink's
        message cap when it has one (each request encoded once, here)."""
        if self._max_payload is not None:
            yield from self._encoded_chunks(batch, self._max_payload)
            return
        limit = self.limits.max_batch_bytes
        chunk = _Chunk([], None, Counter())
        size = 0
        for request, runs in _requests(batch):
            n = sum(s.size for s in runs)
            if chunk.requests and size + n > limit:
                yield chunk
                chunk, size = _Chunk([], None, Counter()), 0
            chunk.requests.append(request)
            chunk.runs += len(runs)
            size += n
        if chunk.requests:
            yield chunk

    def _encoded_chunks(self, batch: list[Shipment], max_payload: int) -> Iterator[_Chunk]:
        cutter = RequestCutter(max_payload, max_bytes=self.limits.max_batch_bytes)
        try:
            yield from self._cut(batch, cutter)
        finally:
            self._tally.error("text_replaced", cutter.runs_text_replaced)

    def _cut(self, batch: list[Shipment], cutter: RequestCutter) -> Iterator[_Chunk]:
        rejected: Counter[str] = Counter()
        for request, runs in _requests(batch):
            try:
                closed = cutter.add(request)
            except RunTooLarge as exc:
                if len(runs) == 1:
                    _too_large(exc)
                    rejected["too_large"] += 1
                    continue
                # The trace's runs together are too large for one message: each run goes on
                # its own, with its own spans (as each would alone), and only a run too large
                # by itself is dropped.
                closed = []
                for s in runs:
                    one = spans_request(s.spans, [s.target_span_id], s.scorer_ids, s.enqueued_at)
                    try:
                        closed += cutter.add(one)
                    except RunTooLarge as alone:
                        _too_large(alone)
                        rejected["too_large"] += 1
            except Exception as exc:
                # A value no encoder writes (a span built outside the SDK, which refuses such
                # attributes): this trace's runs go, not the others sharing its message.
                log.error("exporter_run_unencodable", trace_id=request.trace_id, runs=len(runs), error=describe(exc))
                rejected["unencodable"] += len(runs)
                continue
            for chunk in closed:
                yield _Chunk(chunk.requests, chunk.encoded, rejected, chunk.runs)
                rejected = Counter()
        last = cutter.take()
        if last.requests or rejected:
            yield _Chunk(last.requests, last.encoded, rejected, last.runs)

    def _deliver(self, chunk: _Chunk) -> bool:
        """Send one chunk, retrying until it is sent (True) or the sender stops (False)."""
        batch = ScoreBatch.model_construct(batch_id=uuid.uuid4().hex, requests=chunk.requests)
        sink = self._sink
        delay = self.limits.retry_initial_s
        while not self._stop.is_set():  # checked before every attempt: no send after stop
            try:
                if chunk.encoded is not None and isinstance(sink, EncodedSink):
                    sink.send_encoded(batch, chunk.encoded)
                else:
                    sink.send(batch)
            except (ValueError, TypeError) as exc:
                # The sink refuses this batch itself (too large for its cap, not encodable):
                # retrying cannot help, and every batch queued behind it would wait forever.
                log.error("sink_refused_batch", error=describe(exc), runs=chunk.runs)
                self._tally.error("send")
                raise _Refused from None
            except APP_CODE_ERRORS as exc:
                self._failed(describe(exc), chunk.runs)
                # Jitter so several exporters do not hammer a recovering broker in step.
                self._stop.wait(delay * (0.5 + random.random() / 2))
                delay = min(self.limits.retry_max_s, delay * 2)
                continue
            self._sent()
            return True
        return False

    def _failed(self, error: str, runs: int) -> None:
        """Count a failed send; log it when it starts a run of failures, when the error is not
        the one logged last, and else once a minute (retries come every few seconds)."""
        now = time.monotonic()
        with self._lock:
            self.send_failures += 1
            self._streak += 1
            due = (
                self._streak == 1 or error != self._streak_error or now - self._streak_logged >= _FAILURE_LOG_INTERVAL_S
            )
            if due:
                self._streak_error, self._streak_logged = error, now
            failures, streak = self.send_failures, self._streak
        if due:
            log.warning("sink_send_failed", error=error, runs=runs, failures=failures, in_a_row=streak)

    def _sent(self) -> None:
        with self._lock:
            streak, self._streak, self._streak_error = self._streak, 0, None
        if streak:
            log.info("sink_send_recovered", after_failures=streak)

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {
                "runs_enqueued": self.runs_enqueued,
                "runs_sent": self.runs_sent,
                "batches_sent": self.batches_sent,
                "send_failures": self.send_failures,
            }


class _Refused(Exception):
    """The sink refused a batch for good (counted as ``send_failed``; the sender goes on)."""


def _too_large(exc: RunTooLarge) -> None:
    # Only ids and sizes: the spans are the agent's content.
    log.warning(
        "exporter_run_too_large",
        trace_id=exc.trace_id,
        span_id=exc.span_id,
        bytes=exc.size,
        max_payload_bytes=exc.max_payload_bytes,
    )


def _requests(batch: list[Shipment]) -> Iterator[tuple[ScoreRequest, list[Shipment]]]:
    """Each request of ``batch`` with the runs it carries: the runs of one trace side by side
    with the same scorers go together (the trace's spans once when all of them are here, else
    the spans of those that are), every other run alone."""
    i, n = 0, len(batch)
    while i < n:
        first = batch[i]
        j = i + 1
        trace = first.trace
        if trace is not None:
            # At most the group's own runs (``first.runs``): a request names each target once.
            ids, end = first.scorer_ids, min(n, i + first.runs)
            while j < end and batch[j].trace is trace and (batch[j].scorer_ids is ids or batch[j].scorer_ids == ids):
                j += 1
        runs = batch[i:j]
        if len(runs) == 1:
            spans = first.spans
        elif trace is not None and len(runs) == first.runs:
            spans = trace
        else:
            spans = [r for s in runs for r in s.spans]
        yield spans_request(spans, [s.target_span_id for s in runs], first.scorer_ids, first.enqueued_at), runs
        i = j


def shipment_size(spans: Sequence[SpanRecord]) -> int:
    """The approximate JSON size of ``spans`` (compacted in place: idempotent)."""
    return sum(compact(r) for r in spans)
