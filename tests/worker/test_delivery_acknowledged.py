"""Through the drainer: a 2xx that is not the backend's acknowledgement leaves the score owed."""

from __future__ import annotations

import asyncio

import pytest

from tests.tracing.test_sinks_acknowledged import _ACK, _NOT_ACKS, _answering, _record, _sink
from worker._delivery import DrainPolicy, drain_once
from worker.store import MemoryScoreStore


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
def test_a_score_answered_by_a_page_stays_owed_and_is_delivered_once_the_backend_answers(kind: str) -> None:
    """The page's answer leaves the score queued (it was counted delivered and gone), the
    backend's own answer then delivers it."""
    store = MemoryScoreStore(sinks=(kind,))
    asyncio.run(store.put_records([_record()], "w1", 600))
    outbox = store.outbox
    policy = DrainPolicy(backoff_s=0.0, backoff_max_s=0.0, max_attempts=5)
    with _answering([(200, *_NOT_ACKS["web_page"]), (200, "application/json", _ACK[kind])]) as url:
        sink = _sink(kind, url)
        try:
            assert drain_once(sink, outbox, policy) == 1
            counts = outbox.counts()[kind]
            assert (counts.delivered, counts.pending, counts.failed) == (0, 1, 0)
            assert drain_once(sink, outbox, policy) == 1
        finally:
            sink.close()
    counts = outbox.counts()[kind]
    assert (counts.delivered, counts.pending, counts.failed) == (1, 0, 0)
