"""Tests for the answer_similarity LLM scorer."""

from typing import Any

import pytest

from scorers import ScorerRunError
from scorers.builtin import answer_similarity
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.fakellm import FakeLLMServer, Reply

UNITS = {"output_units": ["Paris is the capital", "It is in Europe"], "ground_truth_units": ["u1", "u2", "u3", "u4"]}


def match(kind: str) -> dict[str, Any]:
    return {
        "ground_truth_unit": "g",
        "output_unit": None if kind == "missing" else "o",
        "match_type": kind,
        "explanation": "e",
    }


def test_worked_example(fake_llm: FakeLLMServer) -> None:
    """exact 1.2 + semantic 0.8 + partial 0.4 − missing 0.15 = 2.25; /(4·1.2) = 0.46875; −0.05 extra → 0.42."""
    fake_llm.script(
        Reply.json(UNITS),
        Reply.json(
            {
                "matches": [match("exact"), match("semantic"), match("partial"), match("missing")],
                "extra_in_output": ["It is in Europe"],
                "contradictions": [],
            }
        ),
        Reply.text("Close but incomplete."),
    )
    result = score(
        answer_similarity(OPENAI),
        input="q",
        output="Paris is the capital. It is in Europe.",
        ground_truth={"answer": "Paris"},
    )
    assert result.score == pytest.approx(0.42)
    assert fenced_blocks(fake_llm.requests[0].last_user_text)["ground truth"] == '{"answer": "Paris"}'


def test_contradiction_drives_score_to_zero(fake_llm: FakeLLMServer) -> None:
    """A contradiction costs 1.0 by default: clamped to 0."""
    fake_llm.script(
        Reply.json(UNITS),
        Reply.json(
            {
                "matches": [match("exact")],
                "extra_in_output": [],
                "contradictions": [{"output_unit": "o", "ground_truth_unit": "g", "explanation": "e"}],
            }
        ),
        Reply.text("Contradicts."),
    )
    assert score(answer_similarity(OPENAI), input="q", output="x", ground_truth="y").score == 0.0


def test_missing_ground_truth_is_an_error_or_not_scorable(fake_llm: FakeLLMServer) -> None:
    """Without ground truth: a clear error by default, not scorable when not required."""
    with pytest.raises(ScorerRunError, match="pass ground_truth="):
        score(answer_similarity(OPENAI), input="q", output="x")
    result = score(answer_similarity(OPENAI, require_ground_truth=False), input="q", output="x")
    assert result.not_scorable is not None
    assert fake_llm.count() == 0


def test_no_ground_truth_units_scores_zero(fake_llm: FakeLLMServer) -> None:
    """No units to match gives 0."""
    fake_llm.script(
        Reply.json({"output_units": ["a"], "ground_truth_units": []}),
        Reply.json({"matches": [], "extra_in_output": ["a"], "contradictions": []}),
        Reply.text("Nothing to compare."),
    )
    assert score(answer_similarity(OPENAI), input="q", output="a", ground_truth="-").score == 0.0
