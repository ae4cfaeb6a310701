"""Sinks on this machine: a JSON Lines file, the console, and memory (a test double).

Each is also a ``ScoreWriter`` (``write``/``flush``/``close``), so the commands can use the same
classes for their own outputs (``--out``, a table) that see records right after they are stored.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from tracing._score_record import ScoreRecord
from tracing._text import printable
from tracing.sinks._sink import Delivered, Delivery, Retry

__all__ = ["ConsoleSink", "JsonlSink", "MemorySink"]


class JsonlSink:
    """Appends one ``ScoreRecord`` JSON object per line to ``path`` (safe across threads; a
    re-sent score is a second line with the same ``score_id``: readers keep the last).

    Unbuffered, one ``write`` per group of lines: a write that fails part way (a full disk)
    leaves half a line whatever happens next, never bytes held back to land later. The next
    write starts a new line when the file does not end with one, so that half line is a line of
    its own and what this or another process appends next stays readable."""

    name = "jsonl"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.endpoint: str | None = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # (read too: the last byte tells whether a write before ours was cut short; a file this
        # process may only write, or a socket, is appended to without that look)
        flags = os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | flags, 0o666)
            self._readable = True
        except OSError:
            self._fd, self._readable = os.open(self.path, os.O_WRONLY | flags, 0o666), False

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        try:
            self.write(records)
        except OSError as exc:  # a full disk comes back; the outbox keeps the records meanwhile
            return [Retry(f"jsonl_write_failed:{exc.errno}")] * len(records)
        return [Delivered()] * len(records)

    def write(self, records: Sequence[ScoreRecord]) -> None:
        data = "".join(r.model_dump_json() + "\n" for r in records).encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"the JSONL sink for {self.path} is closed")
            found = os.fstat(self._fd)
            # (a pipe or a device: no last byte)
            size = found.st_size if self._readable and stat.S_ISREG(found.st_mode) else 0
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            # One write call per group: concurrent processes appending (O_APPEND) do not interleave.
            view = memoryview(data)
            while view:  # (a short write: the rest follows, as a buffered file would send it)
                view = view[os.write(self._fd, view) :]

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class ConsoleSink:
    """One short human-readable line per score, for local runs; each control character of what
    it shows (a reason, an error message) as U+FFFD."""

    name = "console"

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        self.write(records)
        return [Delivered()] * len(records)

    def write(self, records: Sequence[ScoreRecord]) -> None:
        stream = self._stream or sys.stdout
        lines = []
        for r in records:
            if r.error_type:
                value = f"error {r.error_type}: {r.error_message or ''}"
            elif r.score is None:
                value = f"not scorable: {r.not_scorable or ''}"
            else:
                value = f"{r.score:.3f}" + (f" ({r.label})" if r.label else "")
            line = f"score trace={r.trace_id} span={r.span_id} scorer={r.scorer_id} {value}"
            # (a judge's or an agent's text, shown: it must not drive the terminal or add a line)
            lines.append(printable(line) + "\n")
        with self._lock:
            stream.write("".join(lines))
            stream.flush()

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        return None


class MemorySink:
    """Keeps every record it is given in ``records`` (a test double; ``name`` is yours to pick).
    ``outcome`` (settable) is what ``deliver`` answers, ``Delivered`` by default; only delivered
    records are kept."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.records: list[ScoreRecord] = []
        self.writes = 0
        self.outcome: Delivery = Delivered()
        self._lock = threading.Lock()

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        with self._lock:
            outcome = self.outcome
            if isinstance(outcome, Delivered):
                self.records.extend(records)
            self.writes += 1
        return [outcome] * len(records)

    def write(self, records: Sequence[ScoreRecord]) -> None:
        with self._lock:
            self.records.extend(records)
            self.writes += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        return None
