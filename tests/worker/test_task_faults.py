"""The task's fault handling (issue 10 review): a failure of the machinery around scoring never
acks and drops a message, never counts as a crash, never burns the retry budget.

Real Redis (DB 11 of the session's server), the real task body (``apply``) and, where the
finding is about the worker, real ``celery -A worker worker`` processes.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scorers import create_scorer
from scorers.judge import get_judge_hooks, set_judge_hooks
from tests._redis import RedisServer, free_port
from tests.worker._batches import OUTPUT, batch, payload
from tests.worker._fault_workers import FaultWorker
from tests.worker._workers import read_scores, wait_for
from tests.worker.fault_scorers import SPINNING_KEY
from tracing import CelerySink
from tracing.queue import ScoreBatch
from worker._app import TracescoreApp, create_app
from worker._limiter import RedisRateLimiter
from worker._loop import run_coro, stop_loop
from worker._runtime import get_runtime, reset_runtime
from worker._scoring import ScoringDeps, StoreUnavailableError, score_batch
from worker._settings import ModelRateLimit, SettingsError, load_settings
from worker.store import DeadLetter, DeliveryLog, MemoryScoreStore, new_token


def _dlq(redis_url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


@pytest.fixture
def app(redis_url: str) -> Iterator[TracescoreApp]:
    """An app on DB 11 whose task runs in this process (``apply``); its runtime torn down after."""
    hooks = get_judge_hooks()
    reset_runtime()
    settings = load_settings(
        broker_url=redis_url, scorers="tests.worker.sample_scorers", writer="none", max_payload_bytes=4096
    )
    yield create_app(settings)
    runtime = reset_runtime()
    if runtime is not None:
        run_coro(runtime.store.close(), 5)
        run_coro(runtime.dead_letters.close(), 5)
        run_coro(runtime.limiter.close(), 5)
    stop_loop()
    set_judge_hooks(hooks)


# --- 1. A loop wait that runs out hands the message back; nothing is acked and lost ---------


def test_batches_waiting_behind_a_blocked_loop_are_all_scored_once(redis_url: str, tmp_path: Path) -> None:
    """Threads pool, one shared event loop: a sync step blocks it for the run timeout (34 s,
    above the 30 s the task used to wait for its store calls). Every batch that arrived
    meanwhile is scored exactly once (they used to time out on count_delivery and be acked
    and lost), and the blocking run is a `timeout` record."""
    scores_path = tmp_path / "scores.jsonl"
    env = {
        "TRACESCORE_RUN_TIMEOUT_SECONDS": "34",
        "TRACESCORE_TASK_SOFT_TIME_LIMIT": "50",
        "TRACESCORE_TASK_TIME_LIMIT": "55",
        "TRACESCORE_VISIBILITY_TIMEOUT": "60",
    }
    worker = FaultWorker("blocked", redis_url, tmp_path, env=env, pool="threads", concurrency=6)
    flags = redis.Redis.from_url(redis_url)
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        try:
            sink.send(batch(range(1), ["spin_flagged"], salt="blocker"))
            assert wait_for(lambda: flags.exists(SPINNING_KEY) == 1, 30), worker.text()[-3000:]
            sent = time.time()  # the loop is blocked from here on
            for i in range(4):
                sink.send(batch(range(i * 3, i * 3 + 3), ["length"], salt="waiting"))
        finally:
            sink.close()
        assert wait_for(lambda: len(read_scores(scores_path)) >= 13, 150), worker.text()[-4000:]
        scores = read_scores(scores_path)
        per_score = collections.Counter(s["score_id"] for s in scores)
        assert len(per_score) == 13, per_score
        assert set(per_score.values()) == {1}, per_score
        (blocked,) = [s for s in scores if s["scorer_id"] == "spin_flagged"]
        assert blocked["error_type"] == "timeout"
        assert sorted(s["scorer_id"] for s in scores if s["scorer_id"] != "spin_flagged") == ["length"] * 12
        assert all(s["error_type"] is None for s in scores if s["scorer_id"] == "length")
        # They did wait behind the blocked loop, past the 30 s the task used to allow.
        assert min(s["scored_at"] for s in scores if s["scorer_id"] == "length") - sent > 30
        assert _dlq(redis_url) == []
        assert worker.proc.poll() is None
    finally:
        worker.stop()
        flags.close()


class _ProcessDied(BaseException):
    """Stands in for the process going down mid-delivery (SIGKILL, OOM kill)."""


def test_a_split_that_cannot_publish_requeues_the_message(app: TracescoreApp, redis_url: str) -> None:
    """The split's publishing fails (the broker is away): the message is handed back (Reject
    with requeue), not failed and acked."""
    task = app.score_batch_task
    raw = payload(range(3), ["length"], salt="split-fail")
    store = get_runtime(app.settings).store
    real_existing = store.existing

    async def process_dies(score_ids: Any) -> Any:
        raise _ProcessDied

    # The first delivery's process goes down while scoring (nothing of the task runs after it).
    store.existing = process_dies  # type: ignore[method-assign]
    with pytest.raises(_ProcessDied):
        task.apply(args=[raw], task_id="split-fail")
    store.existing = real_existing  # type: ignore[method-assign]

    def broken_publish(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("broker away")

    task.apply_async = broken_publish  # type: ignore[method-assign]
    try:
        result = task.apply(args=[raw], task_id="split-fail")
    finally:
        del task.apply_async
    assert result.state == "REJECTED", result.state
    assert result.result.requeue is True
    assert _dlq(redis_url) == []


# --- 2. Only deliveries that vanished count as crashes ---------------------------------------


def test_a_batch_requeued_for_redis_four_times_is_neither_split_nor_dead_lettered(
    app: TracescoreApp, redis_url: str
) -> None:
    """Redis is away four times while the batch is being scored (StoreUnavailableError →
    Reject(requeue=True)); the fifth delivery scores it whole: no split, no dead letter. (Each
    requeue used to count as a crash: the batch was split on the second delivery, and a one-run
    message was dead-lettered as too_many_deliveries on the fourth.)"""
    task = app.score_batch_task
    runtime = get_runtime(app.settings)
    store = runtime.store
    real_existing = store.existing
    outages = collections.Counter[str]()

    async def flaky_existing(score_ids: Any) -> Any:
        key = "many" if len(score_ids) > 1 else "one"
        if outages[key] < 4:
            outages[key] += 1
            raise StoreUnavailableError("Redis is unreachable: existing failed (test outage)")
        return await real_existing(score_ids)

    store.existing = flaky_existing  # type: ignore[method-assign]
    many = payload(range(3), ["length"], salt="requeued-many")
    one = payload(range(1), ["length"], salt="requeued-one")
    for _ in range(4):
        assert task.apply(args=[many], task_id="requeued-many").state == "REJECTED"
        assert task.apply(args=[one], task_id="requeued-one").state == "REJECTED"
    assert task.apply(args=[many], task_id="requeued-many").result["scored"] == 3
    assert task.apply(args=[one], task_id="requeued-one").result["scored"] == 1
    assert _dlq(redis_url) == []


def test_a_requeue_is_one_log_line_with_its_reason_and_no_traceback(
    app: TracescoreApp, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery logged every ``Reject(requeue=True)`` at WARNING with a traceback, which read like a
    crash; it is one line naming the reason. Celery's other task logs keep their tracebacks."""
    import logging
    import sys

    task = app.score_batch_task
    store = get_runtime(app.settings).store
    real_existing = store.existing

    async def away(score_ids: Any) -> Any:
        raise StoreUnavailableError("Redis is unreachable: existing failed (test outage)")

    store.existing = away  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="celery.app.trace"):
            assert task.apply(args=[payload(range(2), ["length"], salt="one-line")]).state == "REJECTED"
    finally:
        store.existing = real_existing  # type: ignore[method-assign]
    [record] = [r for r in caplog.records if r.name == "celery.app.trace"]
    assert record.levelno == logging.WARNING
    assert "Redis is unreachable" in record.getMessage()
    assert record.exc_info is None
    assert "Traceback" not in caplog.text

    try:
        raise RuntimeError("a task's own failure")
    except RuntimeError:
        failure = logging.LogRecord("celery.app.trace", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    failure.data = {"description": "raised unexpected"}
    assert logging.getLogger("celery.app.trace").filter(failure)
    assert failure.exc_info is not None


def test_delivery_marks_are_idempotent_and_outlive_a_redis_outage(redis_server: RedisServer) -> None:
    """A delivery token sent twice (redis-py re-sending after a lost reply) is one delivery; an
    end that could not be written while Redis was down is written before the next delivery,
    so it is not counted as a crash."""

    async def go() -> tuple[int, int, int]:
        log = DeliveryLog(redis_server.url(12), ttl_s=60, reconnect_s=0.5)
        first = new_token()
        await log.start("m1", first)
        again = await log.start("m1", first)  # the same delivery, its command re-sent
        redis_server.stop()
        try:
            written = await log.end("m1", first)
        finally:
            redis_server.start()
        assert not written
        second = new_token()
        crashes = await log.start("m1", second)
        await log.end("m1", second)
        crashed = new_token()
        await log.start("m1", crashed)  # never ends: its process died
        after_crash = await log.start("m1", new_token())
        await log.close()
        return again, crashes, after_crash

    try:
        assert asyncio.run(go()) == (0, 0, 1)
    finally:
        redis_server.client(12).flushdb()


# --- 3. Retries wait inside the visibility timeout -------------------------------------------


def test_max_eta_fits_inside_the_visibility_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ETA message is held unacked until it runs: the wait plus the hard limit must stay under
    the visibility timeout. The default fits (it was 900 s against 360 s); a value that does not
    fit is refused by name; tight timeouts lower the default instead."""
    settings = load_settings()
    assert settings.max_eta_seconds + settings.task_time_limit < settings.visibility_timeout
    with pytest.raises(SettingsError, match=r"TRACESCORE_MAX_ETA_SECONDS \(900\).*TRACESCORE_VISIBILITY_TIMEOUT"):
        load_settings(max_eta_seconds=900)
    monkeypatch.setenv("TRACESCORE_MAX_ETA_SECONDS", "61")
    with pytest.raises(SettingsError, match="TRACESCORE_MAX_ETA_SECONDS"):
        load_settings()
    monkeypatch.delenv("TRACESCORE_MAX_ETA_SECONDS")
    tight = load_settings(task_soft_time_limit=5, task_time_limit=6, visibility_timeout=8)
    assert tight.max_eta_seconds + tight.task_time_limit < tight.visibility_timeout


# --- 4. Redis away inside a step requeues instead of burning the retry budget ----------------


class _CheckpointsAway(MemoryScoreStore):
    async def put_checkpoint(self, score_id: str, partial: Any, ttl_s: int) -> None:
        raise StoreUnavailableError("Redis is unreachable: put_checkpoint failed (test outage)")


@pytest.mark.parametrize("final_attempt", [False, True])
def test_a_checkpoint_lost_to_a_redis_outage_requeues_the_batch(final_attempt: bool) -> None:
    """The step finished but its checkpoint could not be saved (Redis away): the batch raises
    StoreUnavailableError (the task's Reject(requeue=True)) and records nothing. It used to be a
    transient run failure (a retry from the budget) or, on the last attempt, an error record."""

    async def pre(run: Any) -> int:
        return 1

    two_steps = create_scorer("two-steps", type="agent").preprocess(pre).generate_score(lambda run: 1.0)
    store = _CheckpointsAway()
    deps = ScoringDeps(registry={"two-steps": two_steps}, store=store, checkpoint="all")
    with pytest.raises(StoreUnavailableError):
        asyncio.run(score_batch(batch(range(2), ["two-steps"], salt="ckpt"), deps, final_attempt=final_attempt))
    assert store.records == {}


def test_a_rate_limit_slot_with_redis_away_fails_as_store_unavailable_in_bounded_time() -> None:
    """The limiter's slot acquisition is under the same reconnect deadline and translation as
    every other Redis call: StoreUnavailableError (a requeue), not a raw redis ConnectionError
    failing the run."""
    nowhere = f"redis://:nopass@127.0.0.1:{free_port()}/0"
    limiter = RedisRateLimiter(nowhere, lambda model: ModelRateLimit(requests_per_minute=60), reconnect_s=0.5)

    async def take() -> None:
        async with asyncio.timeout(30):
            async with limiter.slot("openai/x", 10):
                pass

    with pytest.raises(StoreUnavailableError, match="try_acquire"):
        asyncio.run(take())


# --- 7. The task measures a message as the guard does ----------------------------------------


def test_a_cjk_payload_just_under_the_cap_is_scored(app: TracescoreApp, redis_url: str) -> None:
    """The guard counts UTF-8 bytes; the task used ASCII-escaped JSON (a CJK character 6 bytes,
    not 3), so a message the guard accepted was dead-lettered as payload_too_large."""
    raw = payload(range(1), ["length"], salt="cjk")
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "答" * 1000}]}]
    raw["requests"][0]["spans"][0]["attributes"][OUTPUT] = json.dumps(answer, ensure_ascii=False)
    utf8 = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    escaped = len(json.dumps(raw, separators=(",", ":")))
    cap = app.settings.max_payload_bytes
    assert utf8 < cap < escaped, (utf8, cap, escaped)
    ScoreBatch.model_validate(raw)
    result = app.score_batch_task.apply(args=[raw], task_id="cjk")
    assert result.result["scored"] == 1, result.result
    assert _dlq(redis_url) == []


# --- 8. A letter that cannot be written with its payload is written without it ---------------

_DEEP: Any = [1]
for _ in range(300):
    _DEEP = [_DEEP]

# Payloads the task receives without the consumer's screen (applied in process): each passes the
# task's own size check, is no ScoreBatch, and makes a letter no store can encode with its payload.
_UNWRITABLE = {
    # JSON writes it (nested 300 deep), the letter's encoder refuses past 254 levels.
    "too-deep": {"batch_id": "deep-1", "requests": [], "extra": _DEEP},
    # JSON escapes a lone surrogate; no UTF-8 store can hold it.
    "lone-surrogate": {"batch_id": "sur-1", "requests": 5, "extra": "\ud800 AGENT TEXT"},
    # ... nor a batch id holding one: the letter without its payload must not keep it either.
    "surrogate-batch-id": {"batch_id": "b-\ud800", "requests": 5},
}


@pytest.mark.parametrize("raw", list(_UNWRITABLE.values()), ids=list(_UNWRITABLE))
def test_a_letter_that_cannot_be_encoded_is_kept_without_its_payload(
    app: TracescoreApp, redis_url: str, raw: dict[str, Any]
) -> None:
    """The letter failed to be written, so did the task's fallback letter (the same payload), and
    the message was requeued (Reject) on every delivery, a second apart, for ever. Now the letter
    is written without the payload, saying why; the message leaves the queue, counted once."""
    task = app.score_batch_task
    for _ in range(3):  # the same message, delivered again (as a requeue brings it back)
        result = task.apply(args=[raw], task_id="unwritable-1")
        assert result.state == "SUCCESS", (result.state, result.result)
    [letter] = _dlq(redis_url)
    assert letter.reason == "invalid_payload"
    assert letter.payload is None
    assert letter.retryable is False
    assert "payload was not kept" in letter.error, letter.error
    assert letter.batch_id in ("deep-1", "sur-1", None)
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hgetall("tracescore:dlq:reasons") == {b"invalid_payload": b"1"}
    finally:
        client.close()
