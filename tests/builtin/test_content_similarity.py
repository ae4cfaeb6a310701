"""Tests for the content_similarity scorer."""

import pytest

from scorers.builtin import content_similarity
from scorers.builtin._content_similarity import bigram_dice


def test_worked_example() -> None:
    """'night' vs 'nacht': bigrams ni,ig,gh,ht / na,ac,ch,ht share one → 2·1/8."""
    assert content_similarity().run_sync(input="Night", output="nacht").score == pytest.approx(0.25)


def test_whitespace_and_case_options() -> None:
    """By default case and whitespace are ignored; turning that off makes them count."""
    assert content_similarity().run_sync(input="Hello World", output="helloworld").score == 1.0
    strict = content_similarity(ignore_case=False, ignore_whitespace=False)
    # "ab c" bigrams: "ab", "b ", " c"; "abc": "ab", "bc" → 2·1/(3+2)
    assert strict.run_sync(input="ab c", output="abc").score == pytest.approx(2 / 5)
    # case kept: "Ab"/"ab" differ, "bc" shared → 2·1/4
    assert strict.run_sync(input="Abc", output="abc").score == pytest.approx(0.5)


def test_repeated_bigrams_count_as_multisets() -> None:
    """'aaaa' has aa×3 and 'aa' has aa×1: 2·1/(3+1)."""
    assert bigram_dice("aaaa", "aa") == pytest.approx(0.5)


def test_empty_output() -> None:
    """An empty output shares nothing with a non-empty input; two empty texts are identical."""
    assert content_similarity().run_sync(input="hello", output="").score == 0.0
    assert bigram_dice("", "") == 1.0
    assert bigram_dice("a", "b") == 0.0


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # Each value is what string-similarity's compareTwoStrings returns under Node (JS strings
        # are UTF-16: an emoji is a surrogate pair, two units, so it makes two bigrams).
        ("😀😀", "😀", 0.5),  # code points: "😀" has no bigram → 0
        ("a😀b", "a😀c", 2 / 3),  # code points: 2·1/4 = 0.5
        ("𝒳y", "𝒳z", 0.5),  # mathematical script letters are astral too
        ("great 👍 thanks", "great 👍👍 thanks", 0.9230769230769231),
    ],
)
def test_astral_characters_count_as_utf16_units_like_mastra(a: str, b: str, expected: float) -> None:
    """Emoji and other astral characters are two UTF-16 units, as in Mastra's JavaScript."""
    assert bigram_dice(a.replace(" ", ""), b.replace(" ", "")) == pytest.approx(expected)
    assert content_similarity().run_sync(input=a, output=b).score == pytest.approx(expected)
