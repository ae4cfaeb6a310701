"""The store contracts (ScoreStore, JobStats, DeadLetters), each on Redis (DB 11) and in memory."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from scorers import ScoreResult
from tracing import ScoreRecord, score_id_for
from worker import _keys
from worker.store import (
    DeadLetter,
    DeadLetters,
    JobStats,
    MemoryDeadLetters,
    MemoryScoreStore,
    RedisDeadLetters,
    RedisJobStats,
    RedisScoreStore,
    ScoreStore,
    StoreUnavailableError,
    SyncRedisDeadLetters,
    claim,
    delivery_owner,
    process_owner,
)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each test runs against both implementations."""
    if request.param == "memory":
        yield MemoryScoreStore()
        return
    yield RedisScoreStore(request.getfixturevalue("redis_url"))


@pytest.fixture(params=["memory", "redis"])
def letters(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryDeadLetters()
        return
    yield RedisDeadLetters(request.getfixturevalue("redis_url"))


def _record(n: int, **kw: Any) -> ScoreRecord:
    trace, span = f"{n:032x}", f"{n:016x}"
    return ScoreRecord(score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s", **kw)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_implementations_satisfy_their_protocols(redis_url: str) -> None:
    """Each implementation is an instance of its protocol (methods and the ``jobs`` property)."""
    for store in (MemoryScoreStore(), RedisScoreStore(redis_url)):
        assert isinstance(store, ScoreStore)
        assert isinstance(store.jobs, JobStats)
    assert isinstance(RedisJobStats(redis_url), JobStats)
    for dead in (MemoryDeadLetters(), RedisDeadLetters(redis_url)):
        assert isinstance(dead, DeadLetters)


# --- ScoreStore: records, claims, checkpoints ----------------------------------------------------


def test_put_records_first_writer_wins(store: Any) -> None:
    """A score id is recorded once; the second put reports a duplicate and keeps the first."""

    async def go() -> tuple[list[bool], list[bool], list[ScoreRecord]]:
        first = await store.put_records([_record(1, score=0.1), _record(2, score=0.2)], "w1", 60)
        second = await store.put_records([_record(1, score=0.9)], "w2", 60)
        found = await store.records_for_trace(f"{1:032x}")
        await store.close()
        return first, second, found

    first, second, found = run(go())
    assert first == [True, True]
    assert second == [False]
    assert [r.score for r in found] == [0.1]


def test_a_record_is_forgotten_after_its_ttl(store: Any) -> None:
    """A record lasts the TTL of its put, in memory as in Redis (the in-memory store kept every
    record for good: an app scoring in process grew by a few KB a score)."""

    async def go() -> tuple[set[str], set[str]]:
        kept, short = _record(1), _record(2)
        await store.put_records([kept], "w", 600)
        await store.put_records([short], "w", 1)
        before = set(await store.existing([kept.score_id, short.score_id]))
        deadline = time.monotonic() + 10
        after = before
        while short.score_id in after and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            after = set(await store.existing([kept.score_id, short.score_id]))
        await store.close()
        return before, after

    before, after = run(go())
    assert before == {_record(1).score_id, _record(2).score_id}
    assert after == {_record(1).score_id}


def test_the_memory_store_keeps_its_newest_records_and_those_still_owed_to_a_sink() -> None:
    """With max_records the oldest records go first, except one a sink has yet to take: it and
    the newer ones stay until the sink settles it."""

    async def go() -> tuple[int, set[str], str, str]:
        store = MemoryScoreStore(sinks=["otlp"], max_records=3)
        await store.put_records([_record(n) for n in range(5)], "w", 600)
        while_owed = len(store.records)
        lease = store.outbox.lease("otlp", 100, 30)
        store.outbox.ack(lease, list(lease.attempts))
        await store.put_records([_record(5)], "w", 600)
        states = store.outbox.states("otlp", [_record(0).score_id, _record(5).score_id])
        return while_owed, set(store.records), states[_record(0).score_id], states[_record(5).score_id]

    while_owed, kept, forgotten, newest = run(go())
    assert while_owed == 5
    assert kept == {_record(n).score_id for n in (3, 4, 5)}
    assert (forgotten, newest) == ("none", "pending")  # the outbox keeps nothing of a forgotten record


def test_concurrent_puts_record_exactly_once(store: Any) -> None:
    """Many concurrent puts of the same score: exactly one is new."""

    async def go() -> list[bool]:
        results = await asyncio.gather(*(store.put_records([_record(7, score=i)], f"w{i}", 60) for i in range(20)))
        await store.close()
        return [r[0] for r in results]

    assert sum(run(go())) == 1


def test_claims_exclude_other_owners_until_released(store: Any) -> None:
    """A claim blocks other owners, is re-entrant for its owner, and release frees it."""

    async def go() -> tuple[set[str], set[str], set[str], set[str]]:
        a = await store.claim(["x", "y"], "w1", 60)
        b = await store.claim(["x", "z"], "w2", 60)
        again = await store.claim(["x"], "w1", 60)
        await store.release(["x"], "w2")  # not w2's: no effect
        await store.release(["x"], "w1")
        c = await store.claim(["x"], "w2", 60)
        await store.close()
        assert [a.recorded, b.recorded, again.recorded, c.recorded] == [{}, {}, {}, {}]
        return a.held, b.held, again.held, c.held

    a, b, again, c = run(go())
    assert a == {"x", "y"}
    assert b == {"z"}
    assert again == {"x"}
    assert c == {"x"}


def test_claim_takes_over_a_dead_local_owner_only(store: Any) -> None:
    """``claim`` takes the claims of a process of this host that no longer exists; a live
    owner's (this process, another delivery) and another host's are left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = delivery_owner(process_owner())
    host = socket.gethostname()

    async def go() -> tuple[set[str], dict[str, str]]:
        await store.claim(["dead"], f"{host}:{gone.pid}:d1234", 60)
        await store.claim(["old-format"], f"{host}:{gone.pid}", 60)  # owners before deliveries had ids
        await store.claim(["alive"], delivery_owner(process_owner()), 60)
        await store.claim(["elsewhere"], f"{host}-other:{gone.pid}:d1234", 60)
        held = (await claim(store, ["dead", "old-format", "alive", "elsewhere", "free"], me, 60)).held
        owners = await store.claim_owners(["dead", "old-format", "alive", "elsewhere", "free"])
        await store.close()
        return held, owners

    held, owners = run(go())
    assert held == {"dead", "old-format", "free"}
    assert {owners[s] for s in held} == {me}
    assert owners["alive"].startswith(f"{host}:{os.getpid()}:d")
    assert owners["alive"] != me


def test_recording_clears_checkpoint_and_claim_and_counts_job(store: Any) -> None:
    """put_records drops the checkpoint and the owner's claim, and counts scored/failed per job
    and failure reason in ``store.jobs``."""

    async def go() -> tuple[dict[str, Any], dict[str, int], dict[str, int], dict[str, str]]:
        rec = _record(3, score=1.0, job_id="job")
        await store.claim([rec.score_id], "w", 60)
        await store.put_checkpoint(rec.score_id, ScoreResult(run_id="r", completed_steps=["preprocess"]), 60)
        before = await store.get_checkpoints([rec.score_id])
        await store.put_records([rec, _record(4, job_id="job", error_type="JudgeAuthError")], "w", 60)
        after = await store.get_checkpoints([rec.score_id])
        progress = await store.jobs.progress("job")
        failures = await store.jobs.recent_failures()
        owners = await store.claim_owners([rec.score_id])
        await store.close()
        return {"before": before, "after": after}, progress, failures, owners

    cps, progress, failures, owners = run(go())
    assert next(iter(cps["before"].values())).completed_steps == ["preprocess"]
    assert cps["after"] == {}
    assert progress == {"scored": 1, "failed": 1, "failed:JudgeAuthError": 1}
    assert failures == {"JudgeAuthError": 1}
    assert owners == {}


def test_records_and_counts_keep_text_outside_ascii(store: Any) -> None:
    """A record's fields and its job's counters read back as put when they hold text outside
    ASCII (the Redis store sends each record's keys and arguments as UTF-8 bytes it encodes)."""
    job = "jöb-✓"

    async def go() -> tuple[list[bool], list[ScoreRecord], dict[str, int]]:
        scored = _record(41, score=0.5, job_id=job, reason="naïve ✓ 🙂", span_name="ağent")
        failed = _record(42, job_id=job, error_type="Ошибка", error_message="сломано ✗")
        fresh = await store.put_records([scored, failed], "w", 60)
        back = [*await store.records_for_trace(f"{41:032x}"), *await store.records_for_trace(f"{42:032x}")]
        progress = await store.jobs.progress(job)
        await store.close()
        return fresh, back, progress

    fresh, back, progress = run(go())
    assert fresh == [True, True]
    assert [(r.reason, r.span_name, r.error_type, r.error_message, r.job_id) for r in back] == [
        ("naïve ✓ 🙂", "ağent", None, None, job),
        (None, "", "Ошибка", "сломано ✗", job),
    ]
    assert progress == {"scored": 1, "failed": 1, "failed:Ошибка": 1}


def test_retryable_error_record_can_be_replaced_once(store: Any) -> None:
    """A retryable error record gives way to a score (job counts corrected); a score never does."""

    async def go() -> tuple[list[bool], list[bool], list[bool], dict[str, int], float | None]:
        err = _record(9, job_id="j", error_type="JudgeTimeoutError", retryable=True)
        first = await store.put_records([err], "w", 60)
        second = await store.put_records([_record(9, job_id="j", score=0.5)], "w", 60)
        third = await store.put_records([_record(9, job_id="j", score=0.7)], "w", 60)
        progress = await store.jobs.progress("j")
        (kept,) = await store.records_for_trace(f"{9:032x}")
        await store.close()
        return first, second, third, progress, kept.score

    first, second, third, progress, kept = run(go())
    assert (first, second, third) == ([True], [True], [False])
    assert kept == 0.5
    assert progress["scored"] == 1
    assert progress["failed"] == 0


def test_another_jobs_final_record_makes_a_failure_that_jobs_skip(store: Any) -> None:
    """Job a's retryable failure replaced by job b's score (or live traffic's): a counts a skip,
    not a failure, once: a's own retry meeting the run (before or after), the put sent again
    after a lost reply, and a later retryable failure of a third job change nothing more."""
    failed = _record(31, job_id="a", error_type="TimeoutError", retryable=True)
    met_first = _record(32, job_id="a", error_type="TimeoutError", retryable=True)
    by_b, by_live = _record(31, job_id="b", score=0.5), _record(32, score=0.6)

    async def go() -> tuple[list[list[bool]], int, dict[str, int], dict[str, int]]:
        fresh = [await store.put_records([failed, met_first], "w", 60)]
        await store.jobs.count_skipped_once("a", "already_scored", [met_first.score_id])  # a's retry first
        fresh.append(await store.put_records([by_b, by_live], "w", 60))
        fresh.append(await store.put_records([by_b], "w", 60))  # its reply was lost: sent again
        again = await store.jobs.count_skipped_once("a", "already_scored", [failed.score_id, met_first.score_id])
        a, b = await store.jobs.progress("a"), await store.jobs.progress("b")
        await store.close()
        return fresh, again, a, b

    fresh, again, a, b = run(go())
    assert fresh == [[True, True], [True, True], [True]]
    assert again == 0
    assert {k: v for k, v in a.items() if v} == {"skipped": 2, "skipped:already_scored": 2}
    assert b == {"scored": 1}


def _totals(progress: dict[str, int]) -> dict[str, int]:
    """A job's counts that are not zero (a corrected count stays in Redis' hash as 0)."""
    return {k: v for k, v in progress.items() if v}


def _failure(job: str | None, error: str = "TimeoutError") -> ScoreRecord:
    return _record(33, job_id=job, error_type=error, retryable=True)


def _score(job: str | None) -> ScoreRecord:
    return _record(33, job_id=job, score=0.5)


# Each case: puts of one score (a job's or live traffic's record, retryable failure or score), and
# a job's delivery meeting another's record (``count_skipped_once``, as ``score_batch`` does):
# each job counts the score once, as its own record's outcome or as a skip. (Job a's count went
# to 2 of 1 expected in each, and a backfill waiting for its total ended with a score on its way:
# audit.)
_CHAINS: dict[str, tuple[list[ScoreRecord | str], dict[str, dict[str, int]]]] = {
    "a's retry fails again after b's failure": (
        [_failure("a"), _failure("b", "RateLimit"), _failure("a")],
        {"a": {"failed": 1, "failed:TimeoutError": 1}, "b": {"skipped": 1, "skipped:already_scored": 1}},
    ),
    "a's retry scores it after b's failure": (
        [_failure("a"), _failure("b", "RateLimit"), _score("a")],
        {"a": {"scored": 1}, "b": {"skipped": 1, "skipped:already_scored": 1}},
    ),
    "b scores it after its failure, then a's retry meets it": (
        [_failure("a"), _failure("b", "RateLimit"), _score("b"), "a"],
        {"a": {"skipped": 1, "skipped:already_scored": 1}, "b": {"scored": 1}},
    ),
    "live traffic fails then scores it, then a's retry meets it": (
        [_failure("a"), _failure(None, "RateLimit"), _score(None), "a"],
        {"a": {"skipped": 1, "skipped:already_scored": 1}},
    ),
    "b's put refused for a's score (b's claim lapsed), twice": (
        [_score("a"), _score("b"), _score("b")],
        {"a": {"scored": 1}, "b": {"skipped": 1, "skipped:already_scored": 1}},
    ),
    "a's second delivery's put refused for its own score": (
        [_score("a"), _record(33, job_id="a", score=0.7)],
        {"a": {"scored": 1}},
    ),
    "a met live traffic's failure, then scored it": (
        [_failure(None), "a", _score("a")],
        {"a": {"scored": 1}},
    ),
}


@pytest.mark.parametrize("chain", list(_CHAINS))
def test_a_job_counts_each_score_once_whoever_records_it(store: Any, chain: str) -> None:
    steps, expected = _CHAINS[chain]
    assert run(_play(store, steps)) == {"a": {}, "b": {}, **expected}


async def _play(store: Any, steps: list[ScoreRecord | str]) -> dict[str, dict[str, int]]:
    """Each step in turn (a record put, a job's skip counted by its id, ``"end"``: job a
    finishes); then jobs a's and b's totals."""
    for step in steps:
        if step == "end":
            await store.jobs.finish("a")
        elif isinstance(step, str):
            await store.jobs.count_skipped_once(step, "already_scored", [_score(None).score_id])
        else:
            await store.put_records([step], "w", 60)
    progress = {job: _totals(await store.jobs.progress(job)) for job in "ab"}
    await store.close()
    return progress


async def _one_id_twice(
    store: Any, n: int, before: Callable[[], Awaitable[None]] | None = None
) -> tuple[list[bool], dict[str, dict[str, int]]]:
    """Job a's retryable failure of run ``n``, then (after ``before``) one put of job c's
    retryable failure and job b's score of it: what the put answered, and jobs a, b, c's counts."""
    await store.put_records([_record(n, job_id="a", error_type="TimeoutError", retryable=True)], "w", 60)
    if before is not None:
        await before()
    c = _record(n, job_id="c", error_type="RateLimit", retryable=True)
    fresh = await store.put_records([c, _record(n, job_id="b", score=0.5)], "w", 60)
    progress = {job: await store.jobs.progress(job) for job in "abc"}
    await store.close()
    return fresh, progress


_SKIP = {"skipped": 1, "skipped:already_scored": 1}


def test_one_score_id_twice_in_one_put_is_put_in_turn(store: Any) -> None:
    """Job a's failure, then one put of job c's retryable failure and job b's score of the same
    run: as two puts would, both are stored (the Redis script read every stored value before
    writing, and put b's score over a value it never read: review); a and c count a skip."""
    fresh, progress = run(_one_id_twice(store, 34))
    assert fresh == [True, True]
    assert {job: _totals(counts) for job, counts in progress.items()} == {"a": _SKIP, "b": {"scored": 1}, "c": _SKIP}


def test_one_score_id_twice_in_one_put_stays_in_turn_through_a_key_repair(redis_url: str) -> None:
    """As above, with the run's claim key holding another Redis type: the repaired call was sent
    again after the next one, so b's score came first and c's failure was refused (review). (A
    job's counters of another type are refused now, not repaired: test_store_key_types.)"""
    store = RedisScoreStore(redis_url)

    async def break_the_claim() -> None:
        await store._redis.client.sadd(_keys.claim_key(_record(37, job_id="c").score_id), "not a claim")

    fresh, progress = run(_one_id_twice(store, 37, break_the_claim))
    assert fresh == [True, True]
    assert {job: _totals(counts) for job, counts in progress.items()} == {"a": _SKIP, "b": {"scored": 1}, "c": _SKIP}


def test_a_failure_of_a_job_whose_counters_expired_is_replaced_without_them(redis_url: str) -> None:
    """Job a's counters gone (their 7 days passed; a record may live longer): b's score of a's
    failed run makes no counters of a, which would hold -1 failed for another 7 days."""
    store = RedisScoreStore(redis_url)

    async def go() -> tuple[dict[str, int], dict[str, int]]:
        await store.put_records([_record(35, job_id="a", error_type="TimeoutError", retryable=True)], "w", 60)
        await store._redis.client.delete(_keys.job_key("a"))
        await store.put_records([_record(35, job_id="b", score=0.5)], "w", 60)
        progress = await store.jobs.progress("a"), await store.jobs.progress("b")
        await store.close()
        return progress

    a, b = run(go())
    assert a == {}
    assert b == {"scored": 1}


def test_a_jobs_own_retry_of_a_failure_whose_counters_expired_makes_no_negative_count(redis_url: str) -> None:
    """Job a's counters gone (a TTL of records above the job's 7 days), its own `dlq retry` then
    scoring its failed run: the run counts as a score of a, not as a move from a failure the
    counters no longer hold (they came back as failed -1, scored 1)."""
    store = RedisScoreStore(redis_url)

    async def go() -> dict[str, int]:
        await store.put_records([_record(36, job_id="a", error_type="TimeoutError", retryable=True)], "w", 60)
        await store._redis.client.delete(_keys.job_key("a"))
        await store.put_records([_record(36, job_id="a", score=0.5)], "w", 60)
        progress = await store.jobs.progress("a")
        await store.close()
        return progress

    assert run(go()) == {"scored": 1}


def test_a_finished_job_that_failed_keeps_its_counted_skips_for_its_dlq_retry(redis_url: str) -> None:
    """Job a's failure scored by job b before a finished: its set of counted skips went with
    a's end, and a's `dlq retry` counted the run skipped again (review). A job that recorded a
    failure keeps the set until it expires; one that did not drops it."""
    import redis as sync_redis

    from worker.backfill._state import RedisJobStore

    store, failed = RedisScoreStore(redis_url), _record(36, job_id="a", error_type="TimeoutError", retryable=True)

    async def convert() -> dict[str, int]:
        await store.put_records([failed], "w", 60)
        await store.put_records([_record(36, job_id="b", score=0.5)], "w", 60)
        await store.jobs.count_skipped_once("b", "already_scored", ["other"])
        progress = await store.jobs.progress("a")
        await store.close()
        return progress

    progress = run(convert())
    jobs = RedisJobStore(sync_redis.Redis.from_url(redis_url))
    jobs.finished("a")
    jobs.finished("b")
    assert jobs.client.exists(_keys.job_skips_key("a")) == 1
    assert jobs.client.exists(_keys.job_skips_key("b")) == 0

    async def dlq_retry() -> tuple[int, dict[str, int]]:
        stats = RedisJobStats(redis_url)
        again = await stats.count_skipped_once("a", "already_scored", [failed.score_id])
        progress = await stats.progress("a")
        await stats.close()
        return again, progress

    again, after = run(dlq_retry())
    assert again == 0
    assert after == progress
    jobs.client.close()


async def _until_gone(store: Any, score_id: str) -> None:
    deadline, found = time.monotonic() + 10, await store.existing([score_id])
    while found and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        found = await store.existing([score_id])


def test_a_finished_jobs_late_delivery_counts_nothing_more(store: Any) -> None:
    """Job a counted its 3 scores (one its own, two skips: live traffic's score, and b's that
    refused a's put) and finished. Its message delivered again (a worker killed before its ack,
    Celery's redelivery, `dlq retry`) met its set of counted skips dropped and counted them
    again, and its own record, expired since and made again, anew: 6 of 3 (review)."""
    ours, live, theirs = _record(40, job_id="a", score=0.1), _record(41, score=0.2), _record(42, job_id="b", score=0.3)

    async def go() -> tuple[dict[str, int], dict[str, int], bool]:
        await store.put_records([live, theirs], "w", 60)
        await store.put_records([ours], "w", 1)
        await store.jobs.count_skipped_once("a", "already_scored", [live.score_id])
        await store.put_records([theirs.model_copy(update={"job_id": "a", "score": 0.9})], "w", 60)
        done = await store.jobs.progress("a")
        await store.jobs.finish("a")
        await _until_gone(store, ours.score_id)
        await store.jobs.count_skipped_once("a", "already_scored", [live.score_id])  # the late delivery
        await store.put_records([theirs.model_copy(update={"job_id": "a", "score": 0.9})], "w", 60)
        (again,) = await store.put_records([ours], "w", 60)
        late = await store.jobs.progress("a")
        await store.close()
        return done, late, again

    done, late, again = run(go())
    assert done == {"scored": 1, "skipped": 2, "skipped:already_scored": 2}
    assert again  # (stored again: its TTL had passed)
    assert late == done


# Each case: job a's puts and deliveries (as in _CHAINS), a's end (``"end"``), then more: a
# finished job's scores still move from one outcome to another (its `dlq retry` scoring its
# failure), and its total stays.
_AFTER_THE_END: dict[str, tuple[list[ScoreRecord | str], dict[str, dict[str, int]]]] = {
    "a's retry scores its failure": (
        [_failure("a"), "end", _score("a")],
        {"a": {"scored": 1}},
    ),
    "b scores a's failure, then a's retry meets it": (
        [_failure("a"), "end", _score("b"), "a", _score("a")],
        {"a": {"skipped": 1, "skipped:already_scored": 1}, "b": {"scored": 1}},
    ),
    "b's failure replaced a's, then a's retry scores it": (
        [_failure("a"), _failure("b", "RateLimit"), "end", _score("a")],
        {"a": {"scored": 1}, "b": {"skipped": 1, "skipped:already_scored": 1}},
    ),
}


@pytest.mark.parametrize("chain", list(_AFTER_THE_END))
def test_a_finished_jobs_scores_still_change_outcome(store: Any, chain: str) -> None:
    steps, expected = _AFTER_THE_END[chain]
    assert run(_play(store, steps)) == {"a": {}, "b": {}, **expected}


@pytest.mark.parametrize(
    ("then", "expected_b"),
    [(_score("a"), {}), (_score("b"), {"scored": 1}), (_failure(None, "RateLimit"), {})],
    ids=["a's retry scores it", "b scores it", "live traffic fails it"],
)
def test_a_finished_jobs_late_failure_was_never_counted_so_replacing_it_moves_nothing(
    store: Any, then: ScoreRecord, expected_b: dict[str, int]
) -> None:
    """Job a scored the run and finished; the record expired, and a late delivery of a's message
    failed on it (a retryable failure, not counted: a's count was final). That failure replaced
    later (a's next `dlq retry`, another job, live traffic) was taken for one a had counted, and
    moved: a showed failed -1 and scored 2 of 1 (review's random search)."""

    async def go() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        await store.put_records([_score("a")], "w", 1)
        await store.jobs.finish("a")
        done = _totals(await store.jobs.progress("a"))
        await _until_gone(store, _score("a").score_id)
        await store.put_records([_failure("a")], "w", 60)  # the late delivery: not counted
        await store.put_records([then], "w", 60)
        await store.put_records([_failure("a", "Late")], "w", 60)  # and once more, late
        a, b = _totals(await store.jobs.progress("a")), _totals(await store.jobs.progress("b"))
        await store.close()
        return done, a, b

    done, a, b = run(go())
    assert done == {"scored": 1}
    assert a == done
    assert b == expected_b


def test_put_records_retried_after_a_lost_reply_is_new_again(store: Any) -> None:
    """The same record put twice (the client retrying after a dropped connection lost the first
    reply) is reported new both times and counted once, so it is still written back; a
    different record for the same score id stays a duplicate."""

    async def go() -> tuple[list[bool], list[bool], list[bool], dict[str, int]]:
        rec = _record(11, job_id="lost", score=0.4)
        first = await store.put_records([rec], "w", 60)
        retried = await store.put_records([rec], "w", 60)
        other = await store.put_records([_record(11, job_id="lost", score=0.9)], "w2", 60)
        progress = await store.jobs.progress("lost")
        await store.close()
        return first, retried, other, progress

    first, retried, other, progress = run(go())
    assert (first, retried, other) == ([True], [True], [False])
    assert progress == {"scored": 1}


# --- JobStats ------------------------------------------------------------------------------------


def test_skips_are_counted_beside_recorded_scores(store: Any) -> None:
    """count_skipped_once adds to the same job counters put_records counts into, by reason."""

    async def go() -> dict[str, int]:
        await store.put_records([_record(21, job_id="s", score=1.0)], "w", 60)
        await store.jobs.count_skipped_once("s", "already_scored", ["s1", "s2", "s3"])
        await store.jobs.count_skipped_once("s", "duplicate", ["duplicate:b:s1:2"])
        progress = await store.jobs.progress("s")
        await store.close()
        return progress

    assert run(go()) == {
        "scored": 1,
        "skipped": 4,
        "skipped:already_scored": 3,
        "skipped:duplicate": 1,
    }


def test_a_skip_another_job_caused_is_counted_once_per_score(store: Any) -> None:
    """A message retried for its deferred runs met the runs another job had scored again, and
    each meeting counted a skip: a job's counts passed its expected total (concurrency audit)."""

    async def go() -> tuple[list[int], dict[str, int], dict[str, int]]:
        added = [
            await store.jobs.count_skipped_once("a", "already_scored", ["s1", "s2"]),
            await store.jobs.count_skipped_once("a", "already_scored", ["s1", "s2", "s3"]),  # the retry
            await store.jobs.count_skipped_once("a", "already_scored", []),
            await store.jobs.count_skipped_once("b", "already_scored", ["s1"]),  # another job's own count
            # Past what one Lua call can take at a time (4,000 ids a SADD): the retry's ids, old
            # and new, across three chunks, two of them ending between old and new ones.
            await store.jobs.count_skipped_once("a", "already_scored", ["s3", *(f"m{i}" for i in range(9_001))]),
            await store.jobs.count_skipped_once("a", "already_scored", [f"m{i}" for i in range(3_999, 9_002)]),
        ]
        a, b = await store.jobs.progress("a"), await store.jobs.progress("b")
        await store.close()
        return added, a, b

    added, a, b = run(go())
    assert added == [2, 1, 0, 1, 9_001, 1]
    assert a == {"skipped": 9_005, "skipped:already_scored": 9_005}
    assert b == {"skipped": 1, "skipped:already_scored": 1}


def test_redis_job_stats_read_what_the_redis_store_counted(redis_url: str) -> None:
    """A RedisJobStats of its own (``tracescore status``) sees the counters the store wrote."""

    async def go() -> tuple[dict[str, int], dict[str, int]]:
        store, stats = RedisScoreStore(redis_url), RedisJobStats(redis_url)
        await store.put_records([_record(22, job_id="own", error_type="JudgeTimeoutError")], "w", 60)
        result = await stats.progress("own"), await stats.recent_failures()
        await store.close()
        await stats.close()
        return result

    progress, failures = run(go())
    assert progress == {"failed": 1, "failed:JudgeTimeoutError": 1}
    assert failures["JudgeTimeoutError"] >= 1


def test_redis_store_repairs_wrong_typed_keys_before_writing(redis_url: str) -> None:
    """Keys of ours holding another type (hand-edited) would fail the storing script halfway,
    leaving a record stored but not counted nor owed to its sinks: those the store can rebuild
    are deleted first, so every record of the call is stored whole, counted and queued for each
    sink; a claim key of the wrong type is taken as free."""
    import redis

    from worker import _keys
    from worker.store import RedisOutbox

    records = [_record(600 + n, job_id="typed", score=1.0) for n in range(250)]  # two script calls
    client = redis.Redis.from_url(redis_url)
    client.rpush(_keys.trace_key(records[3].trace_id), "not a set")
    client.sadd(_keys.claim_key(records[7].score_id), "not a claim")
    client.set(_keys.outbox_attempts_key("jsonl"), "not a hash")

    async def go() -> tuple[list[bool], set[str], dict[str, int]]:
        store = RedisScoreStore(redis_url, sinks=["jsonl"])
        held = (await claim(store, [records[7].score_id], "w", 60)).held
        fresh = await store.put_records(records, "w", 60)
        progress = await store.jobs.progress("typed")
        await store.close()
        return fresh, held, progress

    fresh, held, progress = run(go())
    assert fresh == [True] * len(records)
    assert held == {records[7].score_id}
    assert progress == {"scored": len(records)}
    assert client.type(_keys.trace_key(records[3].trace_id)) == b"set"
    outbox = RedisOutbox(redis_url)
    try:
        assert outbox.counts()["jsonl"].pending == len(records)
    finally:
        outbox.close()
    client.close()


def test_redis_store_refuses_a_wrong_typed_outbox_queue_whole(redis_url: str) -> None:
    """A sink's queue holding another type may be undelivered scores (an older version's): it is
    not deleted, and the call stores nothing (no record, no count) rather than a record owed to
    no one; the error names the key and is not retryable."""
    import redis

    from worker import _keys
    from worker.store import StoreKeyTypeError

    records = [_record(700 + n, job_id="refused", score=1.0) for n in range(3)]
    client = redis.Redis.from_url(redis_url)
    client.hset(_keys.outbox_key("jsonl"), "older", "undelivered")

    async def go() -> tuple[BaseException | None, dict[str, ScoreRecord], dict[str, int]]:
        store = RedisScoreStore(redis_url, sinks=["jsonl"])
        try:
            await store.put_records(records, "w", 60)
        except StoreKeyTypeError as exc:
            caught: BaseException | None = exc
        else:
            caught = None
        found = await store.existing([r.score_id for r in records])
        progress = await store.jobs.progress("refused")
        await store.close()
        return caught, found, progress

    caught, found, progress = run(go())
    assert isinstance(caught, StoreKeyTypeError)
    assert caught.key == _keys.outbox_key("jsonl")
    assert caught.category == "config"
    assert found == {}
    assert progress == {}
    assert client.hgetall(_keys.outbox_key("jsonl")) == {b"older": b"undelivered"}
    client.close()


def test_take_over_sent_again_still_holds(store: Any) -> None:
    """A take-over sent again (after a repair, or a reply lost) answers held, as the first did."""

    async def go() -> tuple[set[str], set[str]]:
        sid = _record(800).score_id
        first = await store.take_over([(sid, "")], "w2", 60)
        again = await store.take_over([(sid, "")], "w2", 60)
        await store.close()
        return first.held, again.held

    first, again = run(go())
    assert first == again == {_record(800).score_id}


def test_a_recorded_score_is_not_claimed_unless_its_record_may_be_replaced(store: Any) -> None:
    """A claim (and a take-over: a claim that vanished was often released by the put) refuses a
    score whose record the put would keep, and names that record's job; one marked retryable
    is claimed, as the put replaces it. Scoring the refused one would pay for a record the put
    then throws away: another delivery recorded it since this one read the records."""
    kept, other_job, replaceable, free = (
        _record(900, score=1.0, job_id="j1"),
        _record(901, score=0.5),
        _record(902, error_type="JudgeRateLimitError", retryable=True),
        _record(903),
    )

    async def go() -> tuple[Any, Any]:
        await store.claim([kept.score_id, other_job.score_id, replaceable.score_id], "w1", 60)
        await store.put_records([kept, other_job, replaceable], "w1", 60)
        ids = [kept.score_id, other_job.score_id, replaceable.score_id, free.score_id]
        claimed = await store.claim(ids, "w2", 60)
        taken = await store.take_over([(s, "w2") for s in ids], "w3", 60)
        await store.close()
        return claimed, taken

    claimed, taken = run(go())
    recorded = {kept.score_id: "j1", other_job.score_id: ""}
    assert (claimed.held, claimed.recorded) == ({replaceable.score_id, free.score_id}, recorded)
    assert (taken.held, taken.recorded) == ({replaceable.score_id, free.score_id}, recorded)


# --- DeadLetters ---------------------------------------------------------------------------------


def test_dead_letters_list_and_take(letters: Any) -> None:
    """Dead letters come back newest first and can be taken out by id."""

    async def go() -> tuple[list[str], DeadLetter | None, int, DeadLetter | None]:
        a, b = DeadLetter(reason="invalid_payload", payload={"x": 1}), DeadLetter(reason="retry_budget_exhausted")
        await letters.push(a)
        await letters.push(b)
        listed = [d.reason for d in await letters.latest()]
        taken = await letters.take(a.id)
        left = await letters.size()
        missing = await letters.take("nope")
        await letters.close()
        return listed, taken, left, missing

    listed, taken, left, missing = run(go())
    assert listed == ["retry_budget_exhausted", "invalid_payload"]
    assert taken is not None
    assert taken.payload == {"x": 1}
    assert left == 1
    assert missing is None


@pytest.fixture
def pages_of_three(monkeypatch: pytest.MonkeyPatch) -> None:
    """``each`` reads 3 letters a page: 7 letters span three pages."""
    from worker.store import _dead_letters

    monkeypatch.setattr(_dead_letters, "_PAGE", 3)


def _seven_letters() -> list[DeadLetter]:
    return [DeadLetter(reason="r", message_key=f"m{n}") for n in range(7)]


@pytest.mark.usefixtures("pages_of_three")
def test_each_reads_every_letter_oldest_first_while_the_caller_takes_some(letters: Any) -> None:
    """``each``: every letter once, oldest first, across pages, whether the caller takes the
    letter it is at or leaves it."""
    pushed = _seven_letters()

    async def go() -> tuple[list[str], int]:
        for letter in pushed:
            await letters.push(letter)
        seen = []
        async for letter in letters.each():
            seen.append(letter.id)
            if len(seen) % 2:
                assert await letters.take(letter.id) is not None
        left = await letters.size()
        await letters.close()
        return seen, left

    seen, left = run(go())
    assert seen == [d.id for d in pushed]
    assert left == 3


@pytest.mark.usefixtures("pages_of_three")
def test_each_ends_at_the_letters_it_began_with_while_taken_ones_come_back(letters: Any) -> None:
    """``each`` under a ``dlq retry --all`` whose every requeued message is refused again (a
    new letter pushed as each is taken): it reads the letters the list held when it began and
    ends, not the new ones (a list longer than the worker's refusal took never ended)."""
    pushed = _seven_letters()

    async def go() -> list[str]:
        for letter in pushed:
            await letters.push(letter)
        seen: list[str] = []
        async for letter in letters.each():
            seen.append(letter.id)
            assert await letters.take(letter.id) is not None
            await letters.push(DeadLetter(reason="r", message_key=f"again:{len(seen)}"))
            if len(seen) > 30:  # (the bug: it never ends)
                break
        await letters.close()
        return seen

    seen = run(go())
    assert seen == [d.id for d in pushed]


@pytest.mark.usefixtures("pages_of_three")
def test_each_reads_on_past_a_letter_another_caller_took_mid_page(redis_url: str) -> None:
    """A letter of the page being read, taken by another caller (a second `dlq drop`) before
    this one reaches it: every other letter is still read and taken; the next page skipped one
    (the letter gone was counted as still on the list)."""
    pushed = _seven_letters()

    async def go() -> tuple[list[str], list[str], int]:
        mine, other = RedisDeadLetters(redis_url), RedisDeadLetters(redis_url)
        for letter in pushed:
            await mine.push(letter)
        seen: list[str] = []
        taken: list[str] = []
        async for letter in mine.each():
            if not seen:
                assert await other.take(pushed[2].id) is not None
            seen.append(letter.id)
            if await mine.take(letter.id) is not None:
                taken.append(letter.id)
        left = await mine.size()
        await mine.close()
        await other.close()
        return seen, taken, left

    seen, taken, left = run(go())
    assert seen == [d.id for d in pushed]
    assert taken == [d.id for i, d in enumerate(pushed) if i != 2]
    assert left == 0


@pytest.mark.usefixtures("pages_of_three")
def test_each_takes_every_copy_of_an_entry_stored_twice(redis_url: str) -> None:
    """Two entries of the same bytes (a damaged one, written twice) in one page: each copy is
    read and taken, and the next page starts where it should (nothing left listed)."""

    async def go() -> tuple[int, int]:
        dead = RedisDeadLetters(redis_url)
        await dead.push(DeadLetter(reason="r", message_key="m0"))
        await dead._redis.client.lpush(_keys.dlq_key(), b"damaged{", b"damaged{")
        for n in range(1, 5):
            await dead.push(DeadLetter(reason="r", message_key=f"m{n}"))
        taken = 0
        async for letter in dead.each():
            taken += await dead.take(letter.id) is not None
        left = await dead.size()
        await dead.close()
        return taken, left

    taken, left = run(go())
    assert (taken, left) == (7, 0)


@pytest.mark.usefixtures("pages_of_three")
def test_each_reads_every_letter_while_pushes_at_the_bound_drop_the_oldest(redis_url: str) -> None:
    """A `dlq retry --all` leaving letters listed (not retryable) while a worker pushes new ones
    at the list's bound, each push dropping the oldest, letters this caller read and left: the
    letters not read yet are all read, and none pushed since (they were counted from the right,
    so each letter dropped skipped one not read: 3 and 4 were never read)."""
    pushed = _seven_letters()

    async def go() -> list[str]:
        mine, worker = RedisDeadLetters(redis_url), RedisDeadLetters(redis_url, max_letters=7)
        for letter in pushed:
            await worker.push(letter)
        seen: list[str] = []
        async for letter in mine.each():
            if not seen:
                for n in range(2):
                    await worker.push(DeadLetter(reason="r", message_key=f"new{n}"))
            seen.append(letter.id)
        await mine.close()
        await worker.close()
        return seen

    seen = run(go())
    assert seen == [d.id for d in pushed]


@pytest.mark.usefixtures("pages_of_three")
def test_each_reads_every_letter_once_when_another_caller_took_the_newest_it_left(redis_url: str) -> None:
    """The newest letter of a page the caller left, taken by another caller: each reads on from
    the oldest, every letter not read yet once and none it read twice (the 4th was skipped)."""
    pushed = _seven_letters()

    async def go() -> list[str]:
        mine, other = RedisDeadLetters(redis_url), RedisDeadLetters(redis_url)
        for letter in pushed:
            await mine.push(letter)
        seen: list[str] = []
        async for letter in mine.each():
            if not seen:
                assert await other.take(pushed[2].id) is not None
            seen.append(letter.id)
        await mine.close()
        await other.close()
        return seen

    seen = run(go())
    assert seen == [d.id for d in pushed]


def test_a_dead_letter_is_held_by_one_caller_until_its_hold_lapses(letters: Any) -> None:
    """hold: the first caller gets the letter, a second does not while the hold lasts, and may
    once it lapsed (a `dlq retry` that died mid-send leaves the letter to a later one)."""

    async def go() -> tuple[bool, bool, bool, bool]:
        first = await letters.hold("l1", 0.3)
        second = await letters.hold("l1", 0.3)
        other = await letters.hold("l2", 0.3)
        deadline = time.monotonic() + 5
        later = False
        while not later and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            later = await letters.hold("l1", 0.3)
        await letters.close()
        return first, second, other, later

    assert run(go()) == (True, False, True, True)


def test_a_released_hold_lets_the_next_caller_hold_at_once(letters: Any) -> None:
    """A retry whose send failed releases its hold: the next one need not wait for it to lapse."""

    async def go() -> tuple[bool, bool, bool]:
        first = await letters.hold("l1", 60)
        await letters.release("l1")
        again = await letters.hold("l1", 60)
        other = await letters.hold("l1", 60)
        await letters.close()
        return first, again, other

    assert run(go()) == (True, True, False)


def test_dead_letters_dedupe_by_message_and_count_by_reason(letters: Any) -> None:
    """push adds a message key once; counts follow pushes and takes."""

    async def go() -> tuple[list[bool], dict[str, int], dict[str, int], int]:
        a = DeadLetter(reason="not_json", message_key="msg:a")
        pushed = [
            await letters.push(a),
            await letters.push(DeadLetter(reason="not_json", message_key="msg:a")),
            await letters.push(DeadLetter(reason="bad_body", message_key="msg:b")),
            await letters.push(DeadLetter(reason="bad_body")),
        ]
        before = await letters.counts()
        await letters.take(a.id)
        after = await letters.counts()
        length = await letters.size()
        await letters.close()
        return pushed, before, after, length

    pushed, before, after, length = run(go())
    assert pushed == [True, False, True, True]
    assert before == {"not_json": 1, "bad_body": 2}
    assert after == {"bad_body": 2}
    assert length == 2


def test_sync_dead_letters_share_the_list_and_its_dedupe(redis_url: str) -> None:
    """The consumer's synchronous writer pushes onto the same list, deduplicated with the async one."""
    sync = SyncRedisDeadLetters(redis_url)
    try:
        pushed = [sync.push(DeadLetter(reason="not_json", message_key="msg:s")) for _ in range(2)]
    finally:
        sync.close()

    async def go() -> tuple[bool, dict[str, int]]:
        dead = RedisDeadLetters(redis_url)
        again = await dead.push(DeadLetter(reason="not_json", message_key="msg:s"))
        counts = await dead.counts()
        await dead.close()
        return again, counts

    again, counts = run(go())
    assert pushed == [True, False]
    assert not again
    assert counts == {"not_json": 1}


@pytest.mark.parametrize("kind", ["memory", "redis", "sync"])
def test_past_its_bound_the_oldest_dead_letter_goes_counted_by_reason(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A producer whose every message is refused (a release that breaks the format) made a
    letter of each, with its message, up to 1 MiB: the list grew until Redis refused every write,
    scores included. Past ``max_letters`` the oldest letter goes, taken off its reason's count and
    counted as dropped by reason; the newest stay, in order."""
    url = request.getfixturevalue("redis_url") if kind != "memory" else ""
    reasons = ["not_json", "bad_body", "not_json", "bad_body", "task_crashed"]
    pushed = [DeadLetter(reason=r, message_key=f"msg:{i}") for i, r in enumerate(reasons)]

    async def go() -> tuple[list[bool], list[str], dict[str, int | None], dict[str, int | None]]:
        dead: Any = MemoryDeadLetters(max_letters=3) if kind == "memory" else RedisDeadLetters(url, max_letters=3)
        if kind == "sync":
            sync = SyncRedisDeadLetters(url, max_letters=3)
            try:
                added = [sync.push(letter) for letter in pushed]
            finally:
                sync.close()
        else:
            added = [await dead.push(letter) for letter in pushed]
        listed = [d.id for d in await dead.latest()]
        counts, dropped = await dead.counts(), await dead.dropped()
        await dead.close()
        return added, listed, counts, dropped

    added, listed, counts, dropped = run(go())
    assert added == [True] * 5
    assert listed == [d.id for d in reversed(pushed[2:])]
    assert counts == {"not_json": 1, "bad_body": 1, "task_crashed": 1}
    assert dropped == {"not_json": 1, "bad_body": 1}


def _big(reason: str, n: int, size: int = 10_000) -> DeadLetter:
    """A letter that keeps its message, as the task's do (up to 1 MiB)."""
    return DeadLetter(reason=reason, message_key=f"msg:{n}", payload={"batch_id": f"b{n}", "input": "x" * size})


def _nbytes(*letters: DeadLetter) -> int:
    """The bytes the list holds for ``letters``: each one's JSON, as pushed."""
    return sum(len(letter.model_dump_json().encode()) for letter in letters)


def _dead_letters(kind: str, url: str, **bounds: int) -> Any:
    return MemoryDeadLetters(**bounds) if kind == "memory" else RedisDeadLetters(url, **bounds)


async def _push_all(kind: str, url: str, dead: Any, letters: list[DeadLetter], **bounds: int) -> list[bool]:
    if kind != "sync":
        return [await dead.push(letter) for letter in letters]
    sync = SyncRedisDeadLetters(url, **bounds)
    try:
        return [sync.push(letter) for letter in letters]
    finally:
        sync.close()


@pytest.mark.parametrize("kind", ["memory", "redis", "sync"])
def test_past_its_byte_bound_the_oldest_dead_letters_go_counted_by_reason(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Each letter keeps its message (up to 1 MiB): a bound on their number left their size
    unbounded (100,000 letters of 1 MiB are 125 GiB of Redis; one of 512 MiB refused the 408th
    letter, and score writes with it, long before the bound). Past ``max_bytes`` the oldest
    letters go, as many as it takes, counted as dropped by reason as the count bound's are; the
    byte total is the kept letters' own."""
    url = request.getfixturevalue("redis_url") if kind != "memory" else ""
    reasons = ["not_json", "bad_body", "invalid_payload", "bad_body", "task_crashed"]
    pushed = [_big(r, i) for i, r in enumerate(reasons)]
    # Room for the newest three and half a fourth: the second push past it drops two.
    bounds = {"max_letters": 100, "max_bytes": _nbytes(*pushed[2:]) + _nbytes(pushed[1]) // 2}

    async def go() -> tuple[list[bool], list[str], dict[str, int | None], dict[str, int | None], int | None]:
        dead = _dead_letters(kind, url, **bounds)
        added = await _push_all(kind, url, dead, pushed, **bounds)
        listed = [d.id for d in await dead.latest()]
        said = await dead.counts(), await dead.dropped(), await dead.size_bytes()
        await dead.close()
        return added, listed, *said

    added, listed, counts, dropped, total = run(go())
    assert added == [True] * 5
    assert listed == [d.id for d in reversed(pushed[2:])]
    assert counts == {"invalid_payload": 1, "bad_body": 1, "task_crashed": 1}
    assert dropped == {"not_json": 1, "bad_body": 1}
    assert total == _nbytes(*pushed[2:])


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_dead_letter_larger_than_the_byte_bound_is_kept_alone(kind: str, request: pytest.FixtureRequest) -> None:
    """A letter larger than the whole byte bound is kept, alone (the newest letter is never the
    one dropped: the list is over the bound by at most that letter); the older ones go, counted.
    The next letter drops it in turn."""
    url = request.getfixturevalue("redis_url") if kind != "memory" else ""
    small = [DeadLetter(reason="not_json", message_key=f"msg:{n}") for n in range(2)]
    big, after = _big("budget_exhausted", 2), DeadLetter(reason="bad_body", message_key="msg:3")
    bounds = {"max_letters": 100, "max_bytes": _nbytes(*small) + 100}

    async def go() -> list[tuple[list[str], dict[str, int | None], int | None]]:
        dead = _dead_letters(kind, url, **bounds)
        seen = []
        for letters in (small, [big], [after]):
            assert await _push_all(kind, url, dead, letters, **bounds) == [True] * len(letters)
            seen.append(([d.id for d in await dead.latest()], await dead.dropped(), await dead.size_bytes()))
        await dead.close()
        return seen

    both, alone, next_one = run(go())
    assert both == ([d.id for d in reversed(small)], {}, _nbytes(*small))
    assert alone == ([big.id], {"not_json": 2}, _nbytes(big))
    assert next_one == ([after.id], {"not_json": 2, "budget_exhausted": 1}, _nbytes(after))


@pytest.mark.usefixtures("pages_of_three")
def test_the_byte_total_follows_every_letter_taken(letters: Any) -> None:
    """`dlq retry` and `dlq drop` take letters (by id, or as ``each`` reads them): the byte total
    goes down by each one's bytes, never for a letter not there, and is 0 once the list is empty.
    A total left high would drop letters the bound has room for; left low, let the list grow past it."""
    pushed = [_big("r", n, size=1000 * (n + 1)) for n in range(7)]

    async def go() -> list[int | None]:
        totals = []
        for letter in pushed:
            await letters.push(letter)
        totals.append(await letters.size_bytes())
        assert await letters.take(pushed[5].id) is not None
        assert await letters.take(pushed[5].id) is None  # (gone: nothing more taken off)
        assert await letters.take("nope") is None
        totals.append(await letters.size_bytes())
        async for letter in letters.each():
            if letter.id in (pushed[0].id, pushed[4].id):
                assert await letters.take(letter.id) is not None
        totals.append(await letters.size_bytes())
        async for letter in letters.each():
            await letters.take(letter.id)
        totals.append(await letters.size_bytes())
        await letters.close()
        return totals

    assert run(go()) == [
        _nbytes(*pushed),
        _nbytes(*pushed) - _nbytes(pushed[5]),
        _nbytes(*pushed[1:4], pushed[6]),
        0,
    ]


def test_a_lost_or_damaged_byte_total_is_summed_again_from_the_list(redis_url: str) -> None:
    """The byte total is a counter beside the list: lost (a Redis restarted from a snapshot
    taken between the two, the key deleted), damaged (no count), or past what the bound lets the
    list hold (edited by hand), it is summed again from the letters at the next push, not trusted:
    neither every letter dropped for it nor none. The list deleted by hand leaves a total of
    letters gone: the push that finds itself alone counts its own. Until the push, ``size_bytes``
    is None (unknown) for a total that is no count, never a guess."""
    client = redis.Redis.from_url(redis_url)
    key, pushed = _keys.dlq_bytes_key(), [_big("r", n) for n in range(4)]
    damages: list[tuple[str, Callable[[], Any]]] = [
        ("lost", lambda: client.delete(key)),
        ("no number", lambda: client.set(key, "many")),
        ("negative", lambda: client.set(key, "-5000")),
        ("past the bound", lambda: client.set(key, str(10**12))),
        ("list deleted", lambda: client.delete(_keys.dlq_key(), _keys.dlq_reasons_key())),
    ]

    async def go() -> dict[str, tuple[int | None, int | None, list[str], dict[str, int | None]]]:
        dead = RedisDeadLetters(redis_url, max_letters=100, max_bytes=_nbytes(*pushed) + 100)
        for letter in pushed[:2]:
            await dead.push(letter)
        seen = {}
        for name, damage in damages:
            damage()
            before = await dead.size_bytes()
            assert await dead.push(pushed[2]), name
            listed = [d.id for d in await dead.latest()]
            seen[name] = (before, await dead.size_bytes(), listed, await dead.dropped())
            client.delete(_keys.dlq_seen_key(pushed[2].message_key or ""))  # (to push it again)
            assert await dead.take(pushed[2].id) is not None, name
        await dead.close()
        return seen

    try:
        seen = run(go())
    finally:
        client.close()
    whole = (_nbytes(*pushed[:3]), [pushed[2].id, pushed[1].id, pushed[0].id], {})
    assert seen == {
        "lost": (None, *whole),
        "no number": (None, *whole),
        "negative": (None, *whole),
        "past the bound": (10**12, *whole),
        "list deleted": (0, _nbytes(pushed[2]), [pushed[2].id], {}),  # (an empty list holds 0)
    }


def test_a_total_past_the_bound_beside_one_letter_is_summed_again_not_trusted(redis_url: str) -> None:
    """A total past what the bound lets the list hold is summed again at the next push (the
    README: "drops only what is past it"), but with one letter on the list it was trusted (a
    lone letter may be larger than the bound): the push then dropped that letter, within the
    bound, for a count edited by hand, and counted it as dropped past the bound."""
    client = redis.Redis.from_url(redis_url)
    first, second = _big("r", 0), _big("r", 1)

    async def go() -> tuple[list[str], dict[str, int | None], int | None]:
        dead = RedisDeadLetters(redis_url, max_letters=100, max_bytes=_nbytes(first, second) + 100)
        await dead.push(first)
        client.set(_keys.dlq_bytes_key(), str(10**12))  # (edited by hand; the list holds one letter)
        await dead.push(second)
        kept = [d.id for d in await dead.latest()]
        dropped, total = await dead.dropped(), await dead.size_bytes()
        await dead.close()
        return kept, dropped, total

    try:
        kept, dropped, total = run(go())
    finally:
        client.close()
    assert (kept, dropped, total) == ([second.id, first.id], {}, _nbytes(first, second))


def test_letters_from_a_release_without_the_byte_total_are_summed_and_bounded(redis_url: str) -> None:
    """A list left by the previous release has letters and no byte total, maybe far past the byte
    bound (the count bound let it fill Redis): the first push sums it, from the newest, and drops
    the oldest until both bounds hold, counted by reason as the bound's drops are; the newest stay."""
    client = redis.Redis.from_url(redis_url)
    old = [_big("invalid_payload" if n % 2 else "budget_exhausted", n) for n in range(8)]
    for letter in old:  # as the previous release pushed them: no byte total
        client.lpush(_keys.dlq_key(), letter.model_dump_json())
        client.hincrby(_keys.dlq_reasons_key(), letter.reason, 1)
    new = _big("bad_body", 99)
    bounds = {"max_letters": 100, "max_bytes": _nbytes(new, *old[-2:]) + 100}

    async def go() -> tuple[int | None, list[str], dict[str, int | None], dict[str, int | None], int | None]:
        dead = RedisDeadLetters(redis_url, **bounds)
        before = await dead.size_bytes()
        assert await dead.push(new)
        listed = [d.id for d in await dead.latest()]
        said = await dead.counts(), await dead.dropped(), await dead.size_bytes()
        await dead.close()
        return before, listed, *said

    try:
        before, listed, counts, dropped, total = run(go())
    finally:
        client.close()
    assert before is None
    assert listed == [new.id, old[7].id, old[6].id]
    assert counts == {"bad_body": 1, "invalid_payload": 1, "budget_exhausted": 1}
    assert dropped == {"invalid_payload": 3, "budget_exhausted": 3}
    assert total == _nbytes(new, *old[-2:])


def _dlq_in_step(client: redis.Redis) -> tuple[int, int]:
    """The list, its counts by reason and its bytes agree (the count, or while it is summed again
    the sum of the oldest letters read so far); returns (letters listed, letters dropped)."""
    listed = client.lrange(_keys.dlq_key(), 0, -1)
    reasons = {k.decode(): int(v) for k, v in client.hgetall(_keys.dlq_reasons_key()).items()}
    assert sum(reasons.values()) == len(listed)
    summing = {k.decode(): v.decode() for k, v in client.hgetall(_keys.dlq_bytes_sum_key()).items()}
    if "read" in summing:
        read = int(summing["read"])
        assert int(summing["sum"]) == sum(len(x) for x in listed[len(listed) - read :])
        assert client.get(_keys.dlq_bytes_key()) is None
    else:
        assert int(client.get(_keys.dlq_bytes_key()) or -1) == sum(len(x) for x in listed)
    dropped = sum(int(v) for v in client.hvals(_keys.dlq_dropped_key()))
    return len(listed), dropped


def test_a_lowered_letter_bound_drops_a_step_per_script_until_within_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script holds all of Redis while it runs: DLQ_MAX_LETTERS lowered from 100,000 to 1,000
    dropped 99,001 letters in one push's script (414 ms, bench/store_scripts.py). The push now
    drops them a step per script (here one letter: STEP_BYTES 1), calling again until both bounds
    hold: it ends with exactly the bound's newest letters, every dropped one counted by reason,
    the bytes in step."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    old = [DeadLetter(reason="bad_body", message_key=f"msg:{n}") for n in range(30)]
    new = DeadLetter(reason="invalid_payload", message_key="msg:new")

    async def go() -> tuple[list[int], list[str], dict[str, int | None], dict[str, int | None], int | None]:
        wide = RedisDeadLetters(redis_url, max_letters=100)
        for letter in old:
            await wide.push(letter)
        await wide.close()
        dead = RedisDeadLetters(redis_url, max_letters=5)
        per_script: list[int] = []
        scripts = dead._redis.evalsha_many

        async def spied(*args: Any, **kwargs: Any) -> list[Any]:
            before = sum(int(v) for v in client.hvals(_keys.dlq_dropped_key()))
            replies = await scripts(*args, **kwargs)
            per_script.append(sum(int(v) for v in client.hvals(_keys.dlq_dropped_key())) - before)
            return replies

        dead._redis.evalsha_many = spied  # type: ignore[method-assign]
        assert await dead.push(new)
        dead._redis.evalsha_many = scripts  # type: ignore[method-assign]
        said = [d.id for d in await dead.latest()], await dead.counts(), await dead.dropped(), await dead.size_bytes()
        await dead.close()
        return per_script, *said

    try:
        per_script, listed, counts, dropped, total = run(go())
        assert _dlq_in_step(client) == (5, 26)
    finally:
        client.close()
    assert sum(per_script) == 26
    assert max(per_script) <= 1
    assert listed == [new.id, *(x.id for x in reversed(old[-4:]))]
    assert (counts, dropped) == ({"bad_body": 4, "invalid_payload": 1}, {"bad_body": 26})
    assert total == _nbytes(new, *old[-4:])


def test_the_consumers_sync_push_also_bounds_a_step_per_script(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer's guard pushes on a synchronous client: the same steps, called again until
    both bounds hold."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    wide = SyncRedisDeadLetters(redis_url, max_letters=100)
    narrow = SyncRedisDeadLetters(redis_url, max_letters=3)
    try:
        for n in range(12):
            assert wide.push(DeadLetter(reason="bad_body", message_key=f"msg:{n}"))
        assert narrow.push(DeadLetter(reason="bad_body", message_key="msg:new"))
        assert _dlq_in_step(client) == (3, 10)
    finally:
        wide.close()
        narrow.close()
        client.close()


def test_a_push_interrupted_between_steps_leaves_the_list_and_its_counts_in_step(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pusher gone between two steps of the bounds (its first script run alone, simulated)
    leaves the list, its counts by reason, the dropped counts and the bytes in step: nothing
    lost, nothing counted twice; the next push finishes the bounds. The same while the bytes are
    summed again a page at a time (the count lost), with a letter already summed taken meanwhile."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    old = [_big("bad_body", n, 100) for n in range(20)]

    async def go() -> list[tuple[int, int]]:
        wide = RedisDeadLetters(redis_url, max_letters=100)
        for letter in old:
            await wide.push(letter)
        await wide.close()
        seen = []
        dead = RedisDeadLetters(redis_url, max_letters=5)
        assert await dead._push_step(_big("bad_body", 100, 100)) == (2, True)  # (then gone)
        seen.append(_dlq_in_step(client))
        assert await dead.push(_big("bad_body", 101, 100))
        seen.append(_dlq_in_step(client))
        client.delete(_keys.dlq_bytes_key())  # (lost: summed again, a page of 2 per step)
        assert await dead._push_step(_big("bad_body", 102, 100)) == (1, True)  # (read 2 of 6)
        seen.append(_dlq_in_step(client))
        assert await dead.size_bytes() is None
        async for letter in dead.each():  # the oldest, summed already, taken meanwhile
            assert await dead.take(letter.id) is not None
            break
        seen.append(_dlq_in_step(client))
        assert await dead.push(_big("bad_body", 103, 100))
        seen.append(_dlq_in_step(client))
        assert await dead.size_bytes() == sum(len(x) for x in client.lrange(_keys.dlq_key(), 0, -1))
        await dead.close()
        return seen

    try:
        seen = run(go())
    finally:
        client.close()
    assert seen == [(20, 1), (5, 17), (6, 17), (5, 17), (5, 18)]


def test_a_letter_taken_by_id_is_looked_for_a_page_at_a_time(redis_url: str) -> None:
    """``dlq retry <id>`` and ``dlq drop <id>`` take a letter by its id alone: the list was read
    whole (LRANGE 0 -1), one command holding Redis 154 ms for 256 MiB of letters and growing its
    memory by as much again for the reply (bench/store_scripts.py). It is read a page at a time
    from the newest, until the letter is found; one not there is None."""
    letters = [_big("bad_body", n, 100) for n in range(12)]

    async def go() -> tuple[list[tuple[int, int]], list[str | None]]:
        dead = RedisDeadLetters(redis_url)
        for letter in letters:
            await dead.push(letter)
        reads: list[tuple[int, int]] = []
        client = dead._redis.client
        lrange = client.lrange

        def spied(key: str, start: int, end: int) -> Any:
            reads.append((start, end))
            return lrange(key, start, end)

        client.lrange = spied
        taken = [await dead.take(letters[n].id) for n in (0, 11, 5)]
        taken.append(await dead.take("nope"))
        client.lrange = lrange
        await dead.close()
        return reads, [x.id if x else None for x in taken]

    reads, taken = run(go())
    assert taken == [letters[0].id, letters[11].id, letters[5].id, None]
    assert all(0 <= start <= end and end - start < 8 for start, end in reads), reads


def test_the_newest_letters_are_listed_a_page_at_a_time(redis_url: str) -> None:
    """``dlq list`` (50 by default, any ``--limit``) read its letters in one LRANGE: 50 letters of
    1 MiB are 50 MiB in one command's reply, ``--limit 100000`` the whole list. They are read a
    page at a time, newest first, as many as asked."""
    letters = [_big("bad_body", n, 100) for n in range(12)]

    async def go() -> tuple[list[tuple[int, int]], list[str], list[str]]:
        dead = RedisDeadLetters(redis_url)
        for letter in letters:
            await dead.push(letter)
        reads: list[tuple[int, int]] = []
        client = dead._redis.client
        lrange = client.lrange

        def spied(key: str, start: int, end: int) -> Any:
            reads.append((start, end))
            return lrange(key, start, end)

        client.lrange = spied
        ten = [x.id for x in await dead.latest(10)]
        every = [x.id for x in await dead.latest(1000)]
        client.lrange = lrange
        await dead.close()
        return reads, ten, every

    reads, ten, every = run(go())
    assert ten == [x.id for x in reversed(letters[2:])]
    assert every == [x.id for x in reversed(letters)]
    assert all(0 <= start <= end and end - start < 8 for start, end in reads), reads


def test_a_byte_total_written_by_the_release_before_during_a_sum_stands(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an upgrade a worker of the release before may push while the bytes are summed a
    step at a time: it sums the whole list in one script, drops the oldest (those already read)
    and writes the total. That total stands; the sum under way, read from letters no longer there,
    would have replaced it with a wrong one."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    old = [_big("bad_body", n, 100 * (n + 1)) for n in range(10)]

    async def go() -> None:
        dead = RedisDeadLetters(redis_url, max_letters=100)
        for letter in old:
            await dead.push(letter)
        client.delete(_keys.dlq_bytes_key())
        assert await dead._push_step(_big("bad_body", 100, 100)) == (1, True)  # (then gone)
        for _ in range(2):  # the release before: the two oldest dropped, the total written
            client.rpop(_keys.dlq_key())
            client.hincrby(_keys.dlq_reasons_key(), "bad_body", -1)
            client.hincrby(_keys.dlq_dropped_key(), "bad_body", 1)
        client.set(_keys.dlq_bytes_key(), sum(len(x) for x in client.lrange(_keys.dlq_key(), 0, -1)))
        assert await dead.push(_big("bad_body", 101, 100))
        await dead.close()

    try:
        run(go())
        assert _dlq_in_step(client) == (10, 2)
    finally:
        client.close()


@pytest.mark.parametrize("lost", ["bytes", "sum"])
def test_a_count_lost_between_two_steps_is_summed_again_not_taken_for_naught(
    lost: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The byte count deleted between two steps of a push (by hand, mid-trim), or the state of
    its sum under way (by hand, or repaired for its type): the next step sums the bytes again.
    Read as 0, it wrote a count that low, the byte bound unheld then and at every push after."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    old = [_big("bad_body", n, 100) for n in range(12)]
    new = _big("bad_body", 100, 100)
    bound = _nbytes(new, *old[-2:])

    async def go() -> None:
        wide = RedisDeadLetters(redis_url, max_letters=100)
        for letter in old:
            await wide.push(letter)
        await wide.close()
        dead = RedisDeadLetters(redis_url, max_letters=100, max_bytes=bound)
        assert await dead._push_step(new) == (1, True)  # (the count past the bound: summed again)
        if lost == "bytes":  # (summed, then the oldest dropped a step at a time, the count kept)
            while not client.hexists(_keys.dlq_bytes_sum_key(), "trusted"):
                assert (await dead._trim_step())[1]
            assert client.get(_keys.dlq_bytes_key()) is not None
        client.delete(_keys.dlq_bytes_key() if lost == "bytes" else _keys.dlq_bytes_sum_key())
        steps = 0
        while (await dead._trim_step())[1]:
            steps += 1
            assert steps < 100, "the push's steps never end"
        await dead.close()

    try:
        run(go())
        listed, _ = _dlq_in_step(client)
        assert listed == 3
    finally:
        client.close()


def test_a_push_sent_again_after_its_reply_was_lost_still_ends_within_the_bounds(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push whose reply was lost is sent again with its nonce (the letter is not pushed twice).
    The first try's reply asked for more steps; the second answered "pushed, done", and the push
    ended with the list past its bound (by all the first try's step left)."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    new = DeadLetter(reason="invalid_payload", message_key="msg:new")

    async def go() -> bool:
        wide = RedisDeadLetters(redis_url, max_letters=100)
        for n in range(12):
            await wide.push(DeadLetter(reason="bad_body", message_key=f"msg:{n}"))
        await wide.close()
        dead = RedisDeadLetters(redis_url, max_letters=3)
        keys, args = dead_letters_module._push_args(new, 3, dead.max_bytes)
        await dead._redis.evalsha_many(dead_letters_module._PUSH, len(keys), [(*keys, *args)])  # (reply lost)
        monkeypatch.setattr(dead_letters_module, "_push_args", lambda *_: (keys, args))
        pushed = await dead.push(new)  # (the client's try again: the same nonce)
        await dead.close()
        return pushed

    try:
        assert run(go())
        assert _dlq_in_step(client) == (3, 10)
    finally:
        client.close()


@pytest.mark.parametrize("read", ["-5", "-50", "1.5", "x", "99"])
def test_a_damaged_sum_under_way_is_started_over(read: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state of the bytes summed again damaged by hand (``read``: no count of letters, or
    more than the list holds): the sum starts over. A negative one read from the list's other
    end: past it, nothing, a step that answered "more" for good (the push never ended); near
    it, an index Redis refuses ("-0"), as one not whole did: every push's script failed after
    its letter was pushed. One too large ended the sum at once, with a count of no letters."""
    import worker.store._dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1, raising=False)
    client = redis.Redis.from_url(redis_url)
    letters = [_big("bad_body", n, 100) for n in range(4)]

    async def go() -> None:
        dead = RedisDeadLetters(redis_url, max_letters=100)
        for letter in letters[:3]:
            await dead.push(letter)
        client.delete(_keys.dlq_bytes_key())
        assert await dead._push_step(letters[3]) == (1, True)  # (the sum begun, then gone)
        client.hset(_keys.dlq_bytes_sum_key(), mapping={"read": read, "sum": "7"})
        steps = 0
        while (await dead._trim_step())[1]:
            steps += 1
            assert steps < 100, "the push's steps never end"
        await dead.close()

    try:
        run(go())
        assert _dlq_in_step(client) == (4, 0)
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["redis", "sync"])
def test_pushes_past_the_bound_log_a_line_a_minute_not_one_each(kind: str, redis_url: str) -> None:
    """At the bound every new letter drops the oldest: while a producer's every message is
    refused, each push said so on a line of its own (28 lines for 30 pushes at a bound of 2; a
    line per refused message). One line a minute now, counting the pushes since the last."""
    from structlog.testing import capture_logs

    async def go() -> None:
        letters = [DeadLetter(reason="bad_body", message_key=f"msg:{n}") for n in range(30)]
        if kind == "sync":
            sync = SyncRedisDeadLetters(redis_url, max_letters=2)
            try:
                for letter in letters:
                    sync.push(letter)
            finally:
                sync.close()
            return
        dead = RedisDeadLetters(redis_url, max_letters=2)
        for letter in letters:
            await dead.push(letter)
        await dead.close()

    with capture_logs() as logs:
        run(go())
    said = [e for e in logs if e["event"] == "dead_letters_dropped_past_bound"]
    assert len(said) == 1, said
    assert said[0]["max_letters"] == 2


# --- Redis: reconnect and outage -----------------------------------------------------------------


@pytest.fixture
def restartable(private_redis: Any) -> Any:
    """A Redis of this test's own, to kill and start again on the same port."""
    return private_redis


def test_redis_store_reconnects_after_a_redis_restart(restartable: Any) -> None:
    """Redis killed and started again on the same port: the store's pooled connections are
    stale, and its next commands reconnect instead of failing with ConnectionError."""
    store = RedisScoreStore(restartable.url(0), reconnect_s=10)
    letters = RedisDeadLetters(restartable.url(0), reconnect_s=10)

    async def go() -> tuple[set[str], list[bool], bool]:
        await store.claim(["a"], "w", 60)  # the pools now hold a live connection
        await letters.size()
        restartable.stop()
        restartable.start()
        held = (await store.claim(["b"], "w", 60)).held
        fresh = await store.put_records([_record(12, score=0.3)], "w", 60)
        pushed = await letters.push(DeadLetter(reason="r", message_key="k"))
        await store.close()
        await letters.close()
        return held, fresh, pushed

    assert run(go()) == ({"b"}, [True], True)


@pytest.mark.parametrize("part", ["scores", "jobs", "dead_letters"])
def test_redis_outage_raises_a_requeueing_error(restartable: Any, part: str) -> None:
    """Redis down through every reconnect attempt: StoreUnavailableError, which Celery treats as
    "reject and requeue" (the message is given back, not failed and acknowledged) and the CLI
    still catches as a Redis ConnectionError — from every Redis store."""
    from celery.exceptions import Reject
    from redis.exceptions import ConnectionError as RedisConnectionError

    url = restartable.url(0)
    target: Any
    if part == "scores":
        target, call, name = RedisScoreStore(url, reconnect_s=0.5), "claim_owners", (["x"],)
    elif part == "jobs":
        target, call, name = RedisJobStats(url, reconnect_s=0.5), "progress", ("j",)
    else:
        target, call, name = RedisDeadLetters(url, reconnect_s=0.5), "size", ()
    restartable.stop()

    async def go() -> BaseException:
        try:
            await getattr(target, call)(*name)
        except BaseException as exc:
            return exc
        finally:
            await target.close()
        raise AssertionError("no error with Redis down")

    exc = run(go())
    assert isinstance(exc, StoreUnavailableError)
    assert isinstance(exc, Reject)
    assert exc.requeue
    assert isinstance(exc, RedisConnectionError)
    assert call in str(exc)
    assert restartable.password not in str(exc)


def test_redis_store_call_to_a_silent_server_ends_in_bounded_time() -> None:
    """A server that accepts connections and never answers (a hung Redis, a black-holing proxy):
    each store call still ends, with StoreUnavailableError, within reconnect_s + COMMAND_SLACK_S,
    so a task's 30 s wait for it never gives up first (which would fail and acknowledge it)."""
    import time

    from worker._reconnect import COMMAND_SLACK_S

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        store = RedisScoreStore(f"redis://:pw@127.0.0.1:{silent.getsockname()[1]}/0", reconnect_s=0.5)

        async def go() -> tuple[BaseException | None, float]:
            started = time.monotonic()
            try:
                await asyncio.wait_for(store.existing(["x"]), 30)
            except BaseException as exc:
                return exc, time.monotonic() - started
            finally:
                await store.close()
            return None, time.monotonic() - started

        exc, took = run(go())
    assert isinstance(exc, StoreUnavailableError), repr(exc)
    assert took < 0.5 + COMMAND_SLACK_S + 2
