"""From what the user typed (or what a job stored) to a source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracing.sources._base import SourceError, TraceSource
from tracing.sources._files import FileSource
from tracing.sources._tempo import TempoSource

__all__ = ["open_source", "source_from_description"]

_TEMPO_SCHEMES = ("tempo+http://", "tempo+https://")


def open_source(
    specs: Sequence[str], *, since_ns: int | None = None, until_ns: int | None = None, query: str | None = None
) -> TraceSource:
    """Paths (files, directories) or one ``tempo+http(s)://host:port`` URL.

    The time range goes to a live backend's search (files are filtered by the driver).
    """
    if not specs:
        raise SourceError("give a source: trace files, a directory, or tempo+http://HOST:3200")
    tempo = [s for s in specs if s.startswith(_TEMPO_SCHEMES)]
    if tempo:
        if len(specs) != 1:
            raise SourceError("a tempo+http:// source cannot be combined with other sources")
        return TempoSource(tempo[0].removeprefix("tempo+"), since_ns=since_ns, until_ns=until_ns, query=query)
    return FileSource(list(specs))


def source_from_description(description: dict[str, Any]) -> TraceSource:
    """The source a job recorded with ``describe()`` (for ``--resume``)."""
    kind = description.get("kind")
    if kind == "files":
        return FileSource(list(description["files"]))
    if kind == "tempo":
        return TempoSource.from_description(description)
    raise SourceError(f"unknown source kind {kind!r} in the job state; expected 'files' or 'tempo'")
