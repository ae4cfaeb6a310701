"""Every Redis path of the store, against each of its keys holding each wrong Redis type.

A key of ours may hold another type (an operator's mistake, an older version, another program on
the same DB); Redis then answers WRONGTYPE. Where the key holds state the store owns and can
rebuild (claims, checkpoints, counters, indexes, delivery marks) the path repairs it (deletes it,
counts the repair, logs ``store_keys_repaired``) and does its work; where deleting would lose
data someone needs (the dead-letter list, a sink's queue of undelivered scores and its dead
letters) it leaves the key alone and raises ``StoreKeyTypeError``: named, not retryable, so the
message is dead-lettered or refused instead of being redelivered forever. A value of the right
type that no longer validates is the last case here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import BaseModel

import worker.store._jobs as jobs_module
import worker.store._scores as scores_module
from scorers import ScoreResult, create_scorer
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tracing import ScoreRecord, score_id_for
from worker import _keys
from worker._errors import UnreadableCounterError
from worker._scoring import ScoringDeps, batch_score_ids, score_batch
from worker.store import (
    Claims,
    DeadLetter,
    DeliveryLog,
    RedisDeadLetters,
    RedisJobStats,
    RedisOutbox,
    RedisScoreStore,
    StoreKeyTypeError,
    SyncRedisDeadLetters,
    claim,
    finish_job,
    job_progress,
)
from worker.store._jobs import failure_bucket
from worker.store._keytypes import JOB_COUNTER_KEPT
from worker.store._outbox import delivered_key

SINK = "jsonl"
TRACE, SPAN = f"{7:032x}", f"{7:016x}"
SCORE = score_id_for(TRACE, SPAN, "s", "1")
TYPES = ("string", "list", "set", "zset", "hash")


def _record() -> ScoreRecord:
    return ScoreRecord(score_id=SCORE, trace_id=TRACE, span_id=SPAN, scorer_id="s", score=1.0, job_id="j")


def _seed(client: redis.Redis, key: str, kind: str) -> None:
    """``key`` holding a value of type ``kind`` (not ours), whatever it held before."""
    client.delete(key)
    {
        "string": lambda: client.set(key, "someone else's"),
        "list": lambda: client.rpush(key, "someone else's"),
        "set": lambda: client.sadd(key, "someone else's"),
        "zset": lambda: client.zadd(key, {"someone else's": 1}),
        "hash": lambda: client.hset(key, "someone else's", "1"),
    }[kind]()


# --- the paths: each takes the Redis URL and returns what the path answered ----------------------


def _score_store(url: str, go: Callable[[RedisScoreStore], Any]) -> Any:
    async def run() -> Any:
        store = RedisScoreStore(url, sinks=[SINK])
        try:
            return await go(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _jobs(url: str, go: Callable[[RedisJobStats], Any]) -> Any:
    async def run() -> Any:
        stats = RedisJobStats(url)
        try:
            return await go(stats)
        finally:
            await stats.close()

    return asyncio.run(run())


def _skip_once(stats: RedisJobStats) -> Any:
    return stats.count_skipped_once("j", "r", ["s1"])


def _sync_finish(url: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        finish_job(client, "j")
    finally:
        client.close()


def _sync_progress(url: str) -> Any:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return job_progress(client, "j")
    finally:
        client.close()


def _letters(url: str, go: Callable[[RedisDeadLetters], Any]) -> Any:
    async def run() -> Any:
        letters = RedisDeadLetters(url)
        try:
            return await go(letters)
        finally:
            await letters.close()

    return asyncio.run(run())


def _deliveries(url: str, go: Callable[[DeliveryLog], Any]) -> Any:
    async def run() -> Any:
        log = DeliveryLog(url, ttl_s=60, reconnect_s=0.5)
        try:
            return await go(log)
        finally:
            await log.close()

    return asyncio.run(run())


def _outbox(url: str, go: Callable[[RedisOutbox], Any]) -> Any:
    outbox = RedisOutbox(url, reconnect_s=0.5)
    try:
        return go(outbox)
    finally:
        outbox.close()


def _leased_then(url: str, go: Callable[[RedisOutbox, Any], Any]) -> Callable[[], Any]:
    """The id queued and leased before the key goes bad; then ``go`` settles the lease."""
    outbox = RedisOutbox(url, reconnect_s=0.5)
    outbox.enqueue(SINK, [SCORE])
    lease = outbox.lease(SINK, 10, 60)
    assert lease.ids == [SCORE]

    def settle() -> Any:
        try:
            return go(outbox, lease)
        finally:
            outbox.close()

    return settle


def _queued_then(url: str, go: Callable[[RedisOutbox], Any]) -> Callable[[], Any]:
    """The id queued before the key goes bad; then ``go``."""
    outbox = RedisOutbox(url, reconnect_s=0.5)
    outbox.enqueue(SINK, [SCORE])

    def then() -> Any:
        try:
            return go(outbox)
        finally:
            outbox.close()

    return then


def _letter() -> DeadLetter:
    return DeadLetter(reason="test", message_key="m1")


@dataclass(frozen=True)
class Case:
    path: str
    key: str
    kind: str  # the type the store keeps at ``key``
    keep: bool  # True: data someone needs (refused, never deleted); False: repaired
    call: Callable[[str], Callable[[], Any]]  # Redis URL -> (after the key is seeded) the call
    expect: Any = None  # what a repaired call answers
    # False: the path only reads with MGET, which answers nil for a key of another type: the key
    # reads as absent and is left for the write that follows (put_records, put_checkpoint).
    repairs: bool = True


_CLAIM, _RECORD, _CHECKPOINT = _keys.claim_key(SCORE), _keys.record_key(SCORE), _keys.checkpoint_key(SCORE)
# The failure counts live in a wall-clock bucket; the test pins it (see ``_pinned_bucket``) so a
# run that spans a bucket boundary still meets the key it seeded.
_BUCKET = failure_bucket()
_JOB, _FAILURES = _keys.job_key("j"), _keys.failures_key(_BUCKET)
_QUEUE, _ATTEMPTS, _DEAD = _keys.outbox_key(SINK), _keys.outbox_attempts_key(SINK), _keys.outbox_dead_key(SINK)
_COUNTS, _DELIVERED, _SINKS = _keys.outbox_counts_key(SINK), delivered_key(SINK), _keys.outbox_sinks_key()
_ORDER = _keys.outbox_dead_order_key(SINK)
_STARTED, _ENDED = f"{_keys.delivery_key('t1')}:started", f"{_keys.delivery_key('t1')}:ended"
_DLQ, _SEEN, _REASONS = _keys.dlq_key(), _keys.dlq_seen_key("m1"), _keys.dlq_reasons_key()
_DLQ_BYTES, _DLQ_BYTES_SUM = _keys.dlq_bytes_key(), _keys.dlq_bytes_sum_key()


def _put(url: str) -> Callable[[], Any]:
    return lambda: _score_store(url, lambda s: s.put_records([_record()], "w", 60))


def _put_over_another_jobs_failure(url: str) -> Callable[[], Any]:
    """Job "o"'s retryable failure stored first: the put of job j's score then corrects o's
    counters and its set of counted skips (keys the script names itself)."""
    failed = _record().model_copy(update={"job_id": "o", "score": None, "error_type": "E", "retryable": True})
    assert _score_store(url, lambda s: s.put_records([failed], "w", 60)) == [True]
    return _put(url)


def _claim(url: str) -> Callable[[], Any]:
    return lambda: _score_store(url, lambda s: claim(s, [SCORE], "w", 60))


def _take_over(url: str) -> Callable[[], Any]:
    return lambda: _score_store(url, lambda s: s.take_over([(SCORE, "")], "w", 60))


CASES = [
    # ScoreStore
    Case("claim", _CLAIM, "string", False, _claim, Claims(held={SCORE})),
    # A record key of another type is no record to a claim (it is claimed), left for the put.
    Case("claim", _RECORD, "string", False, _claim, Claims(held={SCORE}), False),
    Case("release", _CLAIM, "string", False, lambda u: lambda: _score_store(u, lambda s: s.release([SCORE], "w"))),
    Case("take_over", _CLAIM, "string", False, _take_over, Claims(held={SCORE})),
    Case("take_over", _RECORD, "string", False, _take_over, Claims(held={SCORE}), False),
    Case(
        "existing",
        _RECORD,
        "string",
        False,
        lambda u: lambda: _score_store(u, lambda s: s.existing([SCORE])),
        {},
        False,
    ),
    Case(
        "get_checkpoints",
        _CHECKPOINT,
        "string",
        False,
        lambda u: lambda: _score_store(u, lambda s: s.get_checkpoints([SCORE])),
        {},
        False,
    ),
    Case(
        "records_for_trace",
        _keys.trace_key(TRACE),
        "set",
        False,
        lambda u: lambda: _score_store(u, lambda s: s.records_for_trace(TRACE)),
        [],
    ),
    *(
        Case("put_records", key, kind, keep, _put, None if keep else [True])
        for key, kind, keep in [
            (_RECORD, "string", False),
            (_keys.trace_key(TRACE), "set", False),
            (_CLAIM, "string", False),
            # What job j counted (the script names them): deleted, j counted them again (its
            # counts and the mark of its end gone: a late delivery counted past its total).
            (_JOB, "hash", True),
            (_keys.job_skips_key("j"), "set", True),  # a score counted as j's skip
            (_keys.job_uncounted_key("j"), "set", True),  # a record j stored once it ended
            (_FAILURES, "hash", False),
            (_SINKS, "set", False),
            (_ATTEMPTS, "hash", False),
            (_DELIVERED, "zset", False),
            (_ORDER, "zset", False),
            (_QUEUE, "zset", True),
            (_DEAD, "hash", True),
        ]
    ),
    *(
        Case("put_records", key, kind, True, _put_over_another_jobs_failure)
        for key, kind in [
            (_keys.job_key("o"), "hash"),
            (_keys.job_skips_key("o"), "set"),
            (_keys.job_uncounted_key("o"), "set"),
        ]
    ),
    # JobStats: what a job counted is refused, never deleted (each path: a call counting nothing)
    *(
        Case("count_skipped_once", key, kind, True, lambda u: lambda: _jobs(u, _skip_once))
        for key, kind in [(_JOB, "hash"), (_keys.job_skips_key("j"), "set")]
    ),
    *(
        case
        for key, kind in [(_JOB, "hash"), (_keys.job_skips_key("j"), "set"), (_keys.job_uncounted_key("j"), "set")]
        for case in (
            Case("progress", key, kind, True, lambda u: lambda: _jobs(u, lambda j: j.progress("j"))),
            Case("job_progress", key, kind, True, lambda u: lambda: _sync_progress(u)),  # (the backfill's)
        )
    ),
    *(
        case
        for key, kind, keep in [(_JOB, "hash", True), (_keys.job_skips_key("j"), "set", True)]
        for case in (
            Case("finish_job", key, kind, keep, lambda u: lambda: _jobs(u, lambda j: j.finish("j"))),
            Case("finish_job", key, kind, keep, lambda u: lambda: _sync_finish(u)),  # (the backfill's)
        )
    ),
    Case("recent_failures", _FAILURES, "hash", False, lambda u: lambda: _jobs(u, lambda j: j.recent_failures()), {}),
    # DeadLetters
    Case("push", _DLQ, "list", True, lambda u: lambda: _letters(u, lambda d: d.push(_letter()))),
    Case("push", _SEEN, "string", False, lambda u: lambda: _letters(u, lambda d: d.push(_letter())), True),
    Case("push", _REASONS, "hash", False, lambda u: lambda: _letters(u, lambda d: d.push(_letter())), True),
    Case("counts", _REASONS, "hash", False, lambda u: lambda: _letters(u, lambda d: d.counts()), {}),
    Case("latest", _DLQ, "list", True, lambda u: lambda: _letters(u, lambda d: d.latest())),
    Case("take", _DLQ, "list", True, lambda u: lambda: _letters(u, lambda d: d.take("x"))),
    Case("size", _DLQ, "list", True, lambda u: lambda: _letters(u, lambda d: d.size())),
    Case("sync_push", _DLQ, "list", True, lambda u: lambda: SyncRedisDeadLetters(u).push(_letter())),
    Case("sync_push", _SEEN, "string", False, lambda u: lambda: SyncRedisDeadLetters(u).push(_letter()), True),
    # (the letters' byte count: a count, summed again from the list)
    Case("push", _DLQ_BYTES, "string", False, lambda u: lambda: _letters(u, lambda d: d.push(_letter())), True),
    Case("sync_push", _DLQ_BYTES, "string", False, lambda u: lambda: SyncRedisDeadLetters(u).push(_letter()), True),
    Case("size_bytes", _DLQ_BYTES, "string", False, lambda u: lambda: _letters(u, lambda d: d.size_bytes()), 0),
    # (the bytes summed again a step at a time: started over)
    Case("push", _DLQ_BYTES_SUM, "hash", False, lambda u: lambda: _letters(u, lambda d: d.push(_letter())), True),
    Case("sync_push", _DLQ_BYTES_SUM, "hash", False, lambda u: lambda: SyncRedisDeadLetters(u).push(_letter()), True),
    # DeliveryLog
    Case("delivery_start", _STARTED, "set", False, lambda u: lambda: _deliveries(u, lambda d: d.start("t1", "a")), 0),
    Case("delivery_start", _ENDED, "set", False, lambda u: lambda: _deliveries(u, lambda d: d.start("t1", "a")), 0),
    Case("delivery_end", _ENDED, "set", False, lambda u: lambda: _deliveries(u, lambda d: d.end("t1", "a")), True),
    # Outbox
    Case("register", _SINKS, "set", False, lambda u: lambda: _outbox(u, lambda o: o.register([SINK]))),
    Case("enqueue", _QUEUE, "zset", True, lambda u: lambda: _outbox(u, lambda o: o.enqueue(SINK, [SCORE]))),
    Case("enqueue", _DEAD, "hash", True, lambda u: lambda: _outbox(u, lambda o: o.enqueue(SINK, [SCORE]))),
    Case("enqueue", _ATTEMPTS, "hash", False, lambda u: lambda: _outbox(u, lambda o: o.enqueue(SINK, [SCORE]))),
    Case("enqueue", _DELIVERED, "zset", False, lambda u: lambda: _outbox(u, lambda o: o.enqueue(SINK, [SCORE]))),
    Case("lease", _QUEUE, "zset", True, lambda u: lambda: _outbox(u, lambda o: o.lease(SINK, 10, 60))),
    Case("lease", _ATTEMPTS, "hash", False, lambda u: _queued_then(u, lambda o: o.lease(SINK, 10, 60).ids), [SCORE]),
    Case("renew", _QUEUE, "zset", True, lambda u: _leased_then(u, lambda o, lease: o.renew(lease, 60))),
    Case("ack", _COUNTS, "hash", False, lambda u: _leased_then(u, lambda o, lease: o.ack(lease, [SCORE])), 1),
    Case("ack", _DELIVERED, "zset", False, lambda u: _leased_then(u, lambda o, lease: o.ack(lease, [SCORE])), 1),
    Case("ack", _ATTEMPTS, "hash", False, lambda u: _leased_then(u, lambda o, lease: o.ack(lease, [SCORE])), 1),
    Case("dead", _DEAD, "hash", True, lambda u: _leased_then(u, _bury)),
    Case("dead", _ORDER, "zset", False, lambda u: _leased_then(u, _bury), 1),
    Case("ack", _ORDER, "zset", False, lambda u: _leased_then(u, lambda o, lease: o.ack(lease, [SCORE])), 1),
    Case("enqueue", _ORDER, "zset", False, lambda u: lambda: _outbox(u, lambda o: o.enqueue(SINK, [SCORE]))),
    Case("redrive", _ORDER, "zset", False, lambda u: lambda: _outbox(u, lambda o: o.redrive(SINK, [SCORE])), 0),
    Case("drop_dead_letters", _DEAD, "hash", True, lambda u: lambda: _outbox(u, _drop_all)),
    # (no letter to drop: the order is not written, so not repaired either)
    Case("drop_dead_letters", _ORDER, "zset", False, lambda u: lambda: _outbox(u, _drop_all), [], repairs=False),
    Case("drop_dead_letters", _ORDER, "zset", False, lambda u: lambda: _outbox(u, _drop_one), []),
    Case("counts", _COUNTS, "hash", False, lambda u: lambda: _outbox(u, lambda o: o.counts()[SINK].delivered), 0),
    Case("counts", _SINKS, "set", False, lambda u: lambda: _outbox(u, lambda o: o.counts()), {}),
    Case("counts", _QUEUE, "zset", True, lambda u: lambda: _outbox(u, lambda o: o.counts())),
    Case("counts", _DEAD, "hash", True, lambda u: lambda: _outbox(u, lambda o: o.counts())),
    Case("dead_letters", _DEAD, "hash", True, lambda u: lambda: _outbox(u, lambda o: o.dead_letters(SINK))),
    Case("redrive", _DEAD, "hash", True, lambda u: lambda: _outbox(u, lambda o: o.redrive(SINK))),
    Case("states", _QUEUE, "zset", True, lambda u: lambda: _outbox(u, lambda o: o.states(SINK, [SCORE]))),
    Case("states", _DEAD, "hash", True, lambda u: lambda: _outbox(u, lambda o: o.states(SINK, [SCORE]))),
    Case(
        "states",
        _DELIVERED,
        "zset",
        False,
        lambda u: lambda: _outbox(u, lambda o: o.states(SINK, [SCORE])),
        {SCORE: "none"},
    ),
]


def _drop_all(outbox: RedisOutbox) -> Any:
    return list(outbox.drop_dead_letters(SINK))


def _drop_one(outbox: RedisOutbox) -> Any:
    return list(outbox.drop_dead_letters(SINK, [SCORE]))


def _bury(outbox: RedisOutbox, lease: Any) -> Any:
    from worker.store import SinkDeadLetter

    return outbox.dead(lease, [SinkDeadLetter(score_id=SCORE, sink=SINK, reason="refused")])


def _counts_case(case: Case) -> bool:
    # `counts` on an outbox without sinks answers {} before reading any sink key: register first.
    return case.path == "counts" and case.key in (_COUNTS, _QUEUE, _DEAD)


PARAMS = [
    pytest.param(case, wrong, id=f"{case.path}-{case.key.removeprefix(_keys.PREFIX)}-{wrong}")
    for case in CASES
    for wrong in TYPES
    if wrong != case.kind
]


def _repairs(where: str | None = None) -> float:
    """Keys repaired by the path ``where`` (None: any path), as the node's metric counts them."""
    from worker.metrics._instruments import _metrics

    (metric,) = _metrics().key_repairs.collect()
    return sum(
        s.value for s in metric.samples if s.name.endswith("_total") and (where is None or s.labels == {"where": where})
    )


@pytest.fixture(autouse=True)
def _pinned_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (jobs_module, scores_module):
        monkeypatch.setattr(module, "failure_bucket", lambda at=None: _BUCKET)


@pytest.mark.parametrize(("case", "wrong"), PARAMS)
def test_a_wrong_typed_key_is_repaired_or_refused_by_name(redis_url: str, case: Case, wrong: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        if _counts_case(case):
            client.sadd(_SINKS, SINK)
        call = case.call(redis_url)  # set-up (a lease) before the key goes bad
        _seed(client, case.key, wrong)
        before_value = client.dump(case.key)
        before = _repairs()
        if case.keep:
            with pytest.raises(Exception) as caught:
                call()
            exc = caught.value
            # Named, not retryable (a redelivery would meet the same key), naming the key.
            assert type(exc).__name__ == "StoreKeyTypeError", f"{type(exc).__name__}: {exc}"
            assert getattr(exc, "category", None) == "config"
            assert getattr(exc, "key", None) == case.key
            assert wrong in str(exc)
            assert case.key in str(exc)
            # Left exactly as it was: it may hold what someone needs.
            assert client.dump(case.key) == before_value
        else:
            answer = call()
            assert answer == case.expect
            if case.repairs:
                assert client.type(case.key).decode() in (case.kind, "none")
                assert before >= 0
                assert _repairs() > before  # counted
            else:
                assert client.dump(case.key) == before_value
    finally:
        client.close()


def test_repairs_are_logged_once_per_call_with_where(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The repair is an operator's fact: one ``store_keys_repaired`` line naming the path and
    the key (never a value), however many keys it mended."""
    import structlog.testing

    client = redis.Redis.from_url(redis_url)
    client.rpush(_keys.trace_key(TRACE), "not a set")
    client.rpush(_CLAIM, "not a claim")
    try:
        metric_before = _repairs("put_records")
        with structlog.testing.capture_logs() as logs:
            assert _score_store(redis_url, lambda s: s.put_records([_record()], "w", 60)) == [True]
        repaired = [e for e in logs if e["event"] == "store_keys_repaired"]
        assert len(repaired) == 1, logs
        assert repaired[0]["keys"] == 2
        assert repaired[0]["where"] == "put_records"
        assert "not a" not in repr(repaired[0])
        # And the node's metric (tracescore_store_key_repairs_total) counts both keys.
        assert _repairs("put_records") == metric_before + 2
    finally:
        client.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_wrongtype_about_a_key_not_checked_is_raised_as_it_came(redis_url: str, driver: str) -> None:
    """WRONGTYPE about a key the call did not name among its checks: the checked keys are fine
    (so nothing is deleted or counted) and Redis' own error reaches the caller; a checked key of
    the wrong type in the same call is still repaired first."""
    import redis.asyncio as aredis

    from worker.store._keytypes import checked, checked_async

    checked_key, other = f"{_keys.PREFIX}test:checked", f"{_keys.PREFIX}test:other"
    client = redis.Redis.from_url(redis_url)
    client.delete(checked_key, other)
    client.set(other, "a string")
    client.sadd(checked_key, "kept")

    calls: list[int] = []

    def run(checks_kind: str) -> Any:
        calls.clear()
        checks = [(checked_key, checks_kind, False)]
        if driver == "sync":
            return checked(client, "test", checks, lambda: calls.append(1) or client.lpush(other, "x"))

        async def go() -> Any:
            async_client = aredis.Redis.from_url(redis_url)
            try:
                return await checked_async(
                    async_client, "test", checks, lambda: calls.append(1) or async_client.lpush(other, "x")
                )
            finally:
                await async_client.aclose()

        return asyncio.run(go())

    try:
        before = _repairs()
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            run("set")
        assert len(calls) == 1  # not made again: nothing was repaired
        assert _repairs() == before
        assert client.smembers(checked_key) == {b"kept"}
        # The checked key wrong too: repaired (counted) on each try, then the call's own error.
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            run("hash")
        assert len(calls) == 2  # once more after the repair
        assert not client.exists(checked_key)
        assert _repairs() == before + 1
        assert client.get(other) == b"a string"
    finally:
        client.delete(checked_key, other)
        client.close()


def test_a_drainer_names_a_refused_key_backs_off_and_delivers_once_it_is_moved(redis_url: str, tmp_path: Path) -> None:
    """A sink's queue key of another type stops its drainer without deleting anything: each try
    is logged as ``drainer_failed`` naming the key (and its category, config); once the operator
    puts the queue back, the same drainer delivers what was queued, once."""
    import json

    import structlog.testing

    from tests.worker._workers import wait_for
    from tracing import JsonlSink
    from worker._delivery import Deliveries, DrainPolicy

    client = redis.Redis.from_url(redis_url)
    aside = f"{_QUEUE}:aside"
    assert _score_store(redis_url, lambda s: s.put_records([_record()], "w", 60)) == [True]
    assert client.zcard(_QUEUE) == 1  # queued for the sink
    client.rename(_QUEUE, aside)
    _seed(client, _QUEUE, "string")
    out = tmp_path / "scores.jsonl"
    deliveries = Deliveries([JsonlSink(out)], lambda: RedisOutbox(redis_url, reconnect_s=0.5), DrainPolicy(poll_s=0.05))
    try:
        with structlog.testing.capture_logs() as logs:
            deliveries.start()
            assert wait_for(lambda: any(e["event"] == "drainer_failed" for e in logs), timeout=20), logs
            failed = next(e for e in logs if e["event"] == "drainer_failed")
            assert failed["error_type"] == "StoreKeyTypeError"
            assert failed["category"] == "config"
            assert failed["key"] == _QUEUE
            assert failed["found"] == "string"
            assert client.get(_QUEUE) == b"someone else's"  # never deleted
            client.delete(_QUEUE)
            client.rename(aside, _QUEUE)
            assert wait_for(lambda: out.exists() and SCORE in out.read_text(), timeout=30)
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [line["score_id"] for line in lines] == [SCORE]
    finally:
        deliveries.stop()
        client.close()


def test_a_checkpoint_that_no_longer_reads_is_left_out_and_its_run_starts_over(redis_url: str) -> None:
    """A checkpoint of the right type whose value does not validate (damaged, not UTF-8, or kept
    by another version) is left out, and the others are read: its run is scored from the first step and
    recorded. Before, reading it raised, so every delivery of the message failed on it."""
    steps: list[str] = []

    def prepare(run: Any) -> dict[str, int]:
        steps.append("preprocess")
        return {"n": 1}

    scorer = create_scorer("resumable", type="agent").preprocess(prepare).generate_score(lambda results: 0.5)
    registry = {"resumable": scorer}
    msg = batch(range(3), ["resumable"], salt="checkpoint")
    damaged, garbled, kept = batch_score_ids(msg, registry)
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(_keys.checkpoint_key(damaged), json.dumps({"run_id": "r", "completed_steps": 5}))
        client.set(_keys.checkpoint_key(garbled), b'\xff{"run_id": "r\xfe"}')

        async def go() -> tuple[dict[str, ScoreResult], Any, dict[str, ScoreRecord]]:
            store = RedisScoreStore(redis_url)
            try:
                resume = ScoreResult(
                    run_id="r",
                    scorer_id="resumable",
                    preprocess_step_result={"n": 1},
                    score=0.5,
                    completed_steps=["preprocess", "generate_score"],
                )
                await store.put_checkpoint(kept, resume, 60)
                read = await store.get_checkpoints([damaged, garbled, kept])
                await store.release([damaged, garbled, kept], "w")
                report = await score_batch(msg, ScoringDeps(registry=registry, store=store, checkpoint="all"))
                return read, report, await store.existing([damaged, garbled, kept])
            finally:
                await store.close()

        read, report, stored = asyncio.run(go())
    finally:
        client.close()
    assert list(read) == [kept]
    assert report.scored == 3
    assert {s: r.score for s, r in stored.items()} == {damaged: 0.5, garbled: 0.5, kept: 0.5}
    assert steps == ["preprocess"] * 2  # the damaged ones started over; the kept one resumed past it


@pytest.mark.parametrize("encoded", [False, True], ids=["text", "not-utf8"])
def test_a_stored_record_that_is_not_json_is_scored_again_and_replaced(
    redis_url: str, capsys: pytest.CaptureFixture[str], encoded: bool
) -> None:
    """A score record key holding a value that is not JSON (damaged; or bytes that are not UTF-8,
    which only another program writes) is read as no record: the run is scored again and the new
    record replaces it, counted once. Before, reading it raised on every delivery of the message,
    and the error quoted the stored value (or, not UTF-8, the reply parser failed the read)."""
    marker = "AGENT-CONTENT-MARKER-record"
    scorer = create_scorer("again", type="agent").generate_score(lambda run: 0.25)
    registry = {"again": scorer}
    msg = batch(range(1), ["again"], salt=f"damaged-record-{encoded}", job_id=f"j-damaged-{encoded}")
    (score_id,) = batch_score_ids(msg, registry)
    client = redis.Redis.from_url(redis_url)
    try:
        damaged = f"{{not json {marker}"
        client.set(_keys.record_key(score_id), b"\xff\xfe" + damaged.encode() if encoded else damaged)

        async def go() -> tuple[Any, list[ScoreRecord], dict[str, int]]:
            store = RedisScoreStore(redis_url)
            try:
                report = await score_batch(msg, ScoringDeps(registry=registry, store=store))
                again = await score_batch(msg, ScoringDeps(registry=registry, store=store))
                assert again.skipped == {"already_scored": 1}
                return (
                    report,
                    await store.records_for_trace(msg.requests[0].trace_id),
                    await store.jobs.progress(f"j-damaged-{encoded}"),
                )
            finally:
                await store.close()

        report, stored, progress = asyncio.run(go())
    finally:
        client.close()
    assert report.scored == 1
    assert [(r.score_id, r.score) for r in stored] == [(score_id, 0.25)]
    assert progress == {"scored": 1}
    log = capsys.readouterr()
    assert "score_record_unreadable" in log.out + log.err
    assert marker not in log.out + log.err


def test_a_stored_record_this_version_cannot_read_is_kept_and_not_scored_again(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A score record key holding a JSON object that does not validate here (a field whose type
    another version changed) is a record the put keeps: the run is not scored again (before,
    each delivery paid for the scorer and counted a duplicate, and a job with that score never
    finished), it counts as already scored, for this job too (the record names another), and it
    is left as it was."""
    calls: list[str] = []

    def once(run: Any) -> float:
        calls.append("scored")
        return 0.25

    registry = {"kept": create_scorer("kept", type="agent").generate_score(once)}
    msg = batch(range(1), ["kept"], salt="foreign-record", job_id="j-foreign")
    (score_id,) = batch_score_ids(msg, registry)
    foreign = json.dumps({"score_id": score_id, "score": {"value": 0.9}, "job_id": "j-newer", "marker": "M-9"})
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(_keys.record_key(score_id), foreign)

        async def go() -> tuple[Any, dict[str, int]]:
            store = RedisScoreStore(redis_url)
            try:
                report = await score_batch(msg, ScoringDeps(registry=registry, store=store))
                return report, await store.jobs.progress("j-foreign")
            finally:
                await store.close()

        report, progress = asyncio.run(go())
        assert client.get(_keys.record_key(score_id)).decode() == foreign
        assert client.exists(_keys.claim_key(score_id)) == 0
    finally:
        client.close()
    assert calls == []
    assert (report.scored, report.skipped, report.deferred) == (0, {"already_scored": 1}, [])
    assert progress == {"skipped": 1, "skipped:already_scored": 1}
    log = capsys.readouterr()
    assert "score_record_unreadable" in log.out + log.err
    assert "M-9" not in log.out + log.err


# --- the judge's keys: the limiter's buckets (rebuilt) and the spend ledger (kept) ------------------


class _Verdict(BaseModel):
    score: float


def _judged(fake_llm: FakeLLMServer, url: str, budgets: Any) -> Any:
    """One judge call through the worker's limiter and guard on ``url``: the result, or the run's
    error cause."""
    from scorers import Judge, PromptStep, ScorerRunError
    from scorers.judge import JudgeHooks, set_judge_hooks
    from worker._budget import BudgetGuard, RedisLedger
    from worker._limiter import RedisRateLimiter
    from worker._settings import ModelRateLimit

    fake_llm.rule(Reply.json({"score": 0.5}))
    limiter = RedisRateLimiter(url, lambda _: ModelRateLimit(requests_per_minute=600, tokens_per_minute=100_000))
    ledger = RedisLedger(url)
    scorer = create_scorer("graded", judge=Judge("openai/gpt-4o-mini")).generate_score(
        PromptStep("grade", lambda run: "Score it", output_schema=_Verdict)
    )

    async def go() -> Any:
        try:
            return await scorer.run(input="q", output="a")
        except ScorerRunError as exc:
            return exc.cause
        finally:
            await limiter.close()
            await ledger.close()

    set_judge_hooks(JudgeHooks(limiter=limiter, guard=BudgetGuard(ledger, budgets, prices={})))
    try:
        return asyncio.run(go())
    finally:
        set_judge_hooks(JudgeHooks())


@pytest.mark.parametrize("bucket", ["req", "tok", "granted"])
@pytest.mark.parametrize("wrong", ["string", "list"])
def test_a_limiter_key_of_another_type_is_repaired_and_the_call_made(
    redis_url: str, fake_llm: FakeLLMServer, bucket: str, wrong: str
) -> None:
    """A limiter bucket holding another type failed every judge call for good, as an internal
    error (a final error record). It is state the limiter rebuilds: deleted, counted, the call made."""
    from worker._budget import Budgets

    model = "openai/gpt-4o-mini"
    key = _keys.limiter_granted_key(model) if bucket == "granted" else _keys.limiter_bucket_key(model, bucket)
    client = redis.Redis.from_url(redis_url)
    try:
        _seed(client, key, wrong)
        before = _repairs("limiter_acquire")
        result = _judged(fake_llm, redis_url, Budgets())
        assert result.score == 0.5, result
        assert _repairs("limiter_acquire") == before + 1
        assert client.type(key).decode() in ("hash", "none")
    finally:
        client.close()


@pytest.mark.parametrize("wrong", ["string", "list"])
def test_a_spend_key_of_another_type_is_refused_by_name_and_kept(
    redis_url: str, fake_llm: FakeLLMServer, wrong: str
) -> None:
    """The day's spend holding another type: every judge call failed as an internal error, a final
    record, and a repair would have let the day's spend start again. No call is made, the run's
    record names the key and is retryable (its message kept to score once the key is moved),
    and the key is left as it is."""
    from scorers.judge import JudgeCallRefused
    from worker._budget import Budgets, utc_day

    key = _keys.spend_key(utc_day())
    client = redis.Redis.from_url(redis_url)
    try:
        _seed(client, key, wrong)
        cause = _judged(fake_llm, redis_url, Budgets(total=100))
        assert isinstance(cause, JudgeCallRefused), cause
        assert cause.error_type == "store_key_refused"
        assert f"Redis key {key} holds a {wrong}" in str(cause)
        assert fake_llm.requests == []
        assert client.type(key).decode() == wrong
    finally:
        client.close()


_MODEL = "openai/gpt-4o-mini"


def _redis_second(client: redis.Redis) -> int:
    return int(client.time()[0])


@pytest.mark.parametrize(
    "damage",
    ["a bucket's time", "a bucket's level of -inf", "the calls granted this second"],
)
def test_a_limiter_field_that_is_no_number_is_repaired_and_the_call_made(
    redis_url: str, fake_llm: FakeLLMServer, damage: str
) -> None:
    """A limiter bucket's field that is not a number: its time failed the acquire script for every
    judge call of the model (a final error record each, until the bucket expired an hour after
    its last grant); a level of -inf was read as a wait past any integer, which Redis answered
    as a negative one: every call admitted, the bucket never charged, the limit gone; the calls
    granted this second not an integer failed the script after it had charged the buckets. Each
    is repaired (the field deleted: a bucket starts full, a second's count over), named and
    counted, before anything is written, and the call is made."""
    from worker._budget import Budgets

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    req, granted = _keys.limiter_bucket_key(_MODEL, "req"), _keys.limiter_granted_key(_MODEL)
    try:
        now_ms = _redis_second(client) * 1000
        if damage == "a bucket's time":
            client.hset(req, mapping={"tokens": "3", "ts": "not a number"})
        elif damage == "a bucket's level of -inf":
            client.hset(req, mapping={"tokens": "-inf", "ts": str(now_ms)})
        else:
            second = now_ms // 1000
            client.hset(granted, mapping={str(second + i): "not a number" for i in range(30)})
        for key in (req, granted):
            client.expire(key, 3600)
        before = _repairs("limiter_acquire")
        result = _judged(fake_llm, redis_url, Budgets())
        assert result.score == 0.5, result
        assert len(fake_llm.requests) == 1
        level = client.hget(req, "tokens")
        assert level is not None
        assert 0 <= float(level) < 10  # charged: the bucket (capacity 10) holds the call
        assert _repairs("limiter_acquire") == before + 1
    finally:
        client.close()


def test_a_limiter_correction_meeting_a_level_that_is_no_number_repairs_it(redis_url: str) -> None:
    """The tokens a call really used are corrected into the bucket (HINCRBYFLOAT): a level that
    is not a number failed that for good (each correction lost, logged only). Repaired (named,
    counted) and the correction made: the level starts again from it, refilled from the bucket's
    last grant at its next call."""
    from worker._limiter import RedisRateLimiter
    from worker._settings import ModelRateLimit

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    tok = _keys.limiter_bucket_key(_MODEL, "tok")
    try:
        client.hset(tok, mapping={"tokens": "not a number", "ts": str(_redis_second(client) * 1000)})
        limiter = RedisRateLimiter(redis_url, lambda _: ModelRateLimit(tokens_per_minute=60_000))

        async def go() -> None:
            try:
                await limiter.record_usage(_MODEL, 100)
            finally:
                await limiter.close()

        before = _repairs("limiter_usage")
        asyncio.run(go())
        assert _repairs("limiter_usage") == before + 1
        assert client.hget(tok, "tokens") is not None  # (deleted: the correction starts it anew)
    finally:
        client.close()


@pytest.mark.parametrize("job", [False, True], ids=["day", "job"])
def test_a_spend_total_that_is_no_number_is_summed_again_and_the_budget_holds(
    redis_url: str, fake_llm: FakeLLMServer, job: bool
) -> None:
    """The day's (or a job's) spend total not a number read as 0: every judge call passed the
    budget (and its spend, added with HINCRBYFLOAT, failed to count: judge_spend_not_counted),
    all day long. It is summed again from the scorers' spend before it is read or added to (named,
    counted, logged without values), and a budget spent refuses the call."""
    from scorers.judge import JudgeCallRefused
    from worker._budget import Budgets, run_scope, utc_day

    key = _keys.job_spend_key("j") if job else _keys.spend_key(utc_day())
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(key, mapping={"scorer:graded": "5", f"model:{_MODEL}": "5", "total": "five dollars"})
        if job:
            client.set(_keys.job_budget_key("j"), "1.0")
        before = _repairs("spend_read")
        with run_scope("t:s:graded", "graded", "j" if job else None, 0):
            cause = _judged(fake_llm, redis_url, Budgets() if job else Budgets(total=1))
        assert isinstance(cause, JudgeCallRefused), cause
        assert cause.error_type == "budget_exhausted"
        assert fake_llm.requests == []
        assert _repairs("spend_read") == before + 1
        assert float(client.hget(key, "total")) == 5.0
    finally:
        client.close()


def test_a_spend_add_meeting_a_field_that_is_no_number_repairs_it_and_counts_the_spend(redis_url: str) -> None:
    """A judge call's spend added to a field that is not a number failed (HINCRBYFLOAT), so the
    call's cost went uncounted, and so did every later one's. Repaired first: the total summed
    again from the scorers' spend, another field started over; the cost counted in each."""
    from worker._budget import RedisLedger, utc_day

    day = utc_day()
    key = _keys.spend_key(day)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(key, mapping={"scorer:graded": "2", f"model:{_MODEL}": "not a number", "total": "oops"})
        ledger = RedisLedger(redis_url)

        async def go() -> None:
            try:
                await ledger.add(day, ["scorer:graded", f"model:{_MODEL}", "total"], 0.5, None)
            finally:
                await ledger.close()

        before = _repairs("spend_add")
        asyncio.run(go())
        assert _repairs("spend_add") == before + 2
        got = {k: float(v) for k, v in client.hgetall(key).items()}
        assert got == {"scorer:graded": 2.5, f"model:{_MODEL}": 0.5, "total": 2.5}
        assert client.ttl(key) > 0
    finally:
        client.close()


def test_a_runs_failed_call_count_that_is_no_integer_is_repaired_and_counted(redis_url: str) -> None:
    """A run's count of failed judge calls that is not an integer failed its HINCRBY, and with it
    the judge's failure hook (a Redis error in place of the provider's); it read as 0, so the cap
    never held. Repaired (named, counted): the count starts over and goes on."""
    from worker._budget import RedisLedger

    key = _keys.judge_calls_key("t:s:graded")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(key, mapping={"1": "not a number", "1:error": "E: earlier"})
        ledger = RedisLedger(redis_url)

        async def go() -> tuple[int, str | None]:
            try:
                await ledger.note_failure("t:s:graded", "1", "E: now", 60)
                return await ledger.failed_calls("t:s:graded", "1")
            finally:
                await ledger.close()

        before = _repairs("judge_calls")
        assert asyncio.run(go()) == (1, "E: now")
        assert _repairs("judge_calls") == before + 1
    finally:
        client.close()


@pytest.mark.parametrize("wrong", ["hash", "list", "string without a TTL"])
def test_a_dlq_hold_key_of_another_type_or_without_a_ttl_is_repaired(redis_url: str, wrong: str) -> None:
    """``SET NX`` over a key of another type answers nil, not WRONGTYPE: a hold key left as a hash
    (or a string no caller of ours wrote, with no TTL) kept its letter from every `dlq retry` for
    good. It is repaired: the hold is taken, with its TTL."""
    key = _keys.dlq_held_key("l1")
    client = redis.Redis.from_url(redis_url)
    try:
        if wrong == "string without a TTL":
            client.set(key, "someone else's")
        else:
            _seed(client, key, wrong)

        async def go() -> tuple[bool, bool]:
            letters = RedisDeadLetters(redis_url)
            try:
                return await letters.hold("l1", 60), await letters.hold("l1", 60)
            finally:
                await letters.close()

        assert asyncio.run(go()) == (True, False)
        assert client.type(key).decode() == "string"
        assert 0 < client.pttl(key) <= 60_000
    finally:
        client.close()


def _failed(job: str, error: str = "E") -> ScoreRecord:
    return _record().model_copy(update={"job_id": job, "score": None, "error_type": error, "retryable": True})


def _put_records(url: str, *records: ScoreRecord) -> Any:
    return _score_store(url, lambda s: s.put_records(list(records), "w", 60))


# (One record each: a put sent again is then the very same record.)
_SCORE, _FAILED, _OTHERS_FAILURE = _record(), _failed("j"), _failed("o")
_OTHERS_SCORE = _record().model_copy(update={"job_id": "o"})

# Each case: what is stored before, a counter hash's field set to what HINCRBY cannot add to,
# the call, what it answers (first, then sent again), and the counters after. A total (failed,
# skipped) is summed again from its per-reason fields; another field starts over (a job's count
# is kept aside: test_a_jobs_counter_that_is_no_integer_is_kept_aside_and_its_counts_are_unknown).
_BAD_COUNTERS: dict[str, tuple[list[ScoreRecord], str, str, Callable[[str], Any], list[Any], dict[str, Any]]] = {
    "another job's failed, summed again from its reasons": (
        [_OTHERS_FAILURE],
        _keys.job_key("o"),
        "failed",
        lambda u: _put_records(u, _SCORE),
        [[True]] * 2,
        {"o": {"failed": 0, "failed:E": 0, "skipped": 1, "skipped:already_scored": 1}, "j": {"scored": 1}},
    ),
    "the failure counts' reason": (
        [],
        _FAILURES,
        "E",
        lambda u: _put_records(u, _FAILED),
        [[True]] * 2,
        {"j": {"failed": 1, "failed:E": 1}},
    ),
    "the job's skipped, met by a put refused for another's record": (
        [_OTHERS_SCORE],
        _JOB,
        "skipped",
        lambda u: _put_records(u, _SCORE),
        [[False]] * 2,
        {"j": {"skipped": 1, "skipped:already_scored": 1}, "o": {"scored": 1}},
    ),
    "the job's skipped, met by count_skipped_once": (
        [],
        _JOB,
        "skipped",
        lambda u: _jobs(u, _skip_once),
        [1, 0],
        {"j": {"skipped": 1, "skipped:r": 1}},
    ),
}


@pytest.mark.parametrize("case", list(_BAD_COUNTERS))
def test_a_counter_that_is_no_integer_is_repaired_before_anything_is_written(redis_url: str, case: str) -> None:
    """A counter field holding a non-integer (written by hand, another program) made the put fail
    at its HINCRBY, after the score record was written: the score stored, its counts not, and the
    message failing on every delivery (a retry met its own record: never counted). Now checked
    with the keys before any write: repaired (named, counted) and the call made again whole."""
    before_puts, key, field, call, answers, counts = _BAD_COUNTERS[case]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for record in before_puts:
            assert _put_records(redis_url, record) == [True]
        bad = "not a number"
        client.hset(key, field, bad)
        repairs = _repairs()
        assert call(redis_url) == answers[0]
        assert _repairs() == repairs + 1
        assert client.hget(key, field) != bad
        for job, want in counts.items():
            assert _jobs(redis_url, lambda j, job=job: j.progress(job)) == want
        assert call(redis_url) == answers[1]  # sent again (its reply lost): nothing counted twice
        for job, want in counts.items():
            assert _jobs(redis_url, lambda j, job=job: j.progress(job)) == want
    finally:
        client.close()


_SKIPS = _keys.job_skips_key("j")


@pytest.mark.parametrize("again", ["count_skipped_once", "put refused", "finish", "progress"])
def test_a_jobs_set_of_counted_skips_of_another_type_is_refused_not_counted_again(redis_url: str, again: str) -> None:
    """Job j counted a skip (another job's record stands for the score); then its set of counted
    skips holds another type. It was repaired by deleting it, so the next delivery meeting the
    score counted the skip again: 2 of 1, the job's wait ending with a score on its way. It is
    refused instead (named, left as it is, nothing written): the job's counts are unknown until
    the key is moved aside, never counted twice."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert _put_records(redis_url, _OTHERS_SCORE) == [True]
        assert _jobs(redis_url, lambda j: j.count_skipped_once("j", "already_scored", [SCORE])) == 1
        counted = _jobs(redis_url, lambda j: j.progress("j"))
        assert counted == {"skipped": 1, "skipped:already_scored": 1}
        client.delete(_SKIPS)
        client.set(_SKIPS, "someone else's")
        call = {
            "count_skipped_once": lambda: _jobs(
                redis_url, lambda j: j.count_skipped_once("j", "already_scored", [SCORE])
            ),
            "put refused": lambda: _put_records(redis_url, _SCORE),
            "finish": lambda: _jobs(redis_url, lambda j: j.finish("j")),
            "progress": lambda: _jobs(redis_url, lambda j: j.progress("j")),
        }[again]
        refused: StoreKeyTypeError | None = None
        try:
            call()
        except StoreKeyTypeError as exc:
            refused = exc
        assert client.hgetall(_JOB) == {k: str(v) for k, v in counted.items()}  # (was skipped 2)
        assert refused is not None
        assert refused.key == _SKIPS
        assert client.get(_SKIPS) == "someone else's"
    finally:
        client.close()


@pytest.mark.parametrize("path", ["late put", "count_skipped_once", "finish", "progress", "job_progress"])
def test_a_jobs_counter_hash_of_another_type_is_refused_not_counted_again(redis_url: str, path: str) -> None:
    """Job j scored its one score and ended; then its counter hash holds another type. Deleted as
    a repair, it lost the job's counts (a backfill waiting for its total waited for good) and the
    mark of its end (a late delivery, its record expired, counted again: past the job's total).
    Refused instead, on every path: named, left as it is, nothing written."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert _put_records(redis_url, _SCORE) == [True]
        _jobs(redis_url, lambda j: j.finish("j"))
        assert client.hgetall(_JOB) == {"scored": "1", "finished": "1"}
        client.delete(_RECORD)  # (expired: a late delivery stores it again)
        client.delete(_JOB)
        client.rpush(_JOB, "an older version's")
        call = {
            "late put": lambda: _put_records(redis_url, _SCORE),
            "count_skipped_once": lambda: _jobs(redis_url, lambda j: j.count_skipped_once("j", "r", ["s2"])),
            "finish": lambda: _jobs(redis_url, lambda j: j.finish("j")),
            "progress": lambda: _jobs(redis_url, lambda j: j.progress("j")),
            "job_progress": lambda: _sync_progress(redis_url),
        }[path]
        with pytest.raises(StoreKeyTypeError) as refused:
            call()
        assert refused.value.key == _JOB
        assert client.lrange(_JOB, 0, -1) == ["an older version's"]
        assert client.get(_RECORD) is None  # (the late put stored nothing either)
    finally:
        client.close()


def test_a_jobs_set_of_uncounted_records_of_another_type_is_refused_by_progress(redis_url: str) -> None:
    """Every put of job j refuses while its set of uncounted records holds another type, so the
    job counts nothing more: its progress is refused too, naming the key (a backfill waiting for
    its total stops and says why), not a figure that stays short of its total for good."""
    uncounted = _keys.job_uncounted_key("j")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.set(uncounted, "someone else's")
        with pytest.raises(StoreKeyTypeError):
            _put_records(redis_url, _SCORE)
        for read in (lambda: _jobs(redis_url, lambda j: j.progress("j")), lambda: _sync_progress(redis_url)):
            with pytest.raises(StoreKeyTypeError) as refused:
                read()
            assert refused.value.key == uncounted
        assert client.get(uncounted) == "someone else's"
    finally:
        client.close()


_LETTER = _letter()  # (one letter: its id is its own)


def _take_pushed(url: str) -> Any:
    async def go(letters: RedisDeadLetters) -> Any:
        taken = await letters.take(_LETTER.id)
        return taken is not None, await letters.size(), await letters.counts()

    return _letters(url, go)


def _push_one(url: str) -> Any:
    async def go(letters: RedisDeadLetters) -> Any:
        return await letters.push(_letter()), await letters.size(), await letters.counts()

    return _letters(url, go)


def _settled(url: str, how: str) -> Any:
    outbox = RedisOutbox(url, reconnect_s=0.5)
    try:
        outbox.register([SINK])
        outbox.enqueue(SINK, [SCORE])
        lease = outbox.lease(SINK, 10, 60)
        done = outbox.ack(lease, [SCORE]) if how == "ack" else outbox.retry(lease, {SCORE: 0.0})
        return done, outbox.counts()[SINK].as_dict()
    finally:
        outbox.close()


def _leased_attempts(url: str) -> Any:
    outbox, client = RedisOutbox(url, reconnect_s=0.5), redis.Redis.from_url(url)
    try:
        lease = outbox.lease(SINK, 10, 60)
        return lease.ids, int(client.hget(_ATTEMPTS, SCORE) or 0)
    finally:
        outbox.close()
        client.close()


# Each case: the counter hash and field made bad, the letters pushed before, the call and what it
# answers. (A letter taken while its reason's count was bad was removed, then the script failed:
# `dlq retry`, which takes a letter once it has requeued it, ended in an error, the count left.)
_OTHER_COUNTERS: dict[str, tuple[str, str, bool, Callable[[str], Any], Any]] = {
    "a dead letter taken": (_REASONS, "test", True, _take_pushed, (True, 0, {})),
    "a dead letter pushed": (_REASONS, "test", False, _push_one, (True, 1, {"test": 1})),
    "a sink's delivery acked": (_COUNTS, "delivered", False, lambda u: _settled(u, "ack"), (1, "delivered")),
    "a sink's delivery retried": (_COUNTS, "retried", False, lambda u: _settled(u, "retry"), (1, "retried")),
    # (each lease failed at it, after moving the ids it had leased: the sink stuck for good)
    "a sink's queued id leased": (_ATTEMPTS, SCORE, False, _leased_attempts, ([SCORE], 1)),
}


@pytest.mark.parametrize("case", list(_OTHER_COUNTERS))
def test_other_scripts_repair_a_counter_that_is_no_integer_before_writing(redis_url: str, case: str) -> None:
    """The put's fault in the store's other scripts that add to a counter after a write."""
    key, field, pushed, call, expected = _OTHER_COUNTERS[case]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        if pushed:
            assert _letters(redis_url, lambda d: d.push(_LETTER)) is True
        if key == _ATTEMPTS:
            _outbox(redis_url, lambda o: o.enqueue(SINK, [SCORE]))
        client.hset(key, field, "not a number")
        repairs = _repairs()
        answer = call(redis_url)
        if key == _COUNTS:
            done, counts = answer
            assert (done, counts[expected[1]]) == (expected[0], 1)
        else:
            assert answer == expected
        assert _repairs() == repairs + 1
    finally:
        client.close()


_BY_HAND = "12, by hand"


def _counts_refused(url: str, job: str) -> list[StoreKeyTypeError | None]:
    """What job ``job``'s progress raises, read by the workers' store and by the backfill's."""

    def sync() -> Any:
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            return job_progress(client, job)
        finally:
            client.close()

    raised: list[StoreKeyTypeError | None] = []
    for read in (lambda: _jobs(url, lambda j: j.progress(job)), sync):
        try:
            read()
        except StoreKeyTypeError as exc:
            raised.append(exc)
        else:
            raised.append(None)
    return raised


# Each case: the records stored before, the job whose field is made no integer, the field, what
# it is made, the call meeting it and what the call answers.
_JOB_FIELDS: dict[str, tuple[list[ScoreRecord], str, str, str, Callable[[str], Any], Any]] = {
    "the job's scored, met by its put": ([], "j", "scored", _BY_HAND, lambda u: _put_records(u, _SCORE), [True]),
    "a count an increment would overflow": (
        [],
        "j",
        "scored",
        "9223372036854775807",
        lambda u: _put_records(u, _SCORE),
        [True],
    ),
    "another job's reason, met by a put replacing its failure": (
        [_OTHERS_FAILURE],
        "o",
        "failed:E",
        _BY_HAND,
        lambda u: _put_records(u, _SCORE),
        [True],
    ),
    "the job's skip reason, met by count_skipped_once": (
        [],
        "j",
        "skipped:r",
        _BY_HAND,
        lambda u: _jobs(u, _skip_once),
        1,
    ),
    "the job's scored, met by its progress": ([], "j", "scored", _BY_HAND, lambda u: None, None),
}


@pytest.mark.parametrize("case", list(_JOB_FIELDS))
def test_a_jobs_counter_that_is_no_integer_is_kept_aside_and_its_counts_are_unknown(redis_url: str, case: str) -> None:
    """A job's counter (not a total) holding no integer was deleted as a repair: its count started
    over, and a backfill waiting for the job's total waited out its --wait-timeout, the job's
    count short of what happened. Refusing the job's writes instead would dead-letter every
    message of the job (and another's whose record replaces one of its failures): so the put
    still writes and counts (nothing lost), the field's value is kept aside
    (``unreadable:<field>``), and the job's progress is refused naming the key and the field,
    never the value."""
    before_puts, job, field, bad, call, answer = _JOB_FIELDS[case]
    key = _keys.job_key(job)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for record in before_puts:
            assert _put_records(redis_url, record) == [True]
        client.hset(key, field, bad)
        repairs = _repairs()
        assert call(redis_url) == answer
        if answer == [True]:
            assert json.loads(client.get(_RECORD))["score"] == 1.0  # stored: nothing lost
        for refused in _counts_refused(redis_url, job):
            assert refused is not None, "the job's counts read as if nothing was wrong"
            assert getattr(refused, "field", None) == field, refused
            assert refused.key == key
            assert field in str(refused)
            assert key in str(refused)
            assert bad not in str(refused)
        assert _repairs() == repairs + 1  # (once: the progress read after it meets it kept aside)
        assert client.hget(key, f"unreadable:{field}") == bad
        assert client.hget(key, field) != bad
        if job == "o":  # (the put's own job counts as ever)
            assert _jobs(redis_url, lambda j: j.progress("j")) == {"scored": 1}
    finally:
        client.close()


def test_a_jobs_counter_damaged_again_keeps_every_value_found_and_counts_them(redis_url: str) -> None:
    """A job's count damaged a second time before the operator repaired the first: the second value
    kept aside replaced the first (an HSET), so the count the first held was lost. Each value is
    kept now, written once: the first where it was (``unreadable:<field>``), the next under
    ``unreadable:<field>#<n>``, and ``unreadable:<field>#count`` counts them; past
    ``JOB_COUNTER_KEPT`` values only the count grows (a field damaged in a loop cannot grow Redis
    without bound). The refusal names every field kept, never a value."""
    key = _keys.job_key("j")
    first = "unreadable:scored"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(key, "scored", _BY_HAND)
        assert _put_records(redis_url, _SCORE) == [True]  # (met by the put: the score stored, counted from 0)
        client.hset(key, "scored", "5, by hand again")
        refusals = _counts_refused(redis_url, "j")  # (met by the progress read)
        assert client.hget(key, first) == _BY_HAND  # the first value, not replaced by the second
        assert client.hget(key, f"{first}#2") == "5, by hand again"
        assert client.hget(key, f"{first}#count") == "2"
        for refused in refusals:
            assert isinstance(refused, UnreadableCounterError), refused
            assert (refused.key, refused.field, refused.times) == (key, "scored", 2)
            assert (refused.kept, refused.counted) == ((first, f"{first}#2"), f"{first}#count")
            assert f"HDEL {key} {first} {first}#2 {first}#count" in str(refused)
            assert "by hand" not in str(refused)

        values = [_BY_HAND, "5, by hand again", *(f"{n}, by hand" for n in range(3, JOB_COUNTER_KEPT + 6))]
        for value in values[2:]:  # damaged in a loop
            client.hset(key, "scored", value)
            _counts_refused(redis_url, "j")
        kept = [first, *(f"{first}#{n}" for n in range(2, JOB_COUNTER_KEPT + 1))]
        aside = {f: v for f, v in client.hgetall(key).items() if f.startswith("unreadable:")}
        assert aside == {**dict(zip(kept, values, strict=False)), f"{first}#count": str(len(values))}
        for refused in _counts_refused(redis_url, "j"):
            assert isinstance(refused, UnreadableCounterError), refused
            assert (refused.times, refused.kept, refused.counted) == (len(values), tuple(kept), f"{first}#count")
            assert f"{len(values)} times" in str(refused)
            assert f"{JOB_COUNTER_KEPT} of the {len(values)} values found are kept" in str(refused)
        # Its count written by hand past what int() reads (4,300 digits): the values kept are named.
        client.hset(key, f"{first}#count", "9" * 5000)
        for refused in _counts_refused(redis_url, "j"):
            assert isinstance(refused, UnreadableCounterError), refused
            assert refused.times == JOB_COUNTER_KEPT
    finally:
        client.close()


@pytest.mark.parametrize("damage", ["not a number", "nan", "inf"])
def test_a_limiter_bucket_level_that_is_no_number_is_shown_unknown_and_counted(redis_url: str, damage: str) -> None:
    """`tracescore status` reads the buckets' levels: one that is no number (or not finite) was
    left out of the model's line, logged only, never counted (or shown as nan); it is unknown
    now, as a second's count that is no number is, and counted as unreadable."""
    from worker._limiter import RedisRateLimiter
    from worker._settings import ModelRateLimit
    from worker.metrics._instruments import _metrics

    def unreadable() -> float:
        (family,) = _metrics().unreadable.collect()
        return sum(s.value for s in family.samples if s.labels == {"key": "limiter_bucket"})

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    req = _keys.limiter_bucket_key(_MODEL, "req")
    try:
        client.hset(req, mapping={"tokens": damage, "ts": str(_redis_second(client) * 1000)})
        limiter = RedisRateLimiter(redis_url, lambda _: ModelRateLimit(requests_per_minute=60))

        async def state() -> dict[str, dict[str, float | None]]:
            try:
                return await limiter.state()
            finally:
                await limiter.close()

        before = unreadable()
        assert asyncio.run(state())[_MODEL] == {"req_bucket": None}
        assert unreadable() == before + 1
        assert client.hget(req, "tokens") == damage  # read only: the next call's script repairs it
    finally:
        client.delete(req)
        client.close()
