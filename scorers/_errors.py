"""The scorer exception tree, grouped by who must handle the error.

    ScorerError                  anything tracescore's scoring raises
    ├── ScorerConfigError        the scorer is built wrong (the author fixes the code)
    ├── RunInputError            the run's input/output does not fit the scorer's type
    └── ScorerRunError           a step failed while running; carries the partial result

``ScorerRunError.cause`` is the original exception (a judge error keeps its provider status
and request id there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from scorers._result import ScoreResult, StepName

__all__ = ["RunInputError", "ScorerConfigError", "ScorerError", "ScorerRunError"]


class ScorerError(Exception):
    """Base of every error raised by the scoring pipeline."""


class ScorerConfigError(ScorerError, ValueError):
    """The scorer definition is invalid (raised when it is built or first run)."""


class RunInputError(ScorerError, ValueError):
    """The run does not fit the scorer's declared input/output type."""


class ScorerRunError(ScorerError):
    """A step failed. ``partial`` holds what the completed steps produced."""

    def __init__(
        self,
        message: str,
        *,
        scorer_id: str,
        failed_step: StepName | Literal["prepare_run"],
        completed_steps: tuple[StepName, ...],
        partial: ScoreResult,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.scorer_id = scorer_id
        self.failed_step = failed_step
        self.completed_steps = completed_steps
        self.partial = partial
        self.cause = cause

    @property
    def error_type(self) -> str:
        """The class name of the underlying error, as used for OTel ``error.type``."""
        return type(self.cause).__name__ if self.cause is not None else type(self).__name__
