"""Span parent ids that form a cycle: every entry point that walks ancestors answers a clear
``TraceReadError`` (reason ``parent_cycle``) in bounded time and memory.

Before the fix, walking up from a span in a cycle never ended (and grew a list as it went), so
each probe runs in a subprocess with an address-space limit and a deadline: an old-code loop
fails the test with MemoryError or a timeout instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._work import assert_linear
from tests.backfill._synth import trace_spans

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ("two", "self", "long")
LONG = 5_000  # under the assembler's 10,000 spans per trace: the whole cycle is read


def cyclic_spans(shape: str, i: int = 7) -> list[dict[str, Any]]:
    """OTLP/JSON spans of trace ``i`` (agent → chat, tool) with its parent ids bent into a cycle."""
    children, root = trace_spans(i)
    chat = children[0]
    if shape == "two":  # root → chat → root
        root["parentSpanId"] = chat["spanId"]
        return [*children, root]
    if shape == "self":  # the root is its own parent
        root["parentSpanId"] = root["spanId"]
        return [*children, root]
    assert shape == "long"  # root → step 0 → ... → step N-1 → root
    steps = []
    parent = root["spanId"]
    for k in range(LONG):
        span_id = f"{0xABC0000000000000 + k:016x}"
        steps.append({**chat, "spanId": span_id, "parentSpanId": parent, "name": f"step {k}", "attributes": []})
        parent = span_id
    root["parentSpanId"] = parent
    return [*children, *steps, root]


def document(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "my.app"}, "spans": spans}]}]}


def _probe(entry: str, shape: str, workdir: str) -> dict[str, Any]:
    """Run one entry point on one cyclic trace; what it answered, as JSON-able data."""
    from tracing import TraceReadError, find_targets, read_trace, trace_to_run, trace_to_runs
    from tracing._records import span_record
    from tracing.otlp import decode_otlp_json
    from tracing.read import plan_runs

    spans = decode_otlp_json(document(cyclic_spans(shape)))
    try:
        if entry == "trace_to_run":
            trace_to_run(spans)
        elif entry == "trace_to_run_target":
            trace_to_run(spans, f"{spans[-1].context.span_id:016x}")  # type: ignore[union-attr]
        elif entry == "trace_to_runs":
            trace_to_runs(spans)
        elif entry == "find_targets":
            find_targets(spans)
        elif entry == "read_trace":
            (found,) = read_trace(spans, exclude_under=["00000000000000ff"])
            assert isinstance(found, TraceReadError)
            raise found
        elif entry == "worker":  # what a worker does with the exporter's span records
            from tracing.queue import ScoreRequest
            from worker._scoring import read_run

            records = [span_record(s) for s in spans]
            request = ScoreRequest(spans=records, target_span_ids=[records[-1].span_id], scorer_ids=["x"])
            (target,) = request.target_span_ids
            result = read_run(request.trace_id, target, request.run_spans()[target])
            assert isinstance(result, TraceReadError)
            raise result
        elif entry == "plan_runs":  # the exporter's default path ships the trace; the worker reads it
            records = [span_record(s) for s in spans]
            planned = plan_runs(records)
            assert len(planned) == 1, planned
            assert len(planned[0][1]) == len(records)
            target, shipped = planned[0]
            trace_to_run(shipped, target.span_id)
        elif entry == "backfill":
            return _probe_backfill(spans, shape, Path(workdir))
        else:
            raise AssertionError(entry)
    except TraceReadError as exc:
        return {"error": "TraceReadError", "reason": exc.reason, "message": str(exc)}
    return {"error": None}


def _probe_backfill(spans: list[Any], shape: str, workdir: Path) -> dict[str, Any]:
    """A dry-run backfill of a file holding the cyclic trace between two good ones."""
    from tracing.sources import FileSource
    from worker.backfill._driver import Backfill
    from worker.backfill._state import BackfillOptions, BackfillState

    path = workdir / f"cycle-{shape}.jsonl"
    good_before, good_after = trace_spans(1), trace_spans(2)
    lines = [
        document([*good_before[0], good_before[1]]),
        document(cyclic_spans(shape)),
        document([*good_after[0], good_after[1]]),
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    source = FileSource([path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    state = BackfillState(job_id="bf-cycles", source=source.describe(), options=options)
    done = Backfill(source, state, None).run()
    return {
        "error": "counted",
        "reason": ",".join(sorted(done.counters.unreadable)),
        "runs_read": done.counters.runs_read,
        "traces_read": done.counters.traces_read,
    }


def _limit_memory() -> None:
    limit = 1536 * 2**20  # far above what the probe needs, far below what a runaway walk takes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run_probe(entry: str, shape: str, tmp_path: Path) -> dict[str, Any]:
    code = (
        "import json, sys\n"
        "from tests.tracing.test_transform_cycles import _probe\n"
        "print(json.dumps(_probe(sys.argv[1], sys.argv[2], sys.argv[3])))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, entry, shape, str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{entry} on a {shape} cycle did not return within 60 s")
    assert done.returncode == 0, f"{entry} on a {shape} cycle failed:\n{done.stderr[-2000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


ENTRIES = ["trace_to_run", "trace_to_run_target", "trace_to_runs", "find_targets", "read_trace", "worker", "plan_runs"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_parent_cycle_is_a_trace_read_error(entry: str, tmp_path: Path) -> None:
    """A 2-cycle, a self-parent and a 5,001-span cycle are each a parent_cycle TraceReadError."""
    for shape in SHAPES:
        answer = _run_probe(entry, shape, tmp_path)
        assert answer["error"] == "TraceReadError", (shape, answer)
        assert answer["reason"] == "parent_cycle", (shape, answer)
        assert "parent_span_id" in answer["message"]
        assert ("own parent" in answer["message"]) == (shape == "self"), answer["message"]
        if shape == "long":
            assert f"cycle of {LONG + 1} spans" in answer["message"]


def test_backfill_counts_a_cyclic_trace_and_reads_its_neighbours(tmp_path: Path) -> None:
    """Backfill (dry run over a file) counts the cyclic trace as unreadable and reads the rest."""
    for shape in SHAPES:
        answer = _run_probe("backfill", shape, tmp_path)
        assert answer == {"error": "counted", "reason": "parent_cycle", "runs_read": 2, "traces_read": 3}, shape


def test_cycle_free_traces_with_remote_and_duplicate_parents_still_read() -> None:
    """No false alarm: a root whose parent is outside the trace (remote) and a duplicated span."""
    from tracing import trace_to_run
    from tracing.otlp import decode_otlp_json

    children, root = trace_spans(3)
    root["parentSpanId"] = "00000000000000aa"  # a parent in another service: still the local root
    spans = decode_otlp_json(document([*children, root, dict(children[0])]))
    run = trace_to_run(spans)
    assert run.identity.span_id == root["spanId"]


def _deep_chain(depth: int, trace: int, base: int, *, stray: bool = False) -> list[Any]:
    """Trace ``trace`` (agent → chat, tool) with ``depth`` tool spans chained one under the next
    between the agent and its LLM call, decoded; ``stray``: and a second local root (its parent
    in another service), which makes the agent's run a subset of the trace."""
    from tracing.otlp import decode_otlp_json

    children, root = trace_spans(trace)
    chat, tool = children
    steps, parent = [], root["spanId"]
    for k in range(depth):
        span_id = f"{base + k:016x}"
        steps.append({**tool, "spanId": span_id, "parentSpanId": parent, "name": f"step {k}"})
        parent = span_id
    extra = [{**tool, "spanId": "00000000000000bb", "parentSpanId": "00000000000000cc", "name": "stray"}]
    return decode_otlp_json(document([root, *steps, {**chat, "parentSpanId": parent}, *(extra if stray else [])]))


def test_a_10000_deep_chain_is_read_in_linear_time() -> None:
    """No cycle, but a 10,000-span chain between the agent and its LLM call: finding targets,
    members and the loop guard walk down once (walking up from every span took ~5 s of CPU).
    Counted, not timed: the chain of 10,000 runs about twice the lines of 5,000 (tests/_work.py)."""
    from tracing import read_trace

    (run,) = assert_linear(
        lambda depth: _deep_chain(depth, 7, 0xABC0000000000000),
        lambda spans: read_trace(spans, exclude_under=["00000000000000aa"]),
        10_000,
        per_item=400,
    )
    assert not isinstance(run, Exception), run
    assert run.identity.span_id == trace_spans(7)[1]["spanId"]
    # only the outermost tool span of the chain is a call of the agent (the rest are nested in it)
    assert len([p for m in run.output for p in m.content.parts if p.type == "tool-invocation"]) == 1


def test_plan_runs_on_a_10000_deep_chain_is_linear() -> None:
    """The exporter's run planning (in the application's process) on the same deep chain, with
    the loop guard on: one walk down (walking up from every span took seconds of CPU). Counted,
    not timed: the chain of 10,000 runs about twice the lines of 5,000 (tests/_work.py)."""
    from tracing._records import span_record
    from tracing.read import plan_runs

    def records(depth: int) -> list[Any]:
        return [span_record(s) for s in _deep_chain(depth, 8, 0xABD0000000000000, stray=True)]

    ((target, shipped),) = assert_linear(records, lambda r: plan_runs(r, exclude_under=["00000000000000aa"]), 10_000)
    assert target.span_id == trace_spans(8)[1]["spanId"]
    assert len(shipped) == 10_003 - 1  # all but the stray root
