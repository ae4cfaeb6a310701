"""The judge-budget tests' worker: a real ``celery -A worker worker`` process running
tests/worker/budget_scorers against tests/fakellm, with the judge priced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.worker._workers import WorkerProcess

SCORERS = "tests.worker.budget_scorers"
PRICES = json.dumps({"openai/fake-judge": {"input": 100.0, "output": 200.0}})


def budget_worker(name: str, **env: str) -> Any:
    """A pytest fixture: a worker named ``name`` (its scores in ``tmp_path / "scores.jsonl"``) on
    the test's Redis, with ``PRICES`` and ``env`` (``TRACESCORE_*``), ready, and stopped after."""

    @pytest.fixture
    def worker(fake_llm_env: dict[str, str], redis_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
        process = WorkerProcess(
            name,
            redis_url,
            tmp_path,
            scores_path=tmp_path / "scores.jsonl",
            env={**fake_llm_env, "TRACESCORE_PRICES": PRICES, **env},
            scorers=SCORERS,
        )
        try:
            process.wait_ready()
            yield process
        finally:
            process.stop()

    return worker
