"""Delivering scores in a test, for any score sink.

``drain`` is the outbox drainer's loop; ``drain_and_close`` the same, then the sink closed.
The scenarios every dashboard sink must pass against its real server: ``redeliver`` (the same
scores again, one changed), ``deliver_early_then_late`` (scores before their trace reaches the
server), ``deliver_across_outage`` (the server killed half-way through, restarted). For a real
worker delivering through its outbox: ``running_worker`` starts one scoring with
tests/integration/phoenix_scorers.py, ``wait_held`` and ``wait_delivered`` wait for the outbox's
counts of a sink.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.integration._servers import Server
from tests.integration._traces import span_ids
from tests.worker._workers import WorkerProcess, wait_for
from tracing import ScoreRecord
from tracing.sinks import Delivered, Delivery, Refused, Retry, ScoreSink
from worker.store import RedisOutbox


def drain(
    sink: ScoreSink, records: Sequence[ScoreRecord], timeout_s: float = 60.0, interval_s: float = 0.2
) -> list[list[Delivery]]:
    """Deliver until every record is Delivered, re-sending the rest each round; returns every
    round's outcomes. A Refused record, or records still pending at the deadline, fail the test."""
    rounds: list[list[Delivery]] = []
    pending = list(records)
    deadline = time.monotonic() + timeout_s
    while pending:
        outcomes = sink.deliver(pending)
        assert len(outcomes) == len(pending), f"{sink.name}: {len(outcomes)} outcomes for {len(pending)} records"
        refused = [o for o in outcomes if isinstance(o, Refused)]
        assert not refused, refused
        rounds.append(outcomes)
        pending = [r for r, o in zip(pending, outcomes, strict=True) if not isinstance(o, Delivered)]
        if pending:
            assert time.monotonic() < deadline, f"{len(pending)} records still not delivered: {outcomes[:3]}"
            time.sleep(interval_s)
    return rounds


def drain_and_close(sink: ScoreSink, records: Sequence[ScoreRecord]) -> list[list[Delivery]]:
    """``drain``, then ``sink`` closed however that ends."""
    try:
        return drain(sink, records)
    finally:
        sink.close()


# What ``redeliver`` changes: a new score, and a reason with a lone surrogate (a judge's JSON
# "\\ud800" decodes to one; it cannot be UTF-8, so the sinks send U+FFFD).
CHANGED_SCORE = 0.123
CHANGED_REASON = "re-scored \ud800"
STORED_REASON = "re-scored \ufffd"


def redeliver(
    sink: ScoreSink, records: Sequence[ScoreRecord], stored: Callable[[], Mapping[str, Any]]
) -> tuple[ScoreRecord, Mapping[str, Any], Mapping[str, Any]]:
    """Drain ``records``: ``stored()`` (what the server holds, by key) has one entry per record.
    Then the outbox re-sending after lost acks: every record again, and one with a score
    changed (CHANGED_SCORE, CHANGED_REASON) twice in one batch: all Delivered, and ``stored()``
    keeps the same keys. Returns that record (as first sent) and ``stored()`` before and after
    the re-sends; closes ``sink``."""
    with_score = next(r for r in records if r.score is not None)
    try:
        drain(sink, records)
        first = stored()
        assert len(first) == len(records)

        assert sink.deliver(records) == [Delivered()] * len(records)
        changed = with_score.model_copy(update={"score": CHANGED_SCORE, "reason": CHANGED_REASON})
        assert sink.deliver([changed, changed]) == [Delivered(), Delivered()]
    finally:
        sink.close()
    again = stored()
    assert again.keys() == first.keys()
    return with_score, first, again


def deliver_early_then_late(
    sink: ScoreSink,
    records: Sequence[ScoreRecord],
    traces: Sequence[dict[str, Any]],
    send: Callable[[list[dict[str, Any]]], None],
    not_yet: str,
) -> list[Delivery]:
    """Scores of two traces, neither sent to the server yet: every record is Retry with
    ``not_yet`` in the reason. ``send`` the first trace: its records are Delivered, the other's
    Retry (``not_yet``, a wait); ``send`` the second: all drained. Returns the middle round's
    outcomes (for the caller's closer look); closes ``sink``."""
    early, late = traces[0], traces[1]
    early_spans = span_ids([early])
    assert any(r.span_id in early_spans for r in records)
    assert any(r.span_id not in early_spans for r in records)
    try:
        nothing_yet = sink.deliver(records)
        assert all(isinstance(o, Retry) and not_yet in o.reason for o in nothing_yet), nothing_yet

        send([early])
        mixed = sink.deliver(records)
        for record, outcome in zip(records, mixed, strict=True):
            if record.span_id in early_spans:
                assert outcome == Delivered()
            else:
                assert isinstance(outcome, Retry)
                assert not_yet in outcome.reason
                assert outcome.after_s > 0

        send([late])
        drain(sink, records)
    finally:
        sink.close()
    return mixed


def deliver_across_outage(server: Server, sink: ScoreSink, records: Sequence[ScoreRecord], unreachable: str) -> None:
    """Half the records drained; ``server`` killed: the rest are each Retry with ``unreachable`` in
    the reason; ``server`` restarted on the same database: every record drained again (all
    re-sent, as an outbox that lost its acks would). Closes ``sink``; ``server`` is up after."""
    half = len(records) // 2
    with server.up_after():
        try:
            drain(sink, records[:half])
            server.stop(kill=True)
            while_down = sink.deliver(records[half:])
            assert all(isinstance(o, Retry) and unreachable in o.reason for o in while_down), while_down[:3]

            server.start()
            drain(sink, records)
        finally:
            sink.close()


@contextmanager
def running_worker(
    name: str, redis_url: str, tmp_path: Path, env: Mapping[str, str]
) -> Iterator[tuple[WorkerProcess, RedisOutbox]]:
    """A real worker scoring with tests.integration.phoenix_scorers, ready, and the outbox it
    delivers through; ``env`` names its sinks (``TRACESCORE_SINKS``, their URLs) and the judge's
    LLM. Both are stopped on leaving."""
    worker = WorkerProcess(
        name,
        redis_url,
        tmp_path,
        scores_path=tmp_path / f"{name}-scores.jsonl",
        scorers="tests.integration.phoenix_scorers",
        env={
            "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2",
            "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "1",
            # Short backoff for a short test; attempts enough to outlast an outage (the default 12
            # with the default backoff cover about twenty minutes).
            "TRACESCORE_SINK_MAX_ATTEMPTS": "1000",
            **env,
        },
    )
    outbox = RedisOutbox(redis_url)
    try:
        worker.wait_ready()
        yield worker, outbox
    finally:
        outbox.close()
        worker.stop()


def sink_counts(outbox: RedisOutbox, sink: str) -> dict[str, int]:
    """The outbox's counts for ``sink`` (empty before its first score)."""
    counts = outbox.counts().get(sink)
    return counts.as_dict() if counts else {}


def wait_held(outbox: RedisOutbox, sink: str, expected: int, worker: WorkerProcess, timeout_s: float = 120) -> None:
    """Wait until ``sink``'s ``expected`` deliveries have each been retried; then all are pending,
    none delivered or failed (its server is down)."""
    assert wait_for(lambda: sink_counts(outbox, sink).get("retried", 0) >= expected, timeout=timeout_s), (
        sink_counts(outbox, sink),
        worker.text()[-3000:],
    )
    counts = sink_counts(outbox, sink)
    assert (counts["pending"], counts["delivered"], counts["failed"]) == (expected, 0, 0), counts


def wait_delivered(
    outbox: RedisOutbox, sink: str, expected: int, worker: WorkerProcess, timeout_s: float = 120
) -> None:
    """Wait until ``sink`` has ``expected`` deliveries; then none pending or failed."""
    assert wait_for(lambda: sink_counts(outbox, sink).get("delivered") == expected, timeout=timeout_s), (
        sink_counts(outbox, sink),
        worker.text()[-3000:],
    )
    counts = sink_counts(outbox, sink)
    assert (counts["pending"], counts["failed"]) == (0, 0), counts
