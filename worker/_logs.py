"""How tracescore's processes (the CLI, the workers) write structlog's lines.

structlog's defaults, but for two things. Lines go to stderr, not stdout: stdout is the
commands' output (``--json`` for scripts), and a warning printed there made it unreadable. And
tracebacks: its default formatter, when ``rich`` is installed,
prints every frame's local variables, and in a scoring process those hold prompts, answers,
score reasons and settings (``score_write_failed`` printed about 850 lines of records). Plain
tracebacks name the code, never the data. Only where nobody configured structlog before: an
application that runs the CLI in its process (``worker.cli.main``) or configures its own
logging keeps it, and one that only imports the exporter is never touched.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["CountedLog", "configure_logs"]

# The HTTP clients of the sinks, the Tempo source and the judges' SDKs (httpx2/httpcore2 are
# theirs): each logs every request at INFO with its URL, user-info and all. A worker logs at INFO,
# so a password in TRACESCORE_PHOENIX_URL or a judge's base URL was printed once a request.
# The HTTP clients' and the judge SDKs' loggers: at DEBUG (which `--loglevel DEBUG` gives every
# logger left without a level) they print request headers, and Anthropic's SDK each request's
# options, the prompt (the agent's content) with them.
_HTTP_CLIENT_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "anthropic")


def configure_logs() -> None:
    """structlog's default processors, each traceback printed plain (no local variables), onto
    stderr, unless structlog is configured already. The level stays as configured later
    (``tracescore backfill`` quiets them). The HTTP clients' and the judge SDKs' loggers go to
    WARNING unless given a level of their own."""
    for name in _HTTP_CLIENT_LOGGERS:
        client_log = logging.getLogger(name)
        if client_log.level == logging.NOTSET:
            client_log.setLevel(logging.WARNING)
    if structlog.is_configured():
        return
    # Colours as structlog's default decides them: on a terminal only, NO_COLOR and FORCE_COLOR
    # obeyed (a worker's log file or pipe gets plain text).
    force = os.environ.get("FORCE_COLOR", "") != ""
    colors = os.environ.get("NO_COLOR", "") == "" and (force or bool(sys.stderr and sys.stderr.isatty()))
    structlog.configure(
        logger_factory=_StderrLoggerFactory(),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(
                colors=colors, force_colors=force, exception_formatter=structlog.dev.plain_traceback
            ),
        ],
    )


class _StderrLoggerFactory:
    """structlog's ``PrintLogger`` on the ``sys.stderr`` of when the logger is made, not of when
    the logs were configured (a test's captured stream, an app that replaces it)."""

    def __call__(self, *args: object) -> structlog.PrintLogger:
        return structlog.PrintLogger(sys.stderr)


class CountedLog:
    """A WARNING (or ``level``) expected again and again while a condition lasts (every message
    while a budget is spent, every retry while a sink is down): one line ``event`` per ``every_s``
    per process, saying how many there were since the last line (``count_key``) and since the
    start, with the fields of the last one; not a line each (a CLI's stderr got hundreds)."""

    def __init__(
        self,
        event: str,
        *,
        logger: Any,
        count_key: str = "count",
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        level: str = "warning",
    ) -> None:
        self.event = event
        self.level = level
        self.logger = logger
        self.count_key = count_key
        self.every_s = every_s
        self.clock = clock
        self.pending = 0
        self.total = 0
        self._last: float | None = None
        self._fields: dict[str, Any] = {}
        self._lock = threading.Lock()  # (sink drainers note from their threads)

    def note(self, n: int = 1, /, **last: Any) -> bool:
        """Count ``n`` more; True when this call wrote the line."""
        with self._lock:
            self.pending += n
            self.total += n
            self._fields = last
            now = self.clock()
            if self._last is not None and now - self._last < self.every_s:
                return False
            self._last = now
            pending, self.pending, total = self.pending, 0, self.total
        self._write(pending, total, last)
        return True

    def flush(self) -> None:
        """The condition ended (the sink delivers again): write what was counted since the last
        line, if anything, so no count is left unsaid."""
        with self._lock:
            if not self.pending:
                return
            pending, self.pending, total = self.pending, 0, self.total
            self._last = None
        self._write(pending, total, self._fields)

    def _write(self, pending: int, total: int, last: dict[str, Any]) -> None:
        write = getattr(self.logger, self.level)
        write(self.event, **{self.count_key: pending}, since_start=total, every_s=self.every_s, **last)
