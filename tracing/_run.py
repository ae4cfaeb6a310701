"""What travels from capture (exporter, backfill) to the workers: runs to score, in batches.

This is the queue's message contract. The producer side (tracing) builds it; the worker
validates it. JSON only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent

__all__ = ["SCORE_TASK_NAME", "RunIdentity", "ScoreBatch", "ScoreRequest", "TracedRun"]

# The Celery task name producers send to; the worker registers its task under this name.
SCORE_TASK_NAME = "tracescore.score_batch"


class RunIdentity(BaseModel):
    """What is being scored: one agent (or LLM) span of one trace."""

    model_config = ConfigDict(frozen=True)

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    span_name: str = ""
    agent_name: str | None = None
    conversation_id: str | None = None
    model: str | None = None
    service_name: str | None = None
    start_time_ns: int | None = None
    end_time_ns: int | None = None


class TracedRun(BaseModel):
    """An agent-typed scorer run read from a trace (``trace_to_run``'s result)."""

    identity: RunIdentity
    input: ScorerRunInputForAgent
    output: ScorerRunOutputForAgent
    ground_truth: Any = None
    request_context: dict[str, Any] | None = None


class ScoreRequest(BaseModel):
    """Score ``run`` with each of ``scorer_ids`` (ids in the worker's registry)."""

    run: TracedRun
    scorer_ids: list[str] = Field(min_length=1)
    source: Literal["live", "backfill"] = "live"
    job_id: str | None = None
    # Wall-clock (epoch seconds) when the run was handed to the queue; for latency figures.
    enqueued_at: float | None = None


class ScoreBatch(BaseModel):
    """One queue message: several requests, so the worker can fan out on one event loop."""

    batch_id: str
    requests: list[ScoreRequest] = Field(min_length=1)
