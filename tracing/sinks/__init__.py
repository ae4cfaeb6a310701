"""Where scores go: one ``ScoreSink`` per backend, each writing a score into that backend's own
model with an id derived from the score id (a re-send updates, never adds).

The worker delivers stored score records to every configured sink at least once (the store is
the outbox; see ``worker.store``); a sink answers per record ``Delivered``, ``Retry`` or
``Refused``.

Sinks here: ``OtlpSink`` (span events on a carrier span inside the scored span), ``JsonlSink``,
``ConsoleSink`` and ``MemorySink`` (a test double); the Phoenix, MLflow and Langfuse sinks each
in their own module. ``ScoreWriter`` is the older, synchronous hook that sees records right
after they are stored (tables, summaries, ``--out``; the drainers' wake-up).
"""

from tracing.sinks._langfuse import LangfuseSink
from tracing.sinks._local import ConsoleSink, JsonlSink, MemorySink
from tracing.sinks._mlflow import MlflowSink
from tracing.sinks._otlp import (
    CARRIER_SPAN_NAME,
    EVALUATION_EVENT,
    ROLE_SCORE_WRITER,
    OtlpSink,
    carrier_spans,
    evaluation_attributes,
)
from tracing.sinks._phoenix import PhoenixSink
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, ScoreSink
from tracing.sinks._writer import ScoreWriter

__all__ = [
    "CARRIER_SPAN_NAME",
    "EVALUATION_EVENT",
    "ROLE_SCORE_WRITER",
    "ConsoleSink",
    "Delivered",
    "Delivery",
    "JsonlSink",
    "LangfuseSink",
    "MemorySink",
    "MlflowSink",
    "OtlpSink",
    "PhoenixSink",
    "Refused",
    "Retry",
    "ScoreSink",
    "ScoreWriter",
    "carrier_spans",
    "evaluation_attributes",
]
