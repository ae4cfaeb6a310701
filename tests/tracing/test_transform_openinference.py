"""trace_to_run on OpenInference spans (AGENT / LLM / TOOL, flattened message attributes)."""

from __future__ import annotations

import json

import pytest

from scorers.agent import extract_tool_calls, get_user_message
from tests.tracing._spans import Recorder
from tracing import TraceReadError, trace_to_run


def _msgs(prefix: str, *msgs: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for i, msg in enumerate(msgs):
        for key, value in msg.items():
            out[f"{prefix}.{i}.message.{key}"] = value
    return out


def test_agent_with_llm_and_tool_spans() -> None:
    """AGENT root with LLM children: history split, tool call filled from the TOOL span."""
    rec = Recorder()
    with rec.span(
        "Agent",
        {
            "openinference.span.kind": "AGENT",
            "agent.name": "helper",
            "session.id": "s-1",
            "input.value": "What is 6*7?",
        },
    ):
        with rec.span(
            "ChatCompletion",
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                **_msgs(
                    "llm.input_messages",
                    {"role": "system", "content": "Use the calculator."},
                    {"role": "user", "content": "Earlier question"},
                    {"role": "assistant", "content": "Earlier answer"},
                    {"role": "user", "content": "What is 6*7?"},
                ),
                **_msgs(
                    "llm.output_messages",
                    {
                        "role": "assistant",
                        "tool_calls.0.tool_call.id": "call_9",
                        "tool_calls.0.tool_call.function.name": "calc",
                        "tool_calls.0.tool_call.function.arguments": '{"expr": "6*7"}',
                    },
                ),
            },
        ):
            pass
        with rec.span(
            "calc",
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "calc",
                "tool_call.id": "call_9",
                "input.value": '{"expr": "6*7"}',
                "output.value": "42",
            },
        ):
            pass
        with rec.span(
            "ChatCompletion",
            {
                "openinference.span.kind": "LLM",
                **_msgs(
                    "llm.output_messages",
                    {
                        "role": "assistant",
                        "contents.0.message_content.type": "text",
                        "contents.0.message_content.text": "6*7 is 42.",
                    },
                ),
            },
        ):
            pass
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "What is 6*7?"
    assert [m.text for m in run.input.remembered_messages] == ["Earlier question", "Earlier answer"]
    assert run.input.system_messages[0].text == "Use the calculator."
    assert run.output.text == "6*7 is 42."
    info = extract_tool_calls(run.output).tool_call_infos[0]
    assert (info.tool_name, info.args, info.result, info.state) == ("calc", {"expr": "6*7"}, "42", "result")
    assert run.identity.agent_name == "helper"
    assert run.identity.conversation_id == "s-1"
    assert run.identity.model == "gpt-4o-mini"


def test_agent_input_value_only() -> None:
    """An AGENT span with only input.value / output.value still gives a run."""
    rec = Recorder()
    with rec.span(
        "Agent",
        {"openinference.span.kind": "AGENT", "input.value": "Hi there", "output.value": "Hello!"},
    ):
        pass
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "Hi there"
    assert run.output.text == "Hello!"


def test_tool_span_without_recorded_call() -> None:
    """A TOOL span no recorded model call asked for is still an invocation, in the step it ran in."""
    rec = Recorder()
    with rec.span("Agent", {"openinference.span.kind": "AGENT", "input.value": "Find the file"}):
        for answer in ("Searching.", "Found it."):
            with rec.span(
                "llm",
                {
                    "openinference.span.kind": "LLM",
                    **_msgs("llm.input_messages", {"role": "user", "content": "Find the file"}),
                    **_msgs("llm.output_messages", {"role": "assistant", "content": answer}),
                },
            ):
                pass
            if answer == "Searching.":
                with rec.span(
                    "search",
                    {
                        "openinference.span.kind": "TOOL",
                        "tool.name": "search",
                        "input.value": '{"q": "file"}',
                        "output.value": "a.txt",
                    },
                ):
                    pass
    run = trace_to_run(rec.spans())
    parts = run.output[0].parts
    kinds = [getattr(p, "type", "") for p in parts]
    assert kinds == ["step-start", "text", "tool-invocation", "step-start", "text"]
    inv = run.output[0].tool_invocations[0]
    assert (inv.tool_name, inv.args, inv.result, inv.state) == ("search", {"q": "file"}, "a.txt", "result")


def test_chain_root_scores_its_llm() -> None:
    """A CHAIN root is not an agent: the outermost LLM span under it is the target."""
    rec = Recorder()
    with (
        rec.span("RunnableSequence", {"openinference.span.kind": "CHAIN", "input.value": "q"}),
        rec.span(
            "llm",
            {
                "openinference.span.kind": "LLM",
                **_msgs("llm.input_messages", {"role": "user", "content": "q"}),
                **_msgs("llm.output_messages", {"role": "assistant", "content": "a"}),
            },
        ),
    ):
        pass
    run = trace_to_run(rec.spans())
    assert run.identity.span_name == "llm"
    assert run.output.text == "a"


def test_llm_output_value_chat_completion_json() -> None:
    """output.value holding an OpenAI chat completion is read when no output messages exist."""
    rec = Recorder()
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}]}
    with rec.span(
        "ChatCompletion",
        {
            "openinference.span.kind": "LLM",
            "input.value": json.dumps({"messages": [{"role": "user", "content": "Capital of France?"}]}),
            "input.mime_type": "application/json",
            "output.value": json.dumps(completion),
        },
    ):
        pass
    run = trace_to_run(rec.spans())
    assert get_user_message(run.input) == "Capital of France?"
    assert run.output.text == "Paris"


def test_bad_flattened_role() -> None:
    """A flattened message with a role outside the known set names its attribute."""
    rec = Recorder()
    with rec.span(
        "ChatCompletion",
        {"openinference.span.kind": "LLM", **_msgs("llm.input_messages", {"role": "robot", "content": "x"})},
    ):
        pass
    with pytest.raises(TraceReadError) as info:
        trace_to_run(rec.spans())
    assert info.value.attribute == "llm.input_messages.0.message.role"
    assert info.value.reason == "unknown_role"


def test_a_bad_flattened_content_or_tool_call_names_the_message_not_its_role() -> None:
    """Every problem of a flattened message was put on its .message.role attribute, a content
    that is a number or a tool call without a name too: the message's attributes are named."""
    rec = Recorder()
    bad = {"openinference.span.kind": "LLM", **_msgs("llm.input_messages", {"role": "user", "content": "q"})}
    bad["llm.input_messages.3.message.role"] = "user"
    bad["llm.input_messages.3.message.content"] = 5
    with rec.span("ChatCompletion", bad):
        pass
    with pytest.raises(TraceReadError) as info:
        trace_to_run(rec.spans())
    assert info.value.attribute == "llm.input_messages.3.message"
    assert "'content' is a int" in str(info.value)
