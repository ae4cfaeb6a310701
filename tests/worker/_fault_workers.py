"""``FaultWorker``: a real ``celery -A worker worker`` loading ``tests.worker.fault_scorers``."""

from __future__ import annotations

from pathlib import Path

from tests.worker._workers import WorkerProcess

LIMITS = {
    "TRACESCORE_RUN_TIMEOUT_SECONDS": "5",
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "20",
    "TRACESCORE_TASK_TIME_LIMIT": "25",
    "TRACESCORE_VISIBILITY_TIMEOUT": "30",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


class FaultWorker(WorkerProcess):
    """A ``WorkerProcess`` loading ``tests.worker.fault_scorers`` (the sample scorers and more),
    writing its scores to ``tmp/scores.jsonl``."""

    def __init__(self, name: str, redis_url: str, tmp: Path, *, env: dict[str, str], pool: str, concurrency: int):
        super().__init__(
            name, redis_url, tmp, scores_path=tmp / "scores.jsonl", env=env, pool=pool,
            concurrency=concurrency, scorers="tests.worker.fault_scorers",
        )  # fmt: skip
