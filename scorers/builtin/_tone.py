"""``tone_consistency``: sentiment agreement with a reference tone, or stability across sentences.

Algorithm: VADER (vaderSentiment: a rule-based, lexicon sentiment model for short English
texts) gives each text a ``compound`` polarity in [-1, 1].

- With ``reference_tone`` (a sample text in the wanted tone): score =
  ``max(0, 1 - |compound(output) - compound(reference_tone)|)`` (Mastra's formula, with VADER's
  compound in place of the ``sentiment`` package's comparative score).
- Without it: the output is split into sentences (a regular expression: a sentence ends at
  ``.``, ``!`` or ``?`` followed by whitespace; any unterminated tail is a sentence too), each
  sentence gets its compound, and score = ``max(0, 1 - population variance)``.

An output with no text has no tone to judge: ``not_scorable``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from scorers import (
    NotScorable,
    Scorer,
    ScorerConfigError,
    ScorerRun,
    StepResults,
    create_scorer,
    not_scorable,
)
from scorers.builtin._runs import assistant_text

__all__ = ["compound_sentiment", "split_sentences", "tone_consistency"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@functools.lru_cache(maxsize=1)
def _analyzer() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def compound_sentiment(text: str) -> float:
    """VADER's compound polarity of ``text``, in [-1, 1]."""
    return float(_analyzer().polarity_scores(text)["compound"])


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def tone_consistency(
    *,
    reference_tone: str | None = None,
    id: str = "tone-consistency",
    name: str | None = None,
) -> Scorer:
    """Tone agreement with ``reference_tone``, else sentiment stability (0–1, higher is better).

    Options:
        reference_tone: a sample text written in the tone the output should have (e.g.
            "Thank you so much, happy to help!"). Without it the scorer measures how steady
            the sentiment is from sentence to sentence.
        id, name: the scorer's identity.
    """
    if reference_tone is not None and not reference_tone.strip():
        raise ScorerConfigError(f"scorer {id!r}: reference_tone must be a non-empty text or None")
    reference = compound_sentiment(reference_tone) if reference_tone is not None else None

    def preprocess(run: ScorerRun) -> dict[str, Any] | NotScorable:
        text = assistant_text(run)
        if not text.strip():
            return not_scorable("the output has no text, so it has no tone")
        if reference is not None:
            response = compound_sentiment(text)
            difference = abs(response - reference)
            return {
                "mode": "reference",
                "response_sentiment": response,
                "reference_sentiment": reference,
                "difference": difference,
                "score": max(0.0, 1.0 - difference),
            }
        sentiments = [compound_sentiment(s) for s in split_sentences(text)]
        mean = sum(sentiments) / len(sentiments)
        variance = sum((s - mean) ** 2 for s in sentiments) / len(sentiments)
        return {
            "mode": "stability",
            "sentence_sentiments": sentiments,
            "average_sentiment": mean,
            "sentiment_variance": variance,
            "score": max(0.0, 1.0 - variance),
        }

    def score(results: StepResults) -> float:
        return float(results.preprocess_step_result["score"])

    def reason(results: StepResults) -> str:
        pre = results.preprocess_step_result
        if pre["mode"] == "reference":
            return (
                f"Output sentiment {pre['response_sentiment']:+.2f} vs reference tone "
                f"{pre['reference_sentiment']:+.2f} (difference {pre['difference']:.2f})."
            )
        return (
            f"Sentiment across {len(pre['sentence_sentiments'])} sentence(s) averages "
            f"{pre['average_sentiment']:+.2f} with variance {pre['sentiment_variance']:.3f}."
        )

    mode = "agreement with a reference tone" if reference_tone else "stability across sentences"
    return (
        create_scorer(
            id,
            name=name or "Tone consistency",
            description=f"Sentiment (VADER) {mode}.",
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
