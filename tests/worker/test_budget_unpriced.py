"""A judge model without a price under a budget, with a real worker, real Redis and tests/fakellm:
the README's promise that its calls are refused as ``unpriced_model`` once seen, kept as retryable
dead letters that `dlq retry` scores once the model has a price."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from click.testing import CliRunner

from tests.fakellm import FakeLLMServer
from tests.worker._batches import batch
from tests.worker._budget import PRICES, SCORERS
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink
from worker._settings import load_settings
from worker.cli import cli as cli_main
from worker.cli._status import collect_status

BUDGETS = json.dumps({"total": 100})
RUNS = 6


def _worker(name: str, redis_url: str, tmp: Path, env: dict[str, str], started: list[WorkerProcess]) -> WorkerProcess:
    worker = WorkerProcess(name, redis_url, tmp, scores_path=tmp / "scores.jsonl", env=env, scorers=SCORERS)
    started.append(worker)
    worker.wait_ready()
    return worker


def test_an_unpriced_model_under_a_budget_is_refused_once_seen_and_its_messages_kept_for_dlq_retry(
    fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    """No price for openai/fake-judge, a total budget of 100 USD: the worker's first call is made
    (logged judge_model_unpriced), every later one refused as unpriced_model, naming the model and
    TRACESCORE_PRICES; the message is a retryable unpriced_model letter, logged as a count; status
    counts the one unpriced call. With the price added, `dlq retry --all` scores the refused runs
    and does not pay for the scored one again."""
    env = {**fake_llm_env, "TRACESCORE_PRICES": "", "TRACESCORE_BUDGETS": BUDGETS, "TRACESCORE_MODEL_CONCURRENCY": "1"}
    worker = _worker("unpriced", redis_url, tmp_path, env, started)
    sink = CelerySink(redis_url)
    sink.send(batch(range(RUNS), ["costly"], salt="unpriced"))
    sink.close()
    scores = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores)) == RUNS, 60), worker.text()[-3000:]

    records = read_scores(scores)
    scored = [r for r in records if r["error_type"] is None]
    refused = [r for r in records if r["error_type"] == "unpriced_model"]
    assert (len(scored), len(refused)) == (1, RUNS - 1), [r["error_type"] for r in records]
    assert fake_llm.count() == 1
    assert scored[0]["cost_usd"] is None  # unpriced, never a made-up 0
    assert all(r["retryable"] and r["judge_calls"] == 0 for r in refused)
    assert "openai/fake-judge has no price" in refused[0]["error_message"]
    assert "TRACESCORE_PRICES" in refused[0]["error_message"]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    letters = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
    client.close()
    assert [(x["reason"], x["retryable"]) for x in letters] == [("unpriced_model", True)]
    assert wait_for(lambda: "unpriced_model_messages" in worker.text(), 10), worker.text()[-3000:]
    assert worker.text().count("judge_model_unpriced") == 1
    status = collect_status(3.0, load_settings(broker_url=redis_url, redis_url=redis_url, budgets=BUDGETS))
    assert status["spend"]["unpriced_calls"] == {"openai/fake-judge": 1}
    assert status["spend"]["total_usd"] == 0
    worker.stop()

    _worker("priced", redis_url, tmp_path, {**env, "TRACESCORE_PRICES": PRICES}, started)
    retried = CliRunner().invoke(
        cli_main, ["dlq", "retry", "--all", "--broker", redis_url], env={"TRACESCORE_REDIS_URL": redis_url}
    )
    assert retried.exit_code == 0, retried.output

    def rescored() -> bool:
        latest = {r["score_id"]: r for r in read_scores(scores)}
        return len(latest) == RUNS and all(r["error_type"] is None for r in latest.values())

    assert wait_for(rescored, 60)
    assert fake_llm.count() == RUNS  # the scored run was not paid for twice
