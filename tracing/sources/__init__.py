"""Stored traces for backfill: OTLP files (JSON Lines, JSON, protobuf, gzip, directories) and
Grafana Tempo over HTTP, plus the bounded-memory assembler that groups spans into traces.
Spans are decoded straight into ``SpanRecord``s (what the exporter ships), so backfill and live
traffic reach the worker in the same shape.

    source = open_source(["examples/traces"])          # or "tempo+http://tempo:3200"
    assembler = TraceAssembler()
    for item in source.read():
        if isinstance(item, SpanBatch):
            for trace in assembler.add(item.spans, item.position): ...
"""

from tracing.sources._assemble import MAX_SPANS_PER_TRACE, AssembledTrace, AssemblerStats, Released, TraceAssembler
from tracing.sources._base import (
    Malformed,
    Position,
    SourceError,
    SourceItem,
    SpanBatch,
    TraceSource,
    UnitEnd,
)
from tracing.sources._files import FileSource
from tracing.sources._open import open_source, source_from_description
from tracing.sources._tempo import TempoSource

__all__ = [
    "MAX_SPANS_PER_TRACE",
    "AssembledTrace",
    "AssemblerStats",
    "FileSource",
    "Malformed",
    "Position",
    "Released",
    "SourceError",
    "SourceItem",
    "SpanBatch",
    "TempoSource",
    "TraceAssembler",
    "TraceSource",
    "UnitEnd",
    "open_source",
    "source_from_description",
]
