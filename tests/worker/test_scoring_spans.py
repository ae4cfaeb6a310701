"""score_batch on requests that carry spans: the worker reads the run, or records why it cannot."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from scorers import create_scorer
from tests.tracing._exporting import Recording
from tests.tracing._spans import Recorder, agent_trace
from tracing import CallbackSink, MemoryScoreWriter, ScoreBatch, ScoreRequest, ScoringRule, ScoringSpanExporter
from tracing._records import span_record
from tracing.read import plan_runs
from worker import _scoring
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker.store import MemoryScoreStore


def _answer_length(run: Any) -> float:
    return min(1.0, len(run.output[0].content.parts[-1].text) / 100)


length = create_scorer("length", type="agent").generate_score(_answer_length)
asked = create_scorer("asked", type="agent", label=lambda s: "q").generate_score(
    lambda run: 1.0 if run.input.input_messages[0].text.endswith("?") else 0.0
)


def _deps() -> tuple[ScoringDeps, MemoryScoreWriter]:
    writer = MemoryScoreWriter()
    return ScoringDeps(registry=Registry([length, asked]), store=MemoryScoreStore(), writer=writer), writer


def _shipped(rec: Recorder) -> list[ScoreRequest]:
    """One spans request per run in the recorder's traces, as the worker receives them (JSON)."""
    records = [span_record(s) for s in rec.spans()]
    by_trace: dict[str, list[Any]] = {}
    for r in records:
        by_trace.setdefault(r.trace_id, []).append(r)
    out = []
    for trace in by_trace.values():
        for target, spans in plan_runs(trace):
            request = ScoreRequest(spans=spans, target_span_ids=[target.span_id], scorer_ids=["length", "asked"])
            out.append(ScoreRequest.model_validate_json(request.model_dump_json()))
    return out


def _scores(writer: MemoryScoreWriter) -> dict[tuple[str, str, str], Any]:
    return {(r.trace_id, r.span_id, r.scorer_id): (r.score, r.label, r.span_name, r.error_type) for r in writer.records}


def test_spans_score_like_the_run_read_in_the_app() -> None:
    """The same traces as shipped in process or as a worker receives them (JSON) give the same score
    records (ids, scores, labels)."""
    rec = Recorder()
    for i in range(3):
        agent_trace(rec, question=f"question {i}?", answer="word " * (i * 7))
    shipped = _shipped(rec)
    assert len(shipped) == 3
    as_runs = [ScoreRequest.model_validate_json(r.model_dump_json()) for r in shipped]  # as a worker gets them
    deps_a, writer_a = _deps()
    deps_b, writer_b = _deps()
    report = asyncio.run(score_batch(ScoreBatch(batch_id="spans", requests=shipped), deps_a))
    asyncio.run(score_batch(ScoreBatch(batch_id="runs", requests=as_runs), deps_b))
    assert report.scored == 6
    assert not report.failed
    assert _scores(writer_a) == _scores(writer_b)
    assert {r.span_name for r in writer_a.records} == {"invoke_agent a"}
    assert sorted({r.score for r in writer_a.records if r.scorer_id == "length"}) == [0.0, 0.35, 0.7]


def test_unreadable_shipped_trace_becomes_error_records() -> None:
    """A trace the worker cannot read gives one error record per scorer; the batch goes on."""
    bad = Recorder()
    with (
        bad.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}),
        bad.span("chat m", {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "{not json"}),
    ):
        pass
    good = Recorder()
    agent_trace(good, question="fine?")
    deps, writer = _deps()
    msg = ScoreBatch(batch_id="mixed", requests=[*_shipped(bad), *_shipped(good)])
    report = asyncio.run(score_batch(msg, deps))
    assert report.scored == 2
    assert report.failed == {"bad_json": 2}
    errors = [r for r in writer.records if r.error_type]
    assert sorted(r.scorer_id for r in errors) == ["asked", "length"]
    for record in errors:
        assert record.span_name == "invoke_agent a"
        assert "'chat m'" in (record.error_message or "")
        assert "gen_ai.input.messages" in (record.error_message or "")
        assert not record.retryable
    again = asyncio.run(score_batch(msg, deps))  # final: a redelivery does not try again
    assert again.skipped == {"already_scored": 4}


def test_spans_are_read_once_and_only_when_something_is_left_to_score(monkeypatch: pytest.MonkeyPatch) -> None:
    """One read per request, and none on a redelivery whose scores are all stored."""
    reads: list[str | None] = []
    real = _scoring.trace_to_run

    def counting(spans: Any, target_span_id: str | None = None, **kw: Any) -> Any:
        reads.append(target_span_id)
        return real(spans, target_span_id, **kw)

    monkeypatch.setattr(_scoring, "trace_to_run", counting)
    rec = Recorder()
    agent_trace(rec)
    agent_trace(rec, question="other?")
    deps, _ = _deps()
    msg = ScoreBatch(batch_id="once", requests=_shipped(rec))
    asyncio.run(score_batch(msg, deps))
    assert sorted(reads) == sorted(r.target_span_ids[0] for r in msg.requests)
    asyncio.run(score_batch(msg, deps))
    assert len(reads) == 2


def test_exporter_batches_score_in_process_without_json() -> None:
    """What the exporter hands a CallbackSink (the embedded mode) scores as is."""
    sink = Recording()
    exporter = ScoringSpanExporter([ScoringRule(["length", "asked"])], CallbackSink(sink), grace_s=0)
    try:
        rec = Recorder()
        agent_trace(rec, question="where?", answer="x" * 50)
        exporter.export(rec.spans())
        assert exporter.force_flush(5000)
    finally:
        exporter.shutdown(2000)
    (batch,) = sink.batches
    assert batch.requests[0].spans is not None
    deps, writer = _deps()
    report = asyncio.run(score_batch(batch, deps))
    assert report.scored == 2
    assert {r.scorer_id: r.score for r in writer.records} == {"length": 0.5, "asked": 1.0}
    json.loads(batch.model_dump_json())  # and it is a valid JSON message too


def test_a_crash_while_reading_is_an_error_record_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a bug in the transform gives error records for that request only."""

    def broken(spans: Any, target_span_id: str | None = None, **kw: Any) -> Any:
        raise KeyError("boom")

    rec = Recorder()
    agent_trace(rec)
    deps, writer = _deps()
    monkeypatch.setattr(_scoring, "trace_to_run", broken)
    report = asyncio.run(score_batch(ScoreBatch(batch_id="crash", requests=_shipped(rec)), deps))
    assert report.failed == {"read_failed": 2}
    assert all("KeyError" in (r.error_message or "") for r in writer.records)
