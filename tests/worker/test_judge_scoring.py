"""score_batch with real LLM-judge steps (fake LLM server), the Redis store and limiter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks
from tests.fakellm import FakeLLMServer, Reply
from tests.worker import sample_scorers
from tests.worker._batches import batch
from tracing import MemoryScoreWriter
from worker._limiter import RedisRateLimiter
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker._settings import ModelRateLimit
from worker.store import RedisScoreStore


@pytest.fixture
def limiter(redis_url: str) -> Iterator[RedisRateLimiter]:
    """The Redis limiter installed as the judge's limiter for the test."""
    previous = get_judge_hooks()
    limiter = RedisRateLimiter(redis_url, lambda m: ModelRateLimit(requests_per_minute=6000))
    set_judge_hooks(JudgeHooks(limiter=limiter))
    yield limiter
    set_judge_hooks(previous)


def test_checkpoint_resume_skips_finished_judge_steps(
    fake_llm: FakeLLMServer, redis_url: str, limiter: RedisRateLimiter
) -> None:
    """A 5xx in generate_reason is retried later from the checkpoint: no second PRE/SCORE call."""
    failing = {"on": True}
    fake_llm.rule(Reply.error(503, "overloaded"), match=lambda req: failing["on"] and "REASON" in req.user_text)
    writer = MemoryScoreWriter()
    msg = batch(range(2), ["judged_steps"], salt="ckpt")

    written_after_first: list[int] = []

    async def go() -> tuple[object, object]:
        store = RedisScoreStore(redis_url)
        deps = ScoringDeps(registry=Registry([sample_scorers.judged_steps]), store=store, writer=writer)
        first = await score_batch(msg, deps, final_attempt=False)
        written_after_first.append(len(writer.records))
        failing["on"] = False
        second = await score_batch(msg, deps, final_attempt=False)
        await store.close()
        await limiter.close()
        return first, second

    first, second = asyncio.run(go())
    assert first.needs_retry  # type: ignore[attr-defined]
    assert written_after_first == [0]  # nothing recorded while the reason step was failing
    assert second.scored == 2  # type: ignore[attr-defined]
    prompts = [r.user_text for r in fake_llm.requests]
    assert sum("PRE:" in p for p in prompts) == 2
    assert sum("SCORE:" in p for p in prompts) == 2
    assert sum("REASON:" in p for p in prompts) >= 4  # failed once per run, then answered
    assert len(writer.records) == 2
    record = writer.records[0]
    assert record.judge_models == ["openai/fake-judge"]
    assert record.input_tokens > 0
    assert record.reason


def test_terminal_judge_error_is_an_error_record(
    fake_llm: FakeLLMServer, redis_url: str, limiter: RedisRateLimiter
) -> None:
    """A 401 from the provider is final: an error record with error.type, no retry."""
    fake_llm.rule(Reply.error(401, "bad key"))
    writer = MemoryScoreWriter()

    async def go() -> object:
        store = RedisScoreStore(redis_url)
        deps = ScoringDeps(registry=Registry([sample_scorers.judged]), store=store, writer=writer)
        report = await score_batch(batch(range(1), ["judged"], salt="auth"), deps, final_attempt=False)
        await store.close()
        await limiter.close()
        return report

    report = asyncio.run(go())
    assert not report.needs_retry  # type: ignore[attr-defined]
    (record,) = writer.records
    assert record.error_type == "JudgeAuthError"
    assert record.failed_step == "generate_score"


def test_429_pauses_the_model_for_every_worker(
    fake_llm: FakeLLMServer, redis_url: str, limiter: RedisRateLimiter
) -> None:
    """A 429 with Retry-After sets the shared pause for that model; the run is left for a retry."""
    fake_llm.rule(Reply.rate_limited(retry_after="20"))
    writer = MemoryScoreWriter()
    other_process = RedisRateLimiter(redis_url, lambda m: ModelRateLimit())

    async def go() -> tuple[object, int]:
        store = RedisScoreStore(redis_url)
        deps = ScoringDeps(registry=Registry([sample_scorers.judged]), store=store, writer=writer)
        report = await score_batch(batch(range(1), ["judged"], salt="429"), deps, final_attempt=False)
        wait_ms = await other_process._try("openai/fake-judge", 1)
        await store.close()
        await limiter.close()
        await other_process.close()
        return report, wait_ms

    report, wait_ms = asyncio.run(go())
    assert report.transient == {"JudgeRateLimitError": 1}  # type: ignore[attr-defined]
    assert not writer.records
    assert wait_ms > 5_000  # another process would wait out the provider's Retry-After


@pytest.mark.parametrize("retry_after", ["86400", "1e9"])
def test_a_429_asking_for_a_day_pauses_the_model_for_at_most_a_minute(
    fake_llm: FakeLLMServer, redis_url: str, limiter: RedisRateLimiter, retry_after: str
) -> None:
    """The pause a 429 sets is shared by every worker: a gateway's Retry-After of a day would stop
    that model everywhere for a day. The README caps it at 60 s (MAX_PAUSE_S)."""
    from scorers.judge import MAX_PAUSE_S

    fake_llm.rule(Reply.rate_limited(retry_after=retry_after))
    writer = MemoryScoreWriter()

    async def go() -> tuple[object, dict[str, dict[str, float | None]]]:
        store = RedisScoreStore(redis_url)
        deps = ScoringDeps(registry=Registry([sample_scorers.judged]), store=store, writer=writer)
        message = batch(range(1), ["judged"], salt=f"429-day-{retry_after}")
        report = await score_batch(message, deps, final_attempt=False)
        state = await limiter.state()
        await store.close()
        await limiter.close()
        return report, state

    report, state = asyncio.run(go())
    assert report.transient == {"JudgeRateLimitError": 1}  # type: ignore[attr-defined]
    paused = state["openai/fake-judge"]["paused_s"]
    assert paused is not None
    assert MAX_PAUSE_S - 15 < paused <= MAX_PAUSE_S
