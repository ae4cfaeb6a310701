"""``answer_similarity`` (LLM judge): how closely the answer matches a ground-truth answer.

Steps (Mastra's answer-similarity semantics, our prompts):
1. preprocess (judge): split the output and the ground truth into semantic units (facts).
2. analyze (judge): match each ground-truth unit to the output — ``exact``, ``semantic``
   (same meaning), ``partial`` or ``missing``; list contradictions and output units the ground
   truth lacks.
3. generate_score (code), Mastra's formula with its defaults:
   per unit exact ``1 + exact_match_bonus`` (0.2), semantic ``semantic_threshold`` (0.8),
   partial ``semantic_threshold / 2``, missing ``-missing_penalty`` (0.15); divided by
   ``units · (1 + exact_match_bonus)``; minus ``contradictions · contradiction_penalty`` (1.0)
   and ``min(extra · extra_info_penalty (0.05), 0.2)``; clamped to 0–1, times ``scale``.
   No ground-truth units → 0.
4. generate_reason (judge).

Ground truth: ``run.ground_truth`` (a string, or anything JSON-serialisable). Without it the
run fails with a clear error (``require_ground_truth=True``, the default), or is not scorable
(``require_ground_truth=False``). Not scorable: no output text.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer, not_scorable
from scorers.builtin._llm import (
    FOLDED,
    LLM_VERSION,
    ModelOption,
    as_json,
    check_scale,
    fenced,
    make_judge,
    numbered,
    parse,
    require_output,
    rounded,
)
from scorers.builtin._runs import ground_truth_text

__all__ = ["SemanticUnits", "SimilarityAnalysis", "answer_similarity"]

INSTRUCTIONS = """You compare an AI assistant's answer with a ground-truth answer, as a regression
test would. Judge meaning, not wording: different phrasings of the same fact match. Be strict
about missing facts and contradictions, and fair with partial matches."""


class SemanticUnits(BaseModel):
    output_units: list[str]
    ground_truth_units: list[str]


class UnitMatch(BaseModel):
    ground_truth_unit: str
    output_unit: str | None
    match_type: Annotated[Literal["exact", "semantic", "partial", "missing"], FOLDED]
    explanation: str


class Contradiction(BaseModel):
    output_unit: str
    ground_truth_unit: str
    explanation: str


class SimilarityAnalysis(BaseModel):
    matches: list[UnitMatch]
    extra_in_output: list[str]
    contradictions: list[Contradiction]


def answer_similarity(
    model: ModelOption,
    *,
    require_ground_truth: bool = True,
    semantic_threshold: float = 0.8,
    exact_match_bonus: float = 0.2,
    missing_penalty: float = 0.15,
    contradiction_penalty: float = 1.0,
    extra_info_penalty: float = 0.05,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "answer-similarity",
    name: str | None = None,
) -> Scorer:
    """Similarity of the answer to ``run.ground_truth`` (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        require_ground_truth: a run without ground truth is an error (True, default) or not
            scorable (False).
        semantic_threshold, exact_match_bonus, missing_penalty, contradiction_penalty,
            extra_info_penalty: the scoring weights (see the module docstring).
        scale: the score of a perfect match (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    for option, value in (
        ("semantic_threshold", semantic_threshold),
        ("exact_match_bonus", exact_match_bonus),
        ("missing_penalty", missing_penalty),
        ("contradiction_penalty", contradiction_penalty),
        ("extra_info_penalty", extra_info_penalty),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ScorerConfigError(f"scorer {id!r}: {option} must be a non-negative number, got {value!r}")

    def ground_truth(run: ScorerRun) -> str:
        text = ground_truth_text(run)
        if text is not None:
            return text
        if not require_ground_truth:
            raise not_scorable("the run has no ground truth to compare with")
        raise ValueError(
            f"scorer {id!r} compares the answer with a ground truth, but run {run.run_id!r} has "
            "none; pass ground_truth= with the run, or build the scorer with "
            "require_ground_truth=False to mark such runs not scorable"
        )

    def extract_prompt(run: ScorerRun) -> str:
        truth = ground_truth(run)
        output = require_output(run)
        return (
            "Split each of the two texts below into semantic units: single facts or pieces of "
            "information, self-contained, in order. Do not merge, add or correct anything.\n\n"
            f"{fenced('assistant answer', output)}\n\n"
            f"{fenced('ground truth', truth)}\n\n"
            'Answer as JSON: {"output_units": [...], "ground_truth_units": [...]}.'
        )

    def analyze_prompt(results: StepResults) -> str:
        units = parse(SemanticUnits, results.preprocess_step_result)
        return (
            "Match every ground-truth unit to the answer's units: exact (same fact, same "
            "wording), semantic (same meaning), partial (part of the fact), or missing (with "
            "output_unit null). Then list the answer's units that contradict a ground-truth unit, "
            "and the answer's units that the ground truth does not contain (extra_in_output).\n\n"
            f"Ground-truth units:\n{numbered('ground truth unit', units.ground_truth_units) or '(none)'}\n\n"
            f"Answer units:\n{numbered('answer unit', units.output_units) or '(none)'}\n\n"
            'Answer as JSON: {"matches": [{"ground_truth_unit": ..., "output_unit": ... or null, '
            '"match_type": "exact"|"semantic"|"partial"|"missing", "explanation": ...}], '
            '"extra_in_output": [...], "contradictions": [{"output_unit": ..., '
            '"ground_truth_unit": ..., "explanation": ...}]}.'
        )

    credit = {
        "exact": 1.0 + exact_match_bonus,
        "semantic": semantic_threshold,
        "partial": semantic_threshold * 0.5,
        "missing": -missing_penalty,
    }

    def score(results: StepResults) -> float:
        analysis = parse(SimilarityAnalysis, results.analyze_step_result)
        if not analysis.matches:
            return 0.0
        value = sum(credit[m.match_type] for m in analysis.matches)
        value /= len(analysis.matches) * (1.0 + exact_match_bonus)
        value -= len(analysis.contradictions) * contradiction_penalty
        value -= min(len(analysis.extra_in_output) * extra_info_penalty, 0.2)
        return rounded(value, scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        analysis = parse(SimilarityAnalysis, results.analyze_step_result)
        return (
            f"The answer-similarity score is {score} on a scale of 0 to {scale:g}. Explain it in "
            "two or three sentences: which ground-truth facts the answer matched, missed or "
            "contradicted.\n\n"
            f"Analysis:\n{fenced('analysis', as_json(analysis.model_dump()))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Answer similarity",
            description="Semantic similarity of the answer to the ground-truth answer (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .preprocess(PromptStep("Split into semantic units", extract_prompt, output_schema=SemanticUnits))
        .analyze(PromptStep("Match the units", analyze_prompt, output_schema=SimilarityAnalysis))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
