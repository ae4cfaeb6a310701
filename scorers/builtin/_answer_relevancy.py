"""``answer_relevancy`` (LLM judge): how much of the answer addresses what the user asked.

Steps (Mastra's answer-relevancy semantics, our prompts):
1. preprocess (judge): split the output into self-contained statements.
2. analyze (judge): a verdict per statement against the user's message — ``yes`` (addresses
   the request), ``unsure`` (related but partial or indirect), ``no`` (off-topic).
3. generate_score (code): ``(yes + uncertainty_weight · unsure) / verdicts · scale``, one verdict
   asked per statement (as in Mastra, the share is of the verdicts the judge returned); an
   output in which the judge finds no statements scores 0.
4. generate_reason (judge): a short explanation of the score.

Not scorable: no user message, or no output text.
"""

from __future__ import annotations

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
    numbered,
    parse,
    require_output,
    require_user,
    rounded,
)

__all__ = ["RelevancyVerdicts", "Statements", "answer_relevancy"]

INSTRUCTIONS = """You judge whether an AI assistant's answer is relevant to what the user asked.
Relevance is about addressing the request, not about factual correctness. A statement that
answers the request is relevant; one that discusses the right subject but only partly or
indirectly answers it is uncertain; one about something else, or an error message or refusal
with no content, is not relevant."""


class Statements(BaseModel):
    statements: list[str] = Field(description="Self-contained statements made by the output, in order")


class RelevancyVerdict(BaseModel):
    statement: str
    verdict: Annotated[Literal["yes", "unsure", "no"], FOLDED]
    reason: str


class RelevancyVerdicts(BaseModel):
    verdicts: list[RelevancyVerdict]


def answer_relevancy(
    model: ModelOption,
    *,
    uncertainty_weight: float = 0.3,
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "answer-relevancy",
    name: str | None = None,
) -> Scorer:
    """Relevance of the answer to the user's message (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` (e.g. ``"openai/gpt-4o-mini"``) or a ``JudgeModel``.
        uncertainty_weight: credit for an ``unsure`` verdict, 0–1 (default 0.3).
        scale: the score for a fully relevant answer (default 1).
        judge: a ``Judge`` whose set fields (processors, retries, instructions...) apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    if isinstance(uncertainty_weight, bool) or not 0 <= uncertainty_weight <= 1:
        raise ScorerConfigError(f"scorer {id!r}: uncertainty_weight must be within 0–1, got {uncertainty_weight!r}")

    def extract_prompt(run: ScorerRun) -> str:
        require_user(run)
        output = require_output(run)
        return (
            "Split the assistant output below into its statements. A statement is one claim, "
            "instruction or piece of information that can be judged on its own; resolve pronouns "
            "so each statement stands alone; keep the output's order; do not add anything.\n\n"
            f"{fenced('assistant output', output)}\n\n"
            'Answer as JSON: {"statements": [...]}.'
        )

    def analyze_prompt(run: ScorerRun, results: StepResults) -> str:
        statements = parse(Statements, results.preprocess_step_result).statements
        return (
            "For each statement decide whether it addresses the user's message:\n"
            '- "yes": it answers or directly serves the request;\n'
            '- "unsure": related to the request but partial, indirect or only background;\n'
            '- "no": unrelated to the request, or an empty/error reply.\n'
            "Give one verdict per statement, in the same order, each with a one-sentence reason.\n\n"
            f"{fenced('user message', require_user(run))}\n\n"
            f"Statements:\n{numbered('statement', statements)}\n\n"
            'Answer as JSON: {"verdicts": [{"statement": ..., "verdict": "yes"|"unsure"|"no", '
            '"reason": ...}]}.'
        )

    def score(results: StepResults) -> float:
        verdicts = parse(RelevancyVerdicts, results.analyze_step_result).verdicts
        if not verdicts:
            return 0.0
        credit = sum(
            1.0 if v.verdict == "yes" else uncertainty_weight if v.verdict == "unsure" else 0.0 for v in verdicts
        )
        return rounded(credit / len(verdicts), scale)

    def reason_prompt(run: ScorerRun, results: StepResults, score: float) -> str:
        verdicts = parse(RelevancyVerdicts, results.analyze_step_result).verdicts
        return (
            f"The answer-relevancy score is {score} on a scale of 0 to {scale:g} "
            f"(unsure statements count {uncertainty_weight:g}). Explain the score in two or three "
            "sentences, naming what made the answer relevant or not. Do not restate the scale.\n\n"
            f"{fenced('user message', require_user(run))}\n\n"
            f"Verdicts:\n{fenced('verdicts', as_json([v.model_dump() for v in verdicts]))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Answer relevancy",
            description="How relevant the answer's statements are to the user's message (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .preprocess(PromptStep("Extract the output's statements", extract_prompt, output_schema=Statements))
        .analyze(PromptStep("Judge each statement's relevance", analyze_prompt, output_schema=RelevancyVerdicts))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
