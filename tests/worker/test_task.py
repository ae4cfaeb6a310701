"""The Celery task body, run in this process (``apply``): size bound and the normal path."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from scorers.judge import get_judge_hooks, set_judge_hooks
from tests.worker._batches import payload
from worker._loop import stop_loop
from worker._runtime import reset_runtime
from worker._settings import get_settings
from worker._store import RedisScoreStore
from worker._task import score_batch_task


@pytest.fixture
def runtime_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Worker settings for an in-process runtime on DB 11; torn down afterwards."""
    hooks = get_judge_hooks()
    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    monkeypatch.setenv("TRACESCORE_SCORERS", "tests.worker.sample_scorers")
    monkeypatch.setenv("TRACESCORE_WRITER", "none")
    monkeypatch.setenv("TRACESCORE_MAX_PAYLOAD_BYTES", "4096")
    get_settings.cache_clear()
    reset_runtime()
    yield redis_url
    runtime = reset_runtime()
    if runtime is not None:
        from worker._loop import run_coro

        run_coro(runtime.store.close(), 5)
        run_coro(runtime.limiter.close(), 5)
    stop_loop()
    get_settings.cache_clear()
    set_judge_hooks(hooks)


def _dlq_and_progress(url: str, job: str) -> tuple[list[str], dict[str, int]]:
    async def go() -> tuple[list[str], dict[str, int]]:
        store = RedisScoreStore(url)
        letters = [d.reason for d in await store.dlq_list()]
        progress = await store.job_progress(job)
        await store.close()
        return letters, progress

    return asyncio.run(go())


def test_oversized_payload_is_dead_lettered_without_scoring(runtime_env: str) -> None:
    """A message above TRACESCORE_MAX_PAYLOAD_BYTES goes to the DLQ (not kept), nothing is scored."""
    big = payload(range(40), ["length"], job_id="big")
    score_batch_task.apply(args=[big])
    letters, progress = _dlq_and_progress(runtime_env, "big")
    assert letters == ["payload_too_large"]
    assert progress == {}


def test_valid_payload_is_scored_and_reported(runtime_env: str) -> None:
    """A small valid batch is scored; the task returns the batch report."""
    result = score_batch_task.apply(args=[payload(range(2), ["length", "steps"], job_id="ok")])
    assert result.result["scored"] == 4
    letters, progress = _dlq_and_progress(runtime_env, "ok")
    assert letters == []
    assert progress == {"scored": 4}
