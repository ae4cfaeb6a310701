"""trace_to_run on Mastra's exported traces (agent_run → model_generation / tool_call)."""

from __future__ import annotations

import json

from scorers.agent import extract_tool_calls, get_user_message
from tests.tracing._spans import Recorder
from tracing import trace_to_run


def test_mastra_observability_exporter_shape() -> None:
    """Current @mastra/otel-exporter: gen_ai.* on model spans, mastra.agent_run.* on the agent."""
    rec = Recorder(scope="@mastra/otel")
    with (
        rec.span(
            "invoke_agent Weather Agent",
            {
                "mastra.span.type": "agent_run",
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": "weatherAgent",
                "gen_ai.agent.name": "Weather Agent",
                "gen_ai.conversation.id": "thread-1",
                "gen_ai.system_instructions": "You report the weather.",
                "mastra.agent_run.input": json.dumps([{"role": "user", "content": "Weather in Oslo?"}]),
                "mastra.agent_run.output": json.dumps({"text": "Oslo: 3°C and snowing."}),
            },
        ),
        rec.span(
            "chat gpt-4o-mini",
            {
                "mastra.span.type": "model_generation",
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.input.messages": json.dumps(
                    [
                        {"role": "system", "parts": [{"type": "text", "content": "You report the weather."}]},
                        {"role": "user", "parts": [{"type": "text", "content": "Weather in Oslo?"}]},
                    ]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "Oslo: 3°C and snowing."}]}]
                ),
            },
        ),
        rec.span(
            "execute_tool weatherTool",
            {
                "mastra.span.type": "tool_call",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "weatherTool",
                "gen_ai.tool.call.id": "call_w",
                "gen_ai.tool.call.arguments": '{"city":"Oslo"}',
                "gen_ai.tool.call.result": '{"temp":3}',
            },
        ),
    ):
        pass
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "Weather in Oslo?"
    assert [m.text for m in run.input.system_messages] == ["You report the weather."]
    assert run.output.text == "Oslo: 3°C and snowing."
    assert run.identity.agent_name == "Weather Agent"
    assert run.identity.conversation_id == "thread-1"


def test_mastra_ai_tracing_exporter_shape() -> None:
    """Older ai-tracing exporter: input/output JSON (AI SDK messages), tool calls without ids."""
    rec = Recorder(scope="@mastra/otel")
    model_input = {
        "messages": [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": [{"type": "text", "text": "Remember me?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Yes, Bo."}]},
            {"role": "user", "content": [{"type": "text", "text": "Convert 10 EUR to USD."}]},
        ]
    }
    model_output = {
        "text": "10 EUR is 11 USD.",
        "toolCalls": [{"toolCallId": "t1", "toolName": "fx", "args": {"amount": 10}}],
    }
    with rec.span(
        "agent.fxAgent",
        {"mastra.span.type": "agent_run", "agent.id": "fxAgent", "input": "Convert 10 EUR to USD."},
    ):
        with rec.span(
            "chat gpt-4o",
            {
                "mastra.span.type": "llm_generation",
                "gen_ai.request.model": "gpt-4o",
                "input": json.dumps(model_input),
                "gen_ai.prompt": json.dumps(model_input),
                "output": json.dumps(model_output),
                "gen_ai.completion": json.dumps(model_output),
            },
        ):
            pass
        with rec.span(
            "tool.execute fx",
            {
                "mastra.span.type": "tool_call",
                "gen_ai.tool.name": "fx",
                "gen_ai.tool.input": '{"amount": 10}',
                "gen_ai.tool.output": '{"usd": 11}',
            },
        ):
            pass
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "Convert 10 EUR to USD."
    assert [m.text for m in run.input.remembered_messages] == ["Remember me?", "Yes, Bo."]
    assert run.input.system_messages[0].text == "Be helpful."
    assert run.output.text == "10 EUR is 11 USD."
    info = extract_tool_calls(run.output).tool_call_infos[0]
    assert (info.tool_name, info.result, info.state) == ("fx", {"usd": 11}, "result")
    assert run.identity.agent_name == "fxAgent"


def test_mastra_model_messages_with_tool_parts() -> None:
    """AI SDK tool-call / tool-result content parts in the model input become tool invocations."""
    rec = Recorder(scope="@mastra/otel")
    msgs = {
        "messages": [
            {"role": "user", "content": "Look up order 5"},
            {
                "role": "assistant",
                "content": [{"type": "tool-call", "toolCallId": "o5", "toolName": "order", "input": {"id": 5}}],
            },
            {
                "role": "tool",
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": "o5",
                        "toolName": "order",
                        "output": {"type": "json", "value": {"status": "shipped"}},
                    }
                ],
            },
        ]
    }
    with rec.span(
        "chat m",
        {"mastra.span.type": "model_generation", "input": json.dumps(msgs), "output": '{"text": "Shipped."}'},
    ):
        pass
    run = trace_to_run(rec.spans())
    inv = run.input.input_messages[1].tool_invocations[0]
    assert (inv.tool_call_id, inv.state, inv.result) == ("o5", "result", {"status": "shipped"})
    assert run.output.text == "Shipped."
