"""Tests for the shared language helpers."""

import pytest

from scorers.builtin._text import content_words, fold, stop_words, words


def test_fold_removes_accents_and_case() -> None:
    """Folding lower-cases and strips combining marks."""
    assert fold("Café CRÈME") == "cafe creme"


def test_words_keep_contractions_and_cut_possessives() -> None:
    """An inner apostrophe keeps a contraction whole; a possessive 's is removed."""
    assert words("Don’t touch Paris's café_bar!") == ["don't", "touch", "paris", "cafe", "bar"]


def test_content_words_drop_stop_words_and_duplicates() -> None:
    """Stop words and repeats go; numbers stay only when asked."""
    text = "The cat and the dog ate 3 cats' food, the cat said"
    assert content_words(text, "en", keep_numbers=True) == ["cat", "dog", "ate", "3", "cats", "food"]
    assert "3" not in content_words(text, "en", keep_numbers=False)


def test_unknown_language_is_rejected() -> None:
    """A language yake has no list for raises with the valid form named."""
    with pytest.raises(ValueError, match="ISO 639-1"):
        stop_words("xx")
