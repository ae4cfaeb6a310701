"""What every LLM-judge builtin shares: judge set-up, options, context and fenced run content.

Policy for missing material (the same in every LLM builtin):

- The run lacks what it would be judged on (no output text, no user message, no context from
  the options or the run's tool results): ``not_scorable`` — the run cannot be judged, and no
  judge call is paid for.
- The scorer was configured for material the run should carry but does not (``answer_similarity``
  without ``ground_truth``): a ``ValueError`` naming the fix, so the step fails loudly.
- A bad option (``scale`` <= 0, an empty ``context`` list, a model that is not
  ``"provider/model"`` or a ``JudgeModel``): ``ScorerConfigError`` when the scorer is built.

Scores are multiplied by ``scale`` and rounded to two decimals, halves up (as Mastra does).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias, TypeVar

from pydantic import BaseModel, BeforeValidator

from scorers import Judge, ScorerConfigError, ScorerRun, not_scorable
from scorers.builtin._common import check_positive
from scorers.builtin._runs import assistant_text, tool_results, user_text
from scorers.judge import JudgeModel, fence

__all__ = [
    "FOLDED",
    "LLM_VERSION",
    "ContextOption",
    "ModelOption",
    "as_json",
    "check_context_option",
    "check_scale",
    "fenced",
    "make_judge",
    "numbered",
    "parse",
    "require_output",
    "require_user",
    "resolve_context",
    "rounded",
]

# On a judge's enum field (Annotated[Literal[...], FOLDED]): "Yes" and " yes " are "yes", as
# Mastra's scorers compare verdicts (trimmed, lower-cased); the schema sent still lists the values.
FOLDED = BeforeValidator(lambda value: value.strip().lower() if isinstance(value, str) else value)

# Every LLM builtin's version. "2" (2026-12-05): scores round halves up, as Mastra's do (0.125 is
# 0.13); "1" rounded them to even (0.12).
LLM_VERSION = "2"

ModelOption: TypeAlias = str | JudgeModel
ContextOption: TypeAlias = Sequence[str] | Callable[[ScorerRun], Sequence[str]] | None
M = TypeVar("M", bound=BaseModel)


def make_judge(scorer_id: str, model: ModelOption, instructions: str, judge: Judge | None) -> Judge:
    """The scorer's judge: ``model`` + our instructions, with ``judge``'s set fields on top."""
    if isinstance(model, str):
        provider, _, name = model.partition("/")
        if not provider or not name:
            raise ScorerConfigError(
                f"scorer {scorer_id!r}: model must be 'provider/model' "
                f"(e.g. 'openai/gpt-4o-mini') or a JudgeModel, got {model!r}"
            )
    elif not isinstance(model, JudgeModel):
        raise ScorerConfigError(
            f"scorer {scorer_id!r}: model must be 'provider/model' or a JudgeModel, got {type(model).__name__}"
        )
    if judge is not None and not isinstance(judge, Judge):
        raise ScorerConfigError(f"scorer {scorer_id!r}: judge must be a Judge, got {type(judge).__name__}")
    base = Judge(model=model, instructions=instructions)
    return judge.over(base) if judge is not None else base


def check_scale(scorer_id: str, scale: float) -> float:
    return check_positive(scorer_id, "scale", scale)


def check_context_option(scorer_id: str, context: ContextOption) -> ContextOption:
    if context is None or callable(context):
        return context
    if isinstance(context, str) or not all(isinstance(c, str) for c in context):
        raise ScorerConfigError(
            f"scorer {scorer_id!r}: context must be a list of strings, a function of the run, or None"
        )
    # Blank pieces are dropped, as resolve_context drops them from a context function.
    pieces = [c for c in context if c.strip()]
    if not pieces:
        raise ScorerConfigError(
            f"scorer {scorer_id!r}: context is an empty list (or only blank strings); give context "
            "pieces, or leave it None to use the run's tool results"
        )
    return pieces


def resolve_context(run: ScorerRun, context: ContextOption) -> list[str]:
    """Context pieces from the option (a list or a function of the run), else tool results.

    Raises ``not_scorable`` when there is none: without context the run cannot be judged.
    """
    if callable(context):
        pieces = [str(c) for c in context(run) if str(c).strip()]
        source = "the context function"
    elif context is not None:
        pieces = list(context)
        source = "the context option"
    else:
        pieces = tool_results(run)
        source = "the run's tool results"
    if not pieces:
        raise not_scorable(f"no context to judge against ({source} gave none)")
    return pieces


def require_output(run: ScorerRun) -> str:
    text = assistant_text(run)
    if not text.strip():
        raise not_scorable("the output has no text to judge")
    return text


def require_user(run: ScorerRun) -> str:
    text = user_text(run)
    if not text.strip():
        raise not_scorable("the run has no user message to judge against")
    return text


def fenced(label: str, text: str) -> str:
    """Traced content, fenced by the judge layer so the judge reads it as data, not orders."""
    return fence(text, label)


def numbered(label: str, items: Iterable[str]) -> str:
    """A numbered list of traced items, each fenced."""
    return "\n".join(fenced(f"{label} {i}", item) for i, item in enumerate(items, start=1))


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


def parse(model: type[M], value: Any) -> M:
    """A step result as ``model`` (judge answers and resumed checkpoints arrive as dicts)."""
    return value if isinstance(value, model) else model.model_validate(value)


def rounded(value: float, scale: float) -> float:
    """Clamp to [0, 1], multiply by ``scale`` and round to two decimals, halves up, as Mastra's
    ``roundToTwoDecimals`` (``Math.round((x + Number.EPSILON) * 100) / 100``)."""
    scaled = min(1.0, max(0.0, value)) * scale
    hundredths = (scaled + sys.float_info.epsilon) * 100
    if not math.isfinite(hundredths):  # a scale past 1e306: nothing left to round
        return min(scale, scaled)
    whole = math.floor(hundredths)  # floor(x + 0.5) would round 0.49999999999999994 up
    return min(scale, (whole + (hundredths - whole >= 0.5)) / 100)
