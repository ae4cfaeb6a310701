"""Progress of a long command (backfill, score, compare): a one-line bar with rate and ETA on a
terminal, plain lines otherwise."""

from __future__ import annotations

import shutil
import sys
import time
from typing import IO

from worker._terminal import printable

__all__ = ["ProgressReporter", "format_duration"]


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressReporter:
    """``update`` as often as you like: a TTY redraws at most 10×/s, plain output every ``interval_s``."""

    def __init__(self, stream: IO[str] | None = None, *, tty: bool | None = None, interval_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s if not self.tty else 0.1
        # A terminal shows the bar at once; plain output starts after one interval (no "0 done" line).
        self._last = float("-inf") if self.tty else time.monotonic()
        self._drawn = False
        self._phase_started: dict[str, float] = {}

    def due(self) -> bool:
        """Whether an update now would be shown (callers skip computing it otherwise)."""
        return time.monotonic() - self._last >= self.interval_s

    def start(self, phase: str, at: float | None = None) -> None:
        """Start the clock of ``phase`` (its rate and ETA count from here); else its first update.
        A terminal draws the phase's first update at once (a short phase was never shown)."""
        self._phase_started[phase] = time.monotonic() if at is None else at
        if self.tty:
            self._last = float("-inf")

    def message(self, text: str) -> None:
        """A line of its own (a warning, a notice), without breaking the bar; ``printable``, for
        it may name a file or quote a trace."""
        self.clear()
        self.stream.write(printable(text) + "\n")
        self.stream.flush()

    def update(
        self, phase: str, done: int, unit: str, fraction: float | None, *, extra: str = "", force: bool = False
    ) -> None:
        now = time.monotonic()
        started = self._phase_started.setdefault(phase, now)
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        elapsed = max(now - started, 1e-6)
        rate = done / elapsed
        eta = ""
        if fraction is not None and 0 < fraction < 1 and elapsed > 0.5:
            eta = f"  ETA {format_duration(elapsed * (1 - fraction) / fraction)}"
        percent = f"{fraction * 100:5.1f}%" if fraction is not None else ""
        text = f"{phase}: {done:,} {unit}  {rate:,.0f}/s{eta}{'  ' + extra if extra else ''}"
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns
            bar = ""
            if fraction is not None:
                filled = int(max(0.0, min(1.0, fraction)) * 20)
                bar = f"[{'#' * filled}{'.' * (20 - filled)}] {percent} "
            line = (bar + text)[: width - 1]
            self.stream.write("\r\x1b[2K" + line)
            self._drawn = True
        else:
            self.stream.write(f"{text}{'  (' + percent.strip() + ')' if percent else ''}\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
            self._drawn = False

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()
