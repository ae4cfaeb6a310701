"""A sink that refuses every score (a revoked key, a deleted project) logged one
``sink_dead_letter`` line per score: 100,000 lines a day drowned every other line. Now the first
of a (sink, reason) at once, then a line a minute with the letters since, the rest at stop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

import worker._delivery as delivery
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivery, MemorySink, Refused
from worker._delivery import Deliveries, DrainPolicy
from worker.store import MemoryScoreStore

N = 300


def _record(n: int) -> ScoreRecord:
    trace, span = f"{n:032x}", f"{n:016x}"
    return ScoreRecord(
        score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s", score=0.5,
        reason="the agent's own words",
    )  # fmt: skip


def test_a_sink_refusing_every_score_logs_a_bounded_number_of_lines_that_count_every_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock that moves 7 s at each line considered: 30 batches span about 3.5 minutes.
    ticks = itertools.count(0.0, 7.0)
    monkeypatch.setattr(delivery, "_dead_letter_clock", lambda: next(ticks), raising=False)
    monkeypatch.setattr(delivery, "_dead_letter_logs", {}, raising=False)
    store = MemoryScoreStore(sinks=("alpha",))
    asyncio.run(store.put_records([_record(n) for n in range(N)], "w1", 600))
    sink = MemorySink("alpha")
    sink.outcome = Refused("otlp_http_401", "invalid key sk-secret-123")
    deliveries = Deliveries([sink], lambda: store.outbox, DrainPolicy(batch_size=10, lease_s=30, max_attempts=3))
    with capture_logs() as logs:
        deliveries.start()
        assert deliveries.flush(30)
        deliveries.stop()
    assert store.outbox.counts()["alpha"].failed == N
    lines: list[dict[str, Any]] = [x for x in logs if x["event"] == "sink_dead_letter"]
    assert 2 <= len(lines) <= 8, len(lines)  # not one a score
    assert sum(x["letters"] for x in lines) == N  # every letter counted, none twice
    first = lines[0]
    assert first["letters"] == 10  # the first batch's, said at once
    assert (first["sink"], first["reason"], first["log_level"]) == ("alpha", "otlp_http_401", "error")
    assert first["score_id"] in {r.score_id for r in map(_record, range(N))}
    assert "attempts" in first
    assert "endpoint" in first
    said = repr(lines)
    assert "sk-secret" not in said
    assert "agent's own words" not in said


class _CodeOfItsOwn(MemorySink):
    """A backend that refuses each score with an error code made up for it."""

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        return [Refused(f"refused the assessment (HTTP 400 CODE_{r.trace_id[-6:]})") for r in records]


def test_a_backend_making_up_a_reason_a_score_has_a_bounded_number_of_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines are one a minute per reason, and a reason is the backend's answer: one making up
    an error code for each score had a line, and a counter kept for good, per score (300 here).
    Past 32 reasons of a sink the others share one line, which counts every letter."""
    monkeypatch.setattr(delivery, "_dead_letter_clock", itertools.count(0.0, 0.1).__next__, raising=False)
    monkeypatch.setattr(delivery, "_dead_letter_logs", {}, raising=False)
    store = MemoryScoreStore(sinks=("alpha",))
    asyncio.run(store.put_records([_record(n) for n in range(N)], "w1", 600))
    deliveries = Deliveries(
        [_CodeOfItsOwn("alpha")], lambda: store.outbox, DrainPolicy(batch_size=10, lease_s=30, max_attempts=3)
    )
    with capture_logs() as logs:
        deliveries.start()
        assert deliveries.flush(30)
        deliveries.stop()
    assert store.outbox.counts()["alpha"].failed == N
    lines = [x for x in logs if x["event"] == "sink_dead_letter"]
    assert len(delivery._dead_letter_logs) == 33, len(delivery._dead_letter_logs)
    assert len(lines) <= 34, len(lines)  # the 32 reasons' first lines, the others' first and last
    assert sum(x["letters"] for x in lines) == N  # every letter counted, none twice
    assert lines[-1]["reason"].startswith("(other reasons), the last: refused the assessment (HTTP 400 CODE_")
