"""``context_precision`` (LLM judge): were the useful context pieces ranked first?

Steps (Mastra's context-precision semantics, our prompts):
1. analyze (judge): per context piece, in retrieval order, ``yes`` if it was useful for
   producing the answer to the user's message, else ``no``.
2. generate_score (code): mean average precision over the ranking —
   ``Σ_k [piece k useful] · precision@k / useful pieces`` where precision@k is the share of
   useful pieces among the first k — times ``scale``; no useful piece → 0.
3. generate_reason (judge).

Context: the ``context`` option (a list, or a function of the run), else the run's tool
results, in order. Not scorable: no output text, or no context.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerRun, StepResults, create_scorer
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

__all__ = ["ContextPrecisionVerdicts", "context_precision", "mean_average_precision"]

INSTRUCTIONS = """You evaluate retrieval for a question-answering assistant: for each retrieved
context piece, decide whether it was useful for producing the assistant's answer to the user's
question. Judge each piece on its own merits, not by its position."""


class ContextPrecisionVerdict(BaseModel):
    context_index: int
    verdict: Annotated[Literal["yes", "no"], FOLDED]
    reason: str


class ContextPrecisionVerdicts(BaseModel):
    verdicts: list[ContextPrecisionVerdict]


def mean_average_precision(relevant: list[bool]) -> float:
    """MAP of one ranking: mean of precision@k over the positions k that are relevant."""
    hits, total = 0, 0.0
    for k, is_relevant in enumerate(relevant, start=1):
        if is_relevant:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


def context_precision(
    model: ModelOption,
    *,
    context: ContextOption = None,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "context-precision",
    name: str | None = None,
) -> Scorer:
    """Mean average precision of the context ranking (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        context: ordered list of retrieved texts, or ``fn(run) -> list[str]``; default: the
            run's tool results in call order.
        scale: the score of a perfect ranking (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    context = check_context_option(id, context)

    def analyze_prompt(run: ScorerRun) -> str:
        output = require_output(run)
        pieces = resolve_context(run, context)
        question = user_text(run)
        asked = f"{fenced('user message', question)}\n\n" if question.strip() else ""
        return (
            'For each context piece, in the given order, answer "yes" if it was useful for '
            'producing the assistant answer to the user message, else "no", with a one-sentence '
            f"reason. Give exactly {len(pieces)} verdicts; context_index is the piece's number "
            "(1-based).\n\n"
            f"{asked}{fenced('assistant answer', output)}\n\n"
            f"Context pieces:\n{numbered('context', pieces)}\n\n"
            'Answer as JSON: {"verdicts": [{"context_index": 1, "verdict": "yes"|"no", "reason": ...}]}.'
        )

    def score(results: StepResults) -> float:
        verdicts = parse(ContextPrecisionVerdicts, results.analyze_step_result).verdicts
        ranked = sorted(verdicts, key=lambda v: v.context_index)
        return rounded(mean_average_precision([v.verdict == "yes" for v in ranked]), scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        verdicts = parse(ContextPrecisionVerdicts, results.analyze_step_result).verdicts
        return (
            f"The context-precision score is {score} on a scale of 0 to {scale:g}: the mean "
            "average precision of the retrieved context, high when useful pieces come first. "
            "Explain it in two or three sentences.\n\n"
            f"Verdicts:\n{fenced('verdicts', as_json([v.model_dump() for v in verdicts]))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Context precision",
            description="Mean average precision of the retrieved context's ranking (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .analyze(PromptStep("Judge each context piece", analyze_prompt, output_schema=ContextPrecisionVerdicts))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
