"""``FaultWorker``: a real ``celery -A worker worker`` loading ``tests.worker.fault_scorers``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.worker._workers import CELERY, ROOT, WorkerProcess

LIMITS = {
    "TRACESCORE_RUN_TIMEOUT_SECONDS": "5",
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "20",
    "TRACESCORE_TASK_TIME_LIMIT": "25",
    "TRACESCORE_VISIBILITY_TIMEOUT": "30",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


class FaultWorker(WorkerProcess):
    """A ``WorkerProcess`` loading ``tests.worker.fault_scorers`` (the sample scorers and more)."""

    def __init__(self, name: str, redis_url: str, tmp: Path, *, env: dict[str, str], pool: str, concurrency: int):
        self.name = name
        self.log = tmp / f"{name}.log"
        full_env = {
            **os.environ,
            "TRACESCORE_BROKER_URL": redis_url,
            "TRACESCORE_REDIS_URL": redis_url,
            "TRACESCORE_WRITER": "jsonl",
            "TRACESCORE_WRITER_PATH": str(tmp / "scores.jsonl"),
            "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.2",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        cmd = [
            CELERY, "-A", "worker", "worker",
            "--scorers", "tests.worker.fault_scorers",
            "--pool", pool, "--concurrency", str(concurrency),
            "--hostname", f"{name}@%h",
            "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )
