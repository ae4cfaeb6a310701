"""``tracescore probe live|ready`` against real workers: a busy worker is live and ready; one whose
event loop is blocked by a step that never returns is not live; after SIGTERM it is not ready."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, wait_for
from tracing import CelerySink
from worker.cli import cli

MAX_AGE_S = "2"


def _probe(*args: str) -> Result:
    return CliRunner().invoke(cli, ["probe", *args])


def _starts(calls: Path) -> int:
    return calls.read_text().count("start ") if calls.exists() else 0


def _worker(name: str, redis_url: str, tmp: Path, pool: str, concurrency: int, env: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(
        name, redis_url, tmp, scores_path=tmp / "scores.jsonl", pool=pool, concurrency=concurrency,
        scorers="tests.worker.shutdown_scorers", env=env,
    )  # fmt: skip


def test_probe_without_a_directory_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRACESCORE_PROBE_DIR, or one no worker created: exit 1 naming the variable."""
    monkeypatch.delenv("TRACESCORE_PROBE_DIR", raising=False)
    result = _probe("live")
    assert result.exit_code == 1
    assert "TRACESCORE_PROBE_DIR" in result.output
    result = _probe("ready", "--dir", str(tmp_path / "missing"))
    assert result.exit_code == 1
    assert "does not exist" in result.output


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 4), ("prefork", 2), ("solo", 1)])
def test_busy_worker_is_live_and_ready_and_not_ready_after_sigterm(
    redis_url: str, tmp_path: Path, pool: str, concurrency: int
) -> None:
    """While every slot scores slow runs (beyond the probe's max age), `probe live` and `probe
    ready` pass; after SIGTERM `probe ready` fails (the worker takes no more messages)."""
    probe_dir = tmp_path / "probe"
    calls = tmp_path / "calls.txt"
    env = {
        "TRACESCORE_PROBE_DIR": str(probe_dir),
        "TSTEST_CALLS_FILE": str(calls),
        "TSTEST_PACE_S": "0.5",
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": "2",
    }
    worker = _worker("busy", redis_url, tmp_path, pool, concurrency, env)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 0, 30), worker.text()[-3000:]
        sink = CelerySink(redis_url)
        for b in range(concurrency):
            # runs of 12 words: 6 s each, well past the probe's max age of 2 s
            sink.send(batch(range(12, 12 + 30 * 8, 30), ["paced"], salt=f"busy-{pool}-{b}"))
        sink.close()
        assert wait_for(lambda: _starts(calls) >= 8 * concurrency, 30), worker.text()[-3000:]
        if pool == "prefork":
            assert wait_for(lambda: len(list(probe_dir.glob("loop-*"))) >= concurrency, 10)
        for _ in range(4):  # across 4 s: longer than the max age, still inside the runs
            live = _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S)
            assert live.exit_code == 0, live.output
            ready = _probe("ready", "--dir", str(probe_dir))
            assert ready.exit_code == 0, ready.output
            wait_for(lambda: False, 1.0)
        assert "done " not in calls.read_text()  # it really was busy all along

        os.kill(worker.proc.pid, signal.SIGTERM)
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 1, 10)
        assert "not consuming" in _probe("ready", "--dir", str(probe_dir)).output
    finally:
        worker.stop()


def test_worker_with_a_blocked_loop_is_not_live(redis_url: str, tmp_path: Path) -> None:
    """A step blocking the event loop in a C call (the watchdog's interrupt cannot reach it):
    within a few seconds `probe live` fails and names the blocked process's loop."""
    probe_dir = tmp_path / "probe"
    calls = tmp_path / "calls.txt"
    env = {
        "TRACESCORE_PROBE_DIR": str(probe_dir),
        "TSTEST_CALLS_FILE": str(calls),
        # The watchdog would replace the process after the run timeout: keep it out of the way.
        "TRACESCORE_RUN_TIMEOUT_SECONDS": "120",
        "TSTEST_BLOCK_S": "60",
    }
    worker = _worker("wedged", redis_url, tmp_path, "threads", 2, env)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S).exit_code == 0, 30)
        sink = CelerySink(redis_url)
        sink.send(batch(range(1, 2), ["blocker"], salt="wedged"))
        sink.close()
        assert wait_for(lambda: _starts(calls) >= 1, 30), worker.text()[-3000:]
        assert wait_for(
            lambda: _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S).exit_code == 1, 15
        ), worker.text()[-3000:]
        result = _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S)
        assert "scoring event loop of process" in result.output
        assert "blocked" in result.output
        assert worker.proc.poll() is None  # still running: only the probe can tell
    finally:
        worker.kill()
        worker.stop()  # closes its log
