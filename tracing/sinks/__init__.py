"""Where scores go: one ``ScoreSink`` per backend, each writing a score into that backend's own
model with an id derived from the score id (a re-send updates, never adds).

The worker delivers stored score records to every configured sink at least once (the store is
the outbox; see ``worker.store``); a sink answers per record ``Delivered``, ``Retry`` or
``Refused``.
"""

from tracing.sinks._langfuse import LangfuseSink
from tracing.sinks._mlflow import MlflowSink
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, ScoreSink

__all__ = ["Delivered", "Delivery", "LangfuseSink", "MlflowSink", "Refused", "Retry", "ScoreSink"]
