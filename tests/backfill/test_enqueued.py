"""Redis-mode backfill reads the workers' records back by the runs it enqueued (worker/backfill/
_job.py, ``_Enqueued``): the runs are spooled to a temporary file, so memory stays constant in
the number of runs, and the summary, ``--out`` and the sinks' delivery states stream from it."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import structlog.testing

from tests._redis import RedisServer
from tests.summary_scorers_v1 import length, shouting
from tracing import ScoreRecord, score_id_for
from worker._keys import record_key
from worker._progress import ProgressReporter
from worker._settings import load_settings
from worker._summary import Outcome, Summary
from worker.backfill._job import _Enqueued, _job_delivery
from worker.store import RedisOutbox, SinkDeadLetter

REGISTRY: Any = {"length": length, "shouting": shouting}
SCORERS = ["length", "shouting"]


class _Request(NamedTuple):  # what _Enqueued reads of a ScoreRequest
    trace_id: str
    target_span_ids: list[str]
    agent: str
    scorer_ids: list[str]

    def agent_labels(self) -> dict[str, str]:
        return dict.fromkeys(self.target_span_ids, self.agent)


class _Batch(NamedTuple):
    requests: list[_Request]


def _batches(n: int, size: int = 1000) -> Iterator[Any]:
    # Agent names that would break a naive line format; every 7th run asks for one scorer only.
    agents = ["weather-agent", "shop\tassistant\nü", ""]
    for start in range(0, n, size):
        yield _Batch(
            [
                _Request(f"{i:032x}", [f"{i:016x}"], agents[i % 3], SCORERS[:1] if i % 7 == 0 else SCORERS)
                for i in range(start, min(n, start + size))
            ]
        )


def test_enqueued_runs_take_constant_memory() -> None:
    """200,000 enqueued runs: what Python holds afterwards does not grow with them (the list of
    tuples it replaced held about 45 MB here), and all of them stream back in order."""
    enqueued = _Enqueued()
    tracemalloc.start()
    try:
        for batch in _batches(200_000):
            enqueued(batch)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, f"{held:,} bytes held after enqueueing"
    assert peak < 2_000_000, f"{peak:,} bytes at the peak"
    assert enqueued.count == 200_000
    ids = enqueued.score_ids(REGISTRY, SCORERS)
    assert next(ids) == score_id_for(f"{0:032x}", f"{0:016x}", "length", "1")
    assert sum(1 for _ in ids) + 1 == 200_000 * 2 - (200_000 + 6) // 7
    enqueued.close()


def _record(i: int, scorer_id: str) -> ScoreRecord:
    trace_id, span_id = f"{i:032x}", f"{i:016x}"
    fields: dict[str, Any] = {"score": (i % 10) / 10, "reason": f"r{i}"}
    if i % 11 == 0:
        fields = {"error_type": "ValueError", "error_message": f"boom {i}"}
    elif i % 13 == 0:
        fields = {"not_scorable": "preprocess: empty"}
    return ScoreRecord(
        score_id=score_id_for(trace_id, span_id, scorer_id, "1"),
        trace_id=trace_id,
        span_id=span_id,
        span_name="span",
        scorer_id=scorer_id,
        job_id="bf-test",
        **fields,
    )


class _Reporter(ProgressReporter):
    """Plain progress lines, each shown (no interval); the first lets the sink take what was
    pending."""

    def __init__(self, on_wait: Any) -> None:
        super().__init__(io.StringIO(), tty=False, interval_s=0)
        self.on_wait = on_wait

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        if self.on_wait is not None:
            self.on_wait()
            self.on_wait = None

    def lines(self) -> list[str]:
        assert isinstance(self.stream, io.StringIO)
        return self.stream.getvalue().splitlines()


@pytest.mark.redis
def test_summary_out_and_delivery_states_over_thousands_of_runs(redis_server: RedisServer) -> None:
    """3,000 runs × up to 2 scorers, records in Redis, one sink owed them: the summary and
    ``--out`` are what the records give, read in enqueue order (runs the workers left without
    a record are skipped); the delivery counts are what the outbox holds, after waiting for the
    pending ones; a sink owed none of them is left out."""
    client = redis_server.client(15, decode_responses=True)
    client.flushdb()
    outbox = RedisOutbox(redis_server.url(15))
    try:
        enqueued = _Enqueued()
        batches = list(_batches(3000, size=250))
        for batch in batches:
            enqueued(batch)
        runs = [r for b in batches for r in b.requests]
        records = [(_record(i, s), r.agent) for i, r in enumerate(runs) for s in r.scorer_ids if i % 17]
        client.mset({record_key(rec.score_id): rec.model_dump_json() for rec, _ in records})

        # The sink: a fifth delivered, a tenth dead letters, a tenth pending (delivered while
        # the command waits), the rest never queued; "idle" is owed nothing of this job.
        ids = [rec.score_id for rec, _ in records]
        delivered, failed, pending = ids[::5], ids[1::10], ids[3::10]
        outbox.register(["sink", "idle"])
        outbox.enqueue("sink", delivered + failed)
        lease = outbox.lease("sink", len(delivered) + len(failed), 60)
        outbox.ack(lease, delivered)
        outbox.dead(lease, [SinkDeadLetter(score_id=s, sink="sink", reason="refused") for s in failed])
        outbox.enqueue("sink", pending)
        outbox.enqueue("idle", ["not-this-jobs"])

        out = io.StringIO()
        summary = enqueued.summary(client, REGISTRY, SCORERS, 3, out)
        expected = Summary(REGISTRY, worst_n=3)
        for rec, agent in records:
            expected.add(Outcome.of_record(rec, agent))
        assert summary.as_json() == expected.as_json()
        assert summary.render(width=120) == expected.render(width=120)
        assert out.getvalue().splitlines() == [rec.model_dump_json() for rec, _ in records]

        def take_pending() -> None:
            lease = outbox.lease("sink", len(pending) + 10, 60)
            assert sorted(lease.ids) == sorted(pending)
            outbox.ack(lease, pending)

        settings = load_settings(broker_url=redis_server.url(15), sink_drain_timeout_seconds=60)
        reporter = _Reporter(take_pending)
        states = _job_delivery(settings, lambda: enqueued.score_ids(REGISTRY, SCORERS), reporter)
        every = sum(len(r.scorer_ids) for r in runs)
        # The wait is a phase of the progress: its first line, all still pending (the sink took
        # them after it), then none, the rest said by the summary.
        (line,) = reporter.lines()
        assert line.startswith("delivering: 0 deliveries ")
        assert line.endswith(f"  {len(pending):,} pending  (0.0%)")
        assert list(states) == ["sink"]
        sink = states["sink"]
        assert {k: sink[k] for k in ("delivered", "failed", "pending", "not_queued")} == {
            "delivered": len(delivered) + len(pending),
            "failed": len(failed),
            "pending": 0,
            "not_queued": every - len(delivered) - len(pending) - len(failed),
        }
        assert len(sink["dead_letters"]) == 5
        assert {x["score_id"] for x in sink["dead_letters"]} <= set(failed)
        enqueued.close()
    finally:
        outbox.close()
        client.flushdb()
        client.close()


@pytest.mark.redis
def test_a_sink_that_does_not_drain_is_waited_for_quietly_then_named(redis_server: RedisServer) -> None:
    """The wait for the sinks is a phase of the progress, shown every interval: it printed a
    line every half second for the whole timeout (60 lines by default), and said nothing when
    it gave up. Past the timeout it says what is still pending and which setting waits longer."""
    client = redis_server.client(15, decode_responses=True)
    client.flushdb()
    outbox = RedisOutbox(redis_server.url(15))
    try:
        ids = [score_id_for(f"{i:032x}", f"{i:016x}", "length", "1") for i in range(7)]
        outbox.register(["sink"])
        outbox.enqueue("sink", ids)
        settings = load_settings(broker_url=redis_server.url(15), sink_drain_timeout_seconds=1.5)
        said = io.StringIO()
        states = _job_delivery(settings, lambda: iter(ids), ProgressReporter(said, tty=False, interval_s=3600))
        assert said.getvalue().splitlines() == [
            "stopped waiting for the sinks after 1.5s (TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS): 7 deliveries pending"
        ]
        assert states["sink"]["pending"] == 7
    finally:
        outbox.close()
        client.flushdb()
        client.close()


def test_a_spool_that_cannot_be_written_stops_quietly_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full or missing TMPDIR: the batches are enqueued already, so the job must not fail;
    the spool stops, keeps nothing, and names the reason for the summary it cannot give."""
    enqueued = _Enqueued()
    batches = _batches(3000)
    enqueued(next(batches))
    assert enqueued.count == 1000

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    real = enqueued._spool._file
    assert real is not None
    real.close()
    monkeypatch.setattr(enqueued._spool, "_file", Full())
    for batch in batches:
        enqueued(batch)  # no exception: the job goes on
    assert enqueued.count == 0
    assert enqueued.lost is not None
    assert "No space left on device" in enqueued.lost
    assert list(enqueued.score_ids(REGISTRY, SCORERS)) == []
    enqueued.close()


class _Store:
    """What the summary reads of Redis: MGET over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def mget(self, keys: list[str]) -> list[str | None]:
        return [self.values.get(k) for k in keys]


def test_a_damaged_stored_record_is_left_out_and_the_summary_read() -> None:
    """A stored record that is not one (damaged bytes, another JSON shape, a field of the wrong
    type or missing) ended the summary with a ValueError or AttributeError: the command lost its
    summary, --out and exit code. It is left out (not written to --out) and logged by score id,
    never its value, as the store reads such a record."""
    enqueued = _Enqueued()
    batch = next(_batches(12))
    enqueued(batch)
    runs = batch.requests
    records = [_record(i, s) for i, r in enumerate(runs) for s in r.scorer_ids]
    values = {record_key(rec.score_id): rec.model_dump_json() for rec in records}
    damaged = {
        records[1].score_id: "garbage \udcff SECRET",
        records[2].score_id: "[1, 2]",
        records[3].score_id: records[3].model_dump_json().replace('"score":0.', '"score":"SECRET'),
        records[4].score_id: records[4].model_dump_json().replace('"scorer_id"', '"scorer"'),
    }
    values.update({record_key(s): v for s, v in damaged.items()})
    out = io.StringIO()
    with structlog.testing.capture_logs() as logged:
        summary = enqueued.summary(_Store(values), REGISTRY, SCORERS, 3, out)
    kept = [rec for rec in records if rec.score_id not in damaged]
    expected = Summary(REGISTRY, worst_n=3)
    for rec in kept:
        expected.add(Outcome.of_record(rec, next(r.agent for r in runs if r.trace_id == rec.trace_id)))
    assert summary.as_json() == expected.as_json()
    assert out.getvalue().splitlines() == [rec.model_dump_json() for rec in kept]
    assert sorted(e["score_id"] for e in logged if e["event"] == "score_record_unreadable") == sorted(damaged)
    assert "SECRET" not in repr(logged)
    enqueued.close()


def test_a_read_back_left_unfinished_when_the_job_ends_closes_quietly() -> None:
    """The job closes its spool while a read-back is under way (an error mid-summary): the
    reading generator's cleanup sought in the closed file ("Exception ignored ... 'NoneType'
    object has no attribute 'seek'")."""
    enqueued = _Enqueued()
    enqueued(next(_batches(10)))
    ids = enqueued.score_ids(REGISTRY, SCORERS)
    assert next(ids)
    enqueued.close()
    ids.close()  # raised AttributeError before
