"""Broker-mode batches are cut by bytes: one big run never sinks its neighbours.

The driver sizes each request's JSON once; a batch is cut before the run that would take it
past the submitter's ``max_payload_bytes``; a run over the cap alone is a counted, reported reject.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.backfill._doubles import CapturingSubmitter, Messages
from tests.backfill._synth import trace_id, trace_spans
from tests.tracing._exporting import read_runs
from tests.tracing._spans import THREE_AGENTS, Recorder, genai_messages, three_agent_trace
from tracing.otlp import spans_to_otlp_json
from tracing.queue import ScoreBatch, request_json
from tracing.sources import FileSource
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState


def big_trace_line(i: int, answer_bytes: int = 0) -> str:
    """One trace as an OTLP JSON line; its answer padded to ``answer_bytes`` when given."""
    children, root = trace_spans(i)
    if answer_bytes:
        answer = ("Paris is lovely. " * (answer_bytes // 17 + 1))[:answer_bytes]
        output = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": answer}]}])
        chat = children[0]
        chat["attributes"] = [
            a if a["key"] != "gen_ai.output.messages" else {"key": a["key"], "value": {"stringValue": output}}
            for a in chat["attributes"]
        ]
    document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": [*children, root]}]}]}
    return json.dumps(document, ensure_ascii=False) + "\n"


def _run(path: Path, submitter: CapturingSubmitter, batch_size: int = 200) -> tuple[BackfillState, Messages]:
    source = FileSource([path])
    options = BackfillOptions(
        scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], batch_size=batch_size
    )
    state = BackfillState(job_id="bf-bytes", source=source.describe(), options=options)
    reporter = Messages()
    return Backfill(source, state, submitter, reporter=reporter).run(), reporter


def test_batches_are_cut_by_bytes_and_an_oversized_run_is_a_counted_reject(tmp_path: Path) -> None:
    """Cap 64 KB: 30 small runs, three 25 KB runs and one 100 KB run. Every batch fits the
    cap, the 100 KB run is rejected (counted, reported with its trace), all others are sent."""
    cap = 64 * 1024
    sizes = {5: 25_000, 6: 25_000, 7: 25_000, 12: 100_000}
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i, sizes.get(i, 0)) for i in range(34)))
    submitter = CapturingSubmitter(cap)
    state, reporter = _run(path, submitter)

    assert state.counters.runs_rejected == {"too_large": 1}
    assert state.counters.runs_enqueued == 33
    assert state.counters.traces_enqueued == 33
    assert len(submitter.sent) >= 2  # the old driver sent one batch of 34 (~190 KB)
    for batch, encoded in submitter.sent:
        body = ScoreBatch(batch_id=batch.batch_id, requests=batch.requests).model_dump_json()
        assert len(body.encode()) <= cap + 1024
        assert len(json.dumps(json.loads(body), separators=(",", ":"))) <= cap + 1024  # the worker's measure
        assert encoded == [request_json(r) for r in batch.requests]
    sent_traces = [r.trace_id for batch, _ in submitter.sent for r in batch.requests]
    rejected = next(line for line in reporter.lines if "too_large" in line)
    assert "TRACESCORE_MAX_PAYLOAD_BYTES" in rejected
    big_trace = rejected.split()[1]
    assert big_trace not in sent_traces
    assert len(set(sent_traces)) == 33
    assert [b.batch_id for b, _ in submitter.sent] == [f"bf-bytes-{n:06d}" for n in range(len(submitter.sent))]


def test_count_cut_still_applies_under_the_byte_cap(tmp_path: Path) -> None:
    """Small runs: batches of batch_size, as before."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i) for i in range(25)))
    submitter = CapturingSubmitter(8 * 2**20)
    _run(path, submitter, batch_size=10)
    assert [len(b.requests) for b, _ in submitter.sent] == [10, 10, 5]


def test_in_process_batches_end_at_the_scorers_byte_bound(tmp_path: Path) -> None:
    """In process there is no message to cut by, and a batch was ``--batch-size`` runs (200)
    whatever their spans held: 200 runs of 16 MB prompts scored at once. A batch now ends once
    its traces' span text reaches the submitter's ``max_batch_bytes``, the last one's included;
    every run is still handed over once."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i, 100_000) for i in range(20)))
    submitter = CapturingSubmitter()
    submitter.max_batch_bytes = 300_000
    state, _ = _run(path, submitter)
    sizes = [len(batch.requests) for batch, _ in submitter.sent]
    assert sizes == [3, 3, 3, 3, 3, 3, 2]  # 101 kB of text a trace: the third takes a batch past 300 kB
    assert sorted(submitter.runs) == sorted((trace_id(i), f"{i * 3 + 1:016x}") for i in range(20))
    assert (state.counters.batches, state.counters.runs_enqueued) == (7, 20)


def test_the_in_process_scorer_bounds_its_batches_by_bytes(tmp_path: Path) -> None:
    """The same through the real in-process scorer (``MAX_BATCH_BYTES``, 64 MiB, lowered here):
    every run scored, in batches of the bound."""
    from worker._embedded import MAX_BATCH_BYTES, EmbeddedScorer
    from worker._registry import load_registry

    assert EmbeddedScorer.max_batch_bytes == MAX_BATCH_BYTES == 64 * 2**20
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i, 100_000) for i in range(10)))
    scorer = EmbeddedScorer(load_registry("tests.backfill.scorers"))
    scorer.max_batch_bytes = 250_000
    source = FileSource([path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    state = BackfillState(job_id="bf-bytes-in-process", source=source.describe(), options=options)
    try:
        Backfill(source, state, scorer, reporter=Messages()).run()
    finally:
        scorer.close()
    assert (state.counters.batches, state.counters.runs_enqueued) == (4, 10)
    assert (scorer.totals.pairs, scorer.totals.scored) == (10, 10)


def _three_agent_line(padding: dict[str, int] | None = None) -> tuple[str, dict[str, str]]:
    """One trace of three agent runs as an OTLP JSON line (an agent's answer padded to the
    given bytes), and each agent's span id by name."""
    rec = Recorder()
    three_agent_trace(rec)
    spans = rec.spans()
    document = spans_to_otlp_json(spans)
    ids = {
        s.name.removeprefix("invoke_agent "): format(s.context.span_id, "016x")  # type: ignore[union-attr]
        for s in spans
        if s.name.startswith("invoke_agent")
    }
    for name, size in (padding or {}).items():
        for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            if span.get("parentSpanId") == ids[name] and span["name"] == "chat m":
                span["attributes"] = [
                    a
                    if a["key"] != "gen_ai.output.messages"
                    else {"key": a["key"], "value": {"stringValue": genai_messages(("assistant", "x" * size))}}
                    for a in span["attributes"]
                ]
    return json.dumps(document) + "\n", ids


def test_a_trace_of_three_runs_is_one_request_naming_the_three(tmp_path: Path) -> None:
    """Backfill ships a trace's runs together: one request, the runs' spans once (not the
    workflow span above them), each agent's span a target; the three are counted as runs."""
    line, ids = _three_agent_line()
    path = tmp_path / "t.jsonl"
    path.write_text(line)
    submitter = CapturingSubmitter(8 * 2**20)
    state, _ = _run(path, submitter)
    ((batch, _),) = submitter.sent
    (request,) = batch.requests
    assert request.target_span_ids == [ids["planner"], ids["researcher"], ids["writer"]]
    assert sorted(s.name for s in request.spans) == sorted(
        ["invoke_agent planner", "invoke_agent researcher", "invoke_agent writer", "invoke_agent a"] + ["chat m"] * 4
    )
    assert [run.input.input_messages[0].text for run in read_runs(request)] == [q for _, q in THREE_AGENTS]
    assert (state.counters.runs_read, state.counters.runs_enqueued, state.counters.traces_enqueued) == (3, 3, 1)


def test_a_trace_of_runs_too_large_together_goes_run_by_run(tmp_path: Path) -> None:
    """Cap 64 KB: the three runs together (~40 KB + ~40 KB + small) do not fit one message;
    each goes on its own with its own spans. A run over the cap alone is the only reject."""
    line, ids = _three_agent_line({"planner": 40_000, "writer": 40_000})
    path = tmp_path / "t.jsonl"
    path.write_text(line)
    submitter = CapturingSubmitter(64 * 1024)
    state, _ = _run(path, submitter)
    requests = [r for batch, _ in submitter.sent for r in batch.requests]
    assert [r.target_span_ids for r in requests] == [[ids["planner"]], [ids["researcher"]], [ids["writer"]]]
    names = [sorted(s.name for s in r.spans) for r in requests]
    assert names == [
        ["chat m", "invoke_agent planner"],
        ["chat m", "chat m", "invoke_agent a", "invoke_agent researcher"],
        ["chat m", "invoke_agent writer"],
    ]
    assert (state.counters.runs_enqueued, state.counters.runs_rejected) == (3, {})
    assert (len(submitter.sent), state.counters.traces_enqueued) == (2, 1)  # cut across batches: counted once

    line, ids = _three_agent_line({"planner": 100_000, "writer": 20_000})
    path.write_text(line)
    submitter = CapturingSubmitter(64 * 1024)
    state, reporter = _run(path, submitter)
    requests = [r for batch, _ in submitter.sent for r in batch.requests]
    assert [r.target_span_ids for r in requests] == [[ids["researcher"]], [ids["writer"]]]
    assert (state.counters.runs_enqueued, state.counters.runs_rejected) == (2, {"too_large": 1})
    assert any(f"span {ids['planner']}: run not enqueued (too_large)" in line for line in reporter.lines)


def _nested_line(i: int, depth: int) -> str:
    """Trace ``i`` with a read span attribute and a read event's attribute each nesting ``depth``
    arrayValue levels."""
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(depth):
        value = {"arrayValue": {"values": [value]}}
    children, root = trace_spans(i)
    root["attributes"].append({"key": "gen_ai.conversation.id", "value": value})
    root["events"] = [{"name": "gen_ai.choice", "attributes": [{"key": "message", "value": value}]}]
    document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": [*children, root]}]}]}
    return json.dumps(document) + "\n"


def test_a_value_nested_past_the_limit_is_one_malformed_line_and_never_sinks_a_batch(tmp_path: Path) -> None:
    """A value nesting 95 levels made its whole batch, neighbours included, a dead letter (the
    workers refuse a message nesting past 100 levels). Past MAX_VALUE_DEPTH the line is
    malformed, reported and skipped; at it, every message passes the workers' own screen."""
    from tracing.otlp import MAX_VALUE_DEPTH
    from tracing.queue import task_message
    from worker._guard import check_message
    from worker._settings import load_settings

    path = tmp_path / "t.jsonl"
    lines = [big_trace_line(i) for i in range(6)]
    lines[1] = _nested_line(1, MAX_VALUE_DEPTH)
    lines[3] = _nested_line(3, 95)
    path.write_text("".join(lines))
    submitter = CapturingSubmitter(8 * 2**20)
    state, reporter = _run(path, submitter)

    assert (state.counters.malformed, state.counters.runs_enqueued) == (1, 5)
    assert state.counters.malformed_where == [f"{path}:4"]
    assert any(f"{path}:4" in line and "nested too deeply" in line for line in reporter.lines)
    settings = load_settings()
    for batch, encoded in submitter.sent:
        message = task_message(batch, "tracescore", encoded)
        kombu_like = SimpleNamespace(
            headers=dict(message.headers),
            body=message.body.encode(),
            content_type="application/json",
            content_encoding="utf-8",
        )
        refusal, _ = check_message(kombu_like, settings, frozenset({message.headers["task"]}))
        assert refusal is None, refusal


class _StoppedMidBatch:
    """Scores in place (as the embedded scorer does) and is stopped inside its second batch by
    a second Ctrl-C, after scoring some of it."""

    mode = "embedded"
    max_payload_bytes = None

    def __init__(self) -> None:
        self.scored = 0
        self.batches = 0

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        self.batches += 1
        if self.batches == 2:
            self.scored += 1
            raise KeyboardInterrupt
        self.scored += batch.runs()

    def progress(self, job_id: str) -> dict[str, int]:
        return {"scored": self.scored}

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_batch_stopped_mid_hand_over_counts_as_enqueued(tmp_path: Path) -> None:
    """An embedded backfill stopped by a second Ctrl-C inside a batch reported more scores than
    expected (2,770 scored of 2,000): the batch's runs were scored but not counted as enqueued."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i) for i in range(30)))
    source = FileSource([path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], batch_size=10)
    state = BackfillState(job_id="bf-stopped", source=source.describe(), options=options)
    submitter = _StoppedMidBatch()
    with pytest.raises(KeyboardInterrupt):
        Backfill(source, state, submitter).run()
    assert state.counters.runs_enqueued == 20
    assert submitter.scored <= state.expected_scores


def _many_runs_line(t: int, runs: int) -> str:
    """One trace as an OTLP JSON line: a workflow span above ``runs`` agents (each a run)."""
    tid = trace_id(10_000 + t)
    workflow = {"traceId": tid, "spanId": f"{t:08x}ffffffff", "name": "workflow", "kind": 1, "attributes": []}
    for name in ("startTimeUnixNano", "endTimeUnixNano"):
        workflow[name] = "1700000000000000000"
    spans: list[dict[str, Any]] = [workflow]
    for i in range(runs):
        children, root = trace_spans(t * 100_000 + i)
        for span in (*children, root):
            span["traceId"] = tid
        root["parentSpanId"] = workflow["spanId"]
        spans += [*children, root]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": spans}]}]}) + "\n"


def test_a_backfill_never_sends_a_batch_past_the_pairs_bound_and_loses_no_run(tmp_path: Path) -> None:
    """A backfill of 100 scorers at the largest --batch-size (5,000 runs) over traces of up to
    1,500 runs each: each message asks the workers for at most ``MAX_BATCH_PAIRS`` (run, scorer
    id) pairs (a trace over it alone is split by runs), and every run is enqueued once. The
    driver cut by bytes and runs only: one message of 3,503 runs x 100 ids (350,300 pairs), which
    the workers refuse."""
    from tracing.queue import MAX_BATCH_PAIRS, MAX_SCORER_IDS

    sizes = [1_500, 3, 1_001, 999]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(_many_runs_line(t, runs) for t, runs in enumerate(sizes)))
    submitter = CapturingSubmitter(8 * 2**20)
    options = BackfillOptions(
        scorers_module="tests.backfill.scorers", scorer_ids=[f"s{i}" for i in range(MAX_SCORER_IDS)], batch_size=5_000
    )
    state = BackfillState(job_id="bf-pairs", source=FileSource([path]).describe(), options=options)
    state = Backfill(FileSource([path]), state, submitter, reporter=Messages()).run()
    for batch, encoded in submitter.sent:
        assert batch.pairs() <= MAX_BATCH_PAIRS
        assert encoded is not None
        ScoreBatch.model_validate({"batch_id": batch.batch_id, "requests": [json.loads(e) for e in encoded]})
    runs = submitter.runs
    assert len(runs) == len(set(runs)) == sum(sizes) == state.counters.runs_enqueued
    assert {t for t, _ in runs} == {trace_id(10_000 + t) for t in range(len(sizes))}
    assert state.counters.runs_rejected == {}
    # Full messages: one more than the pairs need for each trace split.
    assert len(submitter.sent) <= -(-sum(sizes) * MAX_SCORER_IDS // MAX_BATCH_PAIRS) + 2
