"""Group a stream of spans into whole traces, in bounded memory.

Spans of one trace may be scattered (several lines, even several files: the exporter flushes
in batches and children can end after their parent). The assembler keeps each open trace until
it is complete:

- a trace whose root span (no parent) has been seen is complete once ``window_spans`` more
  spans have been read without any of them belonging to it;
- a trace without a root yet is kept across file boundaries, and is released (incomplete; the
  transform then picks its outermost agent/LLM span) once it has been idle for ``window_spans``
  spans *and* ``window_files`` file boundaries;
- at the end of the input every open trace is released.

Memory is bounded whatever the input: at most ``max_open_spans`` spans, holding at most
``max_open_bytes`` of text (``record_size``: what a span's message will carry), are held (over
either, the least recently touched trace is released early and counted as ``evicted``; a trace
over the byte bound on its own is released once the input record that took it over is read),
and a trace keeps at most ``max_spans_per_trace`` spans (the rest are dropped and counted; its
root span is always kept, so a big trace whose root ends last still has it).

A span that arrives after its trace was released (the window passed, or the trace was evicted)
is *late*: its trace's remaining spans come out as an ``AssembledTrace`` with ``late=True``, so
the caller can report them instead of scoring the fragment as a trace of its own (a second score
of the trace, or a run made of a fragment). A late one that is the root of a trace released
without one is a *late root* (``late_root=True``, counted in ``stats.late_roots``): the trace was
read without its root. Either says why the trace was released when it was read, its first part
(``late_evicted``: by the memory bound, so ``max_open_spans`` or ``max_open_bytes`` would have
kept it open, not ``window_spans``; None when an earlier release remembered it without saying):
the parts after it are late too, however they were released. The released traces are
remembered by id with a few bits (had its root, why it was released), the newest
``released_kept`` (at least 10,000, else ``max_open_spans``): a span of a trace released further
back cannot be told from a new trace's. With each the caller may keep what a later part needs to
tell a run of its own from spans of a run read before (``note_runs``:
``tracing.read.plan_part``'s summary), handed over with the late part (``runs_before``).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from tracing._run import SpanRecord
from tracing._sizes import record_size
from tracing.sources._base import Position

__all__ = [
    "DEFAULT_MAX_OPEN_BYTES",
    "MAX_SPANS_PER_TRACE",
    "AssembledTrace",
    "AssemblerStats",
    "Released",
    "TraceAssembler",
]

# Spans kept of one trace (its root always): bounds one trace's memory and its message.
MAX_SPANS_PER_TRACE = 10_000
# Span text held while assembling: 120 traces of 16 MB prompts, all open at once under the span
# bound (their window never passed), took a backfill to 4.1 GB.
DEFAULT_MAX_OPEN_BYTES = 256 * 2**20

Completion = Literal["root", "idle", "evicted", "end"]

# What is remembered of a released trace: bits of a small int (no object per remembered id).
_ROOTED = 1  # it had its root
_EVICTED = 2  # the memory bound released it
_WINDOW = 4  # its window passed, or the input ended (neither: an earlier release did not say)


class Released(NamedTuple):
    """A trace released, as remembered: whether it had its root, why it was read (``evicted``:
    by the memory bound; None: not known), and what a later part of it needs (``runs``)."""

    trace_id: str
    rooted: bool
    evicted: bool | None
    runs: str | None = None


@dataclass(slots=True)
class AssembledTrace:
    """One trace's span records, where its first and last spans were read, and why it was released."""

    trace_id: str
    spans: list[SpanRecord]
    first: Position
    # Where its last span (kept or not) was read: a read started after ``first`` and at or
    # before this meets only part of the trace.
    last: Position
    completion: Completion
    dropped_spans: int = 0
    late: bool = False  # the rest of a trace released earlier: not a trace of its own
    late_root: bool = False  # late, and the root of a trace released without one
    # Late, and the trace was read (its first part released) early by the memory bound (else its
    # window passed; None: not known, an earlier release remembered it).
    late_evicted: bool | None = False
    # Its root span was read, among its spans or an earlier part's (else: a root that comes later is late).
    rooted: bool = True
    # Late: what the parts before left for a later part's runs (``TraceAssembler.note_runs``).
    runs_before: str | None = None
    size: int = 0  # its spans' ``record_size``s summed

    @property
    def read_evicted(self) -> bool | None:
        """Why the trace was read (its first part released): by the memory bound (as
        ``late_evicted``). A late part keeps its trace's cause: a span after it missed that read,
        whatever released the late parts between."""
        return self.late_evicted if self.late else self.completion == "evicted"

    def released(self, runs: str | None) -> Released:
        """How the assembler remembers the trace now (the parts before and this one), with ``runs``."""
        return Released(self.trace_id, self.rooted, self.read_evicted, runs)


@dataclass(slots=True)
class AssemblerStats:
    spans_read: int = 0
    duplicate_spans: int = 0
    dropped_spans: int = 0
    traces: int = 0
    evicted: int = 0
    late_roots: int = 0
    max_open_traces: int = 0
    max_open_spans: int = 0
    max_open_bytes: int = 0


@dataclass(slots=True)
class _Open:
    trace_id: str
    first: Position
    last: Position
    spans: list[SpanRecord] = field(default_factory=list)
    span_ids: set[str] = field(default_factory=set)
    size: int = 0  # the spans' record_size summed
    last_seen: int = 0  # spans_read when last touched
    last_unit: int = 0
    dropped: int = 0
    late: bool = False  # an earlier part of this trace was released
    rooted: bool = False
    # Late, and the part released before had its root (a root here is then no late root).
    released_rooted: bool = False
    # Late, and why the trace was read (its first part released): as ``late_evicted``.
    released_evicted: bool | None = False


class TraceAssembler:
    """Feed spans with :meth:`add`; completed traces come out of :meth:`add` and :meth:`finish`."""

    def __init__(
        self,
        *,
        window_spans: int = 10_000,
        window_files: int = 1,
        max_open_spans: int = 100_000,
        max_open_bytes: int = DEFAULT_MAX_OPEN_BYTES,
        max_spans_per_trace: int = MAX_SPANS_PER_TRACE,
    ) -> None:
        if min(window_spans, max_open_spans, max_open_bytes, max_spans_per_trace) < 1 or window_files < 0:
            raise ValueError(
                "window_spans, max_open_spans, max_open_bytes and max_spans_per_trace must be >= 1"
                " and window_files >= 0"
            )
        self.window_spans = window_spans
        self.window_files = window_files
        self.max_open_spans = max_open_spans
        self.max_open_bytes = max_open_bytes
        self.max_spans_per_trace = max_spans_per_trace
        self.stats = AssemblerStats()
        # Least recently touched first; a trace moves from _rootless to _rooted when its root arrives.
        self._rooted: OrderedDict[str, _Open] = OrderedDict()
        self._rootless: OrderedDict[str, _Open] = OrderedDict()
        self._open_spans = 0
        self._open_bytes = 0
        # Traces over the byte bound on their own, since the last release: released before any
        # other (each alone keeps the assembler over it: the others went first, a whole window of
        # traces read as fragments for one big trace, and again for each of its late parts).
        self._oversized: list[_Open] = []
        self._unit = 0
        # (first position, trace id) of open traces; stale entries are skipped lazily.
        self._firsts: list[tuple[Position, str]] = []
        # Traces released, most recent last, each with its _ROOTED and cause bits (bounded: ids
        # only), to tell a late span (or root) from a new trace and say why it is late; and of
        # those that left a later part a run to find, what it needs. Touched once a trace, not a span.
        self._released: OrderedDict[str, int] = OrderedDict()
        self._runs: dict[str, str] = {}
        self._released_limit = max(10_000, max_open_spans)

    @property
    def open_traces(self) -> int:
        return len(self._rooted) + len(self._rootless)

    @property
    def open_spans(self) -> int:
        return self._open_spans

    @property
    def open_bytes(self) -> int:
        return self._open_bytes

    def low_watermark(self) -> Position | None:
        """The earliest position of any span still held (None when nothing is open)."""
        while self._firsts:
            first, trace_id = self._firsts[0]
            held = self._rooted.get(trace_id) or self._rootless.get(trace_id)
            if held is not None and held.first == first:
                return first
            heapq.heappop(self._firsts)
        return None

    def remember_released(self, traces: Iterable[Released]) -> None:
        """Take ``traces`` (oldest first) as released before this assembler's input: a resumed
        read's assembler, which has not seen them, then tells their late spans and roots from
        new traces, why they are late and what runs a late part may hold, as the read before it did."""
        for trace in traces:
            self._remember(trace.trace_id, trace.rooted, trace.evicted)
            self.note_runs(trace.trace_id, trace.runs)

    def note_runs(self, trace_id: str, runs: str | None) -> None:
        """Keep ``runs`` (``plan_part``'s summary of the trace's parts read; None: a later part
        holds no run) for the trace's next late part, while the trace is remembered."""
        if runs is None:
            self._runs.pop(trace_id, None)
        elif trace_id in self._released:
            self._runs[trace_id] = runs

    def _remember(self, trace_id: str, rooted: bool, evicted: bool | None) -> None:
        released = self._released
        cause = 0 if evicted is None else _EVICTED if evicted else _WINDOW
        released[trace_id] = (_ROOTED if rooted else 0) | cause
        released.move_to_end(trace_id)
        if len(released) > self._released_limit:
            forgotten, _ = released.popitem(last=False)
            self._runs.pop(forgotten, None)

    @property
    def released_kept(self) -> int:
        """How many of the traces released are remembered (the newest)."""
        return self._released_limit

    def _compact(self) -> None:
        self._firsts = [(t.first, t.trace_id) for t in (*self._rooted.values(), *self._rootless.values())]
        heapq.heapify(self._firsts)

    def add(self, spans: list[SpanRecord], position: Position) -> Iterator[AssembledTrace]:
        """Take the span records of one input record; yields the traces this completes."""
        if position.unit != self._unit:
            self._unit = position.unit
        stats = self.stats
        for span in spans:
            stats.spans_read += 1
            trace_id = span.trace_id
            held = self._rooted.get(trace_id)
            if held is not None:
                self._rooted.move_to_end(trace_id)
            else:
                held = self._rootless.get(trace_id)
                if held is None:
                    held = _Open(trace_id, position, position)
                    released = self._released.get(trace_id)
                    if released is not None:
                        held.late = True
                        held.released_rooted = bool(released & _ROOTED)
                        held.released_evicted = bool(released & _EVICTED) if released & (_EVICTED | _WINDOW) else None
                    self._rootless[trace_id] = held
                    heapq.heappush(self._firsts, (position, trace_id))
                    if len(self._firsts) > 4 * self.open_traces + 1024:
                        self._compact()
                else:
                    self._rootless.move_to_end(trace_id)
            held.last_seen = stats.spans_read
            held.last_unit = position.unit
            held.last = position
            span_id = span.span_id
            if span_id in held.span_ids:
                stats.duplicate_spans += 1
                continue
            is_root = span.parent_span_id is None
            if len(held.spans) >= self.max_spans_per_trace and not is_root:
                held.dropped += 1
                stats.dropped_spans += 1
                continue
            held.spans.append(span)
            held.span_ids.add(span_id)
            size = record_size(span)
            held.size += size
            self._open_bytes += size
            self._open_spans += 1
            if held.size > self.max_open_bytes >= held.size - size:  # (once, as it goes over)
                self._oversized.append(held)
            if is_root and not held.rooted:
                held.rooted = True
                self._rooted[trace_id] = self._rootless.pop(trace_id)
                if held.late and not held.released_rooted:
                    stats.late_roots += 1
        stats.max_open_traces = max(stats.max_open_traces, self.open_traces)
        stats.max_open_spans = max(stats.max_open_spans, self._open_spans)
        stats.max_open_bytes = max(stats.max_open_bytes, self._open_bytes)
        yield from self._release_due()

    def end_unit(self, unit: int) -> Iterator[AssembledTrace]:
        """A file ended: rootless traces idle for long enough may now be released."""
        self._unit = unit + 1
        yield from self._release_due()

    def finish(self) -> Iterator[AssembledTrace]:
        """End of input: release every open trace, oldest first."""
        everything = sorted([*self._rooted.values(), *self._rootless.values()], key=lambda t: t.first)
        self._rooted.clear()
        self._rootless.clear()
        self._firsts.clear()
        self._oversized.clear()
        for held in everything:
            yield self._emit(held, "end")

    def _release_due(self) -> Iterator[AssembledTrace]:
        horizon = self.stats.spans_read - self.window_spans
        while self._rooted:
            held = next(iter(self._rooted.values()))
            if held.last_seen > horizon:
                break
            self._rooted.popitem(last=False)
            yield self._emit(held, "root")
        unit_horizon = self._unit - self.window_files
        while self._rootless:
            held = next(iter(self._rootless.values()))
            if held.last_seen > horizon or held.last_unit >= unit_horizon:
                break
            self._rootless.popitem(last=False)
            yield self._emit(held, "idle")
        oversized, self._oversized = self._oversized, []
        for held in oversized:
            queue = self._rooted if held.rooted else self._rootless
            if queue.get(held.trace_id) is held:  # (not released by its window meanwhile)
                del queue[held.trace_id]
                yield self._evict(held)
        while self._open_spans > self.max_open_spans or self._open_bytes > self.max_open_bytes:
            # Over the memory bound: release the least recently touched trace, those with their
            # root first: exporters send a root once its children ended, so such a trace is most
            # likely whole, and one without is waiting for it (released, its root came late:
            # children-first traces of big prompts had each read without its root).
            queue = self._rooted if self._rooted else self._rootless
            _, held = queue.popitem(last=False)
            yield self._evict(held)

    def _evict(self, held: _Open) -> AssembledTrace:
        if not held.late:  # (a trace once, however many of its parts the bound releases)
            self.stats.evicted += 1
        return self._emit(held, "evicted")

    def _emit(self, held: _Open, completion: Completion) -> AssembledTrace:
        self._open_spans -= len(held.spans)
        self._open_bytes -= held.size
        self.stats.traces += 1
        rooted = held.rooted
        trace = AssembledTrace(
            held.trace_id,
            held.spans,
            held.first,
            held.last,
            completion,
            held.dropped,
            late=held.late,
            late_root=held.late and rooted and not held.released_rooted,
            late_evicted=held.released_evicted,
            rooted=rooted or held.released_rooted,
            runs_before=self._runs.pop(held.trace_id, None) if held.late else None,
            size=held.size,
        )
        self._remember(trace.trace_id, trace.rooted, trace.read_evicted)
        return trace
