"""OpenTelemetry side of tracescore: the exporter (``capture/``), span records and the one
request shape on the queue (``queue/``), the planner of runs and the loop guard (``read/``), the
span → run readers, OTLP decoding and the backfill's sources (``otlp``, ``sources/``), and the
score write-back (``sinks/``).

The names (``__init__.pyi``) load on first use.
"""

from typing import Any

import lazy_loader

# Each name is imported from its module on first use (the list, which type checkers read too, is
# __init__.pyi): a process that needs one name (the CLI's probes, which Kubernetes runs every few
# seconds) does not pay for the exporter, the sinks and the OTLP decoders.
_load, _, __all__ = lazy_loader.attach_stub(__name__, __file__)

# The score writers' names from before the sinks (each of these sinks is also a ScoreWriter).
_ALIASES = {"ConsoleScoreWriter": "ConsoleSink", "JsonlScoreWriter": "JsonlSink", "MemoryScoreWriter": "MemorySink"}
__all__ = sorted([*__all__, *_ALIASES])


def __getattr__(name: str) -> Any:
    return _load(_ALIASES.get(name, name))


def __dir__() -> list[str]:
    return list(__all__)
