"""Hostile score content on its way to the real Phoenix and MLflow servers: a reason of megabytes,
control characters (NUL too), lone surrogates, NaN and infinities, a scorer id of thousands of
characters, any script. Each record is written as the server stores it on any of its databases
(a lone surrogate and a NUL as U+FFFD, a text too long for its column cut with a marker) or
refused by the sink itself, named, without a request: never a 4xx or 5xx from the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration._servers import Server
from tests.integration._traces import fresh_traces, send_otlp, span_ids
from tests.integration.test_mlflow import EXPERIMENT_HEADER, assessment_id, assessments
from tests.integration.test_mlflow import experiment as experiment
from tests.integration.test_phoenix import by_identifier, phoenix_annotations, wait_ingested
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, MlflowSink, PhoenixSink, Refused, ScoreSink

_HOSTILE: dict[str, dict[str, Any]] = {
    "huge_reason": {"score": 0.5, "reason": "r" * 3_000_000},
    "controls": {"score": 0.5, "reason": "a\x00b\x1b[31mred\x07\r\nforged line\x7f\x85\u2028", "label": "x\x00y"},
    "lone_surrogates": {"score": 0.5, "reason": "half \ud83d of an emoji \udc00", "label": "l\udfff"},
    "nan": {"score": float("nan"), "reason": "not a number"},
    "infinity": {"score": float("inf"), "reason": "too good"},
    "non_ascii": {"score": 0.25, "reason": "Ответ ✓ 答案 🙂 \u202eRTL", "label": "très bien"},
    "error": {"error_type": "JudgeError", "error_message": "boom \x00 \ud800", "failed_step": "judge"},
    "not_scorable": {"not_scorable": "no ground truth \x1b]0;title\x07"},
}
_LONG_ID = "scorer-" + "é" * 3000


def _records(trace_id: str, spans: list[str]) -> list[ScoreRecord]:
    records = []
    for (case, fields), span in zip(sorted(_HOSTILE.items()), spans, strict=False):
        scorer = _LONG_ID if case == "non_ascii" else f"hostile-{case}"
        records.append(
            ScoreRecord(
                score_id=score_id_for(trace_id, span, scorer, "1"),
                trace_id=trace_id,
                span_id=span,
                scorer_id=scorer,
                **fields,
            )
        )
    return records


def _trace(tmp_path: Path, project: str, salt: str) -> tuple[list[dict[str, Any]], str, list[str]]:
    traces = fresh_traces(tmp_path / "traces", lines=1, salt=salt, project=project)
    spans = sorted(span_ids(traces))
    trace_id = traces[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    assert len(spans) >= len(_HOSTILE)
    return traces, trace_id, spans


def _delivered(records: list[ScoreRecord], sink: ScoreSink) -> list[ScoreRecord]:
    """``records`` delivered by ``sink`` (closed after): those it delivered; every other one
    refused by the sink for a reason it names."""
    try:
        outcomes = sink.deliver(records)
    finally:
        sink.close()
    delivered = []
    for record, outcome in zip(records, outcomes, strict=True):
        if isinstance(outcome, Refused):
            assert outcome.reason == "score is not a finite number (JSON cannot carry it)", (record.scorer_id, outcome)
        else:
            assert outcome == Delivered(), (record.scorer_id[:40], outcome)
            delivered.append(record)
    assert {r.scorer_id for r in records} - {r.scorer_id for r in delivered} == {"hostile-infinity", "hostile-nan"}
    return delivered


def test_phoenix_stores_hostile_scores_as_they_are_or_the_sink_refuses_them(
    phoenix: Server, project: str, tmp_path: Path
) -> None:
    traces, trace_id, spans = _trace(tmp_path, project, f"phoenix-hostile:{project}")
    send_otlp(phoenix.url, traces)
    wait_ingested(phoenix, project, set(spans))
    records = _records(trace_id, spans)
    delivered = _delivered(records, PhoenixSink(phoenix.url, timeout_s=30))
    found = by_identifier(phoenix_annotations(phoenix, project, spans))
    # As Phoenix on PostgreSQL stores them too (tests/tracing/test_phoenix_sink_limits.py): NUL
    # as U+FFFD, a name over 2,000 bytes cut with a marker. SQLite would have taken them whole.
    for record in delivered:
        got = found[f"tracescore:{record.score_id}"]
        if len(record.scorer_id.encode()) <= 2_000:
            assert got["name"] == record.scorer_id
        else:
            assert got["name"].startswith(record.scorer_id[:900])
            assert "cut by tracescore from 3,007 characters" in got["name"]
            assert len(got["name"].encode()) <= 2_000
        if record.ok and record.not_scorable is None:
            assert got["result"]["explanation"] == _stored(record.reason)
            assert got["result"]["label"] == _stored(record.label)
        elif not record.ok:
            assert got["result"]["explanation"] == _stored(f"{record.error_type}: {record.error_message}")


def _stored(text: str | None) -> str | None:
    """``text`` with each NUL as U+FFFD (PostgreSQL holds no NUL), as the sinks send it."""
    return None if text is None else text.replace("\x00", "\ufffd")


def test_mlflow_stores_hostile_scores_as_they_are_or_the_sink_refuses_them(
    mlflow: Server, project: str, tmp_path: Path, experiment: str
) -> None:
    traces, trace_id, spans = _trace(tmp_path, project, f"mlflow-hostile:{project}")
    send_otlp(mlflow.url, traces, headers={EXPERIMENT_HEADER: experiment})
    records = _records(trace_id, spans)
    delivered = _delivered(records, MlflowSink(mlflow.url, timeout_s=30))
    found = assessments(mlflow, [trace_id])
    # As every database behind MLflow stores them (tests/tracing/test_mlflow_sink_limits.py):
    # NUL as U+FFFD (PostgreSQL), a name over 250 characters and a rationale over 64 KiB cut
    # with a marker (VARCHAR(250), MySQL's TEXT). SQLite would have taken them whole.
    for record in delivered:
        got = found[assessment_id(record)]
        if len(record.scorer_id) <= 250:
            assert got["assessment_name"] == _stored(record.scorer_id)
        else:
            assert got["assessment_name"].startswith(record.scorer_id[:150])
            assert len(got["assessment_name"]) <= 250
            assert "cut by tracescore from 3,007 characters" in got["assessment_name"]
        if record.ok and record.not_scorable is None:
            reason = _stored(record.reason or "") or ""
            if len(reason.encode()) <= 65_535:
                assert got.get("rationale", "") == reason
            else:
                assert got["rationale"].startswith(reason[:60_000])
                assert got["rationale"].endswith("]")
                assert f"cut by tracescore from {len(reason):,} characters" in got["rationale"]
                assert len(got["rationale"].encode()) <= 65_535
