"""SpanRecord and the spans form of ScoreRequest: building, planning runs, validation."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import TypeAdapter, ValidationError

from tests.tracing._spans import Recorder, agent_trace, genai_messages
from tracing import ScoreRequest, SpanRecord, TracedRun, trace_to_run
from tracing._records import compact, span_record
from tracing.queue import spans_request
from tracing.read import plan_runs

CHAT = {"gen_ai.operation.name": "chat"}


def _chat(rec: Recorder, text: str) -> None:
    with rec.span(
        "chat m",
        {
            **CHAT,
            "gen_ai.input.messages": genai_messages(("user", text)),
            "gen_ai.output.messages": genai_messages(("assistant", "ok")),
        },
    ):
        pass


def test_record_keeps_ids_times_kind_status_and_origin() -> None:
    """A record carries the span's identity, timing, kind, status, service and scope."""
    rec = Recorder(service="svc", scope="my.scope")
    with (
        rec.tracer.start_as_current_span("invoke_agent a", kind=SpanKind.SERVER) as root,
        rec.span("chat m", CHAT) as child,
    ):
        child.set_status(Status(StatusCode.ERROR, "boom"))
    by_name = {s.name: s for s in rec.spans()}
    record = span_record(by_name["chat m"])
    ctx, parent = child.get_span_context(), root.get_span_context()
    assert (record.trace_id, record.span_id) == (format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
    assert record.parent_span_id == format(parent.span_id, "016x")
    assert (record.kind, record.status) == ("INTERNAL", "ERROR")
    assert (record.start_time_ns, record.end_time_ns) == (by_name["chat m"].start_time, by_name["chat m"].end_time)
    assert (record.service_name, record.scope_name) == ("svc", "my.scope")
    assert span_record(by_name["invoke_agent a"]).kind == "SERVER"
    assert span_record(by_name["invoke_agent a"]).parent_span_id is None


def test_compact_keeps_only_read_attributes() -> None:
    """Attributes no reader looks at are left out; OpenInference message lists are kept."""
    rec = Recorder()
    attrs = {"http.url": "/x", "llm.input_messages.0.message.role": "user", "llm.token_count.total": 3, **CHAT}
    with rec.span("chat m", attrs):
        pass
    record = span_record(rec.spans()[0])
    assert record.attributes == {"llm.input_messages.0.message.role": "user", **CHAT}
    size = compact(record)  # idempotent; returns the approximate JSON size
    assert record.attributes == {"llm.input_messages.0.message.role": "user", **CHAT}
    actual = len(TypeAdapter(SpanRecord).dump_json(record))
    assert actual <= size <= actual + 1000


def test_plan_without_agent_targets_top_level_llm_spans() -> None:
    """No agent span: each outermost LLM span is a run; a judge subtree is excluded."""
    rec = Recorder()
    with rec.span("request"):
        _chat(rec, "one")
        with rec.span("judge") as judge:
            _chat(rec, "judge prompt")
        _chat(rec, "two")
    records = [span_record(s) for s in rec.spans()]
    judge_id = format(judge.get_span_context().span_id, "016x")
    runs = plan_runs(records, exclude_under={judge_id})
    assert [len(spans) for _, spans in runs] == [1, 1]
    texts = [trace_to_run(spans, target.span_id).input.input_messages[0].text for target, spans in runs]
    assert texts == ["one", "two"]
    assert len(plan_runs(records)) == 3


def test_request_carries_spans_and_the_target_among_them() -> None:
    """One shape: span records + target_span_id; the target is among the spans of one trace."""
    rec = Recorder()
    agent_trace(rec)
    spans = rec.spans()
    records = [span_record(s) for s in spans]
    target = records[-1].span_id  # the agent span ends last
    run = trace_to_run(spans)
    ok = ScoreRequest(spans=records, target_span_id=target, scorer_ids=["s"])
    assert (ok.trace_id, ok.span_id, ok.span_name) == (run.identity.trace_id, target, "invoke_agent a")
    assert ok.agent_label == run.identity.agent_name == "a"
    with pytest.raises(ValidationError, match="spans"):
        ScoreRequest(scorer_ids=["s"], target_span_id=target)
    with pytest.raises(ValidationError, match="too_short"):
        ScoreRequest(spans=[], target_span_id=target, scorer_ids=["s"])
    with pytest.raises(ValidationError, match="target_span_id"):
        ScoreRequest(spans=records, scorer_ids=["s"])
    with pytest.raises(ValidationError, match="run"):  # the old second shape is refused, not ignored
        ScoreRequest.model_validate({"run": run.model_dump(), "scorer_ids": ["s"]})
    with pytest.raises(ValidationError, match="not among"):
        ScoreRequest(spans=records, target_span_id="0" * 16, scorer_ids=["s"])
    other = SpanRecord(trace_id="1" * 32, span_id="2" * 16, name="x")
    with pytest.raises(ValidationError, match="2 traces"):
        ScoreRequest(spans=[*records, other], target_span_id=target, scorer_ids=["s"])
    with pytest.raises(ValidationError, match="pattern"):
        ScoreRequest.model_validate(
            {"spans": [{"trace_id": "X" * 32, "span_id": target, "name": "x"}], "target_span_id": target,
             "scorer_ids": ["s"]}
        )


def test_fast_request_matches_model_construct() -> None:
    """The exporter's request builder sets exactly what model_construct sets (guards pydantic)."""
    rec = Recorder()
    agent_trace(rec)
    records = [span_record(s) for s in rec.spans()]
    target = records[-1].span_id
    fast = spans_request(records, target, ["a", "b"])
    slow = ScoreRequest.model_construct(spans=records, target_span_id=target, scorer_ids=["a", "b"])
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert (fast.__pydantic_extra__, fast.__pydantic_private__) == (slow.__pydantic_extra__, slow.__pydantic_private__)
    fast.enqueued_at = 1.5  # the exporter stamps it at hand-off
    again = ScoreRequest.model_validate_json(fast.model_dump_json())
    assert again.enqueued_at == 1.5
    assert isinstance(trace_to_run(again.spans or [], again.target_span_id), TracedRun)
