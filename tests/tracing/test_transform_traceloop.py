"""trace_to_run on Traceloop's OpenLLMetry spans: its SDK's @workflow / @agent / @tool / @task
spans around its OpenAI instrumentation's LLM spans.

The attributes are those traceloop-sdk 0.62.4 and opentelemetry-instrumentation-openai 0.62.4
wrote in a run against tests/fakellm on 2026-12-05 (the SDK is not a dependency: it pulls in a
large tree). Its LLM spans follow the OTel GenAI conventions; its decorator spans say what they
are only in ``traceloop.span.kind``, and carry their function's arguments and return value as
JSON in ``traceloop.entity.input`` / ``traceloop.entity.output``.
"""

from __future__ import annotations

import json

from scorers.agent import get_assistant_message, get_user_message
from tests.tracing._spans import Recorder, chat_attributes
from tracing import trace_to_run

QUESTION = "Where is order 42?"
ANSWER = "Order 42 has shipped."


def _entity(kind: str, name: str, args: list[object], output: object) -> dict[str, str]:
    return {
        "traceloop.workflow.name": "support_flow",
        "traceloop.span.kind": kind,
        "traceloop.entity.name": name,
        "traceloop.entity.input": json.dumps({"args": args, "kwargs": {}}),
        "traceloop.entity.output": json.dumps(output),
    }


def _support_flow(rec: Recorder, tool_output: object) -> None:
    messages_in = [
        {"role": "system", "parts": [{"content": "You are a support bot.", "type": "text"}]},
        {"role": "user", "parts": [{"content": QUESTION, "type": "text"}]},
    ]
    messages_out = [{"role": "assistant", "parts": [{"content": ANSWER, "type": "text"}], "finish_reason": "stop"}]
    with (
        rec.span("support_flow.workflow", _entity("workflow", "support_flow", [QUESTION], ANSWER)),
        rec.span(
            "support_agent.agent",
            {**_entity("agent", "support_agent", ["OpenAI", QUESTION], ANSWER), "gen_ai.agent.name": "support_agent"},
        ),
    ):
        tool = {**_entity("tool", "order_status", ["42"], tool_output), "gen_ai.tool.name": "order_status"}
        with rec.span("order_status.tool", {**tool, "gen_ai.agent.name": "support_agent"}):
            pass
        with (
            rec.span("summarize.task", _entity("task", "summarize", ["OpenAI", QUESTION], ANSWER)),
            rec.span(
                "openai.chat",
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o-mini",
                    "gen_ai.agent.name": "support_agent",
                    "traceloop.entity.path": "summarize",
                    "gen_ai.input.messages": json.dumps(messages_in),
                    "gen_ai.output.messages": json.dumps(messages_out),
                },
            ),
        ):
            pass


def test_an_openllmetry_agent_is_one_run_with_its_tool() -> None:
    """The @agent span is the run (it was 'other': each LLM call was a run of its own), its tool
    span an invocation with the function's arguments and return value."""
    rec = Recorder()
    _support_flow(rec, {"order_id": "42", "status": "shipped"})
    run = trace_to_run(rec.spans())
    assert run.identity.span_name == "support_agent.agent"
    assert run.identity.agent_name == "support_agent"
    assert get_user_message(run.input) == QUESTION
    assert get_assistant_message(run.output) == ANSWER
    (call,) = run.output[0].tool_invocations
    assert (call.tool_name, call.args, call.result, call.state) == (
        "order_status",
        {"args": ["42"], "kwargs": {}},
        {"order_id": "42", "status": "shipped"},
        "result",
    )


def test_a_tool_returning_text_gives_that_text_and_one_cut_short_is_kept_as_it_is() -> None:
    """Traceloop writes a returned string as JSON ('"shipped"'): the result is the string. A value
    cut at OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT is no JSON: kept as written."""
    for output, expected in (("shipped", "shipped"), ('"ship', '"ship')):
        rec = Recorder()
        if output == '"ship':
            _support_flow(rec, None)
            spans = [
                s
                if s.name != "order_status.tool"
                else _with_attribute(s, "traceloop.entity.output", output)  # as the SDK cut it
                for s in rec.spans()
            ]
        else:
            _support_flow(rec, output)
            spans = rec.spans()
        (call,) = trace_to_run(spans).output[0].tool_invocations
        assert call.result == expected


def _with_attribute(span: object, key: str, value: str) -> object:
    from opentelemetry.sdk.trace import ReadableSpan

    assert isinstance(span, ReadableSpan)
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes={**(span.attributes or {}), key: value},
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def test_an_agent_around_a_frameworks_agent_reads_through_it() -> None:
    """A Traceloop @agent around a framework that writes GenAI invoke_agent spans: the outer span
    became the run and, with no model call of its own, failed to read (no_content) where the
    inner agent's run had been scored. An agent that calls no model itself reads the calls of
    the agents it runs."""
    rec = Recorder()
    with (
        rec.span("support.agent", _entity("agent", "support", [QUESTION], ANSWER)),
        rec.span("invoke_agent shop", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop"}),
        rec.span("chat m", chat_attributes(QUESTION, ANSWER)),
    ):
        pass
    run = trace_to_run(rec.spans())
    assert run.identity.span_name == "support.agent"
    assert (get_user_message(run.input), get_assistant_message(run.output)) == (QUESTION, ANSWER)


def test_a_tool_span_without_a_call_id_is_the_call_the_model_asked_for() -> None:
    """The usual tool loop: the model asks for order_status (call c1), Traceloop's @tool span runs
    it (with no call id), the next model call's input carries c1's result. The call was read
    twice: c1 with its result, and the id-less span as a call no model had asked for."""
    ask = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "order_status", "arguments": {}}]}]
    history = [
        {"role": "user", "parts": [{"type": "text", "content": QUESTION}]},
        *ask,
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "shipped"}]},
    ]
    rec = Recorder()
    with rec.span("support.agent", _entity("agent", "support", [QUESTION], ANSWER)):
        chat = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(history[:1])}
        with rec.span("openai.chat", {**chat, "gen_ai.output.messages": json.dumps(ask)}):
            pass
        with rec.span(
            "order_status.tool", {**_entity("tool", "order_status", [], "shipped"), "gen_ai.tool.name": "order_status"}
        ):
            pass
        answer = [{"role": "assistant", "parts": [{"type": "text", "content": ANSWER}]}]
        with rec.span(
            "openai.chat",
            {**chat, "gen_ai.input.messages": json.dumps(history), "gen_ai.output.messages": json.dumps(answer)},
        ):
            pass
    calls = [(c.tool_name, c.tool_call_id, c.result) for c in trace_to_run(rec.spans()).output[0].tool_invocations]
    assert calls == [("order_status", "c1", "shipped")]
