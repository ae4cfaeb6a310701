"""``TraceBuffer``: spans filed by trace until the trace is complete. Pure: no threads, no clock
of its own (every call that needs the time takes ``now``), so tests drive it step by step.

Each span becomes a compacted ``SpanRecord`` when it is filed (the SDK span is then freed with
the processor's batch). A trace is decided on its first span if no rule's sample takes it, on
any span if that span makes it tracescore's own (the loop guard: ``tracing.read``'s rules,
applied span by span), and its later spans are ignored at once. A trace is complete once
every span that ended within ``grace_s`` of its local root has arrived (children that end
after their root still make it), and ``poll(now)`` hands it over.

When that is depends on the span processor, which holds ended spans and hands them over in
batches (``BatchSpanProcessor``: every ``schedule_delay``, 5 s by default), in the order they
ended. So the buffer keeps the end time of the latest span handed over (``delivered``): every
span that ended before it has arrived, and a trace whose root ended ``grace_s`` before it is
complete, once ``grace_s`` has also passed since its root arrived (never sooner than that: a
root given a past end time, or a wall clock stepped back, must not skip the grace). A quiet
app hands nothing over to move the mark: there a trace is complete ``grace_s +
processor_delay_s`` after its root arrived, by when the processor has handed over whatever
ended within the grace. (Timing the grace from the root's arrival alone lost a child that ended
after it to the processor's next batch, 5 s later: a ``late_span``.) The order holds for one
``BatchSpanProcessor`` fed by ``on_end``; with anything else in front the mark may run ahead,
and a trace then goes ``grace_s`` after its root arrived, as before.

Bounds (issue 10): ``max_traces`` traces and ``max_buffer_bytes`` of records (approximate JSON
size), ``max_spans_per_trace`` spans each (the oldest span goes), ``max_trace_age_s`` without an
ended root. When full, the oldest trace whose root ended is completed early (it is deliverable,
if the hand-off queue has room for it), else the oldest with an ended agent span (a session's
finished run), else the oldest unfinished trace is dropped, and with it its later spans: a
dropped trace never comes back as a partial run.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

from tracing._formats import NO_ENVIRONMENT, SpanKind, classify
from tracing._records import build_record, compact, key_plan, origin_environment, service_name
from tracing._rules import ScoringRule, sampled
from tracing._run import MAX_TIME_NS, SpanRecord
from tracing._sdk import span_context, span_values
from tracing.capture._tally import Tally
from tracing.read import is_judge, own_origin, takes_trace

__all__ = ["BufferLimits", "BufferedTrace", "Polled", "TraceBuffer"]

# Reserves room for ``size`` bytes in the hand-off queue for a trace completed early; returns
# why there is none ("queue_full", "queue_bytes") or None once reserved.
Reserve = Callable[[int], "str | None"]


@dataclass(frozen=True, slots=True)
class BufferLimits:
    max_traces: int = 2048
    max_spans_per_trace: int = 512
    max_buffer_bytes: int = 64 * 1024 * 1024
    max_trace_age_s: float = 300.0
    grace_s: float = 2.0
    # How long the span processor may hold an ended span (BatchSpanProcessor's schedule delay).
    processor_delay_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_traces", "max_spans_per_trace", "max_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_trace_age_s <= 0:
            raise ValueError(f"max_trace_age_s must be > 0, got {self.max_trace_age_s}")
        for name in ("grace_s", "processor_delay_s"):
            if not getattr(self, name) >= 0:  # also refuses NaN (inf: only force completes)
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(slots=True)
class BufferedTrace:
    trace_id: str  # hex
    first_seen: float
    rules: list[ScoringRule]  # the rules whose sample took it
    spans: list[SpanRecord] = field(default_factory=list)
    kinds: list[SpanKind] = field(default_factory=list)  # each span's, classified when filed
    size: int = 0  # the records' approximate JSON size
    # When its root ended (span time, ns); when it may be complete at the soonest (the clock's
    # time: grace_s after the root arrived), and at the latest, in a quiet app (grace_s +
    # processor_delay_s after).
    root_end_ns: int | None = None
    ready: float = 0.0
    due: float | None = None
    judge_ids: set[str] | None = None  # judge spans in it: what is under them is not scored
    # An agent span of it ended (its root not yet): handed off at max_trace_age_s, not dropped.
    agent_ended: bool = False
    # Its root is the trace's own (no parent at all): no other local root of the trace can come.
    whole: bool = False
    # A later part of a trace partly handed over: its spans above what went before (found when
    # it is handed over). A run whose target is one of them would be scored without what went
    # before: it is not (``partial_run``).
    above_sent: set[str] | None = None


@dataclass(slots=True)
class Polled:
    """What ``poll`` hands over: complete traces, oldest first, of which ``early`` (at the
    front) were completed early from a full buffer and hold ``early_bytes`` reserved in the
    hand-off queue (the caller releases them as it queues what they ship)."""

    traces: list[BufferedTrace]
    early: int = 0
    early_bytes: int = 0


# Span ids of handed-over traces remembered at most (about 100 bytes each).
_SENT_IDS_KEPT = 131_072

# What was handed over of a trace: its spans' ids and their parents' (empty when the trace's
# own root went with them: whatever of it comes later is late).
Sent = tuple[set[str], set[str]]
_WHOLE: Sent = (set(), set())  # (never filled: shared by every trace whose own root went)


# The largest ids W3C trace context writes (32 and 16 hex digits).
_MAX_TRACE_ID = 2**128 - 1
_MAX_SPAN_ID = 2**64 - 1


def _hex(context: SpanContext | None) -> str | None:
    """A local parent's span id as records write it (None: no parent, or a remote one)."""
    return None if context is None or context[2] else "%016x" % context[1]  # noqa: UP031


def _above(spans: list[SpanRecord], parents: set[str]) -> set[str] | None:
    """The ids of ``spans`` that are parents of spans handed over before (``parents``), with
    their ancestors among ``spans`` (None: none)."""
    above = {r.span_id for r in spans if r.span_id in parents}
    if not above:
        return None
    up = {r.span_id: r.parent_span_id for r in spans}
    for span_id in list(above):
        parent = up.get(span_id)
        while parent is not None and parent in up and parent not in above:
            above.add(parent)
            parent = up[parent]
    return above


def _under(parent: SpanContext | None, sent: Sent) -> bool:
    """Whether a span whose parent is ``parent`` belongs under spans already handed over."""
    ids = sent[0]
    return not ids or _hex(parent) in ids


class TraceBuffer:
    """Not thread-safe: the exporter calls it under its lock."""

    def __init__(
        self, rules: Sequence[ScoringRule], limits: BufferLimits, tally: Tally, reserve: Reserve | None = None
    ) -> None:
        # A trace every rule samples in holds this very list: the exporter tells it by identity
        # and ships it with the scorer groups it worked out once.
        self.rules = list(rules)
        self._all_sampled = all(r.sample_rate >= 1.0 for r in self.rules)
        self.limits = limits
        self._tally = tally
        self._reserve: Reserve = reserve or (lambda size: None)
        self._traces: OrderedDict[int, BufferedTrace] = OrderedDict()
        # Buffered traces whose root span ended, oldest first (completed early when full).
        self._due_order: OrderedDict[int, None] = OrderedDict()
        # Taken from a full buffer that way, waiting for the next poll.
        self._early: list[BufferedTrace] = []
        # Traces the loop guard excluded whole: their later spans are ignored at once.
        self._guarded: OrderedDict[int, None] = OrderedDict()
        # Traces no rule's sample takes, or dropped whole (a later span, e.g. the root, must
        # not start a fragment that would be scored as the run).
        self._ignored: OrderedDict[int, None] = OrderedDict()
        # Traces already handed over (bounded like _ignored), with the span ids they carried: a
        # straggler under one of those spans is a late_span drop; any other span of the trace
        # (another local root of it: a second request to this service, a session's next run)
        # starts a unit of its own.
        self._sent: OrderedDict[int, Sent] = OrderedDict()
        self._sent_ids = 0
        self._sent_max = max(4 * limits.max_traces, 16_384)
        self.bytes = 0  # approximate JSON size of the buffered records
        # The end time (span time, ns) of the latest span the processor handed over: see delivered().
        self._delivered_ns = 0
        self._grace_ns = int(limits.grace_s * 1e9) if math.isfinite(limits.grace_s) else None
        self.spans_seen = 0
        # Set when a poll is worth doing at once (a trace due with grace_s == 0, a trace taken
        # from a full buffer, a new trace while ``sleeping``); the caller clears it.
        self.wake = False
        # Set by the caller while it waits with nothing buffered: a new trace then sets ``wake``.
        self.sleeping = False
        # The last (scope, resource) pair seen and what it says: the spans of one tracer share
        # these objects, so each pair is read once.
        self._seen: tuple[object, object] = (None, None)
        self._seen_own = False
        self._seen_service: str | None = None
        self._seen_scope_name: str | None = None
        self._seen_environment: tuple[Any, ...] = NO_ENVIRONMENT
        self._last_parent: tuple[int, str] = (0, "")  # the last parent span id written out, in hex

    def __len__(self) -> int:
        return len(self._traces)

    @property
    def empty(self) -> bool:
        return not self._traces and not self._early

    # --- filing ----------------------------------------------------------------------------

    def add(self, span: ReadableSpan, now: float) -> None:
        """File one span (raises only on a span the SDK itself would not produce)."""
        self.spans_seen += 1
        ctx = span_context(span)
        # SpanContext is a tuple (trace_id, span_id, ...): no property call. An id of 0 or past
        # its width (an IdGenerator of the app's own) is no context either: written out, it got
        # the span's whole message refused by the workers, other traces' runs with it, and a
        # trace id of 0 merged every such request into one trace.
        if ctx is None or not (0 < ctx[0] <= _MAX_TRACE_ID and 0 < ctx[1] <= _MAX_SPAN_ID):
            self._tally.drop("no_context")
            return
        tid = ctx[0]
        if tid in self._guarded or tid in self._ignored:
            return
        values = span_values(span)
        if values is None:
            self._tally.drop("no_context")
            return
        _, parent, attrs, name, otel_kind, start, end, status, events, scope, resource = values
        if parent is not None and not 0 < parent[1] <= _MAX_SPAN_ID:
            parent = None  # an invalid parent is none, as the SDK reads it when a span starts
        sent = self._sent.get(tid)
        if sent is not None and _under(parent, sent):
            # It ended after the part of its trace it belongs to was handed over: as a rootless
            # fragment it would only hold a slot until max_trace_age. Counted per span.
            self._tally.drop("late_span")
            return
        # (``otlp_time``'s bounds, compared here: two calls a span less.)
        if (start is not None and not 0 <= start <= MAX_TIME_NS) or (end is not None and not 0 <= end <= MAX_TIME_NS):
            # The app's own OTLP exporter cannot send it either; shipped, its score's write-back
            # would have no time of its own.
            raise ValueError("a span time outside 0 .. 2^64-1 ns, which OTLP cannot carry")
        is_root = parent is None or parent[2]  # no parent, or a remote one: a local root
        plan = key_plan(attrs)
        judge = plan[1] and is_judge(attrs)
        if scope is not self._seen[0] or resource is not self._seen[1]:
            self._note_origin(scope, resource)
        if takes_trace(self._seen_own, judge, is_root):
            self._guard(tid)
            return
        entry = self._traces.get(tid)
        rules: list[ScoringRule] = []  # a new trace's
        if entry is None:
            trace_id = "%032x" % tid  # noqa: UP031  (twice as fast as format())
            sampled_in = self._rules_for(tid, trace_id)
            if sampled_in is None:
                return
            rules = sampled_in
        else:
            trace_id = entry.trace_id
        kind = classify(name, attrs)
        # A parent's id, written out last (%-formatting: twice as fast as format() for this),
        # is most often the next span's parent too (a sibling), or its own id (spans end
        # before their parent): written once for all of them.
        last_id, last_hex = self._last_parent
        span_hex = last_hex if ctx[1] == last_id else "%016x" % ctx[1]  # noqa: UP031
        if parent is None:
            parent_hex = None
        elif parent[1] == last_id:
            parent_hex = last_hex
        else:
            parent_hex = "%016x" % parent[1]  # noqa: UP031
            self._last_parent = (parent[1], parent_hex)
        # Built before anything is made room for: a span it refuses (a value nested too deep)
        # costs no other trace and no span of its own trace.
        record, size = build_record(
            span_hex,
            parent_hex,
            name,
            trace_id,
            attrs,
            otel_kind,
            start,
            end,
            status,
            events,
            self._seen_service,
            self._seen_scope_name,
            self._seen_environment,
            plan,
        )
        if entry is None:
            entry = self._open(tid, now, trace_id, rules)
        limits = self.limits
        if len(entry.spans) >= limits.max_spans_per_trace:
            dropped = compact(entry.spans[0])  # its size (compacted already: nothing changes)
            entry.size -= dropped
            self.bytes -= dropped
            del entry.spans[0], entry.kinds[0]  # O(n), but only over a bound (rare, n small)
            self._tally.drop("max_spans_per_trace")
        entry.spans.append(record)
        entry.kinds.append(kind)
        entry.size += size
        self.bytes += size
        if judge:
            if entry.judge_ids is None:
                entry.judge_ids = set()
            entry.judge_ids.add(record.span_id)
        # The root's end completes a trace, not an agent span's: a sub-agent (or the first of
        # two agents) ends while its caller still works, and an agent under a judge's span
        # ends before the span that marks it as the judge's own traffic.
        if is_root:
            entry.whole = parent is None
            if entry.due is None:
                self._due_order[tid] = None
            entry.root_end_ns = end
            if limits.grace_s:
                entry.ready = now + limits.grace_s
                entry.due = entry.ready + limits.processor_delay_s
            else:  # no grace: what ended before the root came with it or before
                entry.due = now
                self.wake = True
        elif kind == "agent":
            entry.agent_ended = True
        if self.bytes > limits.max_buffer_bytes:  # last: this trace may be the one to go
            if entry.size > limits.max_buffer_bytes:  # alone over the bound: it goes, not the others
                self._pop(tid)
                self._ignore(tid)
                self._tally.drop("max_buffer_bytes")
            while self.bytes > limits.max_buffer_bytes and self._traces:
                self._make_room("max_buffer_bytes")

    def _note_origin(self, scope: InstrumentationScope | None, resource: Resource | None) -> None:
        self._seen = (scope, resource)
        self._seen_service = service_name(resource)
        self._seen_environment = origin_environment(resource)
        self._seen_scope_name = scope.name if scope is not None else None
        self._seen_own = own_origin(self._seen_scope_name, self._seen_service)

    def _rules_for(self, tid: int, trace_id: str) -> list[ScoringRule] | None:
        """The rules that sample a new trace in (None: none does; it is ignored from now on)."""
        if self._all_sampled:
            return self.rules
        rules = [r for r in self.rules if sampled(trace_id, r.sample_rate)]
        if not rules:
            self._tally.skip("sampled_out")
            self._ignore(tid)
            return None
        return rules

    def _open(self, tid: int, now: float, trace_id: str, rules: list[ScoringRule]) -> BufferedTrace:
        if len(self._traces) >= self.limits.max_traces:
            self._make_room("max_traces")
        entry = self._traces[tid] = BufferedTrace(trace_id, now, rules)

        if self.sleeping:
            self.sleeping = False
            self.wake = True
        return entry

    def _make_room(self, reason: str) -> None:
        """Full (``reason``): complete the oldest trace whose root ended early, else the oldest
        one with an ended agent span, else drop the oldest unfinished trace."""
        while self._due_order:
            if self._hand_over_early(next(iter(self._due_order)), reason):
                return
        # O(traces), only when full and no root has ended: a long-lived root (see poll).
        ended = next((t for t, e in self._traces.items() if e.agent_ended), None)
        if ended is not None and self._hand_over_early(ended, reason):
            return
        tid = next(iter(self._traces))
        self._pop(tid)
        self._ignore(tid)
        self._tally.drop(reason)

    def _hand_over_early(self, tid: int, reason: str) -> bool:
        """Make room (the buffer is full for ``reason``) by handing trace ``tid`` to the sender
        now; with no room there either, it is dropped, counted as a trace under ``reason``: the
        queue's reasons count runs, and its runs were never planned."""
        entry = self._pop(tid)
        if entry is None:
            return False
        if self._reserve(entry.size):
            self._ignore(tid)
            self._tally.drop(reason)
        else:
            self._early.append(entry)
            self._remember_sent(tid, entry)  # a child still inside its grace window: see add()
            self.wake = True
        return True

    def _ignore(self, tid: int) -> None:
        self._ignored[tid] = None
        # Remembered well beyond the buffer: in a flood, a dropped trace's root may come a few
        # thousand traces later (~100 bytes an entry).
        if len(self._ignored) > max(4 * self.limits.max_traces, 16_384):
            self._ignored.popitem(last=False)

    def _remember_sent(self, tid: int, entry: BufferedTrace) -> None:
        sent = self._sent
        part = sent.pop(tid, None)
        if part is not None:
            self._sent_ids -= len(part[0]) + len(part[1])
            if entry.whole and part[1]:  # the trace's own root ends a trace sent in parts
                entry.above_sent = _above(entry.spans, part[1])
        if entry.whole:
            # The trace's own root went: whatever of it comes later is late (the common case,
            # and the cheap one: no ids kept).
            part = _WHOLE
        else:
            # A local root under a remote parent, or a root still open (a session): another
            # part of the trace may follow. Sets, added to in place part after part (a trace
            # handed over in thousands of parts must not cost a copy each, nor a scan a span).
            if part is None or part is _WHOLE:
                part = (set(), set())
            ids, parents = part
            if parents:
                entry.above_sent = _above(entry.spans, parents)
            for record in entry.spans:
                ids.add(record.span_id)
                if record.parent_span_id is not None:
                    parents.add(record.parent_span_id)
        sent[tid] = part
        self._sent_ids += len(part[0]) + len(part[1])
        # Bounded in traces and in span ids (~100 bytes each: 512-span traces must not make it 50 MB).
        while len(sent) > self._sent_max or self._sent_ids > _SENT_IDS_KEPT:
            gone_ids, gone_parents = sent.popitem(last=False)[1]
            self._sent_ids -= len(gone_ids) + len(gone_parents)

    def _guard(self, tid: int) -> None:
        if self._pop(tid) is not None or tid not in self._guarded:
            self._tally.skip("loop_guard")
        self._guarded[tid] = None
        if len(self._guarded) > self.limits.max_traces:
            self._guarded.popitem(last=False)

    def _pop(self, tid: int) -> BufferedTrace | None:
        self._due_order.pop(tid, None)
        entry = self._traces.pop(tid, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry

    def delivered(self, end_ns: int) -> None:
        """The processor handed over a span that ended at ``end_ns`` (span time) last: it hands
        spans over in the order they ended, so every span that ended before has arrived. The
        caller passes the last span of each batch unless it ended later than the batch came (an
        end time given in the future says nothing of the spans queued behind it)."""
        if end_ns > self._delivered_ns:
            self._delivered_ns = end_ns

    # --- completing ------------------------------------------------------------------------

    def poll(self, now: float, *, force: bool = False) -> Polled:
        """The traces complete at ``now``: ``grace_s`` passed since the root arrived and every
        span that ended within the grace of the root has arrived, or a quiet app's bound passed
        (with ``force``, every trace whose root ended, grace or not). A trace
        ``max_trace_age_s`` old without an ended root is handed over when an agent span of it
        ended (a root that lives long: a session or a worker's span), else dropped."""
        early, self._early = self._early, []
        out = Polled(early, len(early), sum(e.size for e in early))
        max_age = self.limits.max_trace_age_s
        due: list[int] = []
        expired: list[int] = []
        # Roots that ended by then have every child that ended within their grace.
        complete_before = -1 if self._grace_ns is None else self._delivered_ns - self._grace_ns
        for tid, entry in self._traces.items():
            if entry.due is not None:
                ended = entry.root_end_ns
                if force or entry.due <= now or (entry.ready <= now and ended is not None and ended <= complete_before):
                    due.append(tid)
            elif now - entry.first_seen >= max_age:
                (due if entry.agent_ended else expired).append(tid)
        for tid in expired:
            self._pop(tid)
            self._ignore(tid)
            self._tally.drop("max_trace_age")
        for tid in due:
            taken = self._pop(tid)
            if taken is not None:
                out.traces.append(taken)
                self._remember_sent(tid, taken)
        return out

    def drain(self) -> tuple[int, int]:
        """Forget every trace (shutdown): returns how many were still buffered, and how many
        were handed over early (room held for them in the sender) and not yet taken by a pass:
        a pass that shutdown abandoned (a filter that never returns) takes none."""
        left, early = len(self._traces), len(self._early)
        self._traces.clear()
        self._due_order.clear()
        self._early.clear()
        self.bytes = 0
        return left, early
