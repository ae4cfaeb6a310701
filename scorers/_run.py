"""What a step sees: the run being scored and the results of earlier steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = ["ScorerRun", "StepResults"]


@dataclass(frozen=True, slots=True)
class ScorerRun:
    """One input/output pair to score. ``prepare_run`` returns a new one (see ``replace``)."""

    input: Any
    output: Any
    run_id: str
    ground_truth: Any = None
    request_context: Any = None

    def replace(self, **changes: Any) -> ScorerRun:
        return replace(self, **changes)

    @property
    def runtime_context(self) -> Any:
        """Older Mastra name of ``request_context``."""
        return self.request_context


@dataclass(frozen=True, slots=True)
class StepResults:
    preprocess_step_result: Any = None
    analyze_step_result: Any = None
