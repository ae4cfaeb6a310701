"""Sender alone: the bounded hand-off queue, batches cut by count and bytes, retries, and stop/close
(its own thread, a real one: waits poll with a deadline)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tests.tracing._exporting import wait_for
from tests.tracing._spans import Recorder, agent_trace
from tracing import ScoreBatch
from tracing._records import span_record
from tracing.capture._sender import Sender, SenderLimits, Shipment, shipment_size
from tracing.capture._tally import Tally


def _shipment(question: str = "Hi?") -> Shipment:
    rec = Recorder()
    agent_trace(rec, question=question)
    spans = [span_record(s) for s in rec.spans()]
    return Shipment(spans, spans[-1].span_id, ["s"], shipment_size(spans))


class Blocked:
    """A sink stuck until released; records what it got."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[ScoreBatch] = []

    def send(self, batch: ScoreBatch) -> None:
        self.release.wait(10)
        self.batches.append(batch)


def test_the_queue_drops_the_newest_over_its_run_and_byte_bounds() -> None:
    """queue_size and max_queue_bytes: what does not fit is dropped and counted, never blocks."""
    sink, tally = Blocked(), Tally()
    one = _shipment()
    sender = Sender(sink, SenderLimits(queue_size=3, max_queue_bytes=10 * one.size, batch_size=1), tally)
    sender.put([_shipment(f"q{i}") for i in range(6)])  # before the thread starts: three wait
    assert tally.dropped == {"queue_full": 3}
    assert sender.reserve(one.size) == "queue_full"
    sender.start()
    try:
        big = _shipment("x" * 20 * one.size)
        sink.release.set()
        assert sender.wait_idle(time.monotonic() + 10)
        sender.put([big])
        assert tally.dropped == {"queue_full": 3, "queue_bytes": 1}
        assert sender.counters()["runs_sent"] == 3
    finally:
        sink.release.set()
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_batches_are_cut_by_count_and_by_bytes() -> None:
    """Up to batch_size runs and about max_batch_bytes a batch; a run is never split."""
    got: list[ScoreBatch] = []
    one = _shipment()
    sender = Sender(_Callback(got.append), SenderLimits(batch_size=3, max_batch_bytes=int(2.5 * one.size)), Tally())
    sender.put([_shipment(f"q{i}") for i in range(7)])  # queued before the thread starts: one take
    sender.start()
    try:
        assert sender.wait_idle(time.monotonic() + 10)
        assert [len(b.requests) for b in got] == [2, 2, 2, 1]
        assert sender.counters()["batches_sent"] == 4
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_a_failing_sink_is_retried_until_it_takes_the_batch() -> None:
    """Each failure is counted and retried with backoff; the batch arrives once."""
    calls: list[int] = []

    def flaky(batch: ScoreBatch) -> None:
        calls.append(len(batch.requests))
        if len(calls) < 3:
            raise ConnectionError("broker down")

    sender = Sender(_Callback(flaky), SenderLimits(retry_initial_s=0.01, retry_max_s=0.02), Tally())
    sender.start()
    try:
        sender.put([_shipment()])
        assert sender.wait_idle(time.monotonic() + 10)
        assert calls == [1, 1, 1]
        assert (sender.counters()["send_failures"], sender.counters()["runs_sent"]) == (2, 1)
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_each_new_fault_is_logged_when_it_starts_and_a_recovery_once() -> None:
    """Failures were logged at the process's 1st and every 100th: after a broker restart had
    logged the first, a later fault (the queue key of another type, a full Redis) went unlogged
    for minutes. A run of failures is logged when it starts and when its error changes (and
    once a minute while it lasts); the send that ends it is logged once."""
    import structlog.testing

    errors = ["Connection refused"] * 3 + [None] + ["Connection refused"] * 2 + ["READONLY"] * 2 + [None]

    def failing(batch: ScoreBatch) -> None:
        error = errors.pop(0)
        if error is not None:
            raise ConnectionError(error)

    sender = Sender(_Callback(failing), SenderLimits(retry_initial_s=0.01, retry_max_s=0.02), Tally())
    sender.start()
    try:
        with structlog.testing.capture_logs() as logs:
            sender.put([_shipment()])
            assert sender.wait_idle(time.monotonic() + 10)
            sender.put([_shipment()])
            assert sender.wait_idle(time.monotonic() + 10)
        assert errors == []
        seen = [(e["event"], e.get("error", e.get("after_failures"))) for e in logs]
        assert seen == [
            ("sink_send_failed", "ConnectionError('Connection refused')"),
            ("sink_send_recovered", 3),
            ("sink_send_failed", "ConnectionError('Connection refused')"),
            ("sink_send_failed", "ConnectionError('READONLY')"),
            ("sink_send_recovered", 4),
        ]
        assert sender.counters()["send_failures"] == 7
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_after_stop_nothing_is_attempted_and_close_counts_the_rest() -> None:
    """stop(): no attempt (nor retry) starts; close() counts queued and in-flight runs once."""
    attempts: list[int] = []

    def down(batch: ScoreBatch) -> None:
        attempts.append(1)
        raise ConnectionError("broker down")

    tally = Tally()
    sender = Sender(_Callback(down), SenderLimits(batch_size=1, retry_initial_s=0.01, retry_max_s=0.02), tally)
    sender.start()
    sender.put([_shipment(f"q{i}") for i in range(3)])
    assert wait_for(lambda: len(attempts) >= 2)
    sender.stop()
    sender.close(time.monotonic() + 1)
    made = len(attempts)
    assert not sender.is_alive()
    assert tally.dropped == {"shutdown_unsent": 3}
    sender.put([_shipment()])  # refused: stopped
    assert tally.dropped == {"shutdown_unsent": 4}
    assert len(attempts) == made


def test_a_capped_sink_gets_encoded_messages_and_a_run_alone_over_the_cap_is_dropped() -> None:
    """EncodedSink: each message under max_payload_bytes; an oversize run goes, its neighbours not."""
    got: list[tuple[ScoreBatch, Sequence[str]]] = []

    class Capped:
        max_payload_bytes = 40_000

        def send(self, batch: ScoreBatch) -> None:
            raise AssertionError("a capped sink gets encoded requests")

        def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
            got.append((batch, requests_json))

    tally = Tally()
    sender = Sender(Capped(), SenderLimits(), tally)
    sender.put([_shipment("a"), _shipment("x" * 60_000), _shipment("b")])
    sender.start()
    try:
        assert sender.wait_idle(time.monotonic() + 10)
        assert tally.dropped == {"too_large": 1}
        sent = [r for batch, _ in got for r in batch.requests]
        assert len(sent) == 2
        assert all(sum(len(j) for j in encoded) < 40_000 for _, encoded in got)
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_a_run_no_encoder_can_write_is_dropped_alone() -> None:
    """A span built outside the SDK can hold an attribute value no encoder writes: that run is
    dropped and counted as unencodable; the runs beside it still go (the whole batch went as
    send_failed)."""
    got: list[ScoreBatch] = []

    class Capped:
        max_payload_bytes = 1_000_000

        def send(self, batch: ScoreBatch) -> None:
            raise AssertionError("a capped sink gets encoded requests")

        def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
            got.append(batch)

    bad = _shipment("bad")
    bad.spans[-1].attributes = {**bad.spans[-1].attributes, "gen_ai.agent.name": object()}
    good = [_shipment("a"), _shipment("b")]
    tally = Tally()
    sender = Sender(Capped(), SenderLimits(), tally)
    sender.put([good[0], bad, good[1]])
    sender.start()
    try:
        assert sender.wait_idle(time.monotonic() + 10)
        assert tally.dropped == {"unencodable": 1}
        assert [r.trace_id for b in got for r in b.requests] == [s.spans[0].trace_id for s in good]
        assert sender.counters()["runs_sent"] == 2
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


class _Callback:
    def __init__(self, fn: object) -> None:
        self._fn = fn

    def send(self, batch: ScoreBatch) -> None:
        self._fn(batch)  # type: ignore[operator]


class RefusesFirst:
    """A sink that refuses its first batch for good (as CelerySink does one over its cap)."""

    def __init__(self) -> None:
        self.calls = 0
        self.batches: list[ScoreBatch] = []

    def send(self, batch: ScoreBatch) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ValueError("batch is over the sink's message cap: retrying cannot help")
        self.batches.append(batch)


def test_a_batch_the_sink_refuses_is_counted_and_the_next_ones_are_sent() -> None:
    """A ValueError from the sink is final: that batch is dropped as send_failed, never retried
    forever in front of the rest of the queue."""
    sink, tally = RefusesFirst(), Tally()
    sender = Sender(sink, SenderLimits(batch_size=1), tally)
    sender.put([_shipment(f"q{i}") for i in range(3)])
    sender.start()
    try:
        assert sender.wait_idle(time.monotonic() + 10)
        assert tally.dropped == {"send_failed": 1}
        assert len(sink.batches) == 2
        assert sink.calls == 3  # the refused batch was tried once
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)


def test_a_failed_or_refused_send_logs_the_runs_of_its_batch_not_its_requests() -> None:
    """A trace's runs travel as one request: ``sink_send_failed`` and ``sink_refused_batch``
    said ``runs=1`` for a batch of a 40-run trace (they logged the requests)."""
    import structlog.testing

    from tests.tracing.test_cut import many_runs
    from tracing.queue import ScoreRequest

    trace, targets = many_runs("logged-runs", 40)
    own = ScoreRequest.model_construct(spans=trace, target_span_ids=targets, scorer_ids=["s"]).run_spans()
    shipments = [Shipment(own[t], t, ["s"], shipment_size(own[t]), trace=trace, runs=40) for t in targets]
    answers: list[Exception] = [ConnectionError("down"), ValueError("refused")]

    def failing(batch: ScoreBatch) -> None:
        assert len(batch.requests) == 1
        raise answers.pop(0)

    sender = Sender(_Callback(failing), SenderLimits(retry_initial_s=0.01, retry_max_s=0.02), Tally())
    sender.start()
    try:
        with structlog.testing.capture_logs() as logs:
            sender.put(shipments)
            assert sender.wait_idle(time.monotonic() + 10)
        runs = {e["event"]: e["runs"] for e in logs if e["event"] in ("sink_send_failed", "sink_refused_batch")}
        assert runs == {"sink_send_failed": 40, "sink_refused_batch": 40}
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)
