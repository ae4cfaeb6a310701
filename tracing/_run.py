"""Span records (the one shape of a span between the app, the queue, backfill and the worker)
and the run read from them (``TracedRun``).

The queue contract that carries the records is ``tracing.queue``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent

__all__ = [
    "MAX_TIME_NS",
    "SPAN_ID_PATTERN",
    "RunIdentity",
    "SpanRecord",
    "SpanRecordEvent",
    "TracedRun",
    "otlp_time",
]

_TRACE_ID = r"^[0-9a-f]{32}$"
SPAN_ID_PATTERN = _SPAN_ID = r"^[0-9a-f]{16}$"
# OTLP carries span times as fixed64: a time past it fails the encoding of every span sent
# with it (the OTLP sink's batch, the app's own exporter). The exporter and backfill's decoder
# refuse such a span where they read it; the queue takes it (a message from an app's exporter
# not yet upgraded is scored) and the OTLP sink writes its score at a time it can carry.
MAX_TIME_NS = 2**64 - 1


def otlp_time(ns: int) -> bool:
    """Whether OTLP can carry ``ns`` as a time (``0 <= ns < 2**64``)."""
    return 0 <= ns <= MAX_TIME_NS


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


# Where a record's span ran: an attribute, not a field of the record, so that a worker of the
# release before reads the message (its records refuse unknown fields).
ENVIRONMENT_ATTRIBUTE = "tracescore.environment"


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

    @property
    def environment(self) -> str | None:
        """Where the span ran, found where its resource was known (the exporter, the OTLP
        decoders: ``tracing._formats.environment_of``) and kept as ``ENVIRONMENT_ATTRIBUTE``."""
        value = self.attributes.get(ENVIRONMENT_ATTRIBUTE)
        return value if isinstance(value, str) else None
