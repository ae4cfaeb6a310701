"""From what the user typed (or what a job stored) to a source."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from tracing.sources._base import SourceError, TraceSource
from tracing.sources._files import FileSource
from tracing.sources._tempo import TempoSource

__all__ = ["TEMPO_HEADERS_ENV", "open_source", "source_from_description", "tempo_headers"]

_TEMPO_SCHEMES = ("tempo+http://", "tempo+https://")
TEMPO_HEADERS_ENV = "TRACESCORE_TEMPO_HEADERS"


def tempo_headers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Extra HTTP headers for Tempo (auth, ``X-Scope-OrgID``) from ``TRACESCORE_TEMPO_HEADERS``.

    Same format as ``OTEL_EXPORTER_OTLP_HEADERS``: ``key1=value1,key2=value2``, values
    URL-encoded. Read from the environment on every start and resume, never stored in job state.
    """
    raw = (os.environ if environ is None else environ).get(TEMPO_HEADERS_ENV, "")
    headers: dict[str, str] = {}
    for number, item in enumerate(filter(None, (part.strip() for part in raw.split(","))), start=1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # By position only: the item is likely a credential ("Authorization: Bearer ...").
            raise SourceError(
                f"{TEMPO_HEADERS_ENV}: item {number} (of {len(item)} chars) is not key=value"
                " (e.g. X-Scope-OrgID=tenant-1,Authorization=Bearer%20TOKEN)"
            )
        headers[key.strip()] = urllib.parse.unquote(value.strip())
    return headers


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
        return TempoSource(
            tempo[0].removeprefix("tempo+"), since_ns=since_ns, until_ns=until_ns, query=query, headers=tempo_headers()
        )
    return FileSource(list(specs))


def source_from_description(description: dict[str, Any]) -> TraceSource:
    """The source a job recorded with ``describe()`` (for ``--resume``)."""
    kind = description.get("kind")
    if kind == "files":
        # As saved, repeats included (a job of an earlier release): the checkpoint indexes it.
        return FileSource(list(description["files"]), each_once=False)
    if kind == "tempo":
        return TempoSource.from_description(description, headers=tempo_headers())
    raise SourceError(f"unknown source kind {kind!r} in the job state; expected 'files' or 'tempo'")
