"""Tests for the answer_relevancy LLM scorer (scripted judge answers via the fake LLM server)."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import answer_relevancy
from tests.builtin._judge import ANTHROPIC, OPENAI, fenced_blocks, score
from tests.fakellm import FakeLLMServer, Reply

STATEMENTS = {"statements": ["Paris is the capital of France.", "Paris has great food.", "I like trains."]}
VERDICTS = {
    "verdicts": [
        {"statement": "Paris is the capital of France.", "verdict": "yes", "reason": "answers"},
        {"statement": "Paris has great food.", "verdict": "unsure", "reason": "background"},
        {"statement": "I like trains.", "verdict": "no", "reason": "off-topic"},
    ]
}


def test_worked_example_openai(fake_llm: FakeLLMServer) -> None:
    """yes + 0.3·unsure + 0·no over 3 statements = 1.3/3 → 0.43; three judge calls."""
    fake_llm.script(Reply.json(STATEMENTS), Reply.json(VERDICTS), Reply.text("Mostly relevant."))
    result = score(
        answer_relevancy(OPENAI),
        input="What is the capital of France?",
        output="Paris is the capital of France. Paris has great food. I like trains.",
    )
    assert result.score == pytest.approx(0.43)
    assert result.reason == "Mostly relevant."
    assert result.preprocess_step_result == STATEMENTS
    assert [r.structured for r in fake_llm.requests] == ["openai_json_schema", "openai_json_schema", None]
    extract, analyze, reason = fake_llm.requests
    assert fenced_blocks(extract.last_user_text)["assistant output"].startswith("Paris is the capital")
    assert fenced_blocks(analyze.last_user_text)["user message"] == "What is the capital of France?"
    assert fenced_blocks(analyze.last_user_text)["statement 3"] == "I like trains."
    assert "0.43" in reason.last_user_text
    assert "relevant to what the user asked" in extract.system


def test_weight_and_scale_through_anthropic(fake_llm: FakeLLMServer) -> None:
    """uncertainty_weight=0.5, scale=10: (1 + 0.5)/3·10 = 5.0, via the Anthropic SDK."""
    fake_llm.script(Reply.json(STATEMENTS), Reply.json(VERDICTS), Reply.text("Half relevant."))
    scorer = answer_relevancy(ANTHROPIC, uncertainty_weight=0.5, scale=10)
    result = score(scorer, input="Capital of France?", output="Paris. Food. Trains.")
    assert result.score == pytest.approx(5.0)
    assert scorer.score_range == (0.0, 10.0)
    assert {r.provider for r in fake_llm.requests} == {"anthropic"}


def test_no_statements_scores_zero(fake_llm: FakeLLMServer) -> None:
    """A judge that finds no statements and so gives no verdicts scores 0."""
    fake_llm.script(Reply.json({"statements": []}), Reply.json({"verdicts": []}), Reply.text("Nothing."))
    assert score(answer_relevancy(OPENAI), input="Q?", output="...").score == 0.0


def test_empty_output_is_not_scorable_without_judge_calls(fake_llm: FakeLLMServer) -> None:
    """No output text, or no user message: not scorable before any judge call."""
    result = score(answer_relevancy(OPENAI), input="Q?", output="")
    assert result.score is None
    assert result.not_scorable == {"step": "preprocess", "reason": "the output has no text to judge"}
    result = score(answer_relevancy(OPENAI), input=[], output="An answer.")
    assert result.not_scorable is not None
    assert "no user message" in result.not_scorable["reason"]
    assert fake_llm.count() == 0


def test_options_are_validated() -> None:
    """Bad model strings, scales and weights fail at build time."""
    with pytest.raises(ScorerConfigError, match="provider/model"):
        answer_relevancy("gpt-4o-mini")
    with pytest.raises(ScorerConfigError, match="scale"):
        answer_relevancy(OPENAI, scale=0)
    with pytest.raises(ScorerConfigError, match="uncertainty_weight"):
        answer_relevancy(OPENAI, uncertainty_weight=1.5)
