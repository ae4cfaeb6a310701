"""Hooks the judge calls around every provider request, so the host (the worker) can
rate-limit judge calls across machines, mark their spans, and keep their cost within budgets
and their number per run within a cap (``JudgeGuard``), without scorers/ knowing how.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar, Protocol

from scorers._errors import ErrorCategory
from scorers._result import JudgeUsage
from scorers.judge._errors import JudgeError, JudgeProviderError

__all__ = ["JudgeCallRefused", "JudgeGuard", "JudgeHooks", "JudgeLimiter", "get_judge_hooks", "set_judge_hooks"]


class JudgeCallRefused(JudgeError):
    """The host refused a judge call before it was made: ``error_type`` is what the run's record
    says (``budget_exhausted``; for a run out of judge calls, its last judge error's type, or
    ``judge_attempts_exhausted``). Final for this delivery; the record is ``retryable`` so a
    later delivery (after the budget resets, or an operator's retry) may replace it: hence
    ``retryable`` (later, not now: the worker records it at once instead of redelivering)."""

    _category: ClassVar[ErrorCategory] = "retryable"

    def __init__(self, message: str, *, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class JudgeGuard(Protocol):
    """Spending control around each provider request (both may raise the host's own
    "store unavailable" error, which fails the run as transient)."""

    async def before_call(self, model_id: str, scorer_id: str) -> None:
        """Raise ``JudgeCallRefused`` to stop the call (a budget spent, the run's cap reached)."""
        ...

    async def after_call(self, model_id: str, scorer_id: str, usage: JudgeUsage) -> None:
        """What a successful request used (its cost is the host's to count)."""
        ...

    async def call_failed(self, model_id: str, scorer_id: str, error: JudgeProviderError) -> None:
        """A request failed (kept so a later refusal can name the run's real failure)."""
        ...


class JudgeLimiter(Protocol):
    """Admission control for judge calls, keyed by model id (``"openai/gpt-4o-mini"``)."""

    def slot(self, model_id: str, estimated_tokens: int) -> AbstractAsyncContextManager[None]:
        """Held for the duration of one provider request; waits while the model is paused,
        over its concurrency limit, or out of request/token budget."""
        ...

    async def record_usage(self, model_id: str, tokens: int) -> None:
        """Tokens a finished request really used (corrects the estimate)."""
        ...

    async def pause(self, model_id: str, seconds: float) -> None:
        """The provider said 429 + Retry-After: stop every caller of this model for ``seconds``."""
        ...


@dataclass(frozen=True)
class JudgeHooks:
    limiter: JudgeLimiter | None = None
    # Wraps each provider request (sync context manager, entered in the calling task), e.g. an
    # OpenTelemetry span marked as a judge call so the exporter never scores judge traffic.
    call_context: Callable[[str], AbstractContextManager[None]] | None = None
    # How the judge waits before a retry (seconds); None means asyncio.sleep. Tests inject a
    # recorder so retry delays are asserted without waiting.
    sleep: Callable[[float], Awaitable[None]] | None = None
    # Budgets and the per-run call cap (``JudgeGuard``); None: every call goes ahead.
    guard: JudgeGuard | None = None

    async def wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        await (self.sleep or asyncio.sleep)(seconds)


_hooks = JudgeHooks()


def set_judge_hooks(hooks: JudgeHooks) -> None:
    """Install process-wide judge hooks (the worker does this once at start-up)."""
    global _hooks
    _hooks = hooks


def get_judge_hooks() -> JudgeHooks:
    return _hooks
