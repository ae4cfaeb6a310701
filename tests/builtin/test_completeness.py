"""Tests for the completeness scorer."""

import pytest

from scorers import ScorerConfigError, ScorerRunError
from scorers.builtin import completeness
from scorers.builtin._completeness import term_matches


def test_worked_example() -> None:
    """Key terms of the input are counted as covered by exact or >60% containment matches."""
    result = completeness().run_sync(
        input="Explain how photosynthesis converts sunlight into energy",
        output="Photosynthesis converts light into chemical energy.",
    )
    # input terms: explain, photosynthesis, converts, sunlight, energy (how/into are stop words)
    # covered: photosynthesis, converts, energy exactly; sunlight by "light" (5/8 > 0.6)
    assert result.preprocess_step_result["missing_terms"] == ["explain"]
    assert result.score == pytest.approx(4 / 5)
    assert result.reason == "4 of 5 key terms covered; missing: explain"


def test_term_matching_rule() -> None:
    """Short terms need an exact match; long ones a containment over 60% of the length."""
    assert term_matches("cat", "cat")
    assert not term_matches("cat", "cats")
    assert term_matches("explain", "explained")  # 7/9 > 0.6
    assert not term_matches("light", "lightweight")  # 5/11 < 0.6


def test_empty_output_scores_zero() -> None:
    """Nothing in the output covers nothing."""
    assert completeness().run_sync(input="List three Nordic capitals", output="").score == 0.0


def test_input_without_key_terms_is_not_scorable() -> None:
    """An input made only of stop words has nothing to look for."""
    result = completeness().run_sync(input="What is it?", output="Something.")
    assert result.score is None
    assert result.not_scorable is not None
    assert "no key terms" in result.not_scorable["reason"]


def test_ground_truth_reference() -> None:
    """With reference='ground_truth' the ground truth's terms are the ones looked for."""
    scorer = completeness(reference="ground_truth")
    result = scorer.run_sync(input="?", output="Oslo and Helsinki", ground_truth="Oslo, Stockholm")
    assert result.score == pytest.approx(1 / 2)


def test_missing_ground_truth_is_a_clear_error() -> None:
    """reference='ground_truth' without a ground truth names the fix."""
    with pytest.raises(ScorerRunError, match="has none; pass ground_truth="):
        completeness(reference="ground_truth").run_sync(input="a", output="b")


def test_bad_options_raise_at_build() -> None:
    """Invalid reference or language fail when the scorer is built."""
    with pytest.raises(ScorerConfigError, match="reference must be"):
        completeness(reference="context")  # type: ignore[arg-type]
    with pytest.raises(ScorerConfigError, match="stop-word list"):
        completeness(language="xx")
