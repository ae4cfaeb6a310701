"""The progress display: a redrawn bar with rate and ETA on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import time

from worker.backfill._progress import ProgressReporter, format_duration


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_one_redrawn_line_with_rate_and_eta() -> None:
    """On a TTY each update redraws the same line (\\r), with a bar, the rate and an ETA."""
    stream = _Tty()
    reporter = ProgressReporter(stream)
    reporter.start("reading", at=time.monotonic() - 10)
    reporter.update("reading", 500, "traces", 0.25, force=True)
    reporter.message("a.jsonl:3: skipped: not JSON")
    reporter.update("reading", 1000, "traces", 0.5, force=True)
    reporter.close()
    text = stream.getvalue()
    assert text.count("\r\x1b[2K") >= 3  # two draws and one clear before the message
    assert "[##########..........]  50.0% reading: 1,000 traces" in text
    assert "100/s  ETA 0:10" in text  # 1,000 in 10 s, half done
    assert "\na.jsonl:3: skipped: not JSON\n" in text.replace("\r\x1b[2K", "\n")
    assert text.endswith("\n")


def test_plain_output_is_one_line_per_interval() -> None:
    """Without a TTY: whole lines, no control characters, at most one per interval."""
    stream = io.StringIO()
    reporter = ProgressReporter(stream, interval_s=3600)
    for done in range(1, 100):
        reporter.update("reading", done, "traces", done / 100)
    reporter.update("reading", 100, "traces", 1.0, force=True)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "\r" not in stream.getvalue()
    assert lines[-1].startswith("reading: 100 traces")
    assert lines[-1].endswith("(100.0%)")


def test_format_duration() -> None:
    """Durations read as m:ss, or h:mm:ss past an hour."""
    assert format_duration(5) == "0:05"
    assert format_duration(125) == "2:05"
    assert format_duration(3725) == "1:02:05"
