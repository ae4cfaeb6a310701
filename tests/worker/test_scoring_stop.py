"""score_batch stopped midway (SIGTERM's grace period, a time limit, the store failing): scores
already paid for are stored before the claims are released, and no scorer is left running."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from scorers import create_scorer
from tests.worker._batches import batch
from tracing import MemoryScoreWriter, ScoreRecord
from tracing._score_record import score_id_for
from tracing.queue import ScoreBatch
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker.store import MemoryScoreStore, StoreUnavailableError


class _SlowPut(MemoryScoreStore):
    """A store whose writes wait for ``gate``: a put in flight when the batch is stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.put_started = asyncio.Event()
        self.gate = asyncio.Event()

    async def put_records(self, records: Sequence[ScoreRecord], owner: str, ttl_s: int) -> list[bool]:
        self.put_started.set()
        await self.gate.wait()
        return await super().put_records(records, owner, ttl_s)


class _Stuck:
    """A scorer body that never returns (until cancelled), counting its cancellations."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.running = asyncio.Event()
        self.all_cancelled = asyncio.Event()

    async def __call__(self, run: Any) -> float:
        self.started += 1
        self.running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            if self.cancelled == self.started:
                self.all_cancelled.set()
            raise
        return 0.0


def _ids(msg: ScoreBatch, scorer_id: str) -> list[str]:
    return [score_id_for(r.trace_id, t, scorer_id, "1") for r in msg.requests for t in r.target_span_ids]


async def _until(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)


def test_a_score_being_stored_when_the_batch_is_cancelled_is_kept() -> None:
    """One run finished and its record is being put when the batch is cancelled: the put
    completes, the record is written once, and only the unfinished runs' claims are released
    (before, the put was cancelled with the batch and the next delivery paid for the run again)."""
    stuck = _Stuck()

    async def first_quick(run: Any) -> float:
        if quick_done.is_set():
            return await stuck(run)
        quick_done.set()
        return 0.7

    quick_done = asyncio.Event()
    scorer = create_scorer("mixed", type="agent").generate_score(first_quick)
    store, writer = _SlowPut(), MemoryScoreWriter()
    deps = ScoringDeps(registry=Registry([scorer]), store=store, writer=writer)
    msg = batch(range(3), ["mixed"])

    async def main() -> dict[str, str]:
        task = asyncio.ensure_future(score_batch(msg, deps))
        await _until(store.put_started)
        await _until(stuck.running)
        task.cancel()
        await _until(stuck.all_cancelled)  # the cancel has reached the runs
        store.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await store.claim_owners(_ids(msg, "mixed"))

    owners = asyncio.run(main())
    assert [r.score for r in store.records.values()] == [0.7]
    assert [r.score for r in writer.records] == [0.7]
    assert stuck.cancelled == stuck.started >= 1
    assert owners == {}


def test_a_cancelled_run_keeps_the_scores_of_its_scorers_that_finished() -> None:
    """A run with two scorers is cancelled after one finished: that one's score is stored and
    written; the other's claim is released for the redelivery."""
    stuck = _Stuck()
    quick = create_scorer("quick", type="agent").generate_score(lambda: 0.4)
    slow = create_scorer("slow", type="agent").generate_score(stuck)
    store, writer = MemoryScoreStore(), MemoryScoreWriter()
    deps = ScoringDeps(registry=Registry([quick, slow]), store=store, writer=writer)
    msg = batch(range(1), ["quick", "slow"])

    async def main() -> dict[str, str]:
        task = asyncio.ensure_future(score_batch(msg, deps))
        await _until(stuck.running)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await store.claim_owners(_ids(msg, "quick") + _ids(msg, "slow"))

    owners = asyncio.run(main())
    assert list(store.records) == _ids(msg, "quick")
    assert [r.scorer_id for r in writer.records] == ["quick"]
    assert stuck.cancelled == 1
    assert owners == {}
    # The redelivery scores only what was cut off.
    again = asyncio.run(
        score_batch(
            msg,
            ScoringDeps(
                registry=Registry([quick, create_scorer("slow", type="agent").generate_score(lambda: 0.9)]),
                store=store,
                writer=writer,
            ),
        )
    )
    assert (again.scored, again.skipped) == (1, {"already_scored": 1})


def test_a_step_that_loses_the_store_stops_the_other_scorers_of_its_run() -> None:
    """A scorer's step finds the store away: the batch raises it, and the same run's other
    scorer is cancelled before ``score_batch`` returns (before, it ran on, unawaited, paying for
    judge calls on a claim already released)."""
    stuck = _Stuck()

    async def loses_store(run: Any) -> float:
        await _until(stuck.running)
        raise StoreUnavailableError("Redis is away")

    lost = create_scorer("lost", type="agent").generate_score(loses_store)
    slow = create_scorer("slow", type="agent").generate_score(stuck)
    store = MemoryScoreStore()
    deps = ScoringDeps(registry=Registry([lost, slow]), store=store)
    msg = batch(range(1), ["lost", "slow"])

    async def main() -> tuple[int, dict[str, str]]:
        with pytest.raises(StoreUnavailableError):
            await score_batch(msg, deps)
        return stuck.cancelled, await store.claim_owners(_ids(msg, "lost") + _ids(msg, "slow"))

    cancelled, owners = asyncio.run(main())
    assert cancelled == 1
    assert owners == {}
    assert store.records == {}
