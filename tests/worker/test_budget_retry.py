"""A run refused by the judge budget beside a neighbour whose judge failed transiently, with a
real worker, real Redis and tests/fakellm: the message's retry (for the neighbour) leaves the
refusal as recorded, so the job's counts, once at its total, stay as they are."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import redis

from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import request
from tests.worker._budget import budget_worker
from tests.worker._workers import WorkerProcess, wait_for
from tracing import CelerySink, ScoreBatch
from worker.store import job_progress

BUDGETS = json.dumps({"scorers": {"costly": 0.01}})
JOB = "refused-job"

worker = budget_worker("refused", TRACESCORE_BUDGETS=BUDGETS, TRACESCORE_RETRY_BACKOFF_SECONDS="1")


def _done(counts: dict[str, int]) -> int:
    return counts.get("scored", 0) + counts.get("failed", 0) + counts.get("skipped", 0)


def test_a_retry_for_a_neighbour_leaves_a_budget_refusal_counted_as_it_was(
    fake_llm: FakeLLMServer, worker: WorkerProcess, redis_url: str
) -> None:
    """Run A is refused by a spent budget (a retryable record, counted failed) while its
    neighbour B's judge answers 503 (left for the message's retry). The budget is raised before
    the retry. The retry used to score A again, slowly, after B's record had brought the job's
    counts to its total: a backfill's wait ended while A was being scored, and its summary said
    failed where A ended scored. Now the retry scores B only; A's refusal stays as counted and
    the message is kept as a budget_exhausted letter for `dlq retry`."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    client.hset(f"tracescore:spend:{day}", mapping={"scorer:costly": "1.0", "total": "1.0"})
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    fake_llm.rule(Reply.auto(latency_ms=4000), user_contains="SCORE")
    a = request(1, ["costly"], salt="refused", job_id=JOB)
    b = request(2, ["plain"], salt="refused", job_id=JOB)
    sink = CelerySink(redis_url)
    sink.send(ScoreBatch(batch_id="refused-job-000001", requests=[a, b]))
    sink.close()
    try:
        assert wait_for(lambda: job_progress(client, JOB).get("failed:budget_exhausted") == 1, 60), worker.text()[
            -3000:
        ]
        client.delete(f"tracescore:spend:{day}")  # the budget is back before the neighbour's retry
        assert wait_for(lambda: _done(job_progress(client, JOB)) == 2, 60), worker.text()[-3000:]
        at_total = job_progress(client, JOB)  # where a backfill's wait ends, and its summary
        assert at_total["failed:budget_exhausted"] == 1
        assert at_total["scored"] == 1
        assert wait_for(lambda: worker.text().count("batch_done") >= 1, 60), worker.text()[-3000:]
        assert job_progress(client, JOB) == at_total
        # A was not paid for by the retry; its message waits as a letter for `dlq retry`.
        assert ["SCORE" in r.user_text for r in fake_llm.requests] == [False, False]
        letters = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
        assert [(x["reason"], x["retryable"]) for x in letters] == [("budget_exhausted", True)]
    finally:
        client.close()
