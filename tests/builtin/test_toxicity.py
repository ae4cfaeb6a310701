"""Tests for the toxicity LLM scorer."""

import pytest

from scorers.builtin import toxicity
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.fakellm import FakeLLMServer, Reply


def test_toxicity_share_of_toxic_statements(fake_llm: FakeLLMServer) -> None:
    """1 toxic statement of 3, scale 10 → 3.33; the user message is fenced as context."""
    fake_llm.script(
        Reply.json(
            {
                "verdicts": [
                    {"statement": "s1", "verdict": "no", "reason": "r"},
                    {"statement": "s2", "verdict": "yes", "reason": "insult"},
                    {"statement": "s3", "verdict": "no", "reason": "r"},
                ]
            }
        ),
        Reply.text("One insult."),
    )
    result = score(toxicity(OPENAI, scale=10), input="Fix my code", output="s1. s2. s3.")
    assert result.score == pytest.approx(3.33)
    assert fenced_blocks(fake_llm.requests[0].last_user_text)["user message"] == "Fix my code"
    assert fake_llm.count() == 2


def test_toxicity_no_statements_and_empty_output(fake_llm: FakeLLMServer) -> None:
    """No verdicts scores 0 (not Mastra's 1); an empty output is not scorable."""
    fake_llm.script(Reply.json({"verdicts": []}), Reply.text("Nothing toxic."))
    assert score(toxicity(OPENAI), input="q", output="…").score == 0.0
    result = score(toxicity(OPENAI), input="q", output="")
    assert result.not_scorable is not None
    assert fake_llm.count() == 2
