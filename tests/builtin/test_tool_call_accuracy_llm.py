"""Tests for the tool_call_accuracy_llm scorer."""

import json

import pytest

from scorers import ScorerConfigError
from scorers.builtin import tool_call_accuracy_llm
from scorers.builtin._tool_call_accuracy_llm import ToolSpec
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.builtin._runs import agent_output, call
from tests.fakellm import FakeLLMServer, Reply

TOOLS: list[ToolSpec] = [
    {"name": "get_weather", "description": "Current weather for a city"},
    ("get_time", "Local time in a city"),
    "send_email",
]


def test_share_of_appropriate_calls(fake_llm: FakeLLMServer) -> None:
    """2 appropriate calls of 3 → 0.67; the tools and calls are fenced in the prompt."""
    fake_llm.script(
        Reply.json(
            {
                "evaluations": [
                    {"tool_called": "get_weather", "was_appropriate": True, "reasoning": "r"},
                    {"tool_called": "get_time", "was_appropriate": True, "reasoning": "r"},
                    {"tool_called": "send_email", "was_appropriate": False, "reasoning": "not asked"},
                ],
                "missing_tools": [],
            }
        ),
        Reply.text("One needless email."),
    )
    output = agent_output(call("get_weather"), call("get_time"), call("send_email"), text="Sunny, 3pm.")
    result = score(
        tool_call_accuracy_llm(OPENAI, available_tools=TOOLS), input="Weather and time in Oslo?", output=output
    )
    assert result.score == pytest.approx(0.67)
    assert result.preprocess_step_result["actual_tools"] == ["get_weather", "get_time", "send_email"]
    blocks = fenced_blocks(fake_llm.requests[0].last_user_text)
    assert blocks["available tools"].splitlines() == [
        "- get_weather: Current weather for a city",
        "- get_time: Local time in a city",
        "- send_email",
    ]
    assert [c["tool_name"] for c in json.loads(blocks["tool calls"])] == ["get_weather", "get_time", "send_email"]


def test_no_tool_calls(fake_llm: FakeLLMServer) -> None:
    """No calls: 0 when the judge names a missing tool, 1 when none was needed."""
    fake_llm.script(
        Reply.json({"evaluations": [], "missing_tools": ["get_weather"]}), Reply.text("Should have called.")
    )
    scorer = tool_call_accuracy_llm(OPENAI, available_tools=TOOLS)
    assert score(scorer, input="Weather in Oslo?", output="I think it's sunny.").score == 0.0
    assert "(no tool calls)" in fake_llm.requests[0].last_user_text
    fake_llm.script(Reply.json({"evaluations": [], "missing_tools": []}), Reply.text("Fine."))
    assert score(scorer, input="Say hi", output="Hi!").score == 1.0


def test_edge_cases(fake_llm: FakeLLMServer) -> None:
    """No user message is not scorable; tools must be given in a known shape."""
    result = score(tool_call_accuracy_llm(OPENAI, available_tools=TOOLS), input=[], output="x")
    assert result.not_scorable is not None
    assert fake_llm.count() == 0
    with pytest.raises(ScorerConfigError, match="at least one tool"):
        tool_call_accuracy_llm(OPENAI, available_tools=[])
    with pytest.raises(ScorerConfigError, match="each available tool"):
        tool_call_accuracy_llm(OPENAI, available_tools=[42])  # type: ignore[list-item]
