"""The names ``tracing.sinks`` exports, for type checkers; ``__init__.py`` loads each from the
module named here on first use."""

from ._http import http_url_problem
from ._langfuse import LangfuseSink
from ._local import ConsoleSink, JsonlSink, MemorySink
from ._mlflow import MlflowSink
from ._otlp import (
    CARRIER_SPAN_NAME,
    EVALUATION_EVENT,
    ROLE_SCORE_WRITER,
    OtlpSink,
    carrier_spans,
    evaluation_attributes,
    otlp_headers_problem,
)
from ._phoenix import PhoenixSink
from ._sink import Delivered, Delivery, Refused, Retry, ScoreSink
from ._writer import ScoreWriter

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
    "http_url_problem",
    "otlp_headers_problem",
]
