"""``context_relevance`` (LLM judge): how relevant and how well used the provided context was.

Steps (Mastra's context-relevance semantics, our prompts):
1. analyze (judge): per context piece a relevance level (``high`` / ``medium`` / ``low`` /
   ``none``) for the user's message and whether the answer used it; plus the information that
   was missing from the context.
2. generate_score (code):
   ``max(0, mean(weight) - unused_high · p_unused - min(missing · p_missing, max_missing))·scale``
   with weights high 1.0, medium 0.7, low 0.3, none 0.0 and default penalties
   ``p_unused`` 0.1, ``p_missing`` 0.15, ``max_missing`` 0.5 (options, as in Mastra). If the
   judge evaluates no piece, the score is 0 when it named missing context, else 1.
3. generate_reason (judge).

Context: the ``context`` option (a list or a function of the run), else the run's tool
results. Not scorable: no output text, or no context (Mastra scores 1 there; we do not guess).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer
from scorers.builtin._llm import (
    FOLDED,
    LLM_VERSION,
    ContextOption,
    ModelOption,
    as_json,
    check_context_option,
    check_scale,
    fenced,
    make_judge,
    numbered,
    parse,
    require_output,
    resolve_context,
    rounded,
)
from scorers.builtin._runs import user_text

__all__ = ["DEFAULT_PENALTIES", "ContextRelevanceAnalysis", "context_relevance"]

INSTRUCTIONS = """You evaluate the context an assistant was given for answering a user: how
relevant each piece is to the user's request, whether the answer actually used it, and what
information the assistant needed but the context lacked."""

RELEVANCE_WEIGHTS = {"high": 1.0, "medium": 0.7, "low": 0.3, "none": 0.0}
DEFAULT_PENALTIES: Mapping[str, float] = {
    "unused_high_relevance_context": 0.1,
    "missing_context_per_item": 0.15,
    "max_missing_context_penalty": 0.5,
}


class ContextEvaluation(BaseModel):
    context_index: int
    relevance_level: Annotated[Literal["high", "medium", "low", "none"], FOLDED]
    was_used: bool
    reasoning: str


class ContextRelevanceAnalysis(BaseModel):
    evaluations: list[ContextEvaluation]
    missing_context: list[str]
    overall_assessment: str


def context_relevance(
    model: ModelOption,
    *,
    context: ContextOption = None,
    penalties: Mapping[str, float] | None = None,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "context-relevance",
    name: str | None = None,
) -> Scorer:
    """Relevance and use of the context, with penalties (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        context: list of context texts, or ``fn(run) -> list[str]``; default: the run's tool
            results.
        penalties: overrides of ``DEFAULT_PENALTIES`` (unused_high_relevance_context,
            missing_context_per_item, max_missing_context_penalty).
        scale: the best score (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    context = check_context_option(id, context)
    unknown = set(penalties or {}) - set(DEFAULT_PENALTIES)
    if unknown:
        raise ScorerConfigError(
            f"scorer {id!r}: unknown penalties {sorted(unknown)}; known: {sorted(DEFAULT_PENALTIES)}"
        )
    rates = {**DEFAULT_PENALTIES, **(penalties or {})}
    if any(isinstance(v, bool) or not isinstance(v, int | float) or v < 0 for v in rates.values()):
        raise ScorerConfigError(f"scorer {id!r}: penalties must be non-negative numbers, got {rates}")

    def analyze_prompt(run: ScorerRun) -> str:
        output = require_output(run)
        pieces = resolve_context(run, context)
        question = user_text(run)
        asked = f"{fenced('user message', question)}\n\n" if question.strip() else ""
        return (
            "Evaluate each context piece: its relevance to the user message (high, medium, low "
            "or none), whether the assistant answer used it (was_used), and a one-sentence "
            f"reasoning. Give exactly {len(pieces)} evaluations; context_index is the piece's "
            "number (1-based). Then list in missing_context the information the answer needed "
            "that no piece provided (empty if none), and give an overall_assessment.\n\n"
            f"{asked}{fenced('assistant answer', output)}\n\n"
            f"Context pieces:\n{numbered('context', pieces)}\n\n"
            'Answer as JSON: {"evaluations": [{"context_index": 1, "relevance_level": '
            '"high"|"medium"|"low"|"none", "was_used": true, "reasoning": ...}], '
            '"missing_context": [...], "overall_assessment": ...}.'
        )

    def score(results: StepResults) -> float:
        analysis = parse(ContextRelevanceAnalysis, results.analyze_step_result)
        evaluations, missing = analysis.evaluations, analysis.missing_context
        if not evaluations:
            return 0.0 if missing else rounded(1.0, scale)
        base = sum(RELEVANCE_WEIGHTS[e.relevance_level] for e in evaluations) / len(evaluations)
        unused_high = sum(e.relevance_level == "high" and not e.was_used for e in evaluations)
        usage_penalty = unused_high * rates["unused_high_relevance_context"]
        missing_penalty = min(len(missing) * rates["missing_context_per_item"], rates["max_missing_context_penalty"])
        return rounded(max(0.0, base - usage_penalty - missing_penalty), scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        analysis = parse(ContextRelevanceAnalysis, results.analyze_step_result)
        return (
            f"The context-relevance score is {score} on a scale of 0 to {scale:g}: how relevant "
            "the context was, less penalties for relevant pieces the answer ignored and for "
            "missing information. Explain it in two or three sentences.\n\n"
            f"Analysis:\n{fenced('analysis', as_json(analysis.model_dump()))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Context relevance",
            description="Relevance and use of the provided context, less penalties for gaps (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .analyze(PromptStep("Evaluate the context", analyze_prompt, output_schema=ContextRelevanceAnalysis))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
