"""Tests for the quick checks and their combinators."""

import asyncio
import re

import pytest

from scorers import Scorer, ScorerConfigError
from scorers.builtin import checks
from tests.builtin._runs import agent_output, call


def score(scorer: Scorer, output: object, input: object = "q") -> float | None:
    """Score one run synchronously."""
    return scorer.run_sync(input=input, output=output).score


def test_includes_and_excludes() -> None:
    """Substring checks are case-insensitive unless asked otherwise."""
    assert score(checks.includes("SUNNY"), "It is sunny today.") == 1.0
    assert score(checks.includes("SUNNY", ignore_case=False), "It is sunny today.") == 0.0
    assert score(checks.excludes("error"), "All good.") == 1.0
    assert score(checks.excludes("error"), "An ERROR happened.") == 0.0


def test_equals_strips_and_folds_case() -> None:
    """equals compares the whole assistant text after strip and case folding."""
    assert score(checks.equals("Paris"), "  paris\n") == 1.0
    assert score(checks.equals("Paris", ignore_case=False, strip=False), " Paris") == 0.0
    assert score(checks.equals("Paris"), "Paris, France") == 0.0


def test_matches_search_and_exact() -> None:
    """matches searches by default and full-matches with exact=True."""
    assert score(checks.matches(r"\d{1,3}°[FC]"), "It is 21°C outside.") == 1.0
    assert score(checks.matches(r"\d{1,3}°[FC]", exact=True), "It is 21°C outside.") == 0.0
    assert score(checks.matches(re.compile(r"(?i)^ok$"), exact=True), "OK") == 1.0
    with pytest.raises(ScorerConfigError, match="invalid regular expression"):
        checks.matches("(unclosed")


def test_tool_call_checks() -> None:
    """called_tool counts calls, did_not_call forbids, max_tool_calls caps, tool_order allows gaps."""
    output = agent_output(call("search"), call("search", call_id="2"), call("summarize"), text="Done.")
    assert score(checks.called_tool("search"), output) == 1.0
    assert score(checks.called_tool("search", times=3), output) == 0.0
    assert score(checks.did_not_call("delete_user"), output) == 1.0
    assert score(checks.did_not_call("summarize"), output) == 0.0
    assert score(checks.max_tool_calls(3), output) == 1.0
    assert score(checks.max_tool_calls(2), output) == 0.0
    assert score(checks.tool_order(["search", "summarize"]), output) == 1.0
    assert score(checks.tool_order(["summarize", "search"]), output) == 0.0


def test_tool_checks_without_tool_calls() -> None:
    """A plain-text answer: no calls, so called_tool fails and the others pass."""
    assert score(checks.called_tool("search"), "Just text.") == 0.0
    assert score(checks.did_not_call("search"), "Just text.") == 1.0
    assert score(checks.max_tool_calls(0), "Just text.") == 1.0
    assert score(checks.no_tool_errors(), "Just text.") == 1.0


def test_no_tool_errors_detects_failures() -> None:
    """An error result, an isError flag or a call without result each fail the check."""
    ok = agent_output(call("a", {"temp": 3}))
    assert score(checks.no_tool_errors(), ok) == 1.0
    for bad in (
        call("a", {"error": "timeout"}),
        call("a", {"isError": True, "content": "boom"}),
        call("a", None, state="call"),
    ):
        result = checks.no_tool_errors().run_sync(input="q", output=agent_output(bad))
        assert result.score == 0.0
        assert result.preprocess_step_result["error_count"] == 1
    pending = agent_output(call("a", None, state="call"))
    assert score(checks.no_tool_errors(incomplete_is_error=False), pending) == 1.0


def test_no_tool_errors_reads_a_failed_call_as_mastra_stores_it() -> None:
    """A call that threw (state output-error, with errorText) failed the run as invalid input; one
    flagged isError on the invocation itself passed. Both fail the check now, as in Mastra."""
    threw = {
        "type": "tool-invocation",
        "toolInvocation": {"state": "output-error", "toolCallId": "c1", "toolName": "a", "errorText": "upstream 500"},
    }
    flagged = {
        "type": "tool-invocation",
        "toolInvocation": {"state": "result", "toolCallId": "c2", "toolName": "a", "isError": True, "result": "x"},
    }
    for part, problem in ((threw, "error: upstream 500"), (flagged, "the call failed")):
        output = [{"role": "assistant", "content": {"parts": [part, {"type": "text", "text": "Sorry."}]}}]
        result = checks.no_tool_errors().run_sync(input="q", output=output)
        assert result.score == 0.0
        assert [e["error"] for e in result.preprocess_step_result["errors"]] == [problem]


def test_all_of_and_any_of() -> None:
    """all_of needs every check to pass; any_of needs one; the reason names the failures."""
    output = agent_output(call("get_weather"), text="Sunny and 21°C.")
    guard = checks.all_of(
        checks.called_tool("get_weather"),
        checks.includes("sunny"),
        checks.excludes("21", id="no-numbers"),
        id="weather-guard",
    )
    result = guard.run_sync(input="q", output=output)
    assert result.score == 0.0
    assert result.reason is not None
    assert result.reason.startswith("2 of 3 checks passed; failed: no-numbers")
    either = checks.any_of(checks.includes("rain"), checks.includes("sunny", id="sunny"))
    assert score(either, output) == 1.0
    assert score(checks.any_of(checks.includes("rain"), checks.includes("snow", id="snow")), output) == 0.0


def test_combinator_runs_inside_an_event_loop() -> None:
    """all_of works through the async driver too."""
    guard = checks.all_of(checks.includes("a"), checks.excludes("z"))
    result = asyncio.run(guard.run(input="q", output="abc"))
    assert result.score == 1.0


def test_combinator_validation() -> None:
    """Empty, non-scorer or duplicate-id arguments are configuration errors."""
    with pytest.raises(ScorerConfigError, match="at least one"):
        checks.all_of()
    with pytest.raises(ScorerConfigError, match="takes scorers"):
        checks.any_of("nope")  # type: ignore[arg-type]
    with pytest.raises(ScorerConfigError, match="same id"):
        checks.all_of(checks.includes("a"), checks.includes("b"))


def test_bad_arguments() -> None:
    """Empty names and negative limits fail at build time."""
    with pytest.raises(ScorerConfigError, match="tool_name"):
        checks.called_tool("")
    with pytest.raises(ScorerConfigError, match="times"):
        checks.called_tool("a", times=0)
    with pytest.raises(ScorerConfigError, match="limit"):
        checks.max_tool_calls(-1)
    with pytest.raises(ScorerConfigError, match="expected_order"):
        checks.tool_order("search")


def test_a_combined_checks_version_follows_its_checks() -> None:
    """all_of's verdict is its checks': when one of them is a new version (called_tool read
    content.toolInvocations from 2026-12-05), all_of's scores must get ids of their own too."""
    from scorers import create_scorer

    first = checks.all_of(checks.called_tool("a"), checks.includes("x"))
    assert first.version == "1/check-called-tool@2+check-includes@1"
    newer = create_scorer("check-includes", version="2").generate_score(lambda: 1.0)
    assert checks.all_of(checks.called_tool("a"), newer).version != first.version
    assert checks.any_of(checks.called_tool("a"), checks.includes("x")).version == first.version
