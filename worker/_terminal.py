"""Text for a terminal: what a trace, a file name or a backend's answer holds is shown, and
cannot drive the terminal.

A file name is any bytes but ``/`` and NUL (ESC sequences included: colour, cursor moves, an OSC
window title), and one that is not UTF-8 reads as lone surrogates, which a strict stream cannot
encode. Every line the CLI prints with such text in it goes through ``printable`` (tracing's,
which the console sink uses too).
"""

from __future__ import annotations

from tracing import printable

__all__ = ["cell", "printable"]


def cell(text: str, width: int) -> str:
    """``text`` on one line, ``printable``, cut to ``width`` characters with an ellipsis."""
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
