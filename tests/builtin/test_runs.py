"""Tests for reading text, ground truth and tool results out of agent-typed runs."""

import pytest

from scorers import ScorerRun
from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent
from scorers.builtin._runs import assistant_text, ground_truth_text, reference_text, tool_results, user_text
from tests.builtin._runs import agent_output, call


def make_run(input: object, output: object, ground_truth: object = None) -> ScorerRun:
    """A run coerced the way type='agent' coerces it."""
    return ScorerRun(
        input=ScorerRunInputForAgent.model_validate(input),
        output=ScorerRunOutputForAgent.validate(output),
        run_id="r",
        ground_truth=ground_truth,
    )


def test_texts_join_every_message_of_the_role() -> None:
    """User text joins this turn's user messages; assistant text every assistant message."""
    run = make_run(
        {"input_messages": ["first", "second"], "system_messages": ["sys"]},
        agent_output(call("search", "hit"), text="Final answer."),
    )
    assert user_text(run) == "first\nsecond"
    assert assistant_text(run) == "Final answer."


def test_tool_results_and_tool_messages() -> None:
    """Finished calls give 'name: result' (JSON for non-strings); unfinished ones are skipped."""
    output = [
        *agent_output(call("search", {"hits": 2}), call("lookup", None, state="call")),
        {"role": "tool", "content": "raw tool text"},
    ]
    assert tool_results(make_run("q", output)) == ['search: {"hits": 2}', "raw tool text"]


def test_ground_truth_as_text() -> None:
    """Strings pass through, other values become JSON, blanks count as missing."""
    assert ground_truth_text(make_run("q", "a", ground_truth="Paris")) == "Paris"
    assert ground_truth_text(make_run("q", "a", ground_truth=["Paris", 1])) == '["Paris", 1]'
    assert ground_truth_text(make_run("q", "a", ground_truth="  ")) is None


def test_reference_text_requires_ground_truth_when_asked() -> None:
    """reference='ground_truth' without one raises a message naming the fix."""
    run = make_run("question", "a")
    assert reference_text(run, "input", "s") == "question"
    with pytest.raises(ValueError, match="pass ground_truth= to run"):
        reference_text(run, "ground_truth", "s")
