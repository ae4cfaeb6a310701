"""``keyword_coverage``: share of the reference's keywords that appear in the output.

Algorithm: keywords are the reference's distinct word tokens (case- and accent-folded) minus
yake's stop-word list for ``language`` and minus pure numbers — the same stop-word extraction
Mastra does with ``keyword-extractor``. With ``max_keywords=N`` yake (YAKE!, unsupervised
statistical keyword extraction: term casing, position, frequency and context spread) ranks the
single-word candidates and only the N best are kept, which suits long references. A keyword is
covered when the output contains the same token. Score = covered / keywords.

A reference with no keywords cannot be judged: ``not_scorable``. An empty output scores 0.
"""

from __future__ import annotations

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
from scorers.builtin._common import check_language
from scorers.builtin._runs import Reference, assistant_text, check_reference, reference_text
from scorers.builtin._text import content_words, fold

__all__ = ["keyword_coverage"]


def _top_keywords(text: str, language: str, candidates: list[str], limit: int) -> list[str]:
    import yake  # numpy-backed; imported only when ranking is asked for

    extractor = yake.KeywordExtractor(lan=language, n=1, top=max(limit * 3, 20), dedup_lim=1.0)
    wanted = set(candidates)
    ranked: list[str] = []
    for phrase, _weight in extractor.extract_keywords(text):
        key = fold(str(phrase))
        if key in wanted and key not in ranked:
            ranked.append(key)
        if len(ranked) == limit:
            break
    return ranked or candidates[:limit]


def keyword_coverage(
    *,
    reference: Reference = "input",
    language: str = "en",
    max_keywords: int | None = None,
    id: str = "keyword-coverage",
    name: str | None = None,
) -> Scorer:
    """Share of the reference's keywords present in the output (0–1, higher is better).

    Options:
        reference: ``"input"`` (the user's message, default) or ``"ground_truth"``.
        language: ISO 639-1 code of the stop-word list, default ``"en"``.
        max_keywords: keep only the N keywords yake ranks highest (default: all keywords).
        id, name: the scorer's identity.
    """
    check_reference(id, reference)
    check_language(id, language)
    if max_keywords is not None and (
        isinstance(max_keywords, bool) or not isinstance(max_keywords, int) or max_keywords < 1
    ):
        raise ScorerConfigError(f"scorer {id!r}: max_keywords must be a positive int or None")

    def preprocess(run: ScorerRun) -> dict[str, Any] | NotScorable:
        source = reference_text(run, reference, id)
        keywords = content_words(source, language, keep_numbers=False)
        if max_keywords is not None and len(keywords) > max_keywords:
            keywords = _top_keywords(source, language, keywords, max_keywords)
        if not keywords:
            return not_scorable(f"the {reference} has no keywords (only stop words or numbers)")
        response = set(content_words(assistant_text(run), language, keep_numbers=False))
        matched = [k for k in keywords if k in response]
        return {
            "reference_keywords": keywords,
            "matched_keywords": matched,
            "missing_keywords": [k for k in keywords if k not in response],
        }

    def score(results: StepResults) -> float:
        pre = results.preprocess_step_result
        return len(pre["matched_keywords"]) / len(pre["reference_keywords"])

    def reason(results: StepResults) -> str:
        pre = results.preprocess_step_result
        head = f"{len(pre['matched_keywords'])} of {len(pre['reference_keywords'])} keywords covered"
        missing = pre["missing_keywords"]
        return f"{head}; missing: {', '.join(missing)}" if missing else f"{head}."

    return (
        create_scorer(
            id,
            name=name or "Keyword coverage",
            description=f"Share of the {reference}'s keywords found in the output.",
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
