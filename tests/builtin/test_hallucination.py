"""Tests for the hallucination LLM scorer."""

import pytest

from scorers.builtin import hallucination
from tests.builtin._judge import OPENAI, score
from tests.builtin._runs import agent_output, call
from tests.fakellm import FakeLLMServer, Reply

CLAIMS = {"claims": ["a", "b", "c", "d"]}
VERDICTS = {
    "verdicts": [
        {"claim": "a", "verdict": "contradicted", "reason": "r"},
        {"claim": "b", "verdict": "unsupported", "reason": "r"},
        {"claim": "c", "verdict": "supported", "reason": "r"},
        {"claim": "d", "verdict": "supported", "reason": "r"},
    ]
}


def test_contradicted_share_lower_is_better(fake_llm: FakeLLMServer) -> None:
    """1 contradicted of 4 → 0.25; the scorer says lower is better."""
    fake_llm.script(Reply.json(CLAIMS), Reply.json(VERDICTS), Reply.text("One contradiction."))
    scorer = hallucination(OPENAI, context=["the facts"])
    result = score(scorer, input="q", output="a. b. c. d.")
    assert result.score == pytest.approx(0.25)
    assert scorer.direction == "lower"


def test_count_unsupported(fake_llm: FakeLLMServer) -> None:
    """count_unsupported=True adds unsupported claims: 2 of 4 → 0.5."""
    fake_llm.script(Reply.json(CLAIMS), Reply.json(VERDICTS), Reply.text("Two."))
    output = agent_output(call("search", "the facts"), text="a. b. c. d.")
    result = score(hallucination(OPENAI, count_unsupported=True), input="q", output=output)
    assert result.score == pytest.approx(0.5)


def test_no_claims_scores_zero(fake_llm: FakeLLMServer) -> None:
    """No claims means nothing hallucinated: 0."""
    fake_llm.script(Reply.json({"claims": []}), Reply.json({"verdicts": []}), Reply.text("None."))
    assert score(hallucination(OPENAI, context=["c"]), input="q", output="Hi!").score == 0.0


def test_missing_context_is_not_scorable(fake_llm: FakeLLMServer) -> None:
    """No context anywhere: not scorable before any judge call."""
    result = score(hallucination(OPENAI), input="q", output="An answer.")
    assert result.not_scorable is not None
    assert fake_llm.count() == 0
