"""How tracescore's processes (the CLI, the workers) write structlog's lines.

structlog's defaults, but for tracebacks: its default formatter, when ``rich`` is installed,
prints every frame's local variables, and in a scoring process those hold prompts, answers,
score reasons and settings (``score_write_failed`` printed about 850 lines of records). Plain
tracebacks name the code, never the data. Only where nobody configured structlog before: an
application that runs the CLI in its process (``worker.cli.main``) or configures its own
logging keeps it, and one that only imports the exporter is never touched.
"""

from __future__ import annotations

import os
import sys

import structlog

__all__ = ["configure_logs"]


def configure_logs() -> None:
    """structlog's default processors, each traceback printed plain (no local variables), unless
    structlog is configured already. Only the processors: the level and the output stay as they
    are configured later (``tracescore backfill`` quiets them)."""
    if structlog.is_configured():
        return
    # Colours as structlog's default decides them: on a terminal only, NO_COLOR and FORCE_COLOR
    # obeyed (a worker's log file or pipe gets plain text).
    force = os.environ.get("FORCE_COLOR", "") != ""
    colors = os.environ.get("NO_COLOR", "") == "" and (force or bool(sys.stdout and sys.stdout.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(
                colors=colors, force_colors=force, exception_formatter=structlog.dev.plain_traceback
            ),
        ]
    )
