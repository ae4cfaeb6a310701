"""Small scorer builders shared by the judge tests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from scorers import Judge, PromptStep, Scorer, create_scorer
from scorers.judge import fence

MODELS = ("openai/gpt-4o-mini", "anthropic/claude-3-5-haiku-latest")


class Verdict(BaseModel):
    verdict: str
    confidence: float = Field(ge=0, le=1)


def score_scorer(judge: Judge, *, step_judge: Judge | None = None) -> Scorer:
    """One prompt step: generate_score asks for {"score": number}."""
    return create_scorer("s", judge=judge).generate_score(
        PromptStep(
            "score",
            lambda run: f"Score this answer from 0 to 1.\n{fence(run.output, 'answer')}",
            judge=step_judge,
        )
    )


def full_scorer(judge: Judge, **step_judges: Judge) -> Scorer:
    """analyze (Verdict) -> generate_score -> generate_reason, all prompt steps."""
    return (
        create_scorer("full", judge=judge)
        .analyze(
            PromptStep(
                "analyze",
                lambda run: f"Analyze:\n{fence(run.output, 'answer')}",
                output_schema=Verdict,
                judge=step_judges.get("analyze"),
            )
        )
        .generate_score(
            PromptStep(
                "score",
                lambda results: f"Verdict {results.analyze_step_result.verdict}: score it",
                judge=step_judges.get("generate_score"),
            )
        )
        .generate_reason(
            PromptStep("reason", lambda score: f"Explain the score {score}.", judge=step_judges.get("generate_reason"))
        )
    )


def run(scorer: Scorer, output: Any = "Paris is the capital of France.") -> Any:
    return scorer.run_sync(input="What is the capital of France?", output=output)
