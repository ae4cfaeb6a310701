"""trace_to_run on arbitrary attribute values: a run or a TraceReadError, never another exception."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tracing._spans import Recorder
from tracing import TraceReadError, trace_to_run

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_keys = st.sampled_from(
    [
        "role",
        "parts",
        "type",
        "content",
        "text",
        "id",
        "name",
        "arguments",
        "response",
        "tool_calls",
        "function",
        "toolCallId",
        "toolName",
        "input",
        "output",
        "messages",
        "tag",
        "value",
    ]
)
_json: Any = st.recursive(
    _scalars | st.sampled_from(["user", "assistant", "system", "tool", "text", "tool_call", "tool-call"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=20,
)

_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "content": st.text(max_size=8)}),
    st.fixed_dictionaries({"type": st.just("text"), "content": _scalars}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "content": _scalars}),
    st.fixed_dictionaries(
        {"type": st.just("tool_call"), "id": _scalars, "name": st.text(max_size=5), "arguments": _json}
    ),
    st.fixed_dictionaries({"type": st.just("tool_call_response"), "id": _scalars, "response": _json}),
    st.fixed_dictionaries({"type": st.text(max_size=6)}),
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "assistant", "system", "tool", "developer", "bot"]),
        "parts": st.lists(_part, max_size=3),
    }
)
_messages = st.lists(_message, min_size=1, max_size=4) | st.lists(_message, max_size=4) | _json


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=_messages, out=_messages, system=_json, as_text=st.booleans())
def test_any_message_payload_gives_run_or_named_error(inp: Any, out: Any, system: Any, as_text: bool) -> None:
    """Whatever the producer wrote, the outcome is a run or a TraceReadError with a reason."""
    rec = Recorder()
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(inp if as_text else [inp]),
        "gen_ai.output.messages": json.dumps(out),
        "gen_ai.system_instructions": json.dumps(system),
    }
    with rec.span("chat m", attrs):
        pass
    outcome: Any
    try:
        outcome = trace_to_run(rec.spans())
    except TraceReadError as exc:
        outcome = exc
    if isinstance(outcome, TraceReadError):
        assert outcome.reason
        assert outcome.span_name == "chat m"
    else:
        assert outcome.identity.span_name == "chat m"


_DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested past the parser's depth
_CHAT = {"gen_ai.operation.name": "chat", "input.value": "q"}
_OI = {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user"}
_INDEX = "9" * 5000  # past int()'s 4300 digits


@pytest.mark.parametrize(
    "attributes",
    [
        {**_CHAT, "output.value": '{"text": "hi", "toolCalls": 5}'},
        {**_CHAT, "output.value": '{"text": "hi", "toolCalls": [{"payload": "x"}]}'},
        {**_CHAT, "output.value": '{"text": "hi", "toolCalls": [{"payload": [1]}]}'},
        {**_CHAT, "output.value": '{"text": "hi", "toolCalls": [{"payload": {"toolCallId": ["x"], "toolName": "t"}}]}'},
        {"gen_ai.operation.name": "chat", "gen_ai.input.messages": _DEEP},
        {"gen_ai.operation.name": "chat", "gen_ai.system_instructions": _DEEP, "gen_ai.input.messages": "[]"},
        {**_CHAT, "output.value": '{"text": "hi", "toolCalls": [{"toolName": "t", "args": "' + _DEEP + '"}]}'},
        {**_OI, f"llm.input_messages.{_INDEX}.message.role": "user"},
        {**_OI, f"llm.input_messages.0.message.tool_calls.{_INDEX}.tool_call.id": "x"},
        {**_OI, f"llm.input_messages.0.message.contents.{_INDEX}.message_content.text": "x"},
    ],
    ids=[
        "toolCalls-number",
        "payload-text",
        "payload-list",
        "tool-call-id-list",
        "deep-messages",
        "deep-system",
        "deep-tool-args",
        "oi-long-index",
        "oi-long-tool-call-index",
        "oi-long-content-index",
    ],
)
def test_content_the_readers_did_not_foresee_is_a_run_or_a_named_read_error(attributes: dict[str, Any]) -> None:
    """Shapes a fuzzer found making the readers raise TypeError, AttributeError, RecursionError or
    ValueError, which the worker records as read_failed ("a bug in the trace reader") and which
    ended a --dry-run: each now reads, or is a TraceReadError naming what was wrong."""
    rec = Recorder()
    with (
        rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}),
        rec.span("chat m", attributes),
    ):
        pass
    with contextlib.suppress(TraceReadError):
        trace_to_run(rec.spans())


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_backfill_names_such_content_without_crashing(tmp_path: Path, dry_run: bool) -> None:
    """The same through `tracescore backfill` (embedded): the job finishes; the dry run too."""
    from tests.backfill.test_batch_bytes import big_trace_line

    lines = [big_trace_line(i) for i in range(3)]
    lines[1] = lines[1].replace('"gen_ai.output.messages"', '"output.value"', 1)
    document = json.loads(lines[1])
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for attribute in span.get("attributes", []):
            if attribute["key"] == "output.value":
                attribute["value"] = {"stringValue": '{"text": "hi", "toolCalls": 5}'}
            if attribute["key"] == "gen_ai.tool.call.arguments":
                attribute["value"] = {"stringValue": _DEEP}
    lines[1] = json.dumps(document) + "\n"
    summary = _backfill_summary(tmp_path, lines, dry_run)
    assert "read_failed" not in json.dumps(summary)


def _backfill_summary(tmp_path: Path, lines: list[str], dry_run: bool) -> dict[str, Any]:
    """``lines`` through an embedded `tracescore backfill --json` (``--dry-run`` or not): it
    exits 0, and its summary."""
    from click.testing import CliRunner

    from worker.cli import cli

    source = tmp_path / "t.jsonl"
    source.write_text("".join(lines))
    args = ["backfill", str(source), "--scorers", "tests.backfill.scorers", "--json"]
    result = CliRunner().invoke(cli, args + (["--dry-run"] if dry_run else []), env={"TRACESCORE_BROKER_URL": ""})
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


# What the OTLP decoders make of an attribute value: text, bytes (a bytesValue), numbers,
# arrays as tuples and kvlists as dicts; non-finite floats left out (JSON writes them as null).
_otlp_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.binary(max_size=6)
    | st.sampled_from([b"\xff\xfe", b"hello", "user", "assistant", "text", "reasoning", "tool_call"])
)
_otlp_value: Any = st.recursive(
    _otlp_leaf,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=16,
)
_READ_KEYS = [
    "input.value",
    "output.value",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "mastra.agent_run.input",
    "mastra.agent_run.output",
]


def _read(spans: list[Any]) -> Any:
    try:
        return trace_to_run(spans).model_dump(mode="json")
    except TraceReadError as exc:
        return ("unreadable", exc.reason, exc.span_id, exc.attribute)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.dictionaries(st.sampled_from(_READ_KEYS), _otlp_value | _messages.map(json.dumps), min_size=1))
def test_a_run_reads_alike_in_process_and_after_the_queue(values: dict[str, Any]) -> None:
    """An embedded backfill reads the decoded OTLP values as they are (bytes, tuples); a worker
    reads them after the queue's JSON. Both get the same run, or the same named read error, and
    never another exception (a bytesValue in input.value was a TypeError in process only)."""
    from tracing import SpanRecord
    from tracing.queue import ScoreRequest, request_json, spans_request

    agent = SpanRecord(
        "d5b4ddbdcb5c0d4c29f4cba8e8ad98c6",
        "00000000000000a1",
        "invoke_agent a",
        attributes={"gen_ai.operation.name": "invoke_agent", "mastra.span.type": "agent_run", **values},
    )
    in_process = _read([agent])
    shipped = ScoreRequest.model_validate_json(request_json(spans_request([agent], [agent.span_id], ["s"])))
    assert _read(shipped.spans) == in_process


def _agent_line(trace_id: str, arguments: str) -> str:
    """One OTLP/JSON line: an agent span and its chat span, whose answer calls a tool."""
    out = [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "weather", "arguments": arguments},
                {"type": "text", "content": "sunny"},
            ],
        }
    ]

    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    spans = [
        {
            "traceId": trace_id,
            "spanId": "00000000000000a1",
            "name": "invoke_agent shop",
            "startTimeUnixNano": "1000",
            "endTimeUnixNano": "9000",
            "attributes": [attr("gen_ai.operation.name", "invoke_agent"), attr("gen_ai.agent.name", "shop")],
        },
        {
            "traceId": trace_id,
            "spanId": "00000000000000a2",
            "parentSpanId": "00000000000000a1",
            "name": "chat m",
            "startTimeUnixNano": "2000",
            "endTimeUnixNano": "3000",
            "attributes": [
                attr("gen_ai.operation.name", "chat"),
                attr(
                    "gen_ai.input.messages", json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q"}]}])
                ),
                attr("gen_ai.output.messages", json.dumps(out)),
            ],
        },
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "app"}, "spans": spans}]}]}) + "\n"


@pytest.mark.parametrize("dry_run", [False, True])
def test_tool_arguments_nested_past_what_a_record_can_hold_stay_text(tmp_path: Path, dry_run: bool) -> None:
    """Tool-call arguments of JSON text nested 300 levels (under the parser's limit, over the 255
    pydantic-core serializes) were decoded: the run read, but a dry run's estimate of it ended
    the command (exit 1, "Circular reference detected"). Past 64 levels they stay text."""
    from tracing import trace_to_run
    from tracing.otlp import decode_otlp_records_line

    deep = "[" * 300 + "]" * 300
    lines = [_agent_line("1" * 32, '{"city": "Paris"}'), _agent_line("2" * 32, deep)]
    summary = _backfill_summary(tmp_path, lines, dry_run)
    assert summary["runs_to_score" if dry_run else "runs_read"] == 2
    if dry_run:
        assert summary["estimate"]["runs_not_estimated"] == 0
    (call,) = [p for m in trace_to_run(decode_otlp_records_line(lines[1])).output for p in m.tool_invocations]
    assert call.args == deep


def test_a_tool_invocation_parts_arguments_nested_past_what_a_record_holds_stay_text() -> None:
    """The 64-level bound missed the AI SDK's tool-invocation parts (Mastra's stored shape): their
    args and result went into the run as decoded, and its record failed to serialize."""
    from pydantic_core import to_jsonable_python

    from tests.tracing._spans import Recorder
    from tracing import trace_to_run

    deep = json.loads("[" * 300 + "]" * 300)
    part = {"type": "tool-invocation", "toolInvocation": {"state": "result", "toolCallId": "c1", "toolName": "t"}}
    part["toolInvocation"].update(args=deep, result=deep)  # type: ignore[attr-defined]
    question = [{"role": "user", "parts": [{"type": "text", "content": "q"}]}]
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "done"}, part]}]
    rec = Recorder()
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(question),
        "gen_ai.output.messages": json.dumps(answer),
    }
    with rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}), rec.span("chat", chat):
        pass
    run = trace_to_run(rec.spans())
    (call,) = run.output[0].tool_invocations
    assert isinstance(call.args, str)
    assert isinstance(call.result, str)
    to_jsonable_python(run.output)  # what a record and a checkpoint do with it
