"""How tracescore's processes (the CLI, the workers) write structlog's lines.

structlog's defaults, but for tracebacks: its default formatter, when ``rich`` is installed,
prints every frame's local variables, and in a scoring process those hold prompts, answers,
score reasons and settings (``score_write_failed`` printed about 850 lines of records). Plain
tracebacks name the code, never the data. Not applied in an application that only imports the
exporter: its logging is the application's.
"""

from __future__ import annotations

import structlog

__all__ = ["configure_logs"]


def configure_logs() -> None:
    """structlog's default processors, each traceback printed plain (no local variables). Only
    the processors: the level and the output stay as the caller configures them."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
        ]
    )
