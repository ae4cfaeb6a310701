"""The Redis rate limiter: a shared budget per model, shared pauses, token corrections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from scorers.judge import JudgeHooks, set_judge_hooks
from tests.fakellm import FakeLLMServer, Reply
from worker import _keys
from worker._limiter import RedisRateLimiter
from worker._settings import ModelRateLimit


def _limits(rpm: float | None = None, tpm: float | None = None) -> object:
    return lambda model_id: ModelRateLimit(requests_per_minute=rpm, tokens_per_minute=tpm)


def test_two_limiters_share_one_request_budget(redis_url: str) -> None:
    """Two limiters (as two processes would) together stay within requests/min."""
    # 600/min = 10/s with a 1 s burst: 30 calls need about 2 s whoever makes them.
    a = RedisRateLimiter(redis_url, _limits(rpm=600))  # type: ignore[arg-type]
    b = RedisRateLimiter(redis_url, _limits(rpm=600))  # type: ignore[arg-type]
    stamps: list[float] = []

    async def call(limiter: RedisRateLimiter) -> None:
        async with limiter.slot("m", 10):
            stamps.append(time.monotonic())

    async def go() -> None:
        await asyncio.gather(*(call(a if i % 2 else b) for i in range(30)))
        await a.close()
        await b.close()

    asyncio.run(go())
    stamps.sort()
    # After the initial burst of 10, calls arrive at no more than 10/s (+10 % for clock jitter).
    span = stamps[-1] - stamps[0]
    assert span >= (30 - 10) / 10 / 1.1
    for i, start in enumerate(stamps):
        in_window = sum(1 for s in stamps[i:] if s < start + 1.0)
        assert in_window <= 10 + 10 + 1  # burst + one second of refill


def test_two_limiters_share_one_token_budget(redis_url: str) -> None:
    """README (Workers): the tokens per minute are shared by all workers as the requests are.
    6,000 tokens/min is 100 a second in a bucket of 6 s (600): what one process takes, another
    waits for (about 6 s for the whole bucket again); another model's bucket is its own."""
    a = RedisRateLimiter(redis_url, _limits(tpm=6000))  # type: ignore[arg-type]
    b = RedisRateLimiter(redis_url, _limits(tpm=6000))  # type: ignore[arg-type]

    async def go() -> tuple[int, int, int]:
        try:
            return await a._try("m", 600), await b._try("m", 600), await b._try("other", 600)
        finally:
            await a.close()
            await b.close()

    first, second, other = asyncio.run(go())
    assert first == 0
    assert 4_000 < second <= 6_000  # the bucket a emptied, refilled at 100 tokens a second
    assert other == 0


def test_pause_from_one_process_stops_the_other(redis_url: str) -> None:
    """A 429 pause set through one limiter makes another wait for that model only."""
    a = RedisRateLimiter(redis_url, _limits())  # type: ignore[arg-type]
    b = RedisRateLimiter(redis_url, _limits())  # type: ignore[arg-type]

    async def go() -> tuple[int, int]:
        await a.pause("openai/x", 30)
        waits = await b._try("openai/x", 1), await b._try("openai/other", 1)
        state = await b.state()
        await a.close()
        await b.close()
        assert state["openai/x"]["paused_s"] > 25
        return waits

    paused, other = asyncio.run(go())
    assert paused > 25_000
    assert other == 0


def test_record_usage_corrects_the_token_estimate(redis_url: str) -> None:
    """Tokens really used replace the estimate taken when the slot was granted."""
    import redis

    limiter = RedisRateLimiter(redis_url, _limits(tpm=60_000))  # type: ignore[arg-type]
    key = _keys.limiter_bucket_key("m", "tok")
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def go() -> None:
        async with limiter.slot("m", 100):
            pass
        before = float(client.hget(key, "tokens") or 0)
        await limiter.record_usage("m", 700)
        after = float(client.hget(key, "tokens") or 0)
        await limiter.close()
        # Capacity 6000 (6 s of 1000/s): 100 taken, then corrected to 700.
        assert 5890 <= before <= 5910
        assert after == before - 600

    asyncio.run(go())
    client.close()


def test_a_call_estimated_past_the_bucket_is_corrected_from_what_it_was_charged(redis_url: str) -> None:
    """A call whose estimate is over the bucket's size is charged the size (else it could never
    be admitted); the correction then started from the estimate, so every such call was
    credited more than it paid (3 workers at 3,000 tokens a minute let 34,925 through). It is
    corrected from the charge: the bucket ends owing what the call really used."""
    import redis

    limiter = RedisRateLimiter(redis_url, _limits(tpm=3000))  # type: ignore[arg-type]
    key = _keys.limiter_bucket_key("big", "tok")
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def go() -> None:
        async with limiter.slot("big", 10_000):  # capacity: 300 (6 s of 50/s)
            pass
        charged = float(client.hget(key, "tokens") or 0)
        await limiter.record_usage("big", 900)
        after = float(client.hget(key, "tokens") or 0)
        # The debt is repaid as the bucket refills; `status` shows the level a call finds now,
        # not the one stored at the last grant (40 s ago here: full again).
        seconds, micros = client.time()
        client.hset(key, "ts", int(seconds) * 1000 + int(micros) // 1000 - 40_000)
        state = await limiter.state()
        await limiter.close()
        assert -5 <= charged <= 5  # the whole bucket
        assert after == charged - 600  # 900 used, 300 charged: it owes 600 more (a debt)
        assert state["big"]["tok_bucket"] == 300.0

    asyncio.run(go())
    client.close()


def test_limiter_reconnects_after_a_redis_restart() -> None:
    """The limiter's pooled connections go stale when Redis restarts; the next slot reconnects."""
    from tests._redis import RedisServer

    server = RedisServer()
    server.start()
    limiter = RedisRateLimiter(server.url(0), _limits(rpm=6000), reconnect_s=10)  # type: ignore[arg-type]

    async def go() -> None:
        async with limiter.slot("m", 1):
            pass
        server.stop()
        server.start()
        async with limiter.slot("m", 1):
            pass
        await limiter.pause("m", 0.01)
        await limiter.close()

    try:
        asyncio.run(go())
    finally:
        server.close()


class Verdict(BaseModel):
    score: float


@pytest.mark.parametrize("tokens_per_minute", [None, 1_000_000])
def test_a_paid_answer_is_kept_when_redis_goes_away_during_the_call(
    fake_llm: FakeLLMServer, tokens_per_minute: int | None
) -> None:
    """Redis dies while the judge is answering: the answer is paid for, so the run keeps it (one
    request, the score), the guard logs the spend it could not count, and the limiter's token
    correction is logged as not made. With a tokens-per-minute limit the correction used to raise
    first: the answer was dropped, its spend neither counted nor logged, and the run failed (a
    redelivery would pay again)."""
    from structlog.testing import capture_logs

    from scorers import Judge, PromptStep, create_scorer
    from scorers.judge import JudgeHooks, set_judge_hooks
    from tests._redis import RedisServer
    from tests.worker._workers import wait_for
    from worker._budget import BudgetGuard, Budgets, RedisLedger

    server = RedisServer()
    server.start()
    fake_llm.rule(Reply.json({"score": 0.5}, latency_ms=800))
    limits = ModelRateLimit(requests_per_minute=1000, tokens_per_minute=tokens_per_minute)
    limiter = RedisRateLimiter(server.url(0), lambda _: limits, reconnect_s=0.3)
    guard = BudgetGuard(RedisLedger(server.url(0), reconnect_s=0.3), Budgets(), prices={})
    scorer = create_scorer("graded", judge=Judge(model="openai/gpt-4o-mini", timeout=10)).generate_score(
        PromptStep("grade", lambda run: "Score it", output_schema=Verdict)
    )

    async def go() -> Any:
        task = asyncio.ensure_future(scorer.run(input="q", output="a"))
        assert await asyncio.to_thread(wait_for, lambda: bool(fake_llm.requests), 10)
        server.stop()  # the request is at the provider
        try:
            return await task
        finally:
            await limiter.close()

    set_judge_hooks(JudgeHooks(limiter=limiter, guard=guard))
    try:
        with capture_logs() as logs:
            result = asyncio.run(go())
    finally:
        set_judge_hooks(JudgeHooks())
        server.close()
    assert result.score == 0.5
    assert len(fake_llm.requests) == 1
    events = [e["event"] for e in logs]
    assert "judge_spend_not_counted" in events
    if tokens_per_minute:
        (update,) = [e for e in logs if e["event"] == "judge.limiter_not_updated"]
        assert (update["what"], update["error_type"]) == ("usage", "StoreUnavailableError")


def _a_jobs_run_cut_short(url: str, job_id: str, before_the_cut: Callable[[], Awaitable[None]]) -> list[Any]:
    """A backfill job's run of a priced judge scorer, its guard's ledger in the Redis at ``url``,
    stopped (its timeout, a worker's shutdown: a cancellation) once ``before_the_cut`` returns;
    the logs."""
    from structlog.testing import capture_logs

    from scorers import Judge, PromptStep, create_scorer
    from worker._budget import BudgetGuard, Budgets, RedisLedger, enter_run, parse_prices

    prices = parse_prices({"openai/fake-judge": {"input": 100.0, "output": 200.0}})
    guard = BudgetGuard(RedisLedger(url, reconnect_s=15.0), Budgets(), prices=prices)
    scorer = create_scorer("graded", judge=Judge(model="openai/fake-judge", timeout=10)).generate_score(
        PromptStep("grade", lambda run: "Score it", output_schema=Verdict)
    )

    async def the_jobs_run() -> Any:
        enter_run("t:s:graded", "graded", job_id, 4, version="1", redelivery=False)
        return await scorer.run(input="q", output="a")

    async def go() -> None:
        task = asyncio.ensure_future(the_jobs_run())
        await before_the_cut()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    set_judge_hooks(JudgeHooks(guard=guard))
    try:
        with capture_logs() as logs:
            asyncio.run(go())
    finally:
        set_judge_hooks(JudgeHooks())
    return logs


@pytest.mark.parametrize("answer", ["ok", "503"])
def test_a_job_calls_write_cut_short_by_the_runs_end_is_named_not_counted(fake_llm: FakeLLMServer, answer: str) -> None:
    """A backfill job's run: the judge answered (a score, or a 503 its cap counts), and the write
    counting the call in the job's spend waits for a Redis that is away (reconnecting, up to 15
    s); the run is stopped meanwhile (its timeout, a worker's shutdown: a cancellation). The call
    is not counted: the guard says so (`judge_spend_not_counted`), as for a write that failed.
    The cancellation went through the guard without a word, so the job's `judge_calls` was short
    of the requests the judge received, the shortfall named nowhere."""
    from tests._redis import RedisServer
    from tests.worker._workers import wait_for

    server = RedisServer()
    server.start()
    slow = 800  # (ms: Redis is stopped while the judge answers)
    fake_llm.rule(
        Reply.json({"score": 0.5}, latency_ms=slow) if answer == "ok" else Reply.error(503, "x", latency_ms=slow)
    )

    async def redis_stopped_while_the_write_waits() -> None:
        assert await asyncio.to_thread(wait_for, lambda: bool(fake_llm.requests), 10)
        server.stop()  # the request is at the judge: the write after its answer reconnects
        await asyncio.sleep(1.5)  # (the answer is in: its write is reconnecting)

    try:
        logs = _a_jobs_run_cut_short(server.url(0), "bf-cut", redis_stopped_while_the_write_waits)
    finally:
        server.close()
    assert len(fake_llm.requests) == 1
    (said,) = [e for e in logs if e["event"] == "judge_spend_not_counted"]
    assert (said["scorer"], said["model"], said["error"]) == ("graded", "openai/fake-judge", "CancelledError")
    assert said["cost_usd"] > 0 if answer == "ok" else said["cost_usd"] == 0.0  # (a failed call costs nothing)


def test_a_job_calls_write_redis_ran_then_cut_short_is_not_said_uncounted(
    own_redis: Any, fake_llm: FakeLLMServer
) -> None:
    """The write counting an answered call reaches Redis, which runs it (fsynced) and dies before
    its reply is sent; the run is stopped while the write reconnects. The README said a job's
    `judge_calls` is short of the calls the judge received "by those lines alone"
    (`judge_spend_not_counted`): here the call is counted, and a line was written all the same
    (the guard cannot know: the reply is lost). Short by at most those lines, it says now."""
    from tests.worker._reply_cut import ReplyCut
    from tests.worker._workers import wait_for
    from worker._budget import job_spend

    def the_count(request: bytes) -> bool:  # (not the read before the call, which names the job's limit)
        return b"EVALSHA" in request and b"spend:job:bf-ran" in request and b"budget:job:" not in request

    proxy = ReplyCut(own_redis, the_count, own_redis.stop)
    proxy.arm()
    fake_llm.rule(Reply.json({"score": 0.5}))

    async def redis_ran_the_write_and_died() -> None:
        assert await asyncio.to_thread(wait_for, proxy.cut.is_set, 10)
        await asyncio.sleep(0.5)  # (the write is reconnecting)

    try:
        logs = _a_jobs_run_cut_short(proxy.url(0), "bf-ran", redis_ran_the_write_and_died)
    finally:
        proxy.close()
    own_redis.start()
    with own_redis.client() as client:
        counted = job_spend(client, "bf-ran").calls
    said = [e for e in logs if e["event"] == "judge_spend_not_counted"]
    assert len(fake_llm.requests) == 1
    assert (counted, len(said)) == (1, 1), (counted, said)  # (counted, and a line that it may not be)
    assert len(fake_llm.requests) - counted <= len(said)
