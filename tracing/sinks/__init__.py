"""Where scores go: one ``ScoreSink`` per backend, each writing a score into that backend's own
model with an id derived from the score id (a re-send updates, never adds).

The worker delivers stored score records to every configured sink at least once (the store is
the outbox; see ``worker.store``); a sink answers per record ``Delivered``, ``Retry`` or
``Refused``.

Sinks here: ``OtlpSink`` (span events on a carrier span inside the scored span), ``JsonlSink``,
``ConsoleSink`` and ``MemorySink`` (a test double); the Phoenix, MLflow and Langfuse sinks each
in their own module. ``ScoreWriter`` is the older, synchronous hook that sees records right
after they are stored (tables, summaries, ``--out``; the drainers' wake-up). Two checks of what a
sink is built from serve the command line and the worker's own OTLP metrics as well:
``http_url_problem`` (an HTTP sink's address) and ``otlp_headers_problem`` (the OTLP exporter's
headers).

The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Imported from their modules on first use (see __init__.pyi): a command writing scores to a file
# does not load the HTTP clients and the OTLP exporter of the backends it does not use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
