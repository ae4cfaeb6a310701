"""Agent-typed runs: message shapes, coercion, helpers."""

from __future__ import annotations

import pytest

from scorers import RunInputError, create_scorer
from scorers.agent import (
    Message,
    ScorerRunInputForAgent,
    ScorerRunOutputForAgent,
    TextPart,
    ToolInvocationPart,
    extract_tool_calls,
    get_assistant_message,
    get_combined_system_prompt,
    get_reasoning,
    get_user_message,
)

MASTRA_OUTPUT = [
    {
        "id": "m1",
        "role": "assistant",
        "createdAt": "2026-01-01T00:00:00Z",
        "content": {
            "format": 2,
            "parts": [
                {"type": "step-start"},
                {"type": "reasoning", "reasoning": "need weather", "details": []},
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "result",
                        "toolCallId": "c1",
                        "toolName": "weather",
                        "args": {"city": "Paris"},
                        "result": {"temp": 21},
                    },
                },
                {"type": "text", "text": "It is 21°C in Paris."},
                {"type": "data-citation", "data": {"url": "https://example.org"}},
            ],
        },
    }
]


def test_plain_strings_coerce_to_messages() -> None:
    """A string input is one user message, a string output one assistant message."""
    scorer = create_scorer("a", type="agent").generate_score(
        lambda run: float(get_user_message(run.input) == "hi" and run.output[0].text == "hello")
    )
    assert scorer.run_sync(input="hi", output="hello").score == 1.0


def test_mastra_camel_case_shape_validates() -> None:
    """Mastra's stored messages (camelCase) validate into our parts."""
    output = ScorerRunOutputForAgent.validate(MASTRA_OUTPUT)
    message = output[0]
    kinds = [p.type for p in message.parts]
    assert kinds == ["step-start", "reasoning", "tool-invocation", "text", "data-citation"]
    invocation = message.tool_invocations[0]
    assert (invocation.tool_name, invocation.tool_call_id, invocation.state) == ("weather", "c1", "result")
    assert invocation.args == {"city": "Paris"}
    assert invocation.result == {"temp": 21}
    assert message.text == "It is 21°C in Paris."
    assert get_reasoning(output) == "need weather"
    assert message.created_at == "2026-01-01T00:00:00Z"


def test_text_view_joins_text_parts_and_falls_back_to_content() -> None:
    """.text joins text parts; a content string is used when there are no parts."""
    message = Message.model_validate(
        {"role": "assistant", "content": {"parts": ["one", {"type": "text", "text": "two"}]}}
    )
    assert message.text == "one\ntwo"
    assert Message.model_validate({"role": "user", "content": {"content": "legacy"}}).text == "legacy"
    assert all(isinstance(p, TextPart) for p in message.parts)


def test_full_agent_input() -> None:
    """All four input fields validate, with strings accepted where text is meant."""
    run_input = ScorerRunInputForAgent.model_validate(
        {
            "inputMessages": ["What is the weather?"],
            "rememberedMessages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            "systemMessages": ["Be brief."],
            "taggedSystemMessages": {"memory": ["User likes Celsius."]},
        }
    )
    assert get_user_message(run_input) == "What is the weather?"
    assert [m.role for m in run_input.remembered_messages] == ["user", "assistant"]
    assert get_combined_system_prompt(run_input) == "Be brief.\n\nUser likes Celsius."


def test_invalid_agent_input_names_the_field() -> None:
    """A bad role in the input is a RunInputError naming the field path."""
    scorer = create_scorer("a", type="agent").generate_score(lambda: 1.0)
    with pytest.raises(
        RunInputError, match=r"run input is not a valid ScorerRunInputForAgent: input_messages\.0\.role"
    ):
        scorer.run_sync(input={"input_messages": [{"role": "robot", "content": "x"}]}, output="ok")
    with pytest.raises(RunInputError, match=r"run output .*0\.content\.parts\.0"):
        scorer.run_sync(input="q", output=[{"role": "assistant", "content": {"parts": [{"type": "bogus"}]}}])


def test_helpers_on_empty_runs() -> None:
    """Helpers return None/empty instead of failing on empty runs."""
    assert get_user_message(ScorerRunInputForAgent()) is None
    assert get_assistant_message(ScorerRunOutputForAgent()) is None
    assert get_combined_system_prompt(None) == ""
    calls = extract_tool_calls(ScorerRunOutputForAgent())
    assert calls.tools == []
    assert calls.tool_call_infos == []


def test_extract_tool_calls_in_order() -> None:
    """Tool calls come back in call order with their message and invocation indexes."""
    output = ScorerRunOutputForAgent.validate(
        [
            {
                "role": "assistant",
                "content": {
                    "parts": [
                        {
                            "type": "tool-invocation",
                            "tool_invocation": {"tool_call_id": "1", "tool_name": "search", "args": {"q": "x"}},
                        },
                        {"type": "tool-invocation", "tool_invocation": {"tool_call_id": "2", "tool_name": "fetch"}},
                    ]
                },
            },
            {
                "role": "assistant",
                "content": {
                    "parts": [
                        {
                            "type": "tool-invocation",
                            "tool_invocation": {
                                "tool_call_id": "3",
                                "tool_name": "search",
                                "state": "result",
                                "result": 5,
                            },
                        },
                        "done",
                    ]
                },
            },
        ]
    )
    calls = extract_tool_calls(output)
    assert calls.tools == ["search", "fetch", "search"]
    assert [(i.message_index, i.invocation_index) for i in calls.tool_call_infos] == [(0, 0), (0, 1), (1, 0)]
    assert calls.tool_call_infos[2].result == 5
    assert get_assistant_message(output) == ""
    assert output.text == "done"


def test_agent_output_serialises_as_messages() -> None:
    """An agent output in a step result dumps to plain message dicts."""
    scorer = create_scorer("a", type="agent").preprocess(lambda run: run.output).generate_score(lambda: 1.0)
    result = scorer.run_sync(input="q", output="answer")
    assert result.preprocess_step_result[0]["role"] == "assistant"
    assert result.preprocess_step_result[0]["content"]["parts"] == [{"type": "text", "text": "answer"}]
    assert isinstance(result.preprocess_step_result[0], dict)


def test_tool_invocation_part_accepts_snake_case() -> None:
    """snake_case names validate too."""
    part = ToolInvocationPart.model_validate(
        {"type": "tool-invocation", "tool_invocation": {"tool_call_id": "x", "tool_name": "t", "state": "partial-call"}}
    )
    assert part.tool_invocation.state == "partial-call"


# Mastra's stored message with its tool calls in ``content.toolInvocations`` (the form its own
# test messages take, and its scorers read first), beside the text.
LEGACY_TOOLS_OUTPUT = [
    {
        "id": "m1",
        "role": "assistant",
        "createdAt": "2026-01-01T00:00:00Z",
        "content": {
            "format": 2,
            "parts": [{"type": "text", "text": "It is 22 degrees in Paris."}],
            "content": "It is 22 degrees in Paris.",
            "toolInvocations": [
                {
                    "toolCallId": "call-1",
                    "toolName": "weatherTool",
                    "args": {"location": "Paris"},
                    "result": {"temp": 22},
                    "state": "result",
                }
            ],
        },
    }
]


def test_tool_calls_in_content_tool_invocations_are_read() -> None:
    """They were dropped silently when the message validated: tool_call_accuracy scored 0 and
    checks.did_not_call passed on a run that called the tool, with no error."""
    from scorers.builtin import checks, tool_call_accuracy

    output = ScorerRunOutputForAgent.validate(LEGACY_TOOLS_OUTPUT)
    calls = extract_tool_calls(output)
    assert calls.tools == ["weatherTool"]
    assert calls.tool_call_infos[0].result == {"temp": 22}
    assert calls.tool_call_infos[0].has_result
    run = {"input": "weather in Paris?", "output": LEGACY_TOOLS_OUTPUT}
    assert tool_call_accuracy(expected_tool="weatherTool").run_sync(**run).score == 1.0
    assert checks.did_not_call("weatherTool").run_sync(**run).score == 0.0
    # Mastra keeps both forms of one call at times: read once, from the older field.
    both = [dict(LEGACY_TOOLS_OUTPUT[0], content=dict(LEGACY_TOOLS_OUTPUT[0]["content"]))]  # type: ignore[arg-type]
    both[0]["content"]["parts"] = [
        {"type": "tool-invocation", "toolInvocation": LEGACY_TOOLS_OUTPUT[0]["content"]["toolInvocations"][0]},  # type: ignore[index]
        {"type": "text", "text": "It is 22 degrees in Paris."},
    ]
    assert extract_tool_calls(ScorerRunOutputForAgent.validate(both)).tools == ["weatherTool"]


def test_ai_sdk_v5_tool_states_validate() -> None:
    """A call that threw is stored as state output-error with errorText; the run was refused as
    invalid input (only partial-call, call and result were taken)."""
    output = ScorerRunOutputForAgent.validate(
        [
            {
                "role": "assistant",
                "content": {
                    "parts": [
                        {
                            "type": "tool-invocation",
                            "toolInvocation": {
                                "state": state,
                                "toolCallId": f"c{n}",
                                "toolName": "get_weather",
                                "errorText": "upstream 500" if state == "output-error" else None,
                            },
                        }
                        for n, state in enumerate(["input-available", "output-available", "output-error"])
                    ]
                },
            }
        ]
    )
    invocations = output[0].tool_invocations
    assert [(i.state, i.has_result, i.error_text) for i in invocations] == [
        ("input-available", False, None),
        ("output-available", True, None),
        ("output-error", False, "upstream 500"),
    ]
