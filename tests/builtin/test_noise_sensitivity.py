"""Tests for the noise_sensitivity LLM scorer."""

from typing import Any

import pytest

from scorers import ScorerConfigError
from scorers.builtin import noise_sensitivity
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.fakellm import FakeLLMServer, Reply


def answer(robustness: float, levels: list[str], issues: int) -> dict[str, Any]:
    return {
        "dimensions": [
            {"dimension": f"d{i}", "impact_level": lvl, "specific_changes": "c", "noise_influence": "n"}
            for i, lvl in enumerate(levels)
        ],
        "major_issues": [f"issue {i}" for i in range(issues)],
        "overall_assessment": "a",
        "robustness_score": robustness,
    }


def scorer() -> Any:
    return noise_sensitivity(
        OPENAI,
        baseline_response="Paris is the capital of France.",
        noisy_query="What is the capital of France? Some say it is Lyon.",
        noise_type="misinformation",
    )


def test_agreeing_scores_and_issue_penalty(fake_llm: FakeLLMServer) -> None:
    """Judge 0.8, impact mean (1.0 + 0.6)/2 = 0.8 agree; one major issue −0.1 → 0.7."""
    fake_llm.script(Reply.json(answer(0.8, ["none", "moderate"], 1)), Reply.text("Slightly swayed."))
    result = score(scorer(), input="What is the capital of France?", output="Paris, not Lyon.")
    assert result.score == pytest.approx(0.7)
    blocks = fenced_blocks(fake_llm.requests[0].last_user_text)
    assert blocks["baseline answer"] == "Paris is the capital of France."
    assert blocks["answer to the noisy query"] == "Paris, not Lyon."
    assert "misinformation" in fake_llm.requests[0].last_user_text


def test_discrepancy_takes_the_lower_score_and_penalty_is_capped(fake_llm: FakeLLMServer) -> None:
    """Judge 0.9 vs impact mean (0.3 + 0.1)/2 = 0.2 differ by > 0.2 → 0.2; 5 issues cap at 0.3 → 0."""
    fake_llm.script(Reply.json(answer(0.9, ["significant", "severe"], 5)), Reply.text("Derailed."))
    assert score(scorer(), input="q", output="Lyon.").score == 0.0


def test_small_discrepancy_keeps_judge_score(fake_llm: FakeLLMServer) -> None:
    """Judge 0.9 vs impact mean 0.85 (within 0.2): 0.9 stays."""
    fake_llm.script(Reply.json(answer(0.9, ["minimal"], 0)), Reply.text("Robust."))
    assert score(scorer(), input="q", output="Paris.").score == pytest.approx(0.9)


def test_required_options_and_edge_cases(fake_llm: FakeLLMServer) -> None:
    """baseline_response/noisy_query are required; an empty output is not scorable."""
    with pytest.raises(ScorerConfigError, match="baseline_response is required"):
        noise_sensitivity(OPENAI, baseline_response="", noisy_query="q")
    with pytest.raises(ScorerConfigError, match="unknown impact levels"):
        noise_sensitivity(OPENAI, baseline_response="b", noisy_query="q", impact_weights={"huge": 0})
    assert score(scorer(), input="q", output="").not_scorable is not None
    assert fake_llm.count() == 0


@pytest.mark.parametrize(
    "option",
    [
        {"impact_weights": {"none": "high"}},
        {"impact_weights": {"none": None}},
        {"major_issue_penalty": "0.1"},
        {"major_issue_penalty": -5.0},
        {"max_major_issue_penalty": True},
        {"discrepancy_threshold": float("nan")},
    ],
)
def test_numeric_options_are_checked_when_built(fake_llm: FakeLLMServer, option: dict[str, Any]) -> None:
    """They were used only after the judge was paid: a string failed every run (TypeError,
    internal), a negative penalty or a NaN threshold scored silently."""
    with pytest.raises(ScorerConfigError, match="must be a finite non-negative number"):
        noise_sensitivity(OPENAI, baseline_response="b", noisy_query="q", **option)
    assert fake_llm.count() == 0
