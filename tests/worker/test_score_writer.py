"""ScoreWriter implementations: OTLP carrier spans with evaluation events, JSONL, console."""

from __future__ import annotations

import io
import json
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tracing._score_record import ScoreRecord, score_id_for
from tracing._score_writer import ConsoleScoreWriter, JsonlScoreWriter, OtlpScoreWriter

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _rec(scorer: str, **kw: object) -> ScoreRecord:
    return ScoreRecord(
        score_id=score_id_for(TRACE, SPAN, scorer, "2"),
        trace_id=TRACE,
        span_id=SPAN,
        span_name="invoke_agent",
        scorer_id=scorer,
        scorer_version="2",
        **kw,  # type: ignore[arg-type]
    )


def test_otlp_writer_makes_one_child_carrier_span_per_scored_span() -> None:
    """Two scores of one span → one carrier span, child of and linked to it, two events."""
    exporter = InMemorySpanExporter()
    writer = OtlpScoreWriter(exporter)
    writer.write(
        [
            _rec(
                "relevancy",
                score=0.8,
                label="relevant",
                reason="on topic",
                judge_models=["openai/gpt-4o-mini"],
                input_tokens=120,
                output_tokens=8,
            ),
            _rec("toxicity", error_type="JudgeAuthError", error_message="no key"),
        ]
    )
    assert writer.flush(5)
    (span,) = exporter.get_finished_spans()
    assert span.kind is SpanKind.INTERNAL
    assert span.context.trace_id == int(TRACE, 16)
    assert span.parent is not None
    assert span.parent.span_id == int(SPAN, 16)
    assert span.parent.is_remote
    assert [link.context.span_id for link in span.links] == [int(SPAN, 16)]
    assert span.attributes["tracescore.role"] == "score_writer"
    ok, bad = span.events
    assert ok.name == bad.name == "gen_ai.evaluation.result"
    assert ok.attributes["gen_ai.evaluation.name"] == "relevancy"
    assert ok.attributes["gen_ai.evaluation.score.value"] == 0.8
    assert ok.attributes["gen_ai.evaluation.score.label"] == "relevant"
    assert ok.attributes["gen_ai.evaluation.explanation"] == "on topic"
    assert ok.attributes["tracescore.score.id"] == score_id_for(TRACE, SPAN, "relevancy", "2")
    assert ok.attributes["tracescore.scorer.version"] == "2"
    assert ok.attributes["gen_ai.usage.input_tokens"] == 120
    assert ok.attributes["tracescore.judge.model"] == "openai/gpt-4o-mini"
    assert "error.type" not in ok.attributes
    assert bad.attributes["error.type"] == "JudgeAuthError"
    assert "gen_ai.evaluation.score.value" not in bad.attributes
    writer.close()


def test_jsonl_writer_appends_records(tmp_path: Path) -> None:
    """Each record is one JSON line that reads back as the same ScoreRecord."""
    path = tmp_path / "scores" / "out.jsonl"
    writer = JsonlScoreWriter(path)
    records = [_rec("a", score=1.0), _rec("b", score=0.0)]
    writer.write(records)
    writer.close()
    lines = path.read_text().splitlines()
    assert [ScoreRecord.model_validate(json.loads(line)) for line in lines] == records


def test_console_writer_prints_one_line_per_score() -> None:
    """Console lines name the trace, scorer, and score or error."""
    out = io.StringIO()
    ConsoleScoreWriter(out).write([_rec("a", score=0.25, label="low"), _rec("b", error_type="X", error_message="m")])
    first, second = out.getvalue().splitlines()
    assert "scorer=a 0.250 (low)" in first
    assert TRACE in first
    assert "error X: m" in second


def test_score_batch_to_otlp_events_and_the_exporter_skips_them() -> None:
    """score_batch → OTLP writer → carrier spans; fed back to the capture exporter, none is scored."""
    import asyncio

    from tests.worker._batches import batch
    from tests.worker.sample_scorers import length
    from tracing import CallbackSink, ScoringRule, ScoringSpanExporter
    from worker._registry import Registry
    from worker._scoring import ScoringDeps, score_batch
    from worker.store import MemoryScoreStore

    exporter = InMemorySpanExporter()
    writer = OtlpScoreWriter(exporter)
    msg = batch(range(3), ["length"], salt="otlp")
    deps = ScoringDeps(registry=Registry([length]), store=MemoryScoreStore(), writer=writer)
    assert asyncio.run(score_batch(msg, deps)).scored == 3
    assert writer.flush(5)
    spans = exporter.get_finished_spans()
    assert sorted(format(s.parent.span_id, "016x") for s in spans if s.parent) == sorted(
        r.span_id for r in msg.requests
    )
    assert all(s.events[0].attributes["gen_ai.evaluation.name"] == "length" for s in spans)

    sent: list[object] = []
    capture = ScoringSpanExporter([ScoringRule(["length"])], CallbackSink(sent.append), grace_s=0.0)
    capture.export(spans)
    assert capture.force_flush(5000)
    assert sent == []  # the loop guard: tracescore's own spans are never scored
    assert capture.stats()["skipped"].get("loop_guard") == 3
    capture.shutdown()
    writer.close()
