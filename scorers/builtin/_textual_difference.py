"""``textual_difference``: how similar two texts are, with the edits between them.

Algorithm (rapidfuzz): the score is the normalized Indel similarity,
``1 - indel_distance / (len(a) + len(b))`` = ``2·LCS / (len(a) + len(b))`` — the ratio
difflib's ``SequenceMatcher`` approximates and Mastra reports, computed exactly. ``changes``
is the number of non-equal blocks in rapidfuzz's Levenshtein opcodes (each a replace, insert
or delete run), ``edit_distance`` the Levenshtein distance, ``length_difference`` is
``|len(a) - len(b)| / max(len(a), len(b))`` and ``confidence`` is ``1 - length_difference``.
Two empty texts are identical (score 1). The edits take time and memory in the product of the
two lengths (about a second at 100,000 units each, two minutes at a million, in one C call no
run timeout interrupts): texts whose lengths multiply past ``MAX_UNITS_PRODUCT`` are not
scorable, the reason naming both lengths.

Lengths and edits count UTF-16 code units, as JavaScript strings (and so Mastra's difflib port)
do: an emoji or other character outside the Basic Multilingual Plane is two units, so
``"hi 😀"`` → ``"hi 😃"`` is one changed unit of five (the surrogate pairs share their high
half), not one changed character of four.
"""

from __future__ import annotations

from typing import Any

from rapidfuzz.distance import Indel, Levenshtein

from scorers import NotScorable, Scorer, ScorerRun, StepResults, create_scorer, not_scorable
from scorers.builtin._content_similarity import utf16_units
from scorers.builtin._runs import Reference, assistant_text, check_reference, reference_text

__all__ = ["MAX_UNITS_PRODUCT", "compare_texts", "textual_difference"]

MAX_UNITS_PRODUCT = 100_000 * 100_000


def compare_texts(a: str, b: str) -> dict[str, Any]:
    """Similarity ratio, change blocks, edit distance and length difference of ``a`` → ``b``
    (counted in UTF-16 code units, like Mastra)."""
    return _compare_units(utf16_units(a).tolist(), utf16_units(b).tolist())


def _compare_units(units_a: list[int], units_b: list[int]) -> dict[str, Any]:
    opcodes = Levenshtein.opcodes(units_a, units_b)
    longest = max(len(units_a), len(units_b))
    length_difference = abs(len(units_a) - len(units_b)) / longest if longest else 0.0
    return {
        "ratio": float(Indel.normalized_similarity(units_a, units_b)),
        "changes": sum(1 for op in opcodes if op.tag != "equal"),
        "edit_distance": int(Levenshtein.distance(units_a, units_b)),
        "length_difference": length_difference,
        "confidence": 1.0 - length_difference,
    }


def textual_difference(
    *,
    ignore_case: bool = False,
    reference: Reference = "input",
    id: str = "textual-difference",
    name: str | None = None,
) -> Scorer:
    """Similarity ratio of the reference and the output (0–1, higher means more similar).

    The preprocess result also carries ``changes``, ``edit_distance``, ``length_difference``
    and ``confidence``.

    Options:
        ignore_case: compare lower-cased text (default False: case changes count).
        reference: ``"input"`` (the user's message, default) or ``"ground_truth"``.
        id, name: the scorer's identity.
    """
    check_reference(id, reference)

    def preprocess(run: ScorerRun) -> dict[str, Any] | NotScorable:
        a, b = reference_text(run, reference, id), assistant_text(run)
        if ignore_case:
            a, b = a.lower(), b.lower()
        units_a, units_b = utf16_units(a).tolist(), utf16_units(b).tolist()
        if len(units_a) * len(units_b) > MAX_UNITS_PRODUCT:
            return not_scorable(
                f"the texts are too long to compare ({len(units_a):,} and {len(units_b):,} UTF-16 units;"
                f" their product may be {MAX_UNITS_PRODUCT:,} at most)"
            )
        return _compare_units(units_a, units_b)

    def score(results: StepResults) -> float:
        return float(results.preprocess_step_result["ratio"])

    def reason(results: StepResults) -> str:
        pre = results.preprocess_step_result
        return (
            f"Similarity ratio {pre['ratio']:.2f}: {pre['changes']} changed block(s), "
            f"edit distance {pre['edit_distance']}, "
            f"length difference {pre['length_difference']:.0%}."
        )

    return (
        create_scorer(
            id,
            name=name or "Textual difference",
            description=f"Similarity ratio of the {reference} and the output, with the edits.",
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
