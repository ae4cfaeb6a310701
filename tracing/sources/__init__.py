"""Stored traces for backfill: OTLP files (JSON Lines, JSON, protobuf, gzip or zstd, directories)
and Grafana Tempo over HTTP, plus the bounded-memory assembler that groups spans into traces.
``open_compressed`` opens any input file as they are opened (the CLI's runs and records too).
Spans are decoded straight into ``SpanRecord``s (what the exporter ships), so backfill and live
traffic reach the worker in the same shape.

    source = open_source(["examples/traces"])          # or "tempo+http://tempo:3200"
    assembler = TraceAssembler()
    for item in source.read():
        if isinstance(item, SpanBatch):
            for trace in assembler.add(item.spans, item.position): ...

The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Imported from their modules on first use (see __init__.pyi): a reader of a job's state needs
# ``Position``, not the Tempo client (httpx) and the protobuf decoder.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
