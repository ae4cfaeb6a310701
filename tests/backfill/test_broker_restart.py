"""A Redis backfill whose broker restarts under it (README "Backfill": losing the broker stops the
job with the `--resume` command; "nothing it enqueued is lost", and a resume scores and counts
each run once). A persistent Redis of the test's own, SIGKILLed and started again on its port,
and a real worker that scores while the backfill enqueues, so the kill can land mid-publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.worker._workers import QUICK_REDELIVERY, ROOT, WorkerProcess, read_scores, wait_for
from worker._keys import backfill_state_key

pytestmark = pytest.mark.redis


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Not pytest's: concurrent sessions prune old basetemp directories while a worker writes."""
    with tempfile.TemporaryDirectory(prefix="tracescore-restart-") as name:
        yield Path(name)


def _backfill(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TRACESCORE_BROKER_URL": url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "backfill"]
    return subprocess.Popen(
        [*command, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_broker_restart_mid_job_then_resume_scores_and_counts_each_run_once(tmp_path: Path) -> None:
    server = RedisServer(persistent=True)
    server.start()
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "restart", server.url(0), tmp_path, scores_path=scores, scorers="tests.backfill.scorers", env=QUICK_REDELIVERY
    )
    try:
        worker.wait_ready()
        n = 600
        write_otlp_files(tmp_path / "in", n, files=2)
        options = ["--scorers", "tests.backfill.scorers", "--batch-size", "10", "--high-water", "3"]
        job = _backfill(server.url(0), str(tmp_path / "in"), *options, "--json", "--wait-timeout", "120")
        db = server.client(0, decode_responses=True)
        keys: list[str] = []

        def midway() -> bool:
            keys[:] = [k for k in db.scan_iter(backfill_state_key("*")) if k.count(":") == 2]
            return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 150

        assert wait_for(midway, 120), "the backfill did not enqueue 150 runs"
        job_id = keys[0].rsplit(":", 1)[1]
        db.close()
        server.stop()  # SIGKILL, mid-publish or mid-wait
        time.sleep(0.5)  # (the port freed; the job may be retrying its publish)
        server.start()
        out, said = job.communicate(timeout=180)
        if job.returncode == 1:  # it gave up: the resume goes on
            assert f"resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
            resumed = _backfill(server.url(0), "--resume", job_id, "--json", "--wait-timeout", "120")
            out, said = resumed.communicate(timeout=240)
            assert resumed.returncode == 0, said[-3000:]
        else:  # it rode the restart out
            assert job.returncode == 0, said[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert server.password not in said
        expected = n * 3  # three scorers
        assert wait_for(lambda: len(read_scores(scores)) >= expected, 60), len(read_scores(scores))
        counts = Counter(r["score_id"] for r in read_scores(scores) if r.get("job_id") == job_id)
        assert (len(counts), max(counts.values())) == (expected, 1)  # each run once, none twice
        assert (summary["status"], summary["traces_read"], summary["runs_enqueued"]) == ("finished", n, n), summary
        assert summary["scored"] + summary["failed"] == expected, summary
    finally:
        worker.stop()
        server.close()


@pytest.mark.parametrize("redis_state", ["answering", "paused"])
def test_sigterm_stops_a_redis_job_resumable_with_exit_130(tmp_path: Path, redis_state: str) -> None:
    """README exit codes: 130 for Ctrl-C or SIGTERM (a Kubernetes Job's stop), the job resumable,
    the workers' counts `null` with --json when Redis does not answer. No worker runs: the job
    enqueues up to its high-water mark, then waits, as a job does behind a backlog."""
    server = RedisServer()
    server.start()
    try:
        write_otlp_files(tmp_path / "in", 300, files=1)
        options = ["--scorers", "tests.backfill.scorers", "--batch-size", "10", "--high-water", "2"]
        job = _backfill(server.url(0), str(tmp_path / "in"), *options, "--json")
        db = server.client(0, decode_responses=True)
        keys: list[str] = []

        def waiting() -> bool:
            keys[:] = [k for k in db.scan_iter(backfill_state_key("*")) if k.count(":") == 2]
            return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 20

        assert wait_for(waiting, 120), "the backfill did not enqueue 20 runs"
        job_id = keys[0].rsplit(":", 1)[1]
        assert server.proc is not None
        if redis_state == "paused":
            os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            job.send_signal(signal.SIGTERM)
            out, said = job.communicate(timeout=90)
        finally:
            if redis_state == "paused":
                os.kill(server.proc.pid, signal.SIGCONT)
        assert job.returncode == 130, said[-2000:]
        assert f"Resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
        assert server.password not in said
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["status"] == "interrupted"
        if redis_state == "paused":
            assert (summary["scored"], summary["failed"]) == (None, None), summary
        else:
            assert (summary["scored"], summary["failed"]) == (0, 0), summary
            assert json.loads(db.get(keys[0]) or "{}")["status"] == "interrupted"
        db.close()
    finally:
        server.close()
