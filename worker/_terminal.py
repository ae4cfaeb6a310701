"""Text for a terminal: what a trace, a file name or a backend's answer holds is shown, and
cannot drive the terminal.

A file name is any bytes but ``/`` and NUL (ESC sequences included: colour, cursor moves, an OSC
window title), and one that is not UTF-8 reads as lone surrogates, which a strict stream cannot
encode. Every line the CLI prints with such text in it goes through ``printable`` (tracing's,
which the console sink uses too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO

from tracing import printable

__all__ = [
    "EXIT_OUTPUT_CLOSED",
    "READER_LEFT",
    "cell",
    "output_closed",
    "outputs_open",
    "printable",
    "reader_left",
    "send",
]

# 128 + SIGPIPE: what a process killed by it exits with, as `yes | head` reports it.
EXIT_OUTPUT_CLOSED = 141
# Why a command stopped when its stdout's reader left (the stop's line and the last one).
READER_LEFT = "stdout was closed (its reader ended)"

_closed: set[int] = set()


def cell(text: str, width: int) -> str:
    """``text`` on one line, ``printable``, cut to ``width`` characters with an ellipsis."""
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def reader_left(stream: IO[str]) -> None:
    """``stream``'s reader is gone (``tracescore ... | head``: a write raised BrokenPipeError).
    The descriptor is pointed at /dev/null, so what the command still prints there (its rows,
    its footer, the interpreter's last flush) is dropped instead of raising again; the command
    stops as on Ctrl-C, with everything else it writes (``--out``, the summary on stderr) whole."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a file (a test's StringIO): nothing to point elsewhere
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
    _closed.add(fd)


def send(stream: IO[str], write: Callable[[], object], on_closed: Callable[[], None]) -> bool:
    """``write()`` to ``stream``; False when its reader left (BrokenPipeError): then
    ``reader_left(stream)`` and ``on_closed()`` (the command asks to stop)."""
    try:
        write()
    except BrokenPipeError:
        reader_left(stream)
        on_closed()
        return False
    return True


def output_closed() -> bool:
    """Whether the reader of an output of this command (stdout, or stderr for a table there)
    left (``reader_left``) since ``outputs_open``."""
    return bool(_closed)


def outputs_open() -> None:
    """A command starts: an earlier command's closed output (in a process that runs several,
    ``worker.cli.main`` called again) is not this one's."""
    _closed.clear()
