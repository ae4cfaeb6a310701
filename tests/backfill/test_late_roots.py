"""Roots that arrive late: counted and reported, never a silent second (rootless) trace.

Exporters write children before their root (the root ends last). A trace whose root comes
after the assembly window has been released without it; when the root then arrives it is a
*late root*. A trace with more spans than the per-trace cap keeps its root all the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.backfill._doubles import Messages
from tests.backfill._synth import trace_id, trace_spans
from tracing.otlp import decode_otlp_records
from tracing.sources import FileSource, Position, TraceAssembler
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState


def _line(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": spans}]}]}) + "\n"


def _whole(i: int) -> str:
    children, root = trace_spans(i)
    return _line([*children, root])


def test_a_root_after_the_window_is_a_counted_late_root(tmp_path: Path) -> None:
    """Trace 0's children in file a, its root two files later (after 50+ spans and a file
    boundary): the trace is read once, without its root, and the root is one late root with
    a message naming the trace and the window option; not a second, unreadable trace."""
    late_children, late_root = trace_spans(0)
    (tmp_path / "a.jsonl").write_text(_line(late_children) + "".join(_whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text("".join(_whole(i) for i in range(31, 61)))
    (tmp_path / "c.jsonl").write_text(_line([late_root]) + "".join(_whole(i) for i in range(61, 71)))
    source = FileSource([tmp_path])
    options = BackfillOptions(
        scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], window_spans=50, window_files=1
    )
    state = BackfillState(job_id="bf-late", source=source.describe(), options=options)
    reporter = Messages()
    done = Backfill(source, state, None, reporter=reporter).run()

    counters = done.counters
    assert counters.late_roots == 1
    assert counters.unreadable == {}  # the old driver read the root alone: "no_content"
    assert counters.traces_read == 71
    assert counters.runs_read == 71
    (message,) = [line for line in reporter.lines if "root span arrived after" in line]
    assert trace_id(0) in message
    assert "--window-spans" in message


def test_a_root_within_the_window_is_not_late(tmp_path: Path) -> None:
    """The same files with the default window: the trace is whole, nothing is late."""
    late_children, late_root = trace_spans(0)
    (tmp_path / "a.jsonl").write_text(_line(late_children) + "".join(_whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text(_line([late_root]))
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    state = BackfillState(job_id="bf-late", source=source.describe(), options=options)
    done = Backfill(source, state, None).run()
    assert done.counters.late_roots == 0
    assert done.counters.traces_read == 31


def test_a_trace_over_the_span_cap_keeps_its_root_when_it_ends_last() -> None:
    """10,050 spans, root last, cap 10,000: the root is kept (the old assembler dropped it, and
    the trace was released rootless); the 49 spans over the cap are dropped and counted."""
    children, root = trace_spans(5)
    chat, tool = children
    many = [{**tool, "spanId": f"{0xC000000000000000 + k:016x}"} for k in range(10_048)]
    spans = decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [chat, *many, root]}]}]})
    assembler = TraceAssembler(window_spans=100)
    released = list(assembler.add(spans, Position(0, 1)))
    released += list(assembler.finish())
    (trace,) = released
    assert any(s.parent_span_id is None for s in trace.spans)
    assert len(trace.spans) == 10_001
    assert trace.dropped_spans == 49
    assert assembler.stats.late_roots == 0


def test_a_resumed_jobs_evictions_add_to_the_jobs_earlier_ones(tmp_path: Path) -> None:
    """Every counter of a job is cumulative over its runs but this one: a resume set it to its
    own evictions, so the summary put this run's figure beside the job's others (noticed)."""
    from tests.backfill._synth import write_otlp_files

    write_otlp_files(tmp_path, 40, files=1)
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], max_open_spans=2)
    state = BackfillState(job_id="bf-evict", source=source.describe(), options=options)
    state.counters.evicted_traces = 7  # (the job's runs before this one)
    backfill = Backfill(source, state, None, reporter=Messages())
    done = backfill.run()
    assert backfill.assembler.stats.evicted > 0
    assert done.counters.evicted_traces == 7 + backfill.assembler.stats.evicted
