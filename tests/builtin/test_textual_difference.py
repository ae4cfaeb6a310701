"""Tests for the textual_difference scorer."""

import pytest

from scorers.builtin import textual_difference


def test_worked_example() -> None:
    """kitten → sitting: LCS 'ittn' (4) → 2·4/13; Levenshtein 3 edits in 3 blocks."""
    result = textual_difference().run_sync(input="kitten", output="sitting")
    pre = result.preprocess_step_result
    assert result.score == pytest.approx(8 / 13)
    assert pre["changes"] == 3  # k→s, e→i, +g
    assert pre["edit_distance"] == 3
    assert pre["length_difference"] == pytest.approx(1 / 7)
    assert pre["confidence"] == pytest.approx(6 / 7)


def test_case_option() -> None:
    """ignore_case makes a case-only difference vanish."""
    assert textual_difference().run_sync(input="Hello", output="hello").score == pytest.approx(0.8)
    assert textual_difference(ignore_case=True).run_sync(input="Hello", output="hello").score == 1.0


def test_empty_texts() -> None:
    """An empty output against a non-empty input scores 0 with full length difference."""
    result = textual_difference().run_sync(input="abc", output="")
    assert result.score == 0.0
    assert result.preprocess_step_result["length_difference"] == 1.0
    assert textual_difference().run_sync(input="", output="").score == 1.0


def test_astral_characters_count_as_utf16_units_like_mastra() -> None:
    """Lengths and edits count UTF-16 code units (JS string semantics), so emoji weigh two."""
    # "hi 😀" → "hi 😃": 5 units each, the surrogate pairs share their high half: 1 substitution.
    result = textual_difference().run_sync(input="hi 😀", output="hi 😃")
    assert result.score == pytest.approx(1 - 2 / 10)  # code points would give 1 - 2/8
    assert result.preprocess_step_result["edit_distance"] == 1
    # "ab" (2 units) vs "ab😀" (4 units): JS length difference 2/4, not 1/3.
    pre = textual_difference().run_sync(input="ab", output="ab😀").preprocess_step_result
    assert pre["length_difference"] == pytest.approx(0.5)
    assert pre["confidence"] == pytest.approx(0.5)
    assert pre["ratio"] == pytest.approx(2 * 2 / 6)


def test_texts_whose_lengths_multiply_past_the_bound_are_not_scorable_at_once() -> None:
    """The edits cost time in the product of the lengths, in one C call no run timeout stops: a
    1 MB input against a 1 MB output took 117 s of CPU (audit). Past 10^10 the run is not
    scorable, naming both lengths; just under it, it is scored."""
    stopped = textual_difference().run_sync(input="a" * 100_001, output="b😀" * 50_000)
    assert stopped.score is None
    assert stopped.not_scorable == {
        "step": "preprocess",
        "reason": "the texts are too long to compare (100,001 and 150,000 UTF-16 units;"
        " their product may be 10,000,000,000 at most)",
    }
    at_the_bound = textual_difference().run_sync(input="ab" * 50_000, output="ab" * 50_000)
    assert at_the_bound.score == 1.0  # 100,000 × 100,000 (common text: fast)
