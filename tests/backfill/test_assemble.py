"""TraceAssembler: spans grouped into traces within a bounded window and bounded memory."""

from __future__ import annotations

import random

from tracing import SpanRecord
from tracing.sources import AssembledTrace, Position, TraceAssembler


def span(trace: int, span_id: int, parent: int | None = None) -> SpanRecord:
    return SpanRecord(
        f"{trace:032x}", f"{span_id:016x}", f"s{span_id}", f"{parent:016x}" if parent else None, "INTERNAL", 1, 2
    )


def test_trace_split_across_files_assembles() -> None:
    """Children in file 0 and the root in file 1 come out as one trace, released after the window."""
    assembler = TraceAssembler(window_spans=3, window_files=1)
    out = list(assembler.add([span(1, 2, parent=1), span(1, 3, parent=1)], Position(0, 1)))
    out += list(assembler.end_unit(0))
    assert out == []  # no root yet, and only one file boundary passed
    out += list(assembler.add([span(1, 1)], Position(1, 1)))
    assert out == []  # root seen, but the window has not passed
    out += list(assembler.add([span(2, 10), span(2, 11, 10), span(2, 12, 10)], Position(1, 2)))
    (trace,) = out
    assert trace.trace_id == f"{1:032x}"
    assert trace.completion == "root"
    assert sorted(int(s.span_id, 16) for s in trace.spans) == [1, 2, 3]
    assert trace.first == Position(0, 1)


def test_late_children_within_the_window_join_their_trace() -> None:
    """A child arriving after its root but within the window is in the same trace."""
    assembler = TraceAssembler(window_spans=5)
    list(assembler.add([span(7, 1)], Position(0, 1)))
    list(assembler.add([span(8, 1)], Position(0, 2)))
    list(assembler.add([span(7, 2, 1)], Position(0, 3)))
    traces = {t.trace_id: t for t in assembler.finish()}
    assert len(traces[f"{7:032x}"].spans) == 2
    assert traces[f"{7:032x}"].completion == "end"


def test_rootless_trace_is_released_after_file_distance_and_window() -> None:
    """A trace whose root never comes is released once idle for the window and the file distance."""
    assembler = TraceAssembler(window_spans=2, window_files=1)
    list(assembler.add([span(1, 2, 1)], Position(0, 1)))
    out = list(assembler.add([span(2, 1), span(2, 2, 1), span(2, 3, 1)], Position(0, 2)))
    assert [t.trace_id for t in out] == []  # idle enough, but still in the same file
    list(assembler.end_unit(0))
    out = list(assembler.add([span(3, 1)], Position(1, 1)))
    out += list(assembler.end_unit(1))
    ids = [t.trace_id for t in out]
    assert f"{1:032x}" in ids
    assert next(t for t in out if t.trace_id == f"{1:032x}").completion == "idle"


def test_memory_stays_bounded_whatever_the_input() -> None:
    """Thousands of interleaved, partly rootless traces: open spans never exceed the bound, no span is lost."""
    rng = random.Random(3)
    assembler = TraceAssembler(window_spans=200, max_open_spans=500)
    total_spans = 0
    emitted_spans = 0
    peak = 0
    open_traces = list(range(1, 60))
    next_trace = 60
    for line in range(4000):
        batch = []
        for _ in range(3):
            trace = rng.choice(open_traces)
            sid = rng.randrange(2, 2**40)
            batch.append(span(trace, sid, parent=1))
            if rng.random() < 0.1:  # the root arrives; the trace id is retired
                batch.append(span(trace, 1))
                open_traces.remove(trace)
                open_traces.append(next_trace)
                next_trace += 1
        total_spans += len(batch)
        emitted_spans += sum(len(t.spans) for t in assembler.add(batch, Position(line // 1000, line)))
        peak = max(peak, assembler.open_spans)
    emitted_spans += sum(len(t.spans) for t in assembler.finish())
    assert peak <= 500 + 4  # the bound, plus at most one record's spans before release
    assert emitted_spans + assembler.stats.duplicate_spans == total_spans
    assert assembler.open_spans == 0
    assert assembler.open_traces == 0


def test_low_watermark_is_the_earliest_open_position() -> None:
    """low_watermark is where the oldest still-open trace began, None when nothing is open."""
    assembler = TraceAssembler(window_spans=1)
    assert assembler.low_watermark() is None
    list(assembler.add([span(1, 2, 1)], Position(0, 1)))
    list(assembler.add([span(2, 2, 1)], Position(0, 2)))
    assert assembler.low_watermark() == Position(0, 1)
    list(assembler.add([span(1, 1)], Position(0, 3)))
    list(assembler.add([span(3, 1)], Position(0, 4)))  # trace 1 completes (root + window)
    assert assembler.low_watermark() == Position(0, 2)


def test_duplicates_and_oversized_traces_are_counted() -> None:
    """A span seen twice is kept once; spans past max_spans_per_trace are dropped and counted."""
    assembler = TraceAssembler(max_spans_per_trace=3)
    list(assembler.add([span(1, 1), span(1, 1), *(span(1, i, 1) for i in range(2, 6))], Position(0, 1)))
    (trace,) = list(assembler.finish())
    assert len(trace.spans) == 3
    assert trace.dropped_spans == 2
    assert assembler.stats.duplicate_spans == 1
    assert assembler.stats.dropped_spans == 2


def test_a_span_after_a_late_part_keeps_the_cause_of_the_traces_read() -> None:
    """Trace 1, read early by the memory bound; its root late, released by the window; a third
    span late again. That span missed the trace's read, which the memory bound made (a wider
    window would not have kept it), but it was said to be past the window: the cause of the late
    part's release had replaced the read's."""
    assembler = TraceAssembler(window_spans=1, window_files=1, max_open_spans=1)
    out = []
    for n, spans in enumerate(
        [[span(1, 2, parent=1), span(1, 3, parent=1)], [span(2, 1)], [span(1, 1)], [span(4, 1)], [span(1, 4, 1)]]
    ):
        out += assembler.add(spans, Position(0, n + 1))
    out += assembler.finish()
    parts = [t for t in out if t.trace_id == f"{1:032x}"]
    assert [(t.completion, t.late, t.late_root) for t in parts] == [
        ("evicted", False, False),
        ("root", True, True),
        ("end", True, False),
    ]
    assert [t.late_evicted for t in parts[1:]] == [True, True]


def test_span_text_held_stays_under_the_byte_bound() -> None:
    """Traces whose spans carry 100 kB prompts, fewer spans than any window: under the span bound
    alone every one was held to the end of the input (120 traces of 16 MB took a backfill to
    4.1 GB). The text held stays under ``max_open_bytes`` (plus the record being read); over it
    the least recently touched trace is released, counted as evicted, every span kept."""
    prompt = "p" * 100_000

    def big(trace: int, span_id: int, parent: int | None = None) -> SpanRecord:
        record = span(trace, span_id, parent)
        record.attributes = {"gen_ai.prompt": prompt}
        return record

    bound = 1_000_000
    assembler = TraceAssembler(window_spans=10_000, max_open_bytes=bound)
    out: list[AssembledTrace] = []
    peak = 0
    for trace in range(1, 41):  # two lines a trace: children first, the root last
        out += assembler.add([big(trace, 2, 1), big(trace, 3, 1)], Position(0, 2 * trace))
        peak = max(peak, assembler.open_bytes)
        out += assembler.add([big(trace, 1)], Position(0, 2 * trace + 1))
        peak = max(peak, assembler.open_bytes)
    out += assembler.finish()
    assert bound - 200_000 < assembler.stats.max_open_bytes <= bound + 2 * 101_000
    assert peak <= bound
    assert assembler.open_bytes == 0
    evicted = [t for t in out if t.completion == "evicted"]
    assert len(evicted) == assembler.stats.evicted > 30
    # Least recently touched first: each trace was whole when the next one's lines pushed it out.
    assert all(len(t.spans) == 3 and not t.late for t in out)
    assert sorted(t.trace_id for t in out) == [f"{i:032x}" for i in range(1, 41)]
    assert all(t.size == sum(100_000 + 13 + 6 + 600 + 2 for _ in t.spans) for t in out)


def test_a_trace_over_the_byte_bound_alone_is_released_at_once() -> None:
    """One trace bigger than the bound is released once the record that took it over is read;
    its later spans are late, as past the span bound."""
    assembler = TraceAssembler(max_open_bytes=50_000)
    record = span(1, 2, 1)
    record.attributes = {"gen_ai.prompt": "p" * 60_000}
    (released,) = assembler.add([record], Position(0, 1))
    assert (released.completion, len(released.spans), assembler.open_bytes) == ("evicted", 1, 0)
    assert list(assembler.add([span(1, 1)], Position(0, 2))) == []
    (late,) = assembler.finish()
    assert (late.late, late.late_root, late.late_evicted) == (True, True, True)


def test_a_trace_over_the_byte_bound_goes_before_the_others() -> None:
    """Five traces waiting for their roots and three whole ones, then one span over the byte
    bound alone: the least recently touched traces were released first, every one of them (the
    offender last), and the five roots came late. Only the trace over the bound goes now."""
    assembler = TraceAssembler(max_open_bytes=1_000_000)
    out: list[AssembledTrace] = []
    lines = [[span(t, 2, 1)] for t in range(1, 6)] + [[span(t, 2, 1), span(t, 1)] for t in range(6, 9)]
    big = span(99, 2, 1)
    big.attributes = {"gen_ai.prompt": "x" * 1_200_000}
    lines += [[big], *([span(t, 1)] for t in range(1, 6))]
    for n, spans in enumerate(lines):
        out += assembler.add(spans, Position(0, n + 1))
    evicted = [t.trace_id for t in out if t.completion == "evicted"]
    out += assembler.finish()
    assert evicted == [f"{99:032x}"]
    assert assembler.stats.late_roots == 0
    assert sorted(len(t.spans) for t in out) == [1] + [2] * 8


def test_a_trace_released_in_parts_by_the_byte_bound_is_one_eviction() -> None:
    """A trace of six 600 kB spans, a line each, over a 1 MB bound: each time a part of it goes
    over, that part is released (its later spans late). The trace counts one eviction, not one
    a part: the summary's traces released early outnumbered the traces read."""
    assembler = TraceAssembler(max_open_bytes=1_000_000)
    out: list[AssembledTrace] = []
    for k in range(6):
        child = span(1, 10 + k, 1)
        child.attributes = {"gen_ai.prompt": "p" * 600_000}
        out += assembler.add([child], Position(0, k + 1))
    out += assembler.add([span(1, 1)], Position(0, 7))
    out += assembler.finish()
    assert [(t.completion, t.late, len(t.spans)) for t in out] == [
        ("evicted", False, 2),
        ("evicted", True, 2),
        ("evicted", True, 2),
        ("end", True, 1),
    ]
    assert assembler.stats.evicted == 1
