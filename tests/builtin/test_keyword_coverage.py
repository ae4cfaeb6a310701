"""Tests for the keyword_coverage scorer."""

import pytest

from scorers import ScorerConfigError, ScorerRunError
from scorers.builtin import keyword_coverage


def test_worked_example() -> None:
    """Reference keywords (stop words and numbers removed) are matched as whole tokens."""
    result = keyword_coverage().run_sync(
        input="Which Python web framework supports async views in 2024?",
        output="Django supports async views, and so does FastAPI.",
    )
    pre = result.preprocess_step_result
    # 'which', 'in' are stop words, '2024' a number
    assert pre["reference_keywords"] == ["python", "web", "framework", "supports", "async", "views"]
    assert pre["matched_keywords"] == ["supports", "async", "views"]
    assert result.score == pytest.approx(3 / 6)
    assert "missing: python, web, framework" in (result.reason or "")


def test_ground_truth_reference_and_max_keywords() -> None:
    """max_keywords keeps yake's best-ranked keywords of the reference."""
    scorer = keyword_coverage(reference="ground_truth", max_keywords=2)
    result = scorer.run_sync(
        input="?",
        output="Kubernetes schedules pods.",
        ground_truth="Kubernetes schedules pods onto nodes; the scheduler weighs resource requests.",
    )
    keywords = result.preprocess_step_result["reference_keywords"]
    assert len(keywords) == 2
    assert set(keywords) <= {"kubernetes", "schedules", "pods", "nodes", "scheduler", "weighs", "resource", "requests"}
    matched = result.preprocess_step_result["matched_keywords"]
    assert result.score == pytest.approx(len(matched) / 2)


def test_empty_output_scores_zero() -> None:
    """No output covers no keyword."""
    assert keyword_coverage().run_sync(input="Rust borrow checker", output="").score == 0.0


def test_reference_without_keywords_is_not_scorable() -> None:
    """Only stop words and numbers: nothing to cover."""
    result = keyword_coverage().run_sync(input="Is it 42?", output="Yes")
    assert result.score is None
    assert result.not_scorable is not None


def test_missing_ground_truth_and_bad_options() -> None:
    """A missing ground truth fails the run; a bad max_keywords fails the build."""
    with pytest.raises(ScorerRunError, match="ground truth"):
        keyword_coverage(reference="ground_truth").run_sync(input="a", output="b")
    with pytest.raises(ScorerConfigError, match="max_keywords"):
        keyword_coverage(max_keywords=0)
