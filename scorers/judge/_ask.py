"""One judge question: prompt in, validated answer out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scorers._errors import ScorerConfigError
from scorers._result import JudgeExecution, StepName
from scorers.judge._config import Judge

__all__ = ["JudgeAnswer", "ask_judge"]


@dataclass(frozen=True, slots=True)
class JudgeAnswer:
    value: Any
    execution: JudgeExecution


async def ask_judge(
    *,
    scorer_id: str,
    step: StepName,
    judge: Judge | None,
    prompt: str,
    output_schema: type[Any] | Mapping[str, Any] | None,
) -> JudgeAnswer:
    """Ask the judge; ``output_schema=None`` asks for free text."""
    raise ScorerConfigError(f"scorer {scorer_id!r} step {step}: LLM judges are not available yet")
