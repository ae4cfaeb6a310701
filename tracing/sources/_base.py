"""What a trace source yields, and the contract every source follows.

A source reads stored spans in a fixed order and yields :class:`SpanBatch` items (the spans of
one line / one fetched trace), :class:`Malformed` items (input it could not decode, with where),
and :class:`UnitEnd` when a file (or a time window) is finished. Every item carries a
:class:`Position`, so a backfill can record how far it got and a source can start again there.
A long read of one record that yields nothing (a file's over-long line being skipped) yields an
empty ``SpanBatch`` at that record's position now and then, so that a caller can stop meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from tracing._errors import SourceError
from tracing._run import SpanRecord

__all__ = ["Malformed", "Position", "SourceError", "SourceItem", "SpanBatch", "TraceSource", "UnitEnd"]


class Position(NamedTuple):
    """Where in a source: unit (file index or time-window index), line within it, byte offset.

    Ordered, so the earliest position still needed is a plain ``min``.
    """

    unit: int
    line: int = 0
    offset: int = 0


@dataclass(slots=True)
class SpanBatch:
    """The spans of one input record (a line, a fetched trace) as span records, and where it was."""

    spans: list[SpanRecord]
    position: Position
    where: str


@dataclass(slots=True)
class Malformed:
    """An input record that could not be decoded: skipped, and reported as ``where: reason``."""

    position: Position
    where: str
    reason: str


@dataclass(slots=True)
class UnitEnd:
    """Everything of one unit (file, time window) has been yielded; ``next`` starts the next one."""

    unit: int
    next: Position = field(default_factory=lambda: Position(0))


SourceItem = SpanBatch | Malformed | UnitEnd


@runtime_checkable
class TraceSource(Protocol):
    """Stored traces to backfill. ``describe()`` is JSON that ``open_source`` turns back into
    an equal source (job state keeps it, so ``--resume`` reads exactly the same input)."""

    def describe(self) -> dict[str, Any]: ...

    def label(self) -> str:
        """A short human description, e.g. ``3 files under examples/traces``."""
        ...

    def read(self, start: Position | None = None) -> Iterator[SourceItem]:
        """Items in order from ``start`` (the beginning when None)."""
        ...
