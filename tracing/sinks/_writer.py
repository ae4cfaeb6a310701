"""``ScoreWriter``: what sees a batch's new records right after they are stored.

Not a delivery path (sinks are: ``ScoreSink``, drained from the outbox at least once); a writer
is for the command's own view (a table, a summary, ``--out``) and for waking the drainers. The
sinks of this package are writers too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tracing._score_record import ScoreRecord

__all__ = ["ScoreWriter"]


@runtime_checkable
class ScoreWriter(Protocol):
    """``write`` gets the records one scored span (or batch) just stored."""

    def write(self, records: Sequence[ScoreRecord]) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> bool: ...

    def close(self) -> None: ...
