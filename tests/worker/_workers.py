"""Real ``celery -A worker worker`` processes for the tests, the ``tracescore`` command run to its
end, and waiting with deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))


# A worker that gets a lost delivery back within seconds: the visibility timeout shortened (the
# task's time limits must fit inside it) and kombu's sweep of unacked messages run every second.
QUICK_REDELIVERY = {
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "4",
    "TRACESCORE_TASK_TIME_LIMIT": "5",
    "TRACESCORE_VISIBILITY_TIMEOUT": "10",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


def run_tracescore(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``tracescore ARGS`` from the repository root, run to its end, its output captured as text."""
    return subprocess.run([TRACESCORE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def failed_start(broker_url: str, scorers: str = "tests.worker.sample_scorers") -> subprocess.CompletedProcess[str]:
    """``celery -A worker worker`` run to its end, for a start that must be refused (60 s at most)."""
    return subprocess.run(
        [CELERY, "-A", "worker", "worker", "--pool", "solo", "--scorers", scorers],
        cwd=ROOT,
        env={**os.environ, "TRACESCORE_BROKER_URL": broker_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds or the deadline passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


class WorkerProcess:
    """One worker process; ``log`` is its combined output. Its broker and score store are both
    ``redis_url`` unless ``broker`` names another broker."""

    def __init__(
        self,
        name: str,
        redis_url: str,
        tmp: Path,
        *,
        scores_path: Path,
        broker: str | None = None,
        env: dict[str, str] | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        scorers: str = "tests.worker.sample_scorers",
        loglevel: str = "INFO",
    ) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        full_env = {
            **os.environ,
            "TRACESCORE_BROKER_URL": redis_url if broker is None else broker,
            "TRACESCORE_REDIS_URL": redis_url,
            "TRACESCORE_WRITER": "jsonl",
            "TRACESCORE_WRITER_PATH": str(scores_path),
            "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.2",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        cmd = [
            CELERY, "-A", "worker", "worker",
            "--scorers", scorers,
            "--pool", pool, "--concurrency", str(concurrency),
            "--hostname", f"{name}@%h",
            "--loglevel", loglevel,
            "--without-heartbeat",  # (gossip and mingle: always off, worker._guard)
        ]  # fmt: skip
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        ok = wait_for(lambda: " ready." in self.text() or self.proc.poll() is not None, timeout)
        if not ok or self.proc.poll() is not None:
            raise AssertionError(f"worker {self.name} did not start:\n{self.text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole worker (its process group: no graceful shutdown at all)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


def queue_and_unacked(url: str, queue: str) -> tuple[int, int]:
    """How many messages ``queue``'s list and kombu's unacked record hold on the broker at ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.llen(queue)), int(client.hlen("unacked"))
    finally:
        client.close()


def complete_lines(path: Path) -> list[str]:
    """The lines a worker process has finished writing to ``path`` (none if it does not exist). A
    reader polling the file can catch the last line while its writer is still copying it in (CI
    caught a score record cut at "retryable":f): that line is left for the next read."""
    if not path.exists():
        return []
    text = path.read_text()
    return [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def read_scores(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in complete_lines(path)]
