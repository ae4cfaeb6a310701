"""SpanRecord and the spans form of ScoreRequest: building, planning runs, validation."""

from __future__ import annotations

import dataclasses
import json

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


def test_a_record_of_many_flattened_keys_is_not_sized_below_its_json() -> None:
    """OpenInference flattens each message into keys of its own (``llm.input_messages.7.message.
    content``): a span of 150 short messages is mostly keys. The size the buffer and the hand-off
    queue are bounded by counted the values only, a fifth of the record's JSON here, so
    ``max_buffer_bytes`` let several times its bytes in."""
    rec = Recorder()
    attrs: dict[str, str] = {"openinference.span.kind": "LLM"}
    for i in range(150):
        attrs[f"llm.input_messages.{i}.message.role"] = "user"
        attrs[f"llm.input_messages.{i}.message.content"] = "hi"
    with rec.span("chat m", attrs):
        pass
    record = span_record(rec.spans()[0])
    size = compact(record)  # the buffer's own (build_record) shares its count of attributes
    actual = len(TypeAdapter(SpanRecord).dump_json(record))
    assert actual <= size <= actual + 1000, (actual, size)


@pytest.mark.parametrize("char", ["x", "é", "中", "😀"])
def test_a_record_of_wide_text_is_sized_by_what_it_holds(char: str) -> None:
    """A prompt of 200,000 characters was counted 200,000 bytes whatever they were. CPython holds
    one with a character past U+00FF at 2 bytes each, past U+FFFF at 4: the exporter's buffer and
    queue and the backfill's assembler let 2 to 4 times their bounds in. The size now covers what
    the text holds (in the span name too), and its JSON is at most twice the size."""
    import sys

    prompt = ("Paris " + char) * 25_000
    rec = Recorder()
    with rec.span(f"chat {char}", {**CHAT, "gen_ai.prompt": prompt}):
        pass
    record = span_record(rec.spans()[0])
    size = compact(record)
    assert size >= sys.getsizeof(prompt) - 100 + len(record.name)
    assert len(TypeAdapter(SpanRecord).dump_json(record)) <= 2 * size


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


def test_request_carries_spans_and_the_targets_among_them() -> None:
    """One shape: span records + target_span_ids; the targets are among the spans of one trace,
    each named once, and the validator says which id is wrong."""
    rec = Recorder()
    agent_trace(rec)
    spans = rec.spans()
    records = [span_record(s) for s in spans]
    target = records[-1].span_id  # the agent span ends last
    run = trace_to_run(spans)
    ok = ScoreRequest(spans=records, target_span_ids=[target], scorer_ids=["s"])
    assert (ok.trace_id, ok.run_ids()) == (run.identity.trace_id, [f"{run.identity.trace_id}:{target}"])
    assert ok.targets() == {target: records[-1]}
    assert records[-1].name == "invoke_agent a"
    assert ok.agent_labels() == {target: run.identity.agent_name} == {target: "a"}
    chat = next(r for r in records if r.name.startswith("chat"))
    # (a run's target is never inside another run: the chat span taken out from under the agent)
    apart = [dataclasses.replace(r, parent_span_id=None) if r is chat else r for r in records]
    both = ScoreRequest(spans=apart, target_span_ids=[chat.span_id, target], scorer_ids=["s"])
    assert list(both.targets()) == [chat.span_id, target]  # in target order
    assert both.agent_labels() == {chat.span_id: chat.name, target: "a"}  # not an agent span: its name
    with pytest.raises(ValidationError, match="spans"):
        ScoreRequest(scorer_ids=["s"], target_span_ids=[target])
    with pytest.raises(ValidationError, match="too_short"):
        ScoreRequest(spans=[], target_span_ids=[target], scorer_ids=["s"])
    with pytest.raises(ValidationError, match="target_span_ids"):
        ScoreRequest(spans=records, scorer_ids=["s"])
    with pytest.raises(ValidationError, match=r"target_span_ids\n  List should have at least 1 item"):
        ScoreRequest(spans=records, target_span_ids=[], scorer_ids=["s"])
    with pytest.raises(ValidationError, match=f"target_span_ids names {target} twice"):
        ScoreRequest(spans=records, target_span_ids=[target, chat.span_id, target], scorer_ids=["s"])
    with pytest.raises(ValidationError, match="run"):  # the old second shape is refused, not ignored
        ScoreRequest.model_validate({"run": run.model_dump(), "scorer_ids": ["s"]})
    with pytest.raises(ValidationError, match=f"target_span_ids {'0' * 16} not among the {len(records)} spans"):
        ScoreRequest(spans=records, target_span_ids=[target, "0" * 16], scorer_ids=["s"])
    other = SpanRecord(trace_id="1" * 32, span_id="2" * 16, name="x")
    with pytest.raises(ValidationError, match="2 traces"):
        ScoreRequest(spans=[*records, other], target_span_ids=[target], scorer_ids=["s"])
    with pytest.raises(ValidationError, match="pattern"):
        ScoreRequest.model_validate(
            {
                "spans": [{"trace_id": "X" * 32, "span_id": target, "name": "x"}],
                "target_span_ids": [target],
                "scorer_ids": ["s"],
            }
        )
    with pytest.raises(ValidationError, match=r"target_span_ids\.0\n  String should match pattern"):
        ScoreRequest.model_validate({**json.loads(ok.model_dump_json()), "target_span_ids": ["X" * 16]})


def test_a_request_of_the_old_shape_is_read_as_one_target() -> None:
    """A message queued by an older producer (one ``target_span_id`` string) still validates,
    as a request of that one target; given both, the old field is refused (not ignored)."""
    rec = Recorder()
    agent_trace(rec)
    records = [span_record(s) for s in rec.spans()]
    target = records[-1].span_id
    new = ScoreRequest(spans=records, target_span_ids=[target], scorer_ids=["s"])
    old_json = new.model_dump_json().replace(f'"target_span_ids":["{target}"]', f'"target_span_id":"{target}"')
    assert '"target_span_id":"' in old_json
    assert "target_span_ids" not in old_json
    old = ScoreRequest.model_validate_json(old_json)
    assert old.target_span_ids == [target]
    assert old == new
    with pytest.raises(ValidationError, match="target_span_id"):
        ScoreRequest.model_validate({**json.loads(new.model_dump_json()), "target_span_id": target})


def test_fast_request_matches_model_construct() -> None:
    """The exporter's request builder sets exactly what model_construct sets (guards pydantic)."""
    rec = Recorder()
    agent_trace(rec)
    records = [span_record(s) for s in rec.spans()]
    target = records[-1].span_id
    fast = spans_request(records, [target], ["a", "b"])
    slow = ScoreRequest.model_construct(spans=records, target_span_ids=[target], scorer_ids=["a", "b"])
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert (fast.__pydantic_extra__, fast.__pydantic_private__) == (slow.__pydantic_extra__, slow.__pydantic_private__)
    fast.enqueued_at = 1.5  # the exporter stamps it at hand-off
    again = ScoreRequest.model_validate_json(fast.model_dump_json())
    assert again.enqueued_at == 1.5
    assert isinstance(trace_to_run(again.spans or [], again.target_span_ids[0]), TracedRun)


def test_a_spans_own_tracescore_environment_is_never_taken() -> None:
    """The exporter's record: what Langfuse reads decides, never the span's own attribute that
    carries it to the worker (kept, it overrode the resource's and went unbounded: review)."""
    plain = Recorder()
    with plain.span("chat m", {"tracescore.environment": "x" * 100_000}):
        pass
    placed = Recorder(resource={"deployment.environment": "prod"})
    with placed.span("chat m", {"tracescore.environment": "elsewhere"}):
        pass
    own = {s.name: s.attributes["tracescore.environment"] for s in plain.spans()}
    assert [span_record(s).environment for s in (*plain.spans(), *placed.spans())] == [None, "prod"]
    assert {s.name: s.attributes["tracescore.environment"] for s in plain.spans()} == own  # the SDK's, untouched
