"""``noise_sensitivity`` (LLM judge): how robust the answer stays when the query carries noise.

The run is the agent's answer to the noisy variant of a query; the scorer compares it with a
baseline answer to the clean query (Mastra's noise-sensitivity semantics, our prompts):

1. analyze (judge): impact of the noise per dimension (content accuracy, completeness,
   relevance, consistency, hallucination...), each ``none`` / ``minimal`` / ``moderate`` /
   ``significant`` / ``severe``; the major issues the noise caused; an overall
   ``robustness_score`` 0–1.
2. generate_score (code): start from ``robustness_score``; when it differs from the mean impact
   weight (none 1.0, minimal 0.85, moderate 0.6, significant 0.3, severe 0.1) by more than
   ``discrepancy_threshold`` (0.2) take the lower of the two; subtract
   ``min(major_issues · 0.1, 0.3)``; times ``scale``.
3. generate_reason (judge).

Required options: ``baseline_response`` and ``noisy_query``. The run's user message is the
original (clean) query. Not scorable: no user message or no output text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from scorers import Judge, PromptStep, Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer
from scorers.builtin._llm import (
    FOLDED,
    LLM_VERSION,
    ModelOption,
    as_json,
    check_scale,
    fenced,
    make_judge,
    parse,
    require_output,
    require_user,
    rounded,
)

__all__ = ["DEFAULT_IMPACT_WEIGHTS", "NoiseAnalysis", "noise_sensitivity"]

INSTRUCTIONS = """You test an AI assistant's robustness to noise: irrelevant, distracting or
misleading information added to a query. Compare the answer it gave to the noisy query with
its baseline answer to the clean query, and judge how much the noise changed the answer's
accuracy, completeness, relevance and consistency, and whether it led to hallucinations."""

Impact = Literal["none", "minimal", "moderate", "significant", "severe"]
DEFAULT_IMPACT_WEIGHTS: Mapping[str, float] = {
    "none": 1.0,
    "minimal": 0.85,
    "moderate": 0.6,
    "significant": 0.3,
    "severe": 0.1,
}


class NoiseDimension(BaseModel):
    dimension: str
    impact_level: Annotated[Impact, FOLDED]
    specific_changes: str
    noise_influence: str


class NoiseAnalysis(BaseModel):
    dimensions: list[NoiseDimension]
    major_issues: list[str]
    overall_assessment: str
    robustness_score: float = Field(description="0 to 1: 1 means the noise had no effect")


def noise_sensitivity(
    model: ModelOption,
    *,
    baseline_response: str,
    noisy_query: str,
    noise_type: str | None = None,
    impact_weights: Mapping[str, float] | None = None,
    major_issue_penalty: float = 0.1,
    max_major_issue_penalty: float = 0.3,
    discrepancy_threshold: float = 0.2,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "noise-sensitivity",
    name: str | None = None,
) -> Scorer:
    """Robustness of the answer to noise in the query (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        baseline_response: the agent's answer to the clean query (required).
        noisy_query: the query with noise added, to which the run's output answers (required).
        noise_type: what kind of noise was added (e.g. "misinformation"), for the judge.
        impact_weights: overrides of ``DEFAULT_IMPACT_WEIGHTS``.
        major_issue_penalty, max_major_issue_penalty: subtracted per major issue, and its cap.
        discrepancy_threshold: when the judge's robustness score and the mean impact weight
            differ by more than this, the lower one is used.
        scale: the best score (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    for option, value in (("baseline_response", baseline_response), ("noisy_query", noisy_query)):
        if not isinstance(value, str) or not value.strip():
            raise ScorerConfigError(f"scorer {id!r}: {option} is required (a non-empty string)")
    unknown = set(impact_weights or {}) - set(DEFAULT_IMPACT_WEIGHTS)
    if unknown:
        raise ScorerConfigError(
            f"scorer {id!r}: unknown impact levels {sorted(unknown)}; known: {list(DEFAULT_IMPACT_WEIGHTS)}"
        )
    weights = {**DEFAULT_IMPACT_WEIGHTS, **(impact_weights or {})}
    # Used only once a judge call is paid for: a bad one then failed every run (TypeError).
    numbers: dict[str, object] = {
        **{f"impact_weights[{level!r}]": w for level, w in weights.items()},
        "major_issue_penalty": major_issue_penalty,
        "max_major_issue_penalty": max_major_issue_penalty,
        "discrepancy_threshold": discrepancy_threshold,
    }
    for option, number in numbers.items():
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number < math.inf:
            raise ScorerConfigError(f"scorer {id!r}: {option} must be a finite non-negative number, got {number!r}")

    def analyze_prompt(run: ScorerRun) -> str:
        query = require_user(run)
        output = require_output(run)
        noise = f" The noise is of this kind: {noise_type}." if noise_type else ""
        return (
            "Compare the answer to the noisy query with the baseline answer to the original "
            f"query.{noise} For each dimension affected or checked (content accuracy, "
            "completeness, relevance, consistency, hallucination) give the impact level (none, "
            "minimal, moderate, significant or severe), the specific changes and how the noise "
            "caused them. List the major issues the noise caused (empty if none), give an "
            "overall_assessment and a robustness_score from 0 (derailed) to 1 (unaffected).\n\n"
            f"{fenced('original query', query)}\n\n"
            f"{fenced('baseline answer', baseline_response)}\n\n"
            f"{fenced('noisy query', noisy_query)}\n\n"
            f"{fenced('answer to the noisy query', output)}\n\n"
            'Answer as JSON: {"dimensions": [{"dimension": ..., "impact_level": ..., '
            '"specific_changes": ..., "noise_influence": ...}], "major_issues": [...], '
            '"overall_assessment": ..., "robustness_score": 0.0}.'
        )

    def score(results: StepResults) -> float:
        analysis = parse(NoiseAnalysis, results.analyze_step_result)
        value = min(1.0, max(0.0, analysis.robustness_score))
        if analysis.dimensions:
            mean_impact = sum(weights[d.impact_level] for d in analysis.dimensions) / len(analysis.dimensions)
            if abs(value - mean_impact) > discrepancy_threshold:
                value = min(value, mean_impact)
        penalty = min(len(analysis.major_issues) * major_issue_penalty, max_major_issue_penalty)
        return rounded(max(0.0, value - penalty), scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        analysis = parse(NoiseAnalysis, results.analyze_step_result)
        return (
            f"The noise-sensitivity score is {score} on a scale of 0 to {scale:g} (higher means "
            "more robust). Explain it in two or three sentences: how the noise changed the "
            "answer, and the major issues if any.\n\n"
            f"Analysis:\n{fenced('analysis', as_json(analysis.model_dump()))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Noise sensitivity",
            description="Robustness of the answer to noise added to the query, against a baseline (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .analyze(PromptStep("Analyse the noise's impact", analyze_prompt, output_schema=NoiseAnalysis))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
