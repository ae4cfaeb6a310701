"""The exporter's counters by reason (``stats()["dropped"|"skipped"|"errors"]``), shared by the
buffer, the completion pass and the sender."""

from __future__ import annotations

import threading

import structlog

__all__ = ["Tally"]

log = structlog.get_logger("tracescore.exporter")


class Tally:
    """Counts by reason, safe from any thread. A drop is logged the first time for its reason,
    then every 1000th: a flood never floods the log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.errors: dict[str, int] = {}

    def drop(self, reason: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            total = self.dropped[reason] = self.dropped.get(reason, 0) + n
        if total == n or total % 1000 < n:
            log.warning("exporter_dropped", reason=reason, total=total)

    def undrop(self, reason: str, n: int) -> None:
        """Take back ``n`` drops counted too early: runs given up at shutdown whose send landed
        after all (a sink whose send outlasted the deadline)."""
        with self._lock:
            left = self.dropped.get(reason, 0) - n
            if left > 0:
                self.dropped[reason] = left
            else:
                self.dropped.pop(reason, None)

    def skip(self, reason: str, n: int = 1) -> None:
        if n > 0:
            with self._lock:
                self.skipped[reason] = self.skipped.get(reason, 0) + n

    def error(self, reason: str, n: int = 1) -> None:
        if n > 0:
            with self._lock:
                self.errors[reason] = self.errors.get(reason, 0) + n

    def snapshot(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.dropped), dict(self.skipped), dict(self.errors)
