"""``completeness``: how many of the input's key terms the output covers.

Algorithm (POS-free, stated honestly): Mastra tags nouns, verbs and topics with a
part-of-speech library; we approximate "key terms" by the input's *content words* — its
Unicode word tokens, case- and accent-folded, minus yake's stop-word list for ``language``.
Numbers are kept (they are often the facts asked about). A term counts as covered when some
output term matches it: exactly for terms of 3 characters or fewer, otherwise when one
contains the other and the shorter is more than 60% of the longer's length, so inflections
such as ``explain``/``explained`` match (Mastra's rule). Score = covered / key terms.

An input with no key terms cannot be judged and is ``not_scorable``; an empty output scores 0.
"""

from __future__ import annotations

from typing import Any

from scorers import NotScorable, Scorer, ScorerRun, StepResults, create_scorer, not_scorable
from scorers.builtin._common import check_language
from scorers.builtin._runs import Reference, assistant_text, check_reference, reference_text
from scorers.builtin._text import content_words

__all__ = ["completeness", "term_matches"]


def term_matches(term: str, candidate: str) -> bool:
    """Whether ``candidate`` (an output term) covers ``term`` (an input term)."""
    if len(term) <= 3:
        return term == candidate
    longer, shorter = (term, candidate) if len(term) >= len(candidate) else (candidate, term)
    return shorter in longer and len(shorter) / len(longer) > 0.6


def completeness(
    *,
    reference: Reference = "input",
    language: str = "en",
    id: str = "completeness",
    name: str | None = None,
) -> Scorer:
    """Share of the reference's key terms found in the output (0–1, higher is better).

    Options:
        reference: ``"input"`` (the user's message, default) or ``"ground_truth"``.
        language: ISO 639-1 code of the stop-word list (yake's lists), default ``"en"``.
        id, name: the scorer's identity, to register several configurations.
    """
    check_reference(id, reference)
    check_language(id, language)

    def preprocess(run: ScorerRun) -> dict[str, Any] | NotScorable:
        source = reference_text(run, reference, id)
        input_terms = content_words(source, language, keep_numbers=True)
        if not input_terms:
            return not_scorable(f"the {reference} has no key terms to look for in the output")
        output_terms = content_words(assistant_text(run), language, keep_numbers=True)
        covered = [t for t in input_terms if any(term_matches(t, o) for o in output_terms)]
        return {
            "input_terms": input_terms,
            "output_terms": output_terms,
            "covered_terms": covered,
            "missing_terms": [t for t in input_terms if t not in covered],
        }

    def score(results: StepResults) -> float:
        pre = results.preprocess_step_result
        return len(pre["covered_terms"]) / len(pre["input_terms"])

    def reason(results: StepResults, score: float) -> str:
        pre = results.preprocess_step_result
        missing = pre["missing_terms"]
        found = f"{len(pre['covered_terms'])} of {len(pre['input_terms'])} key terms covered"
        return f"{found}; missing: {', '.join(missing)}" if missing else f"{found}."

    return (
        create_scorer(
            id,
            name=name or "Completeness",
            description="Share of the input's key terms (content words) that the output covers.",
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
