"""The outbox contract (``worker.store.Outbox``) on Redis (DB 11) and in memory: what
``put_records`` queues per sink, leases, acks, retries, dead letters, redrive, expired records."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.worker._workers import wait_for
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, MemorySink, Refused, Retry
from worker._delivery import DrainPolicy, drain_once
from worker.store import MemoryOutbox, MemoryScoreStore, Outbox, RedisOutbox, RedisScoreStore, SinkDeadLetter

SINKS = ("alpha", "beta")


@pytest.fixture(params=["memory", "redis"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Outbox]]:
    """(store, outbox) of one implementation, with the sinks alpha and beta configured."""
    if request.param == "memory":
        memory = MemoryScoreStore(sinks=SINKS)
        yield (lambda: memory), memory.outbox
        return
    url = request.getfixturevalue("redis_url")
    outbox = RedisOutbox(url)  # the sinks are registered by the first put_records
    # A store per call: its asyncio client belongs to the event loop of that call.
    yield (lambda: RedisScoreStore(url, sinks=SINKS)), outbox
    outbox.close()


def _record(n: int, **kw: Any) -> ScoreRecord:
    trace, span = f"{n:032x}", f"{n:016x}"
    return ScoreRecord(score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s", **kw)


def _put(make_store: Any, *records: ScoreRecord) -> list[bool]:
    async def go() -> list[bool]:
        store = make_store()
        try:
            return list(await store.put_records(list(records), "w1", 600))
        finally:
            await store.close()

    return asyncio.run(go())


def test_implementations_satisfy_the_protocol(redis_url: str) -> None:
    """Both outboxes are Outboxes."""
    redis_outbox = RedisOutbox(redis_url)
    assert isinstance(redis_outbox, Outbox)
    assert isinstance(MemoryOutbox(lambda ids: {}), Outbox)
    redis_outbox.close()


def test_put_records_queues_each_new_score_for_every_sink(pair: tuple[Any, Outbox]) -> None:
    """A new record is pending for each sink; a duplicate put queues nothing more."""
    store, outbox = pair
    assert _put(store, _record(1, score=0.1), _record(2, score=0.2)) == [True, True]
    assert _put(store, _record(1, score=0.9)) == [False]
    counts = outbox.counts()
    assert sorted(counts) == list(SINKS)
    assert all(c.pending == 2 and c.delivered == c.failed == 0 for c in counts.values())


def test_lease_hides_ids_until_it_runs_out_and_counts_attempts(pair: tuple[Any, Outbox]) -> None:
    """Leased ids are invisible to a second drainer; when the lease runs out (its drainer died)
    they come back with the attempt counted; other sinks are unaffected."""
    store, outbox = pair
    _put(store, _record(1, score=0.1), _record(2, score=0.2))
    first = outbox.lease("alpha", 10, lease_s=0.3)
    assert sorted(first.attempts.values()) == [1, 1]
    assert outbox.lease("alpha", 10, lease_s=0.3).ids == []
    assert len(outbox.lease("beta", 10, lease_s=30).ids) == 2
    again: list[Any] = []
    assert wait_for(lambda: bool(again.append(outbox.lease("alpha", 10, lease_s=30)) or again[-1].ids), 5)
    assert sorted(again[-1].ids) == sorted(first.ids)
    assert set(again[-1].attempts.values()) == {2}
    # The dead drainer's late ack is ignored: the ids belong to the second lease now.
    assert outbox.ack(first, first.ids) == 0
    assert outbox.counts()["alpha"].pending == 2


def test_ack_retry_dead_and_redrive(pair: tuple[Any, Outbox]) -> None:
    """ack → delivered; retry → due again after its delay; dead → a dead letter (failed), which
    redrive queues again with its attempts reset."""
    store, outbox = pair
    a, b, c = _record(1, score=0.1), _record(2, score=0.2), _record(3, score=0.3)
    _put(store, a, b, c)
    lease = outbox.lease("alpha", 10, lease_s=30)
    assert outbox.ack(lease, [a.score_id]) == 1
    assert outbox.retry(lease, {b.score_id: 0.4}) == 1
    letter = SinkDeadLetter(score_id=c.score_id, sink="alpha", reason="http_400", detail="bad field", attempts=1)
    assert outbox.dead(lease, [letter]) == 1
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.pending, counts.failed, counts.retried) == (1, 1, 1, 1)
    assert outbox.states("alpha", [a.score_id, b.score_id, c.score_id]) == {
        a.score_id: "delivered",
        b.score_id: "pending",
        c.score_id: "failed",
    }
    assert outbox.lease("alpha", 10, lease_s=30).ids == []  # b waits out its delay
    later: list[Any] = []
    assert wait_for(lambda: bool(later.append(outbox.lease("alpha", 10, lease_s=30)) or later[-1].ids), 5)
    assert later[-1].attempts == {b.score_id: 2}
    (stored,) = outbox.dead_letters("alpha")
    assert (stored.reason, stored.detail) == ("http_400", "bad field")
    assert outbox.redrive("alpha") == 1
    assert outbox.dead_letters("alpha") == []
    assert outbox.lease("alpha", 10, lease_s=30).attempts == {c.score_id: 1}
    assert outbox.redrive("alpha", ["0" * 64]) == 0


def test_a_replaced_record_is_queued_again_even_while_leased(pair: tuple[Any, Outbox]) -> None:
    """A retryable error record replaced by its score while a drainer holds it: the old lease's
    ack does not take the new record off the queue."""
    store, outbox = pair
    old = _record(1, error_type="timeout", retryable=True)
    _put(store, old)
    lease = outbox.lease("alpha", 10, lease_s=30)
    assert _put(store, _record(1, score=0.7)) == [True]
    assert outbox.ack(lease, [old.score_id]) == 0
    fresh = outbox.lease("alpha", 10, lease_s=30)
    assert fresh.ids == [old.score_id]
    assert outbox.records(fresh.ids)[old.score_id].score == 0.7


def test_drain_once_delivers_refuses_retries_and_drops_gone_records(pair: tuple[Any, Outbox]) -> None:
    """The drainer step: delivered ids are acked, a refusal is a dead letter with the backend's
    answer, a retry past max_attempts is a dead letter, an id whose record expired is dropped."""
    store, outbox = pair
    _put(store, _record(1, score=0.1))
    outbox.enqueue("alpha", ["f" * 64])  # its record is gone (TTL)
    sink = MemorySink("alpha")
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=2, backoff_s=0.05, backoff_max_s=0.05)
    assert drain_once(sink, outbox, policy) == 2
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.dropped, counts.pending) == (1, 1, 0)
    assert [r.trace_id for r in sink.records] == [f"{1:032x}"]

    _put(store, _record(2, score=0.2), _record(3, score=0.3))
    sink = MemorySink("beta")
    sink.outcome = Refused("http_422", "experiment header missing")
    assert drain_once(sink, outbox, policy) == 3  # 1, 2 and 3 are all queued for beta
    (first, *_) = letters = outbox.dead_letters("beta")
    assert len(letters) == 3
    assert (first.reason, first.detail) == ("http_422", "experiment header missing")

    _put(store, _record(4, score=0.4))
    sink = MemorySink("alpha")  # alpha still owes 2, 3 and 4
    sink.outcome = Retry("http_503", after_s=0.0)
    assert drain_once(sink, outbox, policy) == 3
    # Each retry comes due after its own (jittered) backoff: drain until all three are settled.
    assert wait_for(lambda: drain_once(sink, outbox, policy) >= 0 and len(outbox.dead_letters("alpha")) == 3, 5)
    letters = outbox.dead_letters("alpha")
    assert len(letters) == 3
    assert {(x.reason, x.attempts) for x in letters} == {("max_attempts", 2)}
    assert all("http_503" in x.detail for x in letters)
    sink.outcome = Delivered()
    assert outbox.redrive("alpha") == 3
    assert drain_once(sink, outbox, policy) == 3
    assert outbox.counts()["alpha"].delivered == 4


def test_a_lone_surrogate_in_record_text_is_stored_and_delivered(pair: tuple[Any, Outbox]) -> None:
    """A record whose text holds a lone surrogate (an agent's cut emoji through json.loads) is
    stored with U+FFFD, its batch neighbours too, and every sink gets it (it used to fail the
    whole group commit on every retry)."""
    store, outbox = pair
    cut = _record(1, score=None, error_type="ValueError", error_message="unexpected answer: cut \ud83d")
    assert _put(store, cut, _record(2, score=0.2, reason="quotes \udc00 too")) == [True, True]
    sink = MemorySink("alpha")
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=2)
    assert drain_once(sink, outbox, policy) == 2
    assert outbox.counts()["alpha"].delivered == 2
    texts = sorted(str(r.error_message or r.reason) for r in sink.records)
    assert texts == ["quotes \ufffd too", "unexpected answer: cut \ufffd"]


def test_an_unreadable_record_is_a_dead_letter_and_its_batch_is_delivered(redis_url: str) -> None:
    """A stored record that no longer validates (corrupt, an older schema) is its own dead letter
    naming why (not its content); its batch neighbours are delivered in the same pass."""
    import redis

    from worker import _keys

    store = lambda: RedisScoreStore(redis_url, sinks=SINKS)  # noqa: E731
    good = [_record(n, score=0.5) for n in range(5)]
    _put(store, *good)
    raw = redis.Redis.from_url(redis_url)
    raw.set(_keys.record_key(good[2].score_id), '{"score_id": "x", "source": "replay", "reason": "secret text"}')
    raw.close()
    outbox = RedisOutbox(redis_url)
    try:
        sink = MemorySink("alpha")
        assert drain_once(sink, outbox, DrainPolicy(batch_size=10, lease_s=30, max_attempts=3)) == 5
        assert sorted(r.score_id for r in sink.records) == sorted(r.score_id for r in good if r != good[2])
        counts = outbox.counts()["alpha"]
        assert (counts.delivered, counts.failed, counts.pending) == (4, 1, 0)
        (letter,) = outbox.dead_letters("alpha")
        assert (letter.score_id, letter.reason) == (good[2].score_id, "unreadable_record")
        assert "source" in letter.detail
        assert "trace_id" in letter.detail
        assert "secret text" not in letter.detail
        assert "replay" not in letter.detail
    finally:
        outbox.close()


def test_max_attempts_bounds_leases_that_never_settle(pair: tuple[Any, Outbox]) -> None:
    """Ids whose every lease ran out unsettled (a record that kills its drainer) become dead
    letters once leased past max_attempts, without another try at the sink."""
    store, outbox = pair
    _put(store, _record(1, score=0.5))
    policy = DrainPolicy(batch_size=10, lease_s=0.05, max_attempts=2)
    for _ in range(policy.max_attempts):  # two drainers that died mid-delivery
        assert wait_for(lambda: bool(outbox.lease("alpha", 10, policy.lease_s).ids), 5)
    sink = MemorySink("alpha")
    assert wait_for(lambda: drain_once(sink, outbox, policy) == 1, 5)
    assert sink.records == []
    (letter,) = outbox.dead_letters("alpha")
    assert (letter.reason, letter.attempts) == ("max_attempts", 3)
    assert outbox.counts()["alpha"].pending == 0


class _Slow(MemorySink):
    """A backend slower than the drainers' lease."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name)
        self.seconds = seconds
        self.lock = threading.Lock()

    def deliver(self, records: Any) -> Any:
        time.sleep(self.seconds)
        with self.lock:
            return super().deliver(records)


def test_a_delivery_slower_than_the_lease_is_renewed_not_resent(pair: tuple[Any, Outbox], redis_url: str) -> None:
    """Two drainers of one sink (two worker processes) and a batch that takes longer than the
    lease: the lease is renewed while it is in flight, so every score reaches the backend once
    and is acknowledged (it used to be re-leased by the other drainer on every lease period)."""
    store, outbox = pair
    records = [_record(n, score=0.5) for n in range(10)]
    _put(store, *records)
    policy = DrainPolicy(batch_size=5, lease_s=0.3, max_attempts=12)
    sink = _Slow("alpha", 1.0)
    stop = threading.Event()
    outboxes = [outbox, outbox if isinstance(outbox, MemoryOutbox) else RedisOutbox(redis_url)]

    def drainer(mine: Outbox) -> None:
        while not stop.is_set():
            if not drain_once(sink, mine, policy):
                stop.wait(0.02)

    threads = [threading.Thread(target=drainer, args=(o,)) for o in outboxes]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: outbox.counts()["alpha"].delivered == 10, 15)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if outboxes[1] is not outbox:
            outboxes[1].close()
    assert sorted(r.score_id for r in sink.records) == sorted(r.score_id for r in records)
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.pending, counts.failed, counts.retried) == (10, 0, 0, 0)


def test_delivered_is_a_positive_fact_never_inferred_from_absence(pair: tuple[Any, Outbox]) -> None:
    """states(): an id never queued for the sink (a run without a record, another sink's) or
    dropped is "none"; only an acknowledged one is "delivered"."""
    store, outbox = pair
    kept, lost = _record(1, score=0.1), _record(2, score=0.2)
    _put(store, kept)
    outbox.enqueue("alpha", [lost.score_id])  # queued, then its record expired
    never = _record(3).score_id
    assert outbox.states("alpha", [kept.score_id, never]) == {kept.score_id: "pending", never: "none"}
    assert drain_once(MemorySink("alpha"), outbox, DrainPolicy(batch_size=10, lease_s=30)) == 2
    assert outbox.states("alpha", [kept.score_id, lost.score_id, never]) == {
        kept.score_id: "delivered",
        lost.score_id: "none",
        never: "none",
    }
    assert outbox.states("beta", [kept.score_id]) == {kept.score_id: "pending"}


def test_a_dead_letter_whose_record_is_replaced_and_delivered_is_no_longer_dead(pair: tuple[Any, Outbox]) -> None:
    """A retryable error record refused by a sink (a dead letter), then replaced by the real
    score: the new record is owed afresh (attempts reset) and, once delivered, is no dead letter."""
    store, outbox = pair
    old = _record(1, error_type="timeout", retryable=True)
    _put(store, old)
    sink = MemorySink("alpha")
    sink.outcome = Refused("http_400", "bad")
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=3)
    assert drain_once(sink, outbox, policy) == 1
    assert outbox.states("alpha", [old.score_id]) == {old.score_id: "failed"}
    assert _put(store, _record(1, score=0.7)) == [True]
    assert outbox.states("alpha", [old.score_id]) == {old.score_id: "pending"}
    assert outbox.dead_letters("alpha") == []
    lease = outbox.lease("alpha", 10, lease_s=30)
    assert lease.attempts == {old.score_id: 1}
    sink.outcome = Delivered()
    assert outbox.ack(lease, lease.ids) == 1
    assert outbox.states("alpha", [old.score_id]) == {old.score_id: "delivered"}
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.failed, counts.pending) == (1, 0, 0)
    # Queued by hand again (enqueue): owed anew, not delivered, not dead.
    outbox.enqueue("alpha", [old.score_id])
    assert outbox.states("alpha", [old.score_id]) == {old.score_id: "pending"}


def test_retry_after_is_respected(pair: tuple[Any, Outbox]) -> None:
    """A sink's Retry.after_s is the least wait before the next attempt."""
    store, outbox = pair
    _put(store, _record(1, score=0.1))
    sink = MemorySink("alpha")
    sink.outcome = Retry("http_429", after_s=1.0)
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=5, backoff_s=0.01, backoff_max_s=0.01)
    started = time.monotonic()
    assert drain_once(sink, outbox, policy) == 1
    sink.outcome = Delivered()
    assert wait_for(lambda: drain_once(sink, outbox, policy) == 1, 5)
    assert time.monotonic() - started >= 0.8  # ≥ after_s, less the jitter


class _TripsOn(MemorySink):
    """A sink with a bug: it raises on a batch holding one particular record."""

    def __init__(self, name: str, bad: str) -> None:
        super().__init__(name)
        self.bad = bad

    def deliver(self, records: Any) -> Any:
        if any(r.score_id == self.bad for r in records):
            raise KeyError("a sink bug")
        return super().deliver(records)


def test_a_sink_that_raises_on_one_record_still_takes_the_others(pair: tuple[Any, Outbox]) -> None:
    """A sink raising for a batch is retried record by record: the others are delivered, the one
    it trips on waits for a retry (counted), and after max_attempts is a dead letter naming the bug."""
    store, outbox = pair
    records = [_record(n, score=0.5) for n in range(5)]
    _put(store, *records)
    sink = _TripsOn("alpha", records[2].score_id)
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=2, backoff_s=0.05, backoff_max_s=0.05)
    assert drain_once(sink, outbox, policy) == 5
    assert sorted(r.score_id for r in sink.records) == sorted(r.score_id for r in records if r != records[2])
    assert wait_for(lambda: drain_once(sink, outbox, policy) >= 0 and outbox.counts()["alpha"].failed == 1, 5)
    (letter,) = outbox.dead_letters("alpha")
    assert letter.score_id == records[2].score_id
    assert "sink_crashed:KeyError" in letter.detail


class _Answers(MemorySink):
    """A sink answering ``answer`` (no Delivery at all) for one record, Delivered for the rest."""

    def __init__(self, name: str, odd: str, answer: Any) -> None:
        super().__init__(name)
        self.odd, self.answer = odd, answer

    def deliver(self, records: Any) -> Any:
        return [self.answer if r.score_id == self.odd else Delivered() for r in records]


@pytest.mark.parametrize("answer", [None, "delivered", True])
def test_a_sink_answering_no_outcome_for_a_record_is_retried_then_named(pair: tuple[Any, Outbox], answer: Any) -> None:
    """An answer that is no Delivered, Retry or Refused (a custom sink's bug) was a dead letter at
    the first try, named "max_attempts" ("1 attempts; the last: bad_outcome"): now it is retried
    as a sink that raises is, and the dead letter, once the attempts are spent, names it."""
    store, outbox = pair
    records = [_record(n, score=0.5) for n in range(3)]
    _put(store, *records)
    sink = _Answers("alpha", records[1].score_id, answer)
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=2, backoff_s=0.05, backoff_max_s=0.05)
    assert drain_once(sink, outbox, policy) == 3
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.failed, counts.pending) == (2, 0, 1)
    assert wait_for(lambda: drain_once(sink, outbox, policy) >= 0 and outbox.counts()["alpha"].failed == 1, 5)
    (letter,) = outbox.dead_letters("alpha")
    assert (letter.score_id, letter.reason, letter.attempts) == (records[1].score_id, "max_attempts", 2)
    assert "sink_answered_no_outcome" in letter.detail


class _Stuck(MemorySink):
    """A sink whose delivery hangs until released, and which records its close."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.delivering = threading.Event()
        self.release = threading.Event()
        self.closed = threading.Event()

    def deliver(self, records: Any) -> Any:
        self.delivering.set()
        self.release.wait(30)
        return super().deliver(records)

    def close(self) -> None:
        self.closed.set()


def test_stop_closes_a_sink_only_after_its_drainer_ended() -> None:
    """Deliveries.stop leaves the sink of a drainer still delivering past the timeout open (its
    close could block the shutdown or pull the file from under it), and closes the others."""
    from worker._delivery import Deliveries

    store = MemoryScoreStore(sinks=SINKS)
    _put(lambda: store, _record(1, score=0.5))
    stuck, idle = _Stuck("alpha"), _Stuck("beta")
    idle.release.set()
    deliveries = Deliveries([stuck, idle], lambda: store.outbox, DrainPolicy(lease_s=30, poll_s=0.05)).start()
    try:
        assert stuck.delivering.wait(10)
        assert wait_for(lambda: store.outbox.counts()["beta"].delivered == 1, 10)
        deliveries.stop(timeout_s=0.2)
        assert idle.closed.is_set()
        assert not stuck.closed.is_set()
    finally:
        stuck.release.set()
    assert wait_for(lambda: store.outbox.counts()["alpha"].delivered == 1, 10)
    assert not stuck.closed.is_set()


def test_finish_waits_no_longer_than_its_timeout_for_a_drainer_still_delivering() -> None:
    """A command scoring in place waits up to TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS for its sinks:
    it joined a drainer stuck in a delivery with no limit (0 s gave 15 s against an OTLP endpoint
    that was down, 30 s gave 43 s; README audit). Now a drainer still delivering at the deadline
    is left to it, its scores pending, while the other sinks' are delivered."""
    from worker._delivery import Deliveries

    store = MemoryScoreStore(sinks=SINKS)
    _put(lambda: store, _record(1, score=0.5))
    stuck = _Stuck("alpha")
    deliveries = Deliveries([stuck, MemorySink("beta")], lambda: store.outbox, DrainPolicy(lease_s=30, poll_s=0.05))
    deliveries.start()
    try:
        assert stuck.delivering.wait(10)
        counts = deliveries.finish(store.outbox, 0.5)  # (before: waited out the stuck delivery, 30 s)
        assert (counts["alpha"].pending, counts["alpha"].delivered) == (1, 0)
        assert counts["beta"].delivered == 1
    finally:
        stuck.release.set()


def test_a_corrupt_dead_letter_is_listed_as_unreadable_not_a_crash(redis_url: str) -> None:
    """One dead letter that does not parse is listed by its id as unreadable_dead_letter (it can
    still be retried); the others as they are; `tracescore sinks list` does not crash. (A sink
    named as a real one: the command takes only those names.)"""
    import json

    import redis
    from click.testing import CliRunner

    from worker import _keys
    from worker.cli import cli

    store = lambda: RedisScoreStore(redis_url, sinks=("otlp",))  # noqa: E731
    records = [_record(n, score=0.5) for n in range(3)]
    _put(store, *records)
    outbox = RedisOutbox(redis_url)
    try:
        sink = MemorySink("otlp")
        sink.outcome = Refused("http_400", "bad")
        assert drain_once(sink, outbox, DrainPolicy(batch_size=10, lease_s=30)) == 3
        raw = redis.Redis.from_url(redis_url)
        raw.hset(_keys.outbox_dead_key("otlp"), records[1].score_id, "{not json")
        raw.close()
        letters = outbox.dead_letters("otlp", 10)
        assert sorted(x.reason for x in letters) == ["http_400", "http_400", "unreadable_dead_letter"]
        assert letters[-1].score_id == records[1].score_id
        assert len(outbox.dead_letters("otlp", 2)) == 2
        result = CliRunner().invoke(cli, ["sinks", "list", "otlp", "--broker", redis_url, "--json"])
        assert result.exit_code == 0, result.output
        listed = json.loads(result.stdout)["otlp"]
        assert listed["failed"] == 3
        assert sorted(x["reason"] for x in listed["dead_letters"]) == ["http_400", "http_400", "unreadable_dead_letter"]
        assert outbox.redrive("otlp", [records[1].score_id]) == 1
        assert outbox.counts()["otlp"].failed == 2
    finally:
        outbox.close()


def test_one_drainer_per_sink_per_node_the_others_take_over(redis_url: str) -> None:
    """While another process of this node holds the turn for sink alpha, this process's alpha
    drainer stands by (its beta drainer, no one else's turn, delivers); when that process ends,
    this one takes over and delivers alpha's scores."""
    import subprocess
    import sys

    from worker._delivery import Deliveries

    script = (
        "import sys\nfrom worker._delivery import _NodeTurn\n"
        f"turn = _NodeTurn({redis_url!r}, 'alpha')\nprint(turn.held(), flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "True"
        _put(lambda: RedisScoreStore(redis_url, sinks=SINKS), _record(1, score=0.1), _record(2, score=0.2))
        alpha, beta = MemorySink("alpha"), MemorySink("beta")
        deliveries = Deliveries(
            [alpha, beta], lambda: RedisOutbox(redis_url), DrainPolicy(poll_s=0.05), node_key=redis_url
        ).start()
        outbox = RedisOutbox(redis_url)
        try:
            assert wait_for(lambda: outbox.counts()["beta"].delivered == 2, 10)
            assert deliveries.flush(5)  # alpha's drainer is idle: not its turn
            assert outbox.counts()["alpha"].pending == 2
            assert alpha.records == []
            assert holder.stdin is not None
            holder.stdin.close()
            assert holder.wait(10) == 0
            assert wait_for(lambda: outbox.counts()["alpha"].delivered == 2, 10)
            assert len(alpha.records) == 2
        finally:
            deliveries.stop()
            outbox.close()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()


class _RenewSeen:
    """An outbox whose renewals are announced, so a test can act once one has happened."""

    def __init__(self, inner: Outbox) -> None:
        self._inner = inner
        self.renewed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def renew(self, lease: Any, lease_s: float) -> Any:
        renewed = self._inner.renew(lease, lease_s)
        self.renewed.set()
        return renewed


def test_a_record_replaced_during_its_delivery_leaves_the_rest_of_the_batch_acked(pair: tuple[Any, Outbox]) -> None:
    """A run scored again (a retryable error replaced) while its old record is in flight to a
    slow sink: the replacement is queued anew, so the lease's renewal no longer holds that id.
    The rest of the batch is still acknowledged, not left to be sent again when the lease
    lapses (settling used to fail on the missing id, and every score went twice)."""
    store, outbox = pair
    first = _record(1, error_type="RateLimitError", error_message="429", retryable=True)
    others = [_record(n, score=0.5) for n in range(2, 6)]
    _put(store, first, *others)
    watched = _RenewSeen(outbox)

    class Replacing(MemorySink):
        def deliver(self, records: Any) -> Any:
            if not self.records:  # the first delivery only
                assert _put(store, _record(1, score=0.9)) == [True]
                assert watched.renewed.wait(10), "the lease was not renewed during the delivery"
            return super().deliver(records)

    sink = Replacing("alpha")
    policy = DrainPolicy(batch_size=10, lease_s=0.3, max_attempts=12)
    assert drain_once(sink, watched, policy) == 5  # type: ignore[arg-type]
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.pending, counts.failed) == (4, 1, 0)
    # The replacement is delivered next; nothing else is sent again.
    assert wait_for(lambda: drain_once(sink, outbox, policy) == 1, 5)
    assert sorted(r.score_id for r in sink.records) == sorted([r.score_id for r in [first, *others]] + [first.score_id])
    assert [r.score for r in sink.records if r.score_id == first.score_id] == [None, 0.9]
    counts = outbox.counts()["alpha"]
    assert (counts.delivered, counts.pending, counts.failed) == (5, 0, 0)


def test_a_sink_that_stays_down_is_logged_with_a_count_not_a_line_a_batch(pair: tuple[Any, Outbox]) -> None:
    """An unreachable sink: a `sink_retry` WARNING each batch, each retry (265 lines for 105
    scores in a 30 s backfill, audit). One line per sink each 30 s, saying how many records were
    retried since the last."""
    from structlog.testing import capture_logs

    import worker._delivery as delivery

    store, outbox = pair
    _put(store, *(_record(n, score=0.5) for n in range(10, 16)))
    sink = MemorySink("alpha")
    sink.outcome = Retry("Phoenix unreachable (ConnectError)", after_s=0.0)
    policy = DrainPolicy(batch_size=2, lease_s=30, max_attempts=50, backoff_s=0.01, backoff_max_s=0.01)
    delivery._retry_logs.pop(("alpha", None), None)  # (another test's retries: their line was logged)
    with capture_logs() as logs:
        leased = 0
        while leased < 30:  # every record retried five times, two at a time
            leased += drain_once(sink, outbox, policy)
        # It delivers again: the retries counted since the line are said, not left unsaid (review).
        sink.outcome = Delivered()
        assert wait_for(lambda: drain_once(sink, outbox, policy) >= 0 and not outbox.counts()["alpha"].pending, 5)
    lines = [e for e in logs if e["event"] == "sink_retry"]
    assert [(e["records"], e["since_start"], e["sink"]) for e in lines] == [
        (2, 2, "alpha"),
        (leased - 2, leased, "alpha"),
    ]
    assert lines[0]["reasons"] == ["Phoenix unreachable (ConnectError)"]


def test_a_sink_retry_line_names_where_the_sink_writes_never_its_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two OTLP collectors down: `sink_retry` named the backend alone ("otlp"), and the two shared
    one line each 30 s, so which collector was down could not be told (noticed). Each sink's line
    names its endpoint, as the backfill's sink line does, its password masked; neither a token in
    its query nor the exporter's header token is logged."""
    import socket

    from structlog.testing import capture_logs

    import worker._delivery as delivery
    from tracing.sinks import OtlpSink

    ports = []
    for _ in range(2):
        with socket.socket() as closed:  # a port nothing listens on
            closed.bind(("127.0.0.1", 0))
            ports.append(closed.getsockname()[1])
    secrets = ("url-pw-0123456789", "query-tok-0123456789", "header-tok-0123456789")
    url = "http://collector:url-pw-0123456789@127.0.0.1:{}/v1/traces?{}=query-tok-0123456789"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer header-tok-0123456789")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.format(ports[0], "token"))
    sinks = [OtlpSink(timeout_s=2), OtlpSink(endpoint=url.format(ports[1], "api_key"), timeout_s=2)]
    shown = [f"http://collector:***@127.0.0.1:{port}/v1/traces" for port in ports]
    policy = DrainPolicy(batch_size=2, lease_s=30, max_attempts=50, backoff_s=0.01, backoff_max_s=0.01)
    for endpoint in shown:
        delivery._retry_logs.pop(("otlp", endpoint), None)  # (a line of another test's)
    with capture_logs() as logs:
        for n, sink in enumerate(sinks):  # (two nodes, each its store)
            store = MemoryScoreStore(sinks=("otlp",))
            _put(lambda store=store: store, _record(n, score=0.5))
            assert drain_once(sink, store.outbox, policy) == 1
            sink.close()
    lines = [e for e in logs if e["event"] == "sink_retry"]
    assert [(e["sink"], e["endpoint"], e["records"]) for e in lines] == [("otlp", shown[0], 1), ("otlp", shown[1], 1)]
    assert not [s for s in secrets if s in repr(logs)]


def test_every_line_naming_a_sink_names_where_it_writes_never_its_secrets() -> None:
    """`sink_retry` named its sink's endpoint, but `sink_dead_letter`, `sink_crashed` and
    `drainer_failed` still named the backend alone ("phoenix"): of two Phoenix projects, which one
    dead-lettered or crashed could not be told (noticed). Each now carries the masked endpoint,
    and neither the URL's password nor the API key reaches a log event."""
    import socket

    from structlog.testing import capture_logs

    from tracing.sinks import PhoenixSink
    from worker._delivery import Deliveries

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    secrets = ("url-pw-0123456789", "api-key-0123456789")
    url = f"http://phx:url-pw-0123456789@127.0.0.1:{port}/proj"
    shown = f"http://phx:***@127.0.0.1:{port}/proj"

    class Crashing(PhoenixSink):
        def deliver(self, records: Any) -> Any:
            raise KeyError("a sink bug")

    class Away(MemoryOutbox):  # the outbox's store unreachable
        def lease(self, sink: str, limit: int, lease_s: float) -> Any:
            raise ConnectionError("store away")

    down = PhoenixSink(url, api_key="api-key-0123456789", timeout_s=2)
    crashing = Crashing(url, api_key="api-key-0123456789", timeout_s=2)
    once = DrainPolicy(batch_size=10, lease_s=30, max_attempts=1, backoff_s=0.01, backoff_max_s=0.01)
    with capture_logs() as logs:
        for n, sink in enumerate((down, crashing)):
            store = MemoryScoreStore(sinks=("phoenix",))
            _put(lambda store=store: store, _record(n, score=0.5))
            assert drain_once(sink, store.outbox, once) == 1  # a retry at its only attempt: a dead letter
            assert store.outbox.counts()["phoenix"].failed == 1
        deliveries = Deliveries([down], lambda: Away(lambda ids: {}), DrainPolicy(poll_s=0.05)).start()
        try:
            assert wait_for(lambda: any(e["event"] == "drainer_failed" for e in logs), 10), logs
        finally:
            deliveries.stop(5.0)
    crashing.close()
    named = {e["event"]: e for e in logs if e.get("sink") == "phoenix"}
    for event in ("sink_dead_letter", "sink_crashed", "drainer_failed"):
        assert named[event]["endpoint"] == shown, (event, logs)
    assert not [s for s in secrets if s in repr(logs)]


def test_a_bounded_stores_sink_keeps_its_newest_dead_letters_and_counts_every_one() -> None:
    """An app's embedded store keeps its newest records only, so its memory stays flat for weeks;
    a sink refusing every score (a deleted project, a revoked key) kept a dead letter per score
    for good: the app's memory grew with every score scored. The newest as many letters as
    records are kept; the older ones are dropped, counted as dead_letters_dropped (they were counted
    inside failed, which the Redis outbox counts as the letters kept: one meaning for both)."""
    memory = MemoryScoreStore(sinks=("alpha",), max_records=5)
    records = [_record(n, score=n / 100) for n in range(1, 21)]
    for record in records:
        _put(lambda: memory, record)
        lease = memory.outbox.lease("alpha", 10, lease_s=30)
        letter = SinkDeadLetter(score_id=record.score_id, sink="alpha", reason="http_403", detail="no", attempts=1)
        assert memory.outbox.dead(lease, [letter]) == 1
    kept = memory.outbox.dead_letters("alpha", 1000)
    assert [x.score_id for x in kept] == [r.score_id for r in reversed(records[-5:])]
    counts = memory.outbox.counts()["alpha"]
    assert (counts.failed, counts.dead_letters_dropped) == (5, 15)  # (as in Redis: failed is what is kept)
    assert len(memory.records) == 5
    assert memory.outbox.redrive("alpha") == 5  # the kept ones go again; the dropped stay counted
    counts = memory.outbox.counts()["alpha"]
    assert (counts.failed, counts.dead_letters_dropped) == (0, 15)


def _bury(outbox: Outbox, sink: str, records: list[ScoreRecord], reasons: Sequence[str] = ("http_403",)) -> None:
    """Each record's id leased and made the sink's dead letter in turn (of ``reasons`` in turn),
    a second apart by failed_at (the order the bound drops them by)."""
    lease = outbox.lease(sink, 1000, lease_s=30)
    for n, record in enumerate(records):
        letter = SinkDeadLetter(
            score_id=record.score_id, sink=sink, reason=reasons[n % len(reasons)], detail="no", attempts=1,
            failed_at=1_700_000_000 + n,
        )  # fmt: skip
        assert outbox.dead(lease, [letter]) == 1


def _order_in_step(redis_url: str, sink: str) -> None:
    """The Redis dead letters' order (the companion sorted set) names exactly the hash's letters."""
    import redis

    from worker import _keys

    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        letters = set(raw.hkeys(_keys.outbox_dead_key(sink)))
        ordered = set(raw.zrange(_keys.outbox_dead_order_key(sink), 0, -1))
    finally:
        raw.close()
    assert ordered == letters


def test_past_the_bound_the_oldest_dead_letters_go_counted_as_dropped(pair: tuple[Any, Outbox]) -> None:
    """A sink that refuses every score (a deleted project, a revoked key) made a dead letter per
    score for good: in Redis they never expired, and Redis filled until it refused every write.
    Past TRACESCORE_SINK_MAX_DEAD_LETTERS the oldest go in the step that buries a new one, counted
    per sink as dead_letters_dropped (not as failed: failed is the letters there now, which
    redrive and drop lower); the newest stay, listed and redrivable."""
    store, outbox = pair
    outbox.max_dead_letters = 3  # type: ignore[attr-defined]
    records = [_record(n, score=0.5) for n in range(1, 7)]
    _put(store, *records)
    _bury(outbox, "alpha", records)
    counts = outbox.counts()["alpha"]
    assert (counts.failed, counts.dead_letters_dropped, counts.pending) == (3, 3, 0)
    assert counts.as_dict()["dead_letters_dropped"] == 3
    assert [x.score_id for x in outbox.dead_letters("alpha")] == [r.score_id for r in reversed(records[3:])]
    assert set(outbox.states("alpha", [r.score_id for r in records]).values()) == {"none", "failed"}
    assert outbox.counts()["beta"].dead_letters_dropped == 0
    assert outbox.redrive("alpha") == 3
    counts = outbox.counts()["alpha"]
    assert (counts.failed, counts.dead_letters_dropped, counts.pending) == (0, 3, 3)


def test_the_dead_letters_order_is_kept_in_step_by_every_path(redis_url: str) -> None:
    """Every path that adds or removes a dead letter (dead, redrive, the ack of a re-queued id,
    the enqueue of a replaced record, the bound, drop_dead_letters) keeps the order in step with
    the letters: a letter gone whose order entry stayed would be dropped in place of a live one."""
    store = lambda: RedisScoreStore(redis_url, sinks=SINKS)  # noqa: E731
    outbox = RedisOutbox(redis_url, max_dead_letters=4)
    try:
        records = [_record(n, score=0.5) for n in range(1, 8)]
        records[3] = _record(4, error_type="timeout", retryable=True)  # (its score replaces it)
        _put(store, *records)
        _bury(outbox, "alpha", records[:6])
        _order_in_step(redis_url, "alpha")
        assert outbox.counts()["alpha"].dead_letters_dropped == 2
        assert outbox.redrive("alpha", [records[2].score_id]) == 1
        _order_in_step(redis_url, "alpha")
        lease = outbox.lease("alpha", 10, lease_s=30)
        assert outbox.ack(lease, [records[2].score_id]) == 1
        _order_in_step(redis_url, "alpha")
        assert _put(store, _record(4, score=0.9)) == [True]  # a replaced record: owed anew
        _order_in_step(redis_url, "alpha")
        assert [x.score_id for x in outbox.drop_dead_letters("alpha", [records[4].score_id])] == [records[4].score_id]
        _order_in_step(redis_url, "alpha")
        assert outbox.counts()["alpha"].failed == 1
        _bury(outbox, "alpha", [records[3]])  # (the replaced record, owed anew)
        _order_in_step(redis_url, "alpha")
        counts = outbox.counts()["alpha"]
        assert (counts.failed, counts.dead_letters_dropped) == (2, 2)  # nothing more dropped: under the bound
    finally:
        outbox.close()


def test_drop_dead_letters_by_id_reason_or_all(pair: tuple[Any, Outbox]) -> None:
    """drop_dead_letters removes letters for good (by id, by reason, or all), yielding each one it
    removed; an id that is no letter is not yielded; a drop is not counted as dropped past the bound."""
    store, outbox = pair
    records = [_record(n, score=0.5) for n in range(1, 7)]
    _put(store, *records)
    _bury(outbox, "alpha", records, ["http_403", "http_404"])
    gone = list(outbox.drop_dead_letters("alpha", [records[0].score_id, "0" * 64, records[0].score_id]))
    assert [x.score_id for x in gone] == [records[0].score_id]
    assert gone[0].reason == "http_403"
    by_reason = list(outbox.drop_dead_letters("alpha", reason="http_404"))
    assert sorted(x.score_id for x in by_reason) == sorted(r.score_id for r in records[1::2])
    assert list(outbox.drop_dead_letters("alpha", reason="http_500")) == []
    assert sorted(x.score_id for x in outbox.dead_letters("alpha")) == sorted(r.score_id for r in records[2::2])
    assert len(list(outbox.drop_dead_letters("alpha"))) == 2
    counts = outbox.counts()["alpha"]
    assert (counts.failed, counts.dead_letters_dropped) == (0, 0)
    assert outbox.states("alpha", [records[2].score_id]) == {records[2].score_id: "none"}
    assert outbox.redrive("alpha") == 0


def test_a_sink_past_its_bound_is_logged_a_line_a_minute_without_content(pair: tuple[Any, Outbox]) -> None:
    """Every bury past the bound drops the oldest letter: one line a minute per sink, with the
    count, the bound and the setting, never a score's content or the backend's answer."""
    from structlog.testing import capture_logs

    import worker.store._outbox as outbox_module

    store, outbox = pair
    outbox.max_dead_letters = 2  # type: ignore[attr-defined]
    records = [_record(n, score=0.5) for n in range(1, 6)]
    _put(store, *records)
    outbox_module._dropped_logs.pop("alpha", None)  # (another test's line)
    with capture_logs() as logs:
        _bury(outbox, "alpha", records)
    lines = [e for e in logs if e["event"] == "sink_dead_letters_dropped_past_bound"]
    assert [(e["sink"], e["dropped"], e["max_dead_letters"], e["setting"]) for e in lines] == [
        ("alpha", 1, 2, "TRACESCORE_SINK_MAX_DEAD_LETTERS")
    ]
    assert "http_403" not in repr(lines)


def test_dead_letters_of_the_previous_release_are_listed_redriven_dropped_and_bounded(redis_url: str) -> None:
    """A previous release kept a sink's dead letters in the hash alone (no order). They are still
    listed, counted, redriven and dropped; once the bound needs them they are ordered by their
    failed_at (older than every letter buried since) and the oldest go first."""
    import redis

    from worker import _keys

    store = lambda: RedisScoreStore(redis_url, sinks=("otlp",))  # noqa: E731
    records = [_record(n, score=0.5) for n in range(1, 8)]
    _put(store, *records)
    outbox = RedisOutbox(redis_url, max_dead_letters=3)
    try:
        lease = outbox.lease("otlp", 10, lease_s=30)
        raw = redis.Redis.from_url(redis_url)
        for n, record in enumerate(records[:5]):  # as the previous release's settle left them
            raw.zrem(_keys.outbox_key("otlp"), record.score_id)
            letter = SinkDeadLetter(
                score_id=record.score_id, sink="otlp", reason="http_401", failed_at=1_600_000_000 + n
            )
            raw.hset(_keys.outbox_dead_key("otlp"), record.score_id, letter.model_dump_json())
        raw.close()
        assert len(outbox.dead_letters("otlp")) == 5
        assert outbox.counts()["otlp"].failed == 5
        assert outbox.redrive("otlp", [records[0].score_id]) == 1
        assert [x.score_id for x in outbox.drop_dead_letters("otlp", [records[1].score_id])] == [records[1].score_id]
        assert outbox.counts()["otlp"].failed == 3
        # A new letter (the two still leased): past the bound the oldest of the old ones go first.
        letter = SinkDeadLetter(score_id=records[5].score_id, sink="otlp", reason="http_401")
        assert outbox.dead(lease, [letter]) == 1
        counts = outbox.counts()["otlp"]
        assert (counts.failed, counts.dead_letters_dropped) == (3, 1)
        kept = [x.score_id for x in outbox.dead_letters("otlp")]
        assert kept == [records[5].score_id, records[4].score_id, records[3].score_id]
        _order_in_step(redis_url, "otlp")
        assert len(list(outbox.drop_dead_letters("otlp", reason="http_401"))) == 3
        assert outbox.counts()["otlp"].failed == 0
    finally:
        outbox.close()


def _bound_replies(outbox: RedisOutbox) -> list[int]:
    """Spy: the letters each script call of ``outbox`` dropped past the bound, in order."""
    dropped: list[int] = []
    scripts = outbox._scripts

    def spied(where: str, script: Any, calls: Any) -> list[Any]:
        replies = scripts(where, script, calls)
        if where in ("settle", "bound_dead_letters"):
            dropped.extend(int(r[0 if where == "bound_dead_letters" else 1]) for r in replies if isinstance(r, list))
        return replies

    outbox._scripts = spied  # type: ignore[method-assign]
    return dropped


def test_a_lowered_sink_bound_drops_a_step_per_script_until_within_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script holds all of Redis while it runs: a bound lowered from 100,000 to 1,000 dropped
    99,000 letters in one (252 ms, bench/store_scripts.py). The drainer drops them a step
    (``_BOUND_STEP``) per script, calling again until the letters are within the bound: it ends
    with exactly the bound's letters, the newest, every dropped one counted, the order in step."""
    import worker.store._outbox as outbox_module

    monkeypatch.setattr(outbox_module, "_BOUND_STEP", 4, raising=False)
    store = lambda: RedisScoreStore(redis_url, sinks=("otlp",))  # noqa: E731
    records = [_record(n, score=0.5) for n in range(1, 32)]
    _put(store, *records[:30])
    wide = RedisOutbox(redis_url, max_dead_letters=100)
    try:
        _bury(wide, "otlp", records[:30])
    finally:
        wide.close()
    _put(store, *records[30:])
    outbox = RedisOutbox(redis_url, max_dead_letters=5)
    try:
        dropped = _bound_replies(outbox)
        lease = outbox.lease("otlp", 10, lease_s=30)
        letter = SinkDeadLetter(score_id=records[30].score_id, sink="otlp", reason="http_403", failed_at=1_800_000_000)
        assert outbox.dead(lease, [letter]) == 1
        assert sum(dropped) == 26
        assert max(dropped) <= 4
        counts = outbox.counts()["otlp"]
        assert (counts.failed, counts.dead_letters_dropped) == (5, 26)
        kept = [x.score_id for x in outbox.dead_letters("otlp")]
        assert kept == [r.score_id for r in reversed(records[26:])]
        _order_in_step(redis_url, "otlp")
    finally:
        outbox.close()


def test_a_sink_bound_interrupted_between_steps_leaves_the_counts_in_step(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drainer that dies between two steps of the bound (one step run, simulated) leaves the
    letters, their order and the count dropped in step: nothing lost, nothing counted twice; the
    next bury finishes the bound."""
    import worker.store._outbox as outbox_module

    monkeypatch.setattr(outbox_module, "_BOUND_STEP", 4, raising=False)
    store = lambda: RedisScoreStore(redis_url, sinks=("otlp",))  # noqa: E731
    records = [_record(n, score=0.5) for n in range(1, 22)]
    _put(store, *records[:20])
    wide = RedisOutbox(redis_url, max_dead_letters=100)
    try:
        _bury(wide, "otlp", records[:20])
    finally:
        wide.close()
    _put(store, *records[20:])
    outbox = RedisOutbox(redis_url, max_dead_letters=5)
    try:
        assert outbox._bound_step("otlp") == (4, False, True)  # (the one step a dead drainer ran)
        counts = outbox.counts()["otlp"]
        assert (counts.failed, counts.dead_letters_dropped) == (16, 4)
        _order_in_step(redis_url, "otlp")
        assert [x.score_id for x in outbox.dead_letters("otlp", 1000)][-1] == records[4].score_id
        lease = outbox.lease("otlp", 10, lease_s=30)
        letter = SinkDeadLetter(score_id=records[20].score_id, sink="otlp", reason="http_403", failed_at=1_800_000_000)
        assert outbox.dead(lease, [letter]) == 1
        counts = outbox.counts()["otlp"]
        assert (counts.failed, counts.dead_letters_dropped) == (5, 16)
        _order_in_step(redis_url, "otlp")
    finally:
        outbox.close()


def test_order_entries_of_letters_gone_by_hand_count_towards_a_bound_step(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An order entry whose letter went another way (redis-cli HDEL; a release without the order
    redriving) is popped by the bound, not counted as dropped. The step counted only the letters
    it dropped: 100,000 such entries older than every letter were popped in one script, however
    small the step. Each pop is one of the step's; the bound still ends within it, the count in
    step."""
    import redis

    import worker.store._outbox as outbox_module
    from worker import _keys

    monkeypatch.setattr(outbox_module, "_BOUND_STEP", 4, raising=False)
    store = lambda: RedisScoreStore(redis_url, sinks=("otlp",))  # noqa: E731
    records = [_record(n, score=0.5) for n in range(1, 9)]
    _put(store, *records)
    wide = RedisOutbox(redis_url, max_dead_letters=100)
    try:
        _bury(wide, "otlp", records)
    finally:
        wide.close()
    raw = redis.Redis.from_url(redis_url)
    order = _keys.outbox_dead_order_key("otlp")
    raw.zadd(order, {f"gone:{n}": n for n in range(20)})  # (older than every letter)
    outbox = RedisOutbox(redis_url, max_dead_letters=5)
    try:
        before = raw.zcard(order)
        assert outbox._bound_step("otlp") == (0, False, True)
        assert before - raw.zcard(order) == 4
        assert outbox._bound_dead_letters("otlp") == (3, False)
        counts = outbox.counts()["otlp"]
        assert (counts.failed, counts.dead_letters_dropped) == (5, 3)
        _order_in_step(redis_url, "otlp")
    finally:
        outbox.close()
        raw.close()
