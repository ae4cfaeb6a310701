"""Tests for the tone_consistency scorer."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import tone_consistency
from scorers.builtin._tone import compound_sentiment, split_sentences


def test_reference_mode_formula() -> None:
    """Score is 1 - |compound(output) - compound(reference)|, floored at 0."""
    reference = "Thanks so much for your help!"
    output = "I love this, it is great!"
    result = tone_consistency(reference_tone=reference).run_sync(input="q", output=output)
    expected = max(0.0, 1 - abs(compound_sentiment(output) - compound_sentiment(reference)))
    assert result.score == pytest.approx(expected)
    assert result.preprocess_step_result["mode"] == "reference"


def test_reference_mode_orders_tones() -> None:
    """A cheerful answer agrees with a cheerful reference more than a gloomy one does."""
    scorer = tone_consistency(reference_tone="Great news, happy to help!")
    cheerful = scorer.run_sync(input="q", output="Wonderful, glad it worked!").score
    gloomy = scorer.run_sync(input="q", output="This is terrible and sad.").score
    assert cheerful is not None
    assert gloomy is not None
    assert cheerful > gloomy
    assert gloomy == 0.0  # compound difference exceeds 1


def test_stability_mode_variance() -> None:
    """Without a reference: 1 - population variance of per-sentence compounds."""
    text = "The sky is blue. I love this, it is great! This is terrible."
    sentences = split_sentences(text)
    assert sentences == ["The sky is blue.", "I love this, it is great!", "This is terrible."]
    values = [compound_sentiment(s) for s in sentences]
    mean = sum(values) / 3
    variance = sum((v - mean) ** 2 for v in values) / 3
    result = tone_consistency().run_sync(input="q", output=text)
    assert result.score is not None
    assert result.score == pytest.approx(1 - variance)
    assert result.score < 1.0


def test_neutral_text_is_stable() -> None:
    """Sentences without sentiment words all score 0: variance 0, score 1."""
    result = tone_consistency().run_sync(input="q", output="The sky is blue. Water is wet")
    assert result.score == 1.0


def test_empty_output_is_not_scorable() -> None:
    """An empty output has no tone to judge."""
    result = tone_consistency().run_sync(input="q", output="")
    assert result.score is None
    assert result.not_scorable is not None


def test_blank_reference_is_rejected() -> None:
    """A blank reference tone is a configuration error."""
    with pytest.raises(ScorerConfigError, match="reference_tone"):
        tone_consistency(reference_tone="  ")
