"""What travels from capture (exporter, backfill) to the workers: what to score, in batches.

This is the queue's message contract. The producer side (tracing) builds it; the worker
validates it. JSON only.

A ``ScoreRequest`` carries one of two things:

- ``run``: a ``TracedRun`` already read from its trace (backfill; the exporter when a rule has
  a ``filter``, which needs the run in the application's process);
- ``spans`` + ``target_span_id``: the trace's spans in a compact form (``SpanRecord``: only the
  attributes and events the transform reads). The worker reads the run itself with
  ``trace_to_run(spans, target_span_id)``: the exporter's default path, so that reading (JSON
  parsing, validation) costs the worker CPU and never the instrumented application's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent

__all__ = [
    "SCORE_TASK_NAME",
    "RunIdentity",
    "ScoreBatch",
    "ScoreRequest",
    "SpanRecord",
    "SpanRecordEvent",
    "TracedRun",
]

# The Celery task name producers send to; the worker registers its task under this name.
SCORE_TASK_NAME = "tracescore.score_batch"

_TRACE_ID = r"^[0-9a-f]{32}$"
_SPAN_ID = r"^[0-9a-f]{16}$"


class RunIdentity(BaseModel):
    """What is being scored: one agent (or LLM) span of one trace."""

    model_config = ConfigDict(frozen=True)

    trace_id: str = Field(pattern=_TRACE_ID)
    span_id: str = Field(pattern=_SPAN_ID)
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


# Span records are built once per span on the application's hot path, so they are slots
# dataclasses (~0.3 µs to build, no per-instance dict) rather than models (~3 µs even with
# model_construct); pydantic validates and serializes them as fields of ``ScoreRequest`` all
# the same (the worker validates every message).


@dataclass(slots=True)
class SpanRecordEvent:
    """One span event the transform reads (GenAI message events, inference details)."""

    name: str
    time_ns: int | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SpanRecord:
    """One span, compact and JSON-friendly: what ``trace_to_run`` needs of it and no more.

    ``attributes`` holds only the keys the transform reads (``tracing._formats.is_read_attribute``)
    and ``events`` only the events it reads; ids are lowercase hex. ``kind`` and ``status`` are
    the OTel enum names (``INTERNAL``, ``OK``...). Treat it as read-only.
    """

    trace_id: Annotated[str, Field(pattern=_TRACE_ID)]
    span_id: Annotated[str, Field(pattern=_SPAN_ID)]
    name: str
    parent_span_id: Annotated[str | None, Field(pattern=_SPAN_ID)] = None
    kind: str = "INTERNAL"
    start_time_ns: int | None = None
    end_time_ns: int | None = None
    status: str = "UNSET"
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[SpanRecordEvent, ...] = ()
    service_name: str | None = None
    scope_name: str | None = None


class ScoreRequest(BaseModel):
    """Score one run with each of ``scorer_ids`` (ids in the worker's registry).

    The run is given either as ``run`` or as ``spans`` + ``target_span_id`` (the worker reads
    it); exactly one of the two.
    """

    run: TracedRun | None = None
    spans: list[SpanRecord] | None = None
    # The span to score among ``spans`` (16 hex digits); only with ``spans``.
    target_span_id: str | None = Field(default=None, pattern=_SPAN_ID)
    scorer_ids: list[str] = Field(min_length=1)
    source: Literal["live", "backfill"] = "live"
    job_id: str | None = None
    # Wall-clock (epoch seconds) when the run was handed to the queue; for latency figures.
    enqueued_at: float | None = None

    @model_validator(mode="after")
    def _one_run(self) -> ScoreRequest:
        if self.run is not None:
            if self.spans is not None or self.target_span_id is not None:
                raise ValueError("a ScoreRequest carries either run or spans + target_span_id, not both")
            return self
        if self.spans is None:
            raise ValueError("a ScoreRequest needs run, or spans + target_span_id")
        if not self.spans:
            raise ValueError("spans is empty: ship at least the target span")
        if self.target_span_id is None:
            raise ValueError("spans needs target_span_id: the span (16 hex digits) to score")
        trace_ids = {s.trace_id for s in self.spans}
        if len(trace_ids) > 1:
            raise ValueError(f"spans belong to {len(trace_ids)} traces; a request carries one trace")
        if not any(s.span_id == self.target_span_id for s in self.spans):
            raise ValueError(f"target_span_id {self.target_span_id} is not among the {len(self.spans)} spans")
        return self

    @property
    def trace_id(self) -> str:
        """The scored trace's id, whichever form the run has."""
        if self.run is not None:
            return self.run.identity.trace_id
        return self.spans[0].trace_id if self.spans else ""

    @property
    def span_id(self) -> str:
        """The scored span's id, whichever form the run has."""
        if self.run is not None:
            return self.run.identity.span_id
        return self.target_span_id or ""

    @property
    def span_name(self) -> str:
        if self.run is not None:
            return self.run.identity.span_name
        target = next((s for s in self.spans or () if s.span_id == self.target_span_id), None)
        return target.name if target is not None else ""


class ScoreBatch(BaseModel):
    """One queue message: several requests, so the worker can fan out on one event loop."""

    batch_id: str
    requests: list[ScoreRequest] = Field(min_length=1)
