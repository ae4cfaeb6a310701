"""``content_similarity``: character-bigram Dice similarity of the reference and the output.

Algorithm: the Sørensen–Dice coefficient over the multisets of character bigrams (the
algorithm of the ``string-similarity`` package Mastra uses): ``2·|A∩B| / (|A| + |B|)`` where A
and B are the bigram multisets. Identical strings score 1 (two empty ones included); a string
shorter than two characters has no bigrams and scores 0 against anything else. It is a
20-line formula over ``collections.Counter``; rapidfuzz has no q-gram Dice metric.

``ignore_case`` lower-cases both texts; ``ignore_whitespace`` removes all whitespace first
(as ``string-similarity`` always does), otherwise runs of whitespace count as one space.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from itertools import pairwise
from typing import Any

from scorers import Scorer, ScorerRun, StepResults, create_scorer
from scorers.builtin._runs import Reference, assistant_text, check_reference, reference_text

__all__ = ["bigram_dice", "content_similarity"]

_SPACE = re.compile(r"\s+")


def utf16_units(text: str) -> array[int]:
    """The text as JavaScript sees it: UTF-16 code units (a surrogate pair for astral characters)."""
    return array("H", text.encode("utf-16-le", "surrogatepass"))


def _bigrams(units: array[int]) -> Counter[tuple[int, int]]:
    return Counter(pairwise(units))


def bigram_dice(a: str, b: str) -> float:
    """Dice coefficient of the UTF-16 code-unit bigram multisets of ``a`` and ``b``."""
    if a == b:
        return 1.0
    ua, ub = utf16_units(a), utf16_units(b)
    if len(ua) < 2 or len(ub) < 2:
        return 0.0
    shared = sum((_bigrams(ua) & _bigrams(ub)).values())
    return 2.0 * shared / (len(ua) - 1 + len(ub) - 1)


def content_similarity(
    *,
    ignore_case: bool = True,
    ignore_whitespace: bool = True,
    reference: Reference = "input",
    id: str = "content-similarity",
    name: str | None = None,
) -> Scorer:
    """Bigram Dice similarity of the reference and the output text (0–1, higher is better).

    Options:
        ignore_case: compare lower-cased text (default True).
        ignore_whitespace: drop all whitespace before comparing (default True); when False,
            whitespace runs are collapsed to one space and take part in the bigrams.
        reference: ``"input"`` (the user's message, default) or ``"ground_truth"``.
        id, name: the scorer's identity.
    """
    check_reference(id, reference)

    def normalize(text: str) -> str:
        if ignore_case:
            text = text.lower()
        return _SPACE.sub("", text) if ignore_whitespace else _SPACE.sub(" ", text).strip()

    def preprocess(run: ScorerRun) -> dict[str, Any]:
        return {
            "processed_reference": normalize(reference_text(run, reference, id)),
            "processed_output": normalize(assistant_text(run)),
        }

    def score(results: StepResults) -> float:
        pre = results.preprocess_step_result
        return bigram_dice(pre["processed_reference"], pre["processed_output"])

    def reason(score: float) -> str:
        return f"Character-bigram Dice similarity of the {reference} and the output is {score:.2f}."

    return (
        create_scorer(
            id,
            name=name or "Content similarity",
            description=f"Character-bigram Dice similarity of the {reference} and the output text.",
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
