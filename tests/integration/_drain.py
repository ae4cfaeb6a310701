"""``drain``: the outbox drainer's loop in a test, for any score sink."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tracing import ScoreRecord
from tracing.sinks import Delivered, Delivery, Refused, ScoreSink


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
