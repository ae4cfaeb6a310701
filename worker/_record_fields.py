"""What a scorer's result gives the rows that show it, besides its score: the fields a score
record (``worker._scoring``) and ``tracescore score``'s ``Outcome`` (``worker._summary``) both
take from it, worded and priced here once so that the two always agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from scorers import ScoreResult
from scorers.judge import ModelPrice, price_executions

__all__ = ["JudgeSpend", "judge_spend", "not_scorable_text"]


class JudgeSpend(TypedDict):
    """A result's judge calls, under ``ScoreRecord``'s field names."""

    judge_models: list[str]
    judge_calls: int
    cost_usd: float | None  # None: a model without a price


def judge_spend(result: ScoreResult | None, prices: Mapping[str, ModelPrice]) -> JudgeSpend:
    """The judge models ``result``'s steps asked, every call they made (retries too: a failed
    run's partial result still shows what it spent) and what the calls cost by ``prices``."""
    executions = list(result.judge.values()) if result is not None else []
    return {
        "judge_models": sorted({e.model for e in executions}),
        "judge_calls": sum(e.attempt_count for e in executions),
        "cost_usd": price_executions(executions, prices),
    }


def not_scorable_text(result: ScoreResult | None) -> str | None:
    """``result``'s not-scorable signal as "step: reason" (None: the run was not declared not scorable)."""
    ns = result.not_scorable if result is not None else None
    return f"{ns.get('step', '?')}: {ns.get('reason', '')}" if ns else None
