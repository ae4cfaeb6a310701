"""Tests for the context_relevance LLM scorer."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import context_relevance
from tests.builtin._judge import OPENAI, score
from tests.fakellm import FakeLLMServer, Reply


def evaluation(index: int, level: str, used: bool) -> dict[str, object]:
    return {"context_index": index, "relevance_level": level, "was_used": used, "reasoning": "r"}


def test_context_relevance_weights_and_penalties(fake_llm: FakeLLMServer) -> None:
    """(1.0 + 0.7 + 0.0)/3 = 0.5667 (the high piece was used), −0.15 for one missing item → 0.42."""
    fake_llm.script(
        Reply.json(
            {
                "evaluations": [
                    evaluation(1, "high", True),
                    evaluation(2, "medium", True),
                    evaluation(3, "none", False),
                ],
                "missing_context": ["population source"],
                "overall_assessment": "ok",
            }
        ),
        Reply.text("Reason."),
    )
    fake_llm.script(Reply.json({}))  # never used: proves only two calls are made
    result = score(context_relevance(OPENAI, context=["a", "b", "c"]), input="q", output="answer")
    assert result.score == pytest.approx(0.42)
    assert fake_llm.pending == 1


def test_context_relevance_unused_high_penalty_and_custom_rates(fake_llm: FakeLLMServer) -> None:
    """Two high pieces, one unused; custom rate 0.25 → 1.0 − 0.25 = 0.75."""
    fake_llm.script(
        Reply.json(
            {
                "evaluations": [evaluation(1, "high", True), evaluation(2, "high", False)],
                "missing_context": [],
                "overall_assessment": "ok",
            }
        ),
        Reply.text("Reason."),
    )
    scorer = context_relevance(OPENAI, context=["a", "b"], penalties={"unused_high_relevance_context": 0.25})
    assert score(scorer, input="q", output="answer").score == pytest.approx(0.75)


def test_context_relevance_missing_penalty_is_capped(fake_llm: FakeLLMServer) -> None:
    """Five missing items cost min(5·0.15, 0.5) = 0.5: 1.0 − 0.5 = 0.5."""
    fake_llm.script(
        Reply.json(
            {
                "evaluations": [evaluation(1, "high", True)],
                "missing_context": ["m1", "m2", "m3", "m4", "m5"],
                "overall_assessment": "gaps",
            }
        ),
        Reply.text("Reason."),
    )
    assert score(context_relevance(OPENAI, context=["a"]), input="q", output="x").score == pytest.approx(0.5)


def test_context_relevance_option_validation() -> None:
    """Unknown penalty names and negative rates are rejected."""
    with pytest.raises(ScorerConfigError, match="unknown penalties"):
        context_relevance(OPENAI, context=["a"], penalties={"typo": 0.1})
    with pytest.raises(ScorerConfigError, match="non-negative"):
        context_relevance(OPENAI, context=["a"], penalties={"missing_context_per_item": -1})
