"""Capture: the exporter that turns an application's finished agent traces into score requests.

It owns ``ScoringSpanExporter`` (put it behind the SDK's ``BatchSpanProcessor``) and what it is
made of: a pure, clock-driven trace buffer (``_buffer``), a sender thread with a bounded queue,
retries and a shutdown deadline (``_sender``), its counters (``_tally``), and the sinks it hands
batches to (``CelerySink`` publishes to the workers' queue, ``CallbackSink`` calls a function).
It reads spans through ``tracing._sdk``, the one place that knows the OTel SDK's private fields.
"""

from tracing.capture._exporter import ScoringSpanExporter
from tracing.capture._sinks import CallbackSink, CelerySink, EncodedSink, Sink

__all__ = ["CallbackSink", "CelerySink", "EncodedSink", "ScoringSpanExporter", "Sink"]
