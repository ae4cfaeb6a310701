"""Capture: the exporter that turns an application's finished agent traces into score requests.

It owns ``ScoringSpanExporter`` (put it behind the SDK's ``BatchSpanProcessor``) and what it is
made of: a pure, clock-driven trace buffer (``_buffer``), a sender thread with a bounded queue,
retries and a shutdown deadline (``_sender``), and the one place that reads the OTel SDK's
``ReadableSpan`` fields (``_sdk``: private fields only on a tested SDK version, else the public
API), and the sinks it hands batches to (``CelerySink`` publishes to the workers' queue,
``CallbackSink`` calls a function).
"""

from tracing.capture._exporter import ScoringSpanExporter
from tracing.capture._sinks import CallbackSink, CelerySink, EncodedSink, Sink

__all__ = ["CallbackSink", "CelerySink", "EncodedSink", "ScoringSpanExporter", "Sink"]
