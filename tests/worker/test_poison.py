"""A run that kills the process scoring it (a segfault, an OOM kill) is isolated: its batch is
split on redelivery, the poison run alone is dead-lettered, its neighbours are scored once."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
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


def test_a_poison_runs_letter_names_a_scorer_id_that_is_no_plain_id_by_its_digest(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The letter of a run that kills its process names the request's scorers, which are the
    producer's text (an id the registry does not have is still one of the request's): its
    error carried them as they were, a fake letter's line after a newline and escapes included,
    shown by `tracescore dlq list`. A scorer id that is no plain id is its digest there now."""
    from worker._settings import get_settings
    from worker.cli import main

    marker = "AGENT-TEXT-IN-A-SCORER-ID-8e1c"
    forged = f"\x1b[2J\n{'0' * 32}  2026-01-01 00:00:00  retry_budget_exhausted  batch=x {marker}"
    worker = WorkerProcess("poison-ids", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl",
                           pool="prefork", concurrency=1)  # fmt: skip
    try:
        worker.wait_ready()
        raw = payload(range(1), ["poison", forged], salt="poison-ids", batch_id="poison-ids")
        raw["requests"][0]["spans"][0]["attributes"][OUTPUT] = output_messages(f"this one kills: {POISON_MARKER}")
        sink = CelerySink(redis_url)
        sink.send(ScoreBatch.model_validate(raw))
        sink.close()
        assert wait_for(lambda: len(_dlq(redis_url)) == 1, 120), worker.text()[-3000:]
    finally:
        worker.stop()
    (letter,) = _dlq(redis_url)
    assert letter.reason == "too_many_deliveries"
    assert marker not in letter.error
    assert "scorers poison, sha256:" in letter.error

    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    get_settings.cache_clear()
    try:
        capsys.readouterr()
        assert main(["dlq", "list"]) == 0
        said = capsys.readouterr()
        assert marker not in said.out + said.err
        assert main(["dlq", "list", "--json"]) == 0  # (the letter with its message: the payload is the batch)
        (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert listed["error"] == letter.error
    finally:
        get_settings.cache_clear()
    assert marker not in worker.text()
