"""The Celery task body, run in this process (``apply``): size bound and the normal path."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from scorers.judge import get_judge_hooks, set_judge_hooks
from tests.worker._batches import payload
from worker._app import score_batch_task
from worker._loop import stop_loop
from worker._runtime import reset_runtime
from worker._settings import get_settings
from worker.store import RedisDeadLetters, RedisScoreStore


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
        run_coro(runtime.dead_letters.close(), 5)
        run_coro(runtime.limiter.close(), 5)
    stop_loop()
    get_settings.cache_clear()
    set_judge_hooks(hooks)


def _dlq_and_progress(url: str, job: str) -> tuple[list[str], dict[str, int]]:
    async def go() -> tuple[list[str], dict[str, int]]:
        store, dead = RedisScoreStore(url), RedisDeadLetters(url)
        letters = [d.reason for d in await dead.latest()]
        progress = await store.jobs.progress(job)
        await store.close()
        await dead.close()
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


def test_the_same_message_twice_is_one_dead_letter(runtime_env: str) -> None:
    """A redelivery of a message the task dead-lettered (same task id, same retry: its ack was
    lost to a consumer restart) finds the letter already there instead of adding a second."""
    bad = {"batch_id": "bad-twice", "requests": [{"run": 42, "scorer_ids": ["length"]}]}
    score_batch_task.apply(args=[bad], task_id="0f6c8a4e-6a57-4b0c-9d43-3f1d2b7c9e01")
    score_batch_task.apply(args=[bad], task_id="0f6c8a4e-6a57-4b0c-9d43-3f1d2b7c9e01")
    score_batch_task.apply(args=[bad], task_id="5a1d0c9b-2f3e-4a6b-8c7d-9e0f1a2b3c4d")  # another message
    letters, _ = _dlq_and_progress(runtime_env, "-")
    assert letters == ["invalid_payload", "invalid_payload"]
