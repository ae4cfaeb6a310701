"""``hallucination`` (LLM judge): share of the answer's claims the context contradicts.

Steps (Mastra's hallucination semantics, our prompts):
1. preprocess (judge): extract the output's factual claims.
2. analyze (judge): per claim, ``contradicted`` (the context says otherwise), ``unsupported``
   (the context does not say) or ``supported``.
3. generate_score (code): ``contradicted / claims · scale`` — lower is better. With
   ``count_unsupported=True`` unsupported claims count as hallucinated too. An output without
   factual claims hallucinates nothing: 0.
4. generate_reason (judge).

Context: the ``context`` option (a list or a function of the run), else the run's tool
results. Not scorable: no output text, or no context.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerRun, StepResults, create_scorer
from scorers.builtin._claims import Claims, claims_prompt
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
    resolve_context,
    rounded,
)

__all__ = ["HallucinationVerdicts", "hallucination"]

INSTRUCTIONS = """You detect hallucinations: claims in an AI assistant's answer that conflict with
the context it was given (documents, tool results). Judge only by the context. A claim is
contradicted when the context states something incompatible with it, unsupported when the
context is silent about it, supported when the context states or directly implies it."""


class HallucinationVerdict(BaseModel):
    claim: str
    verdict: Annotated[Literal["contradicted", "unsupported", "supported"], FOLDED]
    reason: str


class HallucinationVerdicts(BaseModel):
    verdicts: list[HallucinationVerdict]


def hallucination(
    model: ModelOption,
    *,
    context: ContextOption = None,
    count_unsupported: bool = False,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "hallucination",
    name: str | None = None,
) -> Scorer:
    """Share of the output's claims contradicted by the context (0–scale, lower is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        context: list of context texts, or ``fn(run) -> list[str]``; default: the run's tool
            results.
        count_unsupported: also count claims the context does not support (default False).
        scale: the score when every claim is hallucinated (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    context = check_context_option(id, context)
    bad = {"contradicted", "unsupported"} if count_unsupported else {"contradicted"}

    def extract_prompt(run: ScorerRun) -> str:
        resolve_context(run, context)  # no context: not scorable before any judge call
        return claims_prompt(run)

    def analyze_prompt(run: ScorerRun, results: StepResults) -> str:
        claims = parse(Claims, results.preprocess_step_result).claims
        pieces = resolve_context(run, context)
        return (
            "For each claim give a verdict against the context:\n"
            '- "contradicted": the context states something incompatible with the claim;\n'
            '- "unsupported": the context does not say;\n'
            '- "supported": the context states or directly implies it.\n'
            "One verdict per claim, in order, each with a one-sentence reason. With no claims, "
            "answer with an empty list.\n\n"
            f"Context:\n{numbered('context', pieces)}\n\n"
            f"Claims:\n{numbered('claim', claims) or '(none)'}\n\n"
            'Answer as JSON: {"verdicts": [{"claim": ..., "verdict": '
            '"contradicted"|"unsupported"|"supported", "reason": ...}]}.'
        )

    def score(results: StepResults) -> float:
        verdicts = parse(HallucinationVerdicts, results.analyze_step_result).verdicts
        if not verdicts:
            return 0.0
        return rounded(sum(v.verdict in bad for v in verdicts) / len(verdicts), scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        verdicts = parse(HallucinationVerdicts, results.analyze_step_result).verdicts
        counted = "contradicted or unsupported" if count_unsupported else "contradicted"
        return (
            f"The hallucination score is {score} on a scale of 0 to {scale:g} (lower is better): "
            f"the share of the answer's claims the context {counted}. Explain it in two or three "
            "sentences, naming the hallucinated claims if any.\n\n"
            f"Verdicts:\n{fenced('verdicts', as_json([v.model_dump() for v in verdicts]))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Hallucination",
            description="Share of the answer's claims contradicted by the context or tool results (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="lower",
            version=LLM_VERSION,
        )
        .preprocess(PromptStep("Extract the output's claims", extract_prompt, output_schema=Claims))
        .analyze(PromptStep("Check each claim for contradictions", analyze_prompt, output_schema=HallucinationVerdicts))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
