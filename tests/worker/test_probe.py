"""``tracescore probe live|ready`` against real workers: a busy worker is live and ready; one whose
event loop is blocked by a step that never returns is not live; after SIGTERM it is not ready."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests._redis import RedisServer
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, wait_for
from tracing import CelerySink
from worker import _heartbeat as probe_files
from worker import _process
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


def _stale(path: Path, text: str, age_s: float) -> None:
    path.write_text(text, encoding="ascii")
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_a_loop_file_of_an_earlier_process_with_the_same_pid_is_not_believed(tmp_path: Path) -> None:
    """A `loop-<pid>` file whose pid now belongs to another process (a restarted container's
    PID 1): its recorded start time is not that process's, so its age says nothing."""
    me = os.getpid()
    started = _process.start_time(me)
    assert started is not None  # Linux: /proc
    _stale(tmp_path / probe_files.CONSUMER_FILE, f"{me} {started}", 0)
    _stale(tmp_path / f"{probe_files.LOOP_PREFIX}{me}", f"{me} {started - 1}", 300)
    assert probe_files.liveness_problems(tmp_path, 240) == []
    _stale(tmp_path / f"{probe_files.LOOP_PREFIX}{me}", f"{me} {started}", 300)  # really this process's
    problems = probe_files.liveness_problems(tmp_path, 240)
    assert len(problems) == 1, problems
    assert f"process {me} has been blocked for 300 s" in problems[0]


def test_a_restarted_worker_clears_the_files_an_earlier_run_left(redis_url: str, tmp_path: Path) -> None:
    """A container restarted in its pod keeps /tmp: the previous run's files (its consumer,
    ready, and loop files of pids alive again) are cleared when the worker starts, so an idle
    healthy worker is live, not blamed for a loop that stopped 300 s ago."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    for name in (probe_files.CONSUMER_FILE, probe_files.READY_FILE, "loop-1", f"loop-{os.getpid()}"):
        _stale(probe_dir / name, name.removeprefix("loop-") if name.startswith("loop-") else "1", 300)
    env = {"TRACESCORE_PROBE_DIR": str(probe_dir), "TSTEST_CALLS_FILE": str(tmp_path / "calls.txt")}
    worker = _worker("restarted", redis_url, tmp_path, "threads", 2, env)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 0, 30), worker.text()[-3000:]
        live = _probe("live", "--dir", str(probe_dir), "--max-age", "240")
        assert live.exit_code == 0, live.output
        assert not (probe_dir / "loop-1").exists()
        assert not (probe_dir / f"loop-{os.getpid()}").exists()
    finally:
        worker.stop()


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_worker_with_a_blocked_loop_is_not_live(redis_url: str, tmp_path: Path, pool: str, concurrency: int) -> None:
    """A step blocking the event loop in a C call (the watchdog's interrupt cannot reach it):
    within a few seconds `probe live` fails and names the blocked process's loop (in the prefork
    pool: the child's, while its sibling and the consumer beat on)."""
    probe_dir = tmp_path / "probe"
    calls = tmp_path / "calls.txt"
    env = {
        "TRACESCORE_PROBE_DIR": str(probe_dir),
        "TSTEST_CALLS_FILE": str(calls),
        # The watchdog would replace the process after the run timeout: keep it out of the way.
        "TRACESCORE_RUN_TIMEOUT_SECONDS": "120",
        "TSTEST_BLOCK_S": "60",
    }
    worker = _worker("wedged", redis_url, tmp_path, pool, concurrency, env)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S).exit_code == 0, 30)
        sink = CelerySink(redis_url)
        sink.send(batch(range(1, 2), ["blocker"], salt=f"wedged-{pool}"))
        sink.close()
        assert wait_for(lambda: _starts(calls) >= 1, 30), worker.text()[-3000:]
        assert wait_for(lambda: _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S).exit_code == 1, 15), (
            worker.text()[-3000:]
        )
        result = _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S)
        assert "scoring event loop of process" in result.output
        assert "blocked" in result.output
        assert worker.proc.poll() is None  # still running: only the probe can tell
    finally:
        worker.kill()
        worker.stop()  # closes its log


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_a_broker_outage_makes_the_worker_unready_but_not_dead(
    private_redis: RedisServer, tmp_path: Path, pool: str, concurrency: int
) -> None:
    """Redis goes away for longer than the probe's max age: Celery restarts the consumer and it
    reconnects. `probe ready` fails meanwhile; `probe live` passes and says the consumer is
    reconnecting (restarting every pod would not bring the broker back). Once Redis is back the
    worker is ready again."""
    probe_dir = tmp_path / "probe"
    env = {"TRACESCORE_PROBE_DIR": str(probe_dir), "TSTEST_CALLS_FILE": str(tmp_path / "calls.txt")}
    worker = _worker("outage", private_redis.url(11), tmp_path, pool, concurrency, env)
    try:
        worker.wait_ready()
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 0, 30), worker.text()[-3000:]
        private_redis.stop()
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 1, 15), worker.text()[-3000:]
        outputs = []
        for _ in range(5):  # 5 s: past the max age of 2 s
            live = _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S)
            assert live.exit_code == 0, live.output + worker.text()[-3000:]
            outputs.append(live.output)
            wait_for(lambda: False, 1.0)
        assert any("reconnecting to the broker" in out for out in outputs), outputs
        assert _probe("ready", "--dir", str(probe_dir)).exit_code == 1
        private_redis.start()
        assert wait_for(lambda: _probe("ready", "--dir", str(probe_dir)).exit_code == 0, 60), worker.text()[-3000:]
        live = _probe("live", "--dir", str(probe_dir), "--max-age", MAX_AGE_S)
        assert live.exit_code == 0, live.output
        assert live.output.strip() == "live"
    finally:
        worker.stop()


def test_ready_asks_the_score_store_of_its_own_too(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose score store is a Redis of its own (TRACESCORE_REDIS_URL) cannot record a
    score while that Redis is away, and `probe ready` asked the broker alone: ready. It now
    asks the store too, and names it (its password masked); ready again once it is back."""
    (tmp_path / probe_files.READY_FILE).write_text("")
    with RedisServer() as broker:
        monkeypatch.setenv("TRACESCORE_BROKER_URL", broker.url(0))
        monkeypatch.setenv("TRACESCORE_REDIS_URL", private_redis.url(1))
        ready = _probe("ready", "--dir", str(tmp_path))
        assert (ready.exit_code, ready.output.strip()) == (0, "ready")
        assert private_redis.proc is not None
        private_redis.proc.send_signal(signal.SIGSTOP)
        try:
            unready = _probe("ready", "--dir", str(tmp_path), "--timeout", "0.5")
        finally:
            private_redis.proc.send_signal(signal.SIGCONT)
        assert unready.exit_code == 1
        assert unready.output.startswith("Error: not ready: cannot reach the score store at redis://:***@"), (
            unready.output
        )
        assert private_redis.password not in unready.output
        assert _probe("ready", "--dir", str(tmp_path)).exit_code == 0
