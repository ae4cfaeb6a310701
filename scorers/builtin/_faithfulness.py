"""``faithfulness`` (LLM judge): how many of the answer's claims the context supports.

Steps (Mastra's faithfulness semantics, our prompts):
1. preprocess (judge): extract the output's factual claims.
2. analyze (judge): per claim, ``yes`` (the context supports it), ``no`` (the context
   contradicts it) or ``unsure`` (the context does not say).
3. generate_score (code): ``yes verdicts / verdicts · scale``. The prompt asks one verdict per
   claim; as in Mastra, the share is of the verdicts the judge returned (a judge that skips a
   claim is not corrected).
4. generate_reason (judge).

Context: the ``context`` option (a list of texts or a function of the run), else the results
of the run's tool calls. Not scorable: no output text, no context, or an output without any
factual claim (nothing to check).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerRun, StepResults, create_scorer, not_scorable
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

__all__ = ["FaithfulnessVerdicts", "faithfulness"]

INSTRUCTIONS = """You check an AI assistant's claims against the context it was given (documents,
tool results). Judge only by the context: a claim is supported when the context states or
directly implies it, contradicted when the context says otherwise, and unsure when the context
does not say — even if the claim is true in the world."""


class FaithfulnessVerdict(BaseModel):
    claim: str
    verdict: Annotated[Literal["yes", "no", "unsure"], FOLDED]
    reason: str


class FaithfulnessVerdicts(BaseModel):
    verdicts: list[FaithfulnessVerdict]


def faithfulness(
    model: ModelOption,
    *,
    context: ContextOption = None,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "faithfulness",
    name: str | None = None,
) -> Scorer:
    """Share of the output's claims supported by the context (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        context: list of context texts, or ``fn(run) -> list[str]``; default: the run's tool
            results.
        scale: the score when every claim is supported (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    context = check_context_option(id, context)

    def extract_prompt(run: ScorerRun) -> str:
        resolve_context(run, context)  # no context: not scorable before any judge call
        return claims_prompt(run)

    def analyze_prompt(run: ScorerRun, results: StepResults) -> str:
        claims = parse(Claims, results.preprocess_step_result).claims
        if not claims:
            raise not_scorable("the output makes no factual claim to check against the context")
        pieces = resolve_context(run, context)
        return (
            "For each claim give a verdict against the context:\n"
            '- "yes": the context states or directly implies it;\n'
            '- "no": the context contradicts it;\n'
            '- "unsure": the context does not say.\n'
            "One verdict per claim, in order, each with a one-sentence reason quoting the context "
            "where it can.\n\n"
            f"Context:\n{numbered('context', pieces)}\n\n"
            f"Claims:\n{numbered('claim', claims)}\n\n"
            'Answer as JSON: {"verdicts": [{"claim": ..., "verdict": "yes"|"no"|"unsure", '
            '"reason": ...}]}.'
        )

    def score(results: StepResults) -> float:
        verdicts = parse(FaithfulnessVerdicts, results.analyze_step_result).verdicts
        if not verdicts:
            return 0.0
        return rounded(sum(v.verdict == "yes" for v in verdicts) / len(verdicts), scale)

    def reason_prompt(run: ScorerRun, results: StepResults, score: float) -> str:
        verdicts = parse(FaithfulnessVerdicts, results.analyze_step_result).verdicts
        return (
            f"The faithfulness score is {score} on a scale of 0 to {scale:g}: the share of the "
            "answer's claims the context supports. Explain it in two or three sentences, naming "
            "the unsupported or contradicted claims if any.\n\n"
            f"Verdicts:\n{fenced('verdicts', as_json([v.model_dump() for v in verdicts]))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Faithfulness",
            description="Share of the answer's claims supported by the context or tool results (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .preprocess(PromptStep("Extract the output's claims", extract_prompt, output_schema=Claims))
        .analyze(PromptStep("Check each claim against the context", analyze_prompt, output_schema=FaithfulnessVerdicts))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
