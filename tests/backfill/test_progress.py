"""The progress display: a redrawn bar with rate and ETA on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.backfill._doubles import CapturingSubmitter
from tests.backfill._synth import write_otlp_files
from tracing.queue import ScoreBatch
from tracing.sources import FileSource
from worker._progress import ProgressReporter, format_duration
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState


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


def test_a_new_phase_is_drawn_at_once_on_a_terminal() -> None:
    """A phase shorter than a redraw's tenth of a second was never shown (compare's reading of a
    small second file); a terminal draws each phase's first update, plain output waits as before."""
    for stream, shown in ((_Tty(), ["reading old", "reading new"]), (io.StringIO(), [])):
        reporter = ProgressReporter(stream, interval_s=3600)
        for phase in ("reading old", "reading new"):
            reporter.start(phase)
            reporter.update(phase, 1000, "lines", 0.5)
        assert [p for p in ("reading old", "reading new") if f"{p}: 1,000 lines" in stream.getvalue()] == shown


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


class _WaitingSubmitter(CapturingSubmitter):
    """Its queue stays full for a few looks at each submit, as a Redis one with slow workers."""

    def __init__(self, on_wait: list[Callable[[int], None]]) -> None:
        super().__init__()
        self._on_wait = on_wait

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        for pending in (40, 30, 21):
            self._on_wait[0](pending)
        super().submit(batch, requests_json)


def test_a_wait_for_the_workers_shows_in_the_progress_line(tmp_path: Path) -> None:
    """Enqueuing held back by the workers' pace printed nothing (14 s without a line in the
    audit, without a TTY); the progress line now says the job waits and how full the queue is."""
    write_otlp_files(tmp_path, 30, files=1)
    source = FileSource(sorted(tmp_path.iterdir()))
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], batch_size=10)
    state = BackfillState(job_id="bf-wait", source=source.describe(), options=options)
    stream = io.StringIO()
    hook: list[Callable[[int], None]] = []
    backfill = Backfill(source, state, _WaitingSubmitter(hook), reporter=ProgressReporter(stream, interval_s=0))
    hook.append(backfill.show_waiting)
    backfill.run()
    assert "runs enqueued; waiting for the workers: 40 batches queued" in stream.getvalue()
