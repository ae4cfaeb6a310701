"""``Judge``: which model answers a prompt step, with what instructions and retries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["Judge", "JsonPromptInjection", "JudgeModel"]

JsonPromptInjection = bool | Literal["auto", "system", "inline"]


@runtime_checkable
class JudgeModel(Protocol):
    """A model the judge can call. Implemented for OpenAI and Anthropic; plug in your own."""

    model_id: str
    provider: str

    async def generate(self, request: Any) -> Any: ...


@dataclass(frozen=True)
class Judge:
    """Judge settings. On a step, every field left ``None`` is inherited from the scorer's judge."""

    model: str | JudgeModel | None = None
    instructions: str | None = None
    json_prompt_injection: JsonPromptInjection | None = None
    input_processors: Sequence[Any] | None = None
    output_processors: Sequence[Any] | None = None
    error_processors: Sequence[Any] | None = None
    max_processor_retries: int | None = None

    def over(self, base: Judge | None) -> Judge:
        """This judge's fields on top of ``base``'s; lists replace, never merge."""
        if base is None:
            return self
        merged = {
            f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(base, f.name)
            for f in fields(self)
        }
        return Judge(**merged)
