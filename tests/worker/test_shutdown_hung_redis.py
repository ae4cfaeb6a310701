"""SIGTERM while Redis hangs (stopped, its connections open: a network partition): the worker
exits within the grace period plus the cleanup time plus the exit allowance, as the README
promises, instead of waiting on a Redis call that has no timeout (Celery's own teardown:
kombu's pidbox, the worker-offline event) until Redis answers again (queue-fault audit: still
running 60-101 s after SIGTERM with an 18 s budget). What it held comes back as after a SIGKILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.worker._workers import WorkerProcess, wait_for
from worker._app import EXIT_SHUTDOWN_OVERRAN
from worker._loop import EXIT_ALLOWANCE_S

GRACE_S, CLEANUP_S = 1.0, 1.0


@pytest.mark.parametrize("pool", ["solo", "threads", "prefork"])
def test_a_worker_exits_in_time_while_redis_hangs(private_redis: RedisServer, tmp_path: Path, pool: str) -> None:
    env = {"TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S), "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S)}
    worker = WorkerProcess("hung", private_redis.url(0), tmp_path, scores_path=tmp_path / "s.jsonl", env=env, pool=pool)
    try:
        worker.wait_ready()
        assert private_redis.proc is not None
        private_redis.proc.send_signal(signal.SIGSTOP)
        os.kill(worker.proc.pid, signal.SIGTERM)
        # The platform's kill comes at grace + cleanup + the allowance: the worker is gone by then.
        budget = GRACE_S + CLEANUP_S + EXIT_ALLOWANCE_S
        assert wait_for(lambda: worker.proc.poll() is not None, budget), worker.text()[-3000:]
        private_redis.proc.send_signal(signal.SIGCONT)
        # It left by the backstop (a healthy slow shutdown exits 0: tests/worker/test_shutdown.py).
        assert worker.proc.returncode == EXIT_SHUTDOWN_OVERRAN, worker.text()[-3000:]
        assert "worker_shutdown_overran after" in worker.text()
    finally:
        if private_redis.proc is not None:
            private_redis.proc.send_signal(signal.SIGCONT)
        worker.stop()  # (gone already; closes its log)
