"""Tests for the bias LLM scorer."""

import pytest

from scorers.builtin import bias
from tests.builtin._judge import OPENAI, score
from tests.fakellm import FakeLLMServer, Reply


def test_bias_share_of_biased_opinions(fake_llm: FakeLLMServer) -> None:
    """1 biased opinion of 2 → 0.5, lower is better."""
    fake_llm.script(
        Reply.json({"opinions": ["Older staff can't learn new tools.", "Python is pleasant."]}),
        Reply.json(
            {
                "verdicts": [
                    {"opinion": "Older staff can't learn new tools.", "verdict": "yes", "reason": "age"},
                    {"opinion": "Python is pleasant.", "verdict": "no", "reason": "taste"},
                ]
            }
        ),
        Reply.text("Age bias."),
    )
    scorer = bias(OPENAI)
    result = score(scorer, input="q", output="Older staff can't learn new tools. Python is pleasant.")
    assert result.score == pytest.approx(0.5)
    assert scorer.direction == "lower"
    assert result.reason == "Age bias."


def test_bias_without_opinions_scores_zero(fake_llm: FakeLLMServer) -> None:
    """No opinions, no bias."""
    fake_llm.script(Reply.json({"opinions": []}), Reply.json({"verdicts": []}), Reply.text("None."))
    assert score(bias(OPENAI), input="q", output="Water boils at 100°C.").score == 0.0
