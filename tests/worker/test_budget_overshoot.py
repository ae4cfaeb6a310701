"""The README's *Overshoot* bound and what a spent budget shows, with a real prefork worker (two
scoring processes), real Redis and tests/fakellm answering slowly, so runs overlap for real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from tests._redis import free_port
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tests.worker._budget import PRICES, SCORERS
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.test_metrics import scrape, total
from tracing import CelerySink
from worker._settings import load_settings
from worker.cli._status import collect_status

PROCESSES = 2
MODEL_CONCURRENCY = 2
MESSAGES, RUNS_PER_MESSAGE = 4, 8


def _call_cost(fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str, tmp: Path) -> float:
    """What one `costly` call costs at PRICES: measured by a worker without budgets."""
    worker = WorkerProcess(
        "measure",
        redis_url,
        tmp,
        scores_path=tmp / "measure.jsonl",
        env={**fake_llm_env, "TRACESCORE_PRICES": PRICES},
        scorers=SCORERS,
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(1), ["costly"], salt="measure"))
        sink.close()
        assert wait_for(lambda: len(read_scores(tmp / "measure.jsonl")) == 1, 60), worker.text()[-3000:]
    finally:
        worker.stop()
    (record,) = read_scores(tmp / "measure.jsonl")
    client = redis.Redis.from_url(redis_url)
    client.flushdb()  # the measured call's spend and record are not the test's
    client.close()
    fake_llm.reset()
    return float(record["cost_usd"])


def test_a_budget_is_passed_by_at_most_the_runs_in_progress_per_process_and_the_metrics_say_so(
    fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    """Two prefork children, TRACESCORE_MODEL_CONCURRENCY=2, 32 runs in 4 messages of 8 (each
    child has 8 runs of a message to score at once), a judge answering in 0.5 s, a budget of
    about three calls: the spend passes it by at most MODEL_CONCURRENCY × processes calls (were
    the gate per batch or missing, all 16 runs in progress pass the check at the start). The
    scrape then says what was paid: the cost counter and the spend gauge equal the records'
    sum, the budget's remaining ratio is 0, the refused runs are counted failed as
    budget_exhausted, and their messages are retryable dead letters on the gauge."""
    cost = _call_cost(fake_llm, fake_llm_env, redis_url, tmp_path)
    assert cost > 0
    budget = 3.5 * cost
    budgets = json.dumps({"scorers": {"costly": budget}})
    fake_llm.rule(Reply.auto(latency_ms=500))
    port = free_port()
    worker = WorkerProcess(
        "overshoot",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        pool="prefork",
        concurrency=PROCESSES,
        scorers=SCORERS,
        env={
            **fake_llm_env,
            "TRACESCORE_PRICES": PRICES,
            "TRACESCORE_BUDGETS": budgets,
            "TRACESCORE_MODEL_CONCURRENCY": str(MODEL_CONCURRENCY),
            "TRACESCORE_RUN_CONCURRENCY": "64",
            "TRACESCORE_METRICS_PORT": str(port),
            "TRACESCORE_METRICS_HOST": "127.0.0.1",
            "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
        },
    )
    started.append(worker)
    worker.wait_ready()
    sink = CelerySink(redis_url)
    for m in range(MESSAGES):
        sink.send(batch(range(m * RUNS_PER_MESSAGE, (m + 1) * RUNS_PER_MESSAGE), ["costly"], salt="overshoot"))
    sink.close()
    runs = MESSAGES * RUNS_PER_MESSAGE
    scores = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores)) == runs, 90), worker.text()[-3000:]

    records = read_scores(scores)
    paid = [r for r in records if r["error_type"] is None]
    refused = [r for r in records if r["error_type"] == "budget_exhausted"]
    assert len(paid) + len(refused) == runs, sorted({r["error_type"] for r in records})
    assert paid
    assert refused
    assert fake_llm.count() == len(paid)  # a refused run made no call
    spent = sum(r["cost_usd"] for r in paid)
    assert spent >= budget
    # The bound: every call that passed the check while the spend was under the budget, at most
    # MODEL_CONCURRENCY runs per process in progress at once.
    assert spent < budget + PROCESSES * MODEL_CONCURRENCY * max(r["cost_usd"] for r in paid), (len(paid), spent)

    def scraped() -> dict[Any, float]:
        return scrape(port)

    # The pool children's counters reach the node's scrape once their last run is counted.
    assert wait_for(lambda: total(scraped(), "tracescore_runs_total") == runs, 10)
    samples = scraped()
    assert total(samples, "tracescore_judge_cost_usd_total", scorer="costly") == pytest.approx(spent, rel=1e-9)
    assert total(samples, "tracescore_runs_total", outcome="failed", reason="budget_exhausted") == len(refused)
    assert samples[("tracescore_spend_today_usd", frozenset({("scope", "scorer:costly")}))] == pytest.approx(spent)
    assert samples[("tracescore_budget_limit_usd", frozenset({("budget", "scorer:costly")}))] == budget
    assert samples[("tracescore_budget_remaining_ratio", frozenset({("budget", "scorer:costly")}))] == 0
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    letters = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
    client.close()
    assert letters
    assert all((x["reason"], x["retryable"]) == ("budget_exhausted", True) for x in letters)
    assert samples[("tracescore_dead_letters", frozenset({("reason", "budget_exhausted")}))] == len(letters)
    status = collect_status(3.0, load_settings(broker_url=redis_url, redis_url=redis_url, budgets=budgets))
    assert status["spend"]["by_scorer"]["costly"] == pytest.approx(spent, rel=1e-9)
