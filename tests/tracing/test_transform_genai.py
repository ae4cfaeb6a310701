"""trace_to_run on OTel GenAI spans (current conventions and the older per-message events)."""

from __future__ import annotations

import json

import pytest

from scorers.agent import extract_tool_calls, get_assistant_message, get_user_message
from tests.tracing._spans import Recorder, genai_messages
from tracing import TraceReadError, trace_to_run

SYSTEM = [{"type": "text", "content": "You are a shop assistant."}]


def _agent_trace(rec: Recorder) -> None:
    history = [
        {"role": "system", "parts": SYSTEM},
        {"role": "user", "parts": [{"type": "text", "content": "Hi, I'm Ann."}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "Hello Ann!"}]},
        {"role": "user", "parts": [{"type": "text", "content": "Is the blue mug in stock?"}]},
    ]
    call = {"type": "tool_call", "id": "call_1", "name": "stock", "arguments": {"sku": "mug-blue"}}
    agent_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "shop",
        "gen_ai.conversation.id": "conv-7",
        "gen_ai.system_instructions": json.dumps(SYSTEM),
    }
    with rec.span("invoke_agent shop", agent_attrs):
        with rec.span(
            "chat gpt-4o",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.model": "gpt-4o-2024-08-06",
                "gen_ai.input.messages": json.dumps(history),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "reasoning", "content": "check stock"}, call],
                            "finish_reason": "tool_call",
                        }
                    ]
                ),
            },
        ):
            pass
        with rec.span(
            "execute_tool stock",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "stock",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.arguments": '{"sku": "mug-blue"}',
                "gen_ai.tool.call.result": '{"in_stock": 3}',
            },
        ):
            pass
        second = [
            *history,
            {"role": "assistant", "parts": [call]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"in_stock": 3}}]},
        ]
        with rec.span(
            "chat gpt-4o",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": json.dumps(second),
                "gen_ai.output.messages": genai_messages(("assistant", "Yes, 3 blue mugs are in stock.")),
            },
        ):
            pass


def test_agent_trace_reads_input_history_system_and_output() -> None:
    """An invoke_agent trace gives this turn, the history, the instructions and one answer."""
    rec = Recorder()
    _agent_trace(rec)
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "Is the blue mug in stock?"
    assert [m.text for m in run.input.remembered_messages] == ["Hi, I'm Ann.", "Hello Ann!"]
    assert [m.text for m in run.input.system_messages] == ["You are a shop assistant."]
    assert len(run.output) == 1
    assert get_assistant_message(run.output) == "Yes, 3 blue mugs are in stock."
    assert run.identity.agent_name == "shop"
    assert run.identity.conversation_id == "conv-7"
    assert run.identity.model == "gpt-4o-2024-08-06"
    assert run.identity.service_name == "shop-app"


def test_tool_calls_become_parts_with_results() -> None:
    """The model's tool call is a tool-invocation part in state result with the tool span's result."""
    rec = Recorder()
    _agent_trace(rec)
    calls = extract_tool_calls(trace_to_run(rec.spans()).output).tool_call_infos
    assert [(c.tool_name, c.tool_call_id, c.state) for c in calls] == [("stock", "call_1", "result")]
    assert calls[0].args == {"sku": "mug-blue"}
    assert calls[0].result == {"in_stock": 3}


def test_reasoning_part_is_kept() -> None:
    """A reasoning part of the output becomes a reasoning part of the assistant message."""
    rec = Recorder()
    _agent_trace(rec)
    parts = trace_to_run(rec.spans()).output[0].parts
    assert any(getattr(p, "reasoning", None) == "check stock" for p in parts)


def test_result_from_next_llm_input_when_no_tool_span() -> None:
    """Without a tool span the result comes from the next LLM call's tool message."""
    rec = Recorder()
    _agent_trace(rec)
    spans = [s for s in rec.spans() if not s.name.startswith("execute_tool")]
    calls = extract_tool_calls(trace_to_run(spans).output).tool_call_infos
    assert calls[0].state == "result"
    assert calls[0].result == {"in_stock": 3}


def test_no_agent_scores_the_outermost_llm_span() -> None:
    """A trace with only a chat span is scored on that span."""
    rec = Recorder()
    with (
        rec.span("web request"),
        rec.span(
            "chat m",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": genai_messages(("system", "Be brief."), ("user", "2+2?")),
                "gen_ai.output.messages": genai_messages(("assistant", "4")),
            },
        ) as span,
    ):
        chat_id = format(span.get_span_context().span_id, "016x")
    run = trace_to_run(rec.spans())
    assert run.identity.span_id == chat_id
    assert get_user_message(run.input) == "2+2?"
    assert run.input.system_messages[0].text == "Be brief."
    assert run.output.text == "4"


def test_tagged_system_messages() -> None:
    """A system message carrying a tag lands in tagged_system_messages under that tag."""
    rec = Recorder()
    msgs = [
        {"role": "system", "parts": [{"type": "text", "content": "Base rules."}]},
        {"role": "system", "tag": "memory", "parts": [{"type": "text", "content": "Ann likes blue."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Pick a mug."}]},
    ]
    with rec.span(
        "chat m",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": json.dumps(msgs),
            "gen_ai.output.messages": genai_messages(("assistant", "The blue one.")),
        },
    ):
        pass
    run = trace_to_run(rec.spans())
    assert [m.text for m in run.input.system_messages] == ["Base rules."]
    assert [m.text for m in run.input.tagged_system_messages["memory"]] == ["Ann likes blue."]


def test_plain_text_system_instructions() -> None:
    """gen_ai.system_instructions as plain text (Mastra writes it so) is one system message."""
    rec = Recorder()
    with (
        rec.span(
            "invoke_agent a",
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.system_instructions": "Answer in French."},
        ),
        rec.span(
            "chat m",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": genai_messages(("user", "Hi")),
                "gen_ai.output.messages": genai_messages(("assistant", "Salut")),
            },
        ),
    ):
        pass
    run = trace_to_run(rec.spans())
    assert [m.text for m in run.input.system_messages] == ["Answer in French."]


def test_older_per_message_span_events() -> None:
    """Older conventions: gen_ai.*.message and gen_ai.choice events with the body as attributes."""
    rec = Recorder()
    with rec.span("chat gpt-4", {"gen_ai.operation.name": "chat", "gen_ai.system": "openai"}) as span:
        span.add_event("gen_ai.system.message", {"gen_ai.system": "openai", "content": "Be nice."})
        span.add_event("gen_ai.user.message", {"gen_ai.event.content": json.dumps({"content": "Weather?"})})
        span.add_event(
            "gen_ai.assistant.message",
            {
                "tool_calls": json.dumps(
                    [{"id": "c1", "type": "function", "function": {"name": "wx", "arguments": "{}"}}]
                )
            },
        )
        span.add_event("gen_ai.tool.message", {"content": "rain", "id": "c1"})
        span.add_event(
            "gen_ai.choice",
            {"index": 0, "finish_reason": "stop", "message": json.dumps({"role": "assistant", "content": "Rain."})},
        )
    run = trace_to_run(rec.spans())
    assert run.input.system_messages[0].text == "Be nice."
    assert get_user_message(run.input) == "Weather?"
    # The tool exchange happened after the user's turn: it is part of this turn's input.
    assert [m.role for m in run.input.input_messages] == ["user", "assistant"]
    assert run.input.input_messages[1].tool_invocations[0].result == "rain"
    assert run.output.text == "Rain."


def test_bad_json_names_span_and_attribute() -> None:
    """gen_ai.input.messages that is not JSON raises TraceReadError naming span and attribute."""
    rec = Recorder()
    with rec.span("chat m", {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[{oops"}) as span:
        span_id = format(span.get_span_context().span_id, "016x")
    with pytest.raises(TraceReadError, match=r"gen_ai\.input\.messages") as info:
        trace_to_run(rec.spans())
    assert info.value.reason == "bad_json"
    assert info.value.span_id == span_id
    assert info.value.span_name == "chat m"
    assert span_id in str(info.value)


def test_unknown_role_is_refused() -> None:
    """A message role outside the known set is an error, not a guess."""
    rec = Recorder()
    with rec.span(
        "chat m",
        {"gen_ai.operation.name": "chat", "gen_ai.input.messages": genai_messages(("narrator", "x"))},
    ):
        pass
    with pytest.raises(TraceReadError) as info:
        trace_to_run(rec.spans())
    assert info.value.reason == "unknown_role"
    assert info.value.attribute == "gen_ai.input.messages"


def test_no_content_captured() -> None:
    """A chat span without messages (capture off) is refused with a hint."""
    rec = Recorder()
    with rec.span("chat m", {"gen_ai.operation.name": "chat"}):
        pass
    with pytest.raises(TraceReadError, match="capture") as info:
        trace_to_run(rec.spans())
    assert info.value.reason == "no_content"


def test_trace_without_agent_or_llm() -> None:
    """A trace with neither agent nor LLM spans has no target."""
    rec = Recorder()
    with rec.span("GET /health"):
        pass
    with pytest.raises(TraceReadError) as info:
        trace_to_run(rec.spans())
    assert info.value.reason == "no_target"


def test_explicit_target_span() -> None:
    """target_span_id picks the span to score; an unknown id is an error."""
    rec = Recorder()
    _agent_trace(rec)
    chats = [s for s in rec.spans() if s.name.startswith("chat")]
    second = format(chats[1].context.span_id, "016x")
    run = trace_to_run(rec.spans(), target_span_id=second)
    assert run.identity.span_id == second
    assert run.output.text == "Yes, 3 blue mugs are in stock."
    with pytest.raises(TraceReadError):
        trace_to_run(rec.spans(), target_span_id="00000000000000ff")


def test_results_attach_by_id_else_by_name_in_call_order() -> None:
    """attach_results: an id picks its call; a result without one takes the first call of its
    name still waiting (one answered by id meanwhile is passed over); the rest are returned."""
    from tracing._messages import Msg, ToolCall, ToolResult, attach_results

    calls = [ToolCall(None, "a"), ToolCall("x", "a"), ToolCall(None, "b"), ToolCall(None, "a")]
    results = [
        ToolResult("x", "a", "by id"),
        ToolResult(None, "a", "first a"),
        ToolResult(None, "a", "second a"),
        ToolResult(None, "b", "the b"),
        ToolResult(None, "a", "one too many"),
        ToolResult("nope", "a", "unknown id"),
    ]
    left = attach_results([Msg("assistant", list(calls))], results)
    assert [c.result for c in calls] == ["first a", "by id", "the b", "second a"]
    assert [r.result for r in left] == ["one too many", "unknown id"]
