"""Tests for the context_precision and context_relevance LLM scorers."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import context_precision, context_relevance
from scorers.builtin._context_precision import mean_average_precision
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.builtin._runs import agent_output, call
from tests.fakellm import FakeLLMServer, Reply

RAG = agent_output(
    call("search", "Doc A: Oslo is Norway's capital.", call_id="1"),
    call("search", "Doc B: Bergen has rain.", call_id="2"),
    call("search", "Doc C: Oslo has 700k people.", call_id="3"),
    text="Oslo is the capital of Norway and has about 700k people.",
)


def verdict(index: int, relevant: bool) -> dict[str, object]:
    return {"context_index": index, "verdict": "yes" if relevant else "no", "reason": "r"}


def test_mean_average_precision_by_hand() -> None:
    """[yes, no, yes] → (1/1 + 2/3) / 2 = 0.8333; nothing relevant → 0."""
    assert mean_average_precision([True, False, True]) == pytest.approx((1 + 2 / 3) / 2)
    assert mean_average_precision([False, True]) == pytest.approx(0.5)
    assert mean_average_precision([False, False]) == 0.0


def test_context_precision_from_tool_results(fake_llm: FakeLLMServer) -> None:
    """Verdicts arrive out of order and are ranked by index: [yes, no, yes] → 0.83."""
    fake_llm.script(
        Reply.json({"verdicts": [verdict(3, True), verdict(1, True), verdict(2, False)]}),
        Reply.text("Useful pieces mostly first."),
    )
    result = score(context_precision(OPENAI), input="Tell me about Oslo", output=RAG)
    assert result.score == pytest.approx(0.83)
    blocks = fenced_blocks(fake_llm.requests[0].last_user_text)
    assert blocks["context 2"] == "search: Doc B: Bergen has rain."
    assert "exactly 3 verdicts" in fake_llm.requests[0].last_user_text


def test_context_precision_needs_context(fake_llm: FakeLLMServer) -> None:
    """No tool results and no option: not scorable, no judge call; [] is a config error."""
    result = score(context_precision(OPENAI), input="q", output="plain answer")
    assert result.not_scorable is not None
    assert fake_llm.count() == 0
    with pytest.raises(ScorerConfigError, match="empty list"):
        context_precision(OPENAI, context=[])


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
