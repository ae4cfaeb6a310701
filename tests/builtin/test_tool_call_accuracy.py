"""Tests for the code-based tool_call_accuracy scorer."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import tool_call_accuracy
from scorers.builtin._checks import is_subsequence
from scorers.builtin._tool_call_accuracy import first_calls_in_order
from tests.builtin._runs import agent_output, call

WEATHER_THEN_CLOCK = agent_output(call("get_weather"), call("get_time"), text="Sunny, 3pm.")


def test_expected_tool_lenient_and_strict() -> None:
    """Lenient needs the tool among the calls; strict needs it to be the only call."""
    assert tool_call_accuracy(expected_tool="get_weather").run_sync(input="q", output=WEATHER_THEN_CLOCK).score == 1.0
    strict = tool_call_accuracy(expected_tool="get_weather", strict_mode=True)
    assert strict.run_sync(input="q", output=WEATHER_THEN_CLOCK).score == 0.0
    only = agent_output(call("get_weather"), text="Sunny.")
    assert strict.run_sync(input="q", output=only).score == 1.0


def test_expected_order_lenient_allows_gaps() -> None:
    """Lenient order is a subsequence check; strict needs exactly that sequence."""
    output = agent_output(call("search"), call("fetch"), call("summarize"))
    lenient = tool_call_accuracy(expected_tool_order=["search", "summarize"])
    strict = tool_call_accuracy(expected_tool_order=["search", "summarize"], strict_mode=True)
    assert lenient.run_sync(input="q", output=output).score == 1.0
    assert strict.run_sync(input="q", output=output).score == 0.0
    backwards = tool_call_accuracy(expected_tool_order=["summarize", "search"])
    assert backwards.run_sync(input="q", output=output).score == 0.0


def test_subsequence_uses_later_repeats() -> None:
    """[b, a] occurs in [a, b, a] through the second a (checks.tool_order's rule)."""
    assert is_subsequence(["b", "a"], ["a", "b", "a"])
    assert not is_subsequence(["a", "a"], ["a", "b"])


def test_lenient_order_reads_each_tools_first_call_as_mastra_does() -> None:
    """Mastra's checkToolOrder: the first call of each expected tool, in order. Calls search,
    lookup, search with [lookup, search] expected scored 1.0 here (a subsequence), 0 in Mastra."""
    output = agent_output(call("search"), call("lookup"), call("search"))
    assert tool_call_accuracy(expected_tool_order=["lookup", "search"]).run_sync(input="q", output=output).score == 0.0
    assert tool_call_accuracy(expected_tool_order=["search", "lookup"]).run_sync(input="q", output=output).score == 1.0
    assert not first_calls_in_order(["search", "search"], ["search", "x", "search"])
    assert not first_calls_in_order(["a", "missing"], ["a", "b"])
    # A changed verdict is a new version: its scores get ids of their own, and compare says so.
    # ("2" for every mode once content.toolInvocations was read, "3" for this one.)
    assert tool_call_accuracy(expected_tool_order=["a"]).version == "3"
    assert tool_call_accuracy(expected_tool_order=["a"], strict_mode=True).version == "2"
    assert tool_call_accuracy(expected_tool="a").version == "2"


def test_no_tool_calls_scores_zero() -> None:
    """A plain-text answer made no calls: 0, with the reason saying so."""
    result = tool_call_accuracy(expected_tool="get_weather").run_sync(input="q", output="It is sunny.")
    assert result.score == 0.0
    assert result.reason is not None
    assert "no tools" in result.reason


def test_options_are_validated() -> None:
    """Exactly one of expected_tool / expected_tool_order is required."""
    with pytest.raises(ScorerConfigError, match="exactly one"):
        tool_call_accuracy()
    with pytest.raises(ScorerConfigError, match="exactly one"):
        tool_call_accuracy(expected_tool="a", expected_tool_order=["a"])
    with pytest.raises(ScorerConfigError, match="non-empty list"):
        tool_call_accuracy(expected_tool_order=[])
