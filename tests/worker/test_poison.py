"""A run that kills the process scoring it (a segfault, an OOM kill) is isolated: its batch is
split on redelivery, the poison run alone is dead-lettered, its neighbours are scored once."""

from __future__ import annotations

import collections
from pathlib import Path

import redis

from tests.worker._batches import OUTPUT, batch, output_messages, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.sample_scorers import POISON_MARKER
from tracing import CelerySink
from tracing.queue import ScoreBatch, ScoreRequest
from worker.store import DeadLetter

N = 6
POISON = 3


def _dlq(redis_url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


def test_poison_run_is_dead_lettered_alone_and_its_neighbours_are_scored(redis_url: str, tmp_path: Path) -> None:
    """Batch of N runs, one SIGKILLs its pool process: N-1 scores (each once), one dead letter
    naming the poison run, the worker still running and scoring later batches."""
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "poisoned", redis_url, tmp_path, scores_path=scores, pool="prefork", concurrency=1,
        env={"TRACESCORE_RUN_CONCURRENCY": "2"},
    )  # fmt: skip
    try:
        worker.wait_ready()
        raw = payload(range(N), ["poison"], salt="poison", batch_id="poisoned-batch")
        raw["requests"][POISON]["spans"][0]["attributes"][OUTPUT] = output_messages(f"this one kills: {POISON_MARKER}")
        poisoned = ScoreBatch.model_validate(raw)
        request = poisoned.requests[POISON]
        (poison_id,) = request.run_ids()
        sink = CelerySink(redis_url)
        sink.send(poisoned)
        sink.close()

        assert wait_for(lambda: len(_dlq(redis_url)) >= 1, 120), worker.text()[-3000:]
        (letter,) = _dlq(redis_url)
        assert letter.run_ids == [poison_id]
        assert letter.reason == "too_many_deliveries"
        assert letter.batch_id == f"poisoned-batch/{POISON}"
        assert poison_id in letter.error
        assert [ScoreRequest.model_validate(r).target_span_ids for r in letter.payload["requests"]] == [
            request.target_span_ids
        ]

        assert wait_for(lambda: len(read_scores(scores)) >= N - 1, 60), worker.text()[-3000:]
        recorded = read_scores(scores)
        per_score = collections.Counter(s["score_id"] for s in recorded)
        assert len(per_score) == N - 1
        assert set(per_score.values()) == {1}
        expected = {r.target_span_ids[0] for i, r in enumerate(poisoned.requests) if i != POISON}
        assert {s["span_id"] for s in recorded} == expected
        assert all(s["error_type"] is None for s in recorded)

        # The worker (its parent process, with a fresh pool child) keeps scoring.
        assert worker.proc.poll() is None
        sink = CelerySink(redis_url)
        sink.send(batch(range(3), ["length"], salt="after-poison"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) == N - 1 + 3, 60), worker.text()[-3000:]
        assert len(_dlq(redis_url)) == 1
        assert "batch_split" in worker.text()
    finally:
        worker.stop()
