"""Budgets and the judge-call cap with real worker processes, real Redis and tests/fakellm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, wait_for
from tracing import CelerySink, ScoreBatch
from worker._settings import load_settings
from worker.cli import cli as cli_main
from worker.cli._status import collect_status
from worker.store import finish_job, job_progress

# Pricey on purpose, so a handful of fake calls spend a tiny budget (and an override is tested).
PRICES = json.dumps({"openai/fake-judge": {"input": 100.0, "output": 200.0}})
BUDGET_USD = 0.01
BUDGETS = json.dumps({"scorers": {"costly": BUDGET_USD}})


def _records(redis_url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = list(client.scan_iter(match="tracescore:score:*", count=500))
        return [json.loads(v) for v in client.mget(keys) if v] if keys else []
    finally:
        client.close()


def _start(started: list[WorkerProcess], name: str, redis_url: str, tmp: Path, env: dict[str, str]) -> WorkerProcess:
    worker = WorkerProcess(
        name, redis_url, tmp, scores_path=tmp / "scores.jsonl", env=env, scorers="tests.worker.budget_scorers"
    )
    started.append(worker)
    worker.wait_ready()
    return worker


def test_runs_past_a_tiny_budget_are_budget_exhausted_and_status_spend_matches_records(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    """A real worker spends a 0.01 USD budget: the rest are retryable budget_exhausted records,
    no judge call is made for them, and `status` shows exactly the records' summed cost."""
    env = {
        **fake_llm_env,
        "TRACESCORE_PRICES": PRICES,
        "TRACESCORE_BUDGETS": BUDGETS,
        # One judge call at a time in the process: overshoot is then at most one call.
        "TRACESCORE_MODEL_CONCURRENCY": "1",
    }
    worker = _start(started, "budget", redis_url, tmp_path, env)
    sink = CelerySink(redis_url)
    sink.send(batch(range(12), ["costly"], salt="budget"))
    sink.close()
    assert wait_for(lambda: len(_records(redis_url)) == 12, 60), worker.text()[-3000:]

    records = _records(redis_url)
    ok = [r for r in records if r["error_type"] is None]
    spent = [r for r in records if r["error_type"] == "budget_exhausted"]
    assert len(ok) + len(spent) == 12, [r["error_type"] for r in records]
    assert ok, "the budget allowed no run at all"
    assert spent, "the budget was never reached"
    # Every scored run says what it cost; the refused ones made no call and cost nothing.
    assert all(r["judge_calls"] == 1 and r["cost_usd"] > 0 and r["input_tokens"] > 0 for r in ok)
    assert all(r["judge_calls"] == 0 and r["cost_usd"] == 0 for r in spent)
    assert all(r["retryable"] for r in spent)
    assert all("daily budget of scorer costly is spent" in r["error_message"] for r in spent)
    assert fake_llm.count() == len(ok)
    # The budget is reached, and passed by at most the one call in flight.
    total = sum(r["cost_usd"] for r in records)
    assert total >= BUDGET_USD
    assert total - max(r["cost_usd"] for r in ok) < BUDGET_USD

    settings = load_settings(broker_url=redis_url, redis_url=redis_url, budgets=BUDGETS)
    status = collect_status(3.0, settings)
    spend = status["spend"]
    assert spend["by_scorer"]["costly"] == pytest.approx(total, rel=1e-9)
    assert spend["by_model"]["openai/fake-judge"] == pytest.approx(total, rel=1e-9)
    assert spend["total_usd"] == pytest.approx(total, rel=1e-9)
    assert spend["budgets"]["scorer:costly"]["remaining_usd"] == 0
    assert status["recent_failures"].get("budget_exhausted") == len(spent)

    shown = CliRunner().invoke(
        cli_main,
        ["status", "--broker", redis_url, "--timeout", "3"],
        env={"TRACESCORE_REDIS_URL": redis_url, "TRACESCORE_BUDGETS": BUDGETS},
    )
    assert shown.exit_code == 0, shown.output
    assert "scorer  costly:" in shown.output
    assert "scorer:costly: 0.0000 of 0.0100 USD left today" in shown.output

    # The message is kept for later: once there is budget again, `dlq retry` scores the
    # refused runs (and only those) and their records replace the budget_exhausted ones.
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    letters = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
    client.close()
    assert [(x["reason"], x["retryable"]) for x in letters] == [("budget_exhausted", True)]
    worker.stop()
    more = json.dumps({"scorers": {"costly": 100.0}})
    _start(started, "budget2", redis_url, tmp_path, {**env, "TRACESCORE_BUDGETS": more})
    retried = CliRunner().invoke(
        cli_main, ["dlq", "retry", "--all", "--broker", redis_url], env={"TRACESCORE_REDIS_URL": redis_url}
    )
    assert retried.exit_code == 0, retried.output
    assert wait_for(lambda: all(r["error_type"] is None for r in _records(redis_url)), 60)
    assert fake_llm.count() == 12  # the scored runs were not paid for twice
    after = collect_status(3.0, load_settings(broker_url=redis_url, redis_url=redis_url, budgets=more))
    assert after["spend"]["total_usd"] == pytest.approx(sum(r["cost_usd"] for r in _records(redis_url)), rel=1e-9)


def test_judge_calls_per_run_are_capped_across_redeliveries(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    """A judge that always answers 503, a worker killed mid-run and a second one taking the
    redelivery: the run's failed judge calls stay within the default cap, one delivery's
    attempts + one per retry delivery (4 + 3 = 7), not 4 × 4 = 16."""
    fake_llm.rule(Reply.error(503, "overloaded", latency_ms=300))
    env = {
        **fake_llm_env,
        "TRACESCORE_VISIBILITY_TIMEOUT": "8",
        "TRACESCORE_TASK_TIME_LIMIT": "6",
        "TRACESCORE_TASK_SOFT_TIME_LIMIT": "5",
        "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
    }
    first = _start(started, "doomed", redis_url, tmp_path, env)
    sink = CelerySink(redis_url)
    sink.send(batch(range(1), ["retrying"], salt="cap"))
    sink.close()
    assert wait_for(lambda: fake_llm.count() >= 2, 30), first.text()[-3000:]
    first.kill()
    second = _start(started, "rescuer", redis_url, tmp_path, env)
    assert wait_for(lambda: len(_records(redis_url)) == 1, 90), second.text()[-3000:]
    (record,) = _records(redis_url)
    # The record names the run's real failure, and says its judge calls were capped.
    assert record["error_type"] == "JudgeServerError", record
    assert "TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN" in record["error_message"]
    assert record["retryable"] is True
    # 7 counted failures, plus at most the one request in flight when the first worker died
    # (sent, but its failure was never recorded).
    assert 7 <= fake_llm.count() <= 8
    # No later delivery calls the judge again.
    calls = fake_llm.count()
    assert not wait_for(lambda: fake_llm.count() > calls, 3)

    # The message is a retryable dead letter; once the judge is healthy, `dlq retry` gives the
    # run a fresh allowance (the operator asked) and its score replaces the error record.
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    letters = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
    client.close()
    assert [(x["reason"], x["retryable"]) for x in letters] == [("judge_attempts_exhausted", True)]
    fake_llm.reset()
    retried = CliRunner().invoke(
        cli_main, ["dlq", "retry", "--all", "--broker", redis_url], env={"TRACESCORE_REDIS_URL": redis_url}
    )
    assert retried.exit_code == 0, retried.output
    assert wait_for(lambda: _records(redis_url)[0]["error_type"] is None, 30), second.text()[-3000:]
    assert fake_llm.count() == 1


def test_a_run_split_from_a_crashed_batch_keeps_its_failed_judge_calls(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    """A run whose judge failed up to TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN in a batch whose
    other run then kills the pool process: the batch comes back split, one message per run, and
    the run's own message (new, never delivered) still holds the run to the cap: no judge call
    is made for it (its split copy used to start from zero and pay the cap again)."""
    fake_llm.rule(Reply.error(503, "overloaded"))
    cap = 2
    env = {**fake_llm_env, "TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN": str(cap), "TRACESCORE_RUN_CONCURRENCY": "2"}
    worker = WorkerProcess(
        "split", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl", env=env, pool="prefork",
        scorers="tests.worker.budget_scorers",
    )  # fmt: skip
    started.append(worker)
    worker.wait_ready()
    judged = batch(range(1), ["retrying"], salt="split-cap").requests
    crashing = batch(range(1, 2), ["crash_after_failed_calls"], salt="split-cap").requests
    sink = CelerySink(redis_url)
    sink.send(ScoreBatch(batch_id="split-cap", requests=judged + crashing))
    sink.close()

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert wait_for(lambda: client.llen("tracescore:dlq") == 1, 60), worker.text()[-3000:]
        (letter,) = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()
    assert "batch_split" in worker.text()  # the crash happened, and split the batch
    assert (letter["batch_id"], letter["reason"], letter["retryable"]) == (
        "split-cap/0",
        "judge_attempts_exhausted",
        True,
    )
    assert wait_for(lambda: len(_records(redis_url)) == 2, 30), worker.text()[-3000:]
    by_scorer = {r["scorer_id"]: r for r in _records(redis_url)}
    assert by_scorer["crash_after_failed_calls"]["score"] == 1.0
    capped = by_scorer["retrying"]
    assert capped["error_type"] == "JudgeServerError", capped
    assert f"TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN: {cap}" in capped["error_message"]
    # The first delivery's failures alone (none in flight: the crash came after the second was counted).
    assert fake_llm.count() == cap
    assert not wait_for(lambda: fake_llm.count() > cap, 3)


@pytest.mark.parametrize("finished", [False, True], ids=["running", "finished"])
def test_a_dlq_retry_of_a_message_holding_a_run_twice_counts_its_copy_once(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
    finished: bool,
) -> None:
    """A job's message naming a run twice (a backfill of the previous release), dead-lettered
    after a 503 on its only attempt, then `dlq retry`: its copy stays one `skipped: duplicate`
    (the retry is a new message, a first delivery, and counted it again: skipped 2 of 1), and its
    counts move only by the retried scores' own outcomes (failed -> scored), running or finished."""
    fake_llm.rule(Reply.error(503, "overloaded"))
    worker = _start(started, "copies", redis_url, tmp_path, {**fake_llm_env, "TRACESCORE_RETRY_BUDGET": "0"})
    one, other = batch(range(2), ["costly"], salt="copies", job_id="copies-job").requests
    sink = CelerySink(redis_url)
    sink.send(ScoreBatch(batch_id="copies-job-000001", requests=[one, other, one.model_copy()]))
    sink.close()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert wait_for(lambda: client.llen("tracescore:dlq") == 1, 60), worker.text()[-3000:]
        (letter,) = [json.loads(x) for x in client.lrange("tracescore:dlq", 0, -1)]
        assert (letter["reason"], letter["retryable"]) == ("retry_budget_exhausted", True)
        failed = {"failed": 2, "failed:JudgeServerError": 2, "skipped": 1, "skipped:duplicate": 1}
        assert job_progress(client, "copies-job") == failed
        if finished:
            finish_job(client, "copies-job")

        fake_llm.reset()  # healthy again
        retried = CliRunner().invoke(
            cli_main, ["dlq", "retry", "--all", "--broker", redis_url], env={"TRACESCORE_REDIS_URL": redis_url}
        )
        assert retried.exit_code == 0, retried.output
        scored_both = wait_for(lambda: [r["error_type"] for r in _records(redis_url)] == [None, None], 60)
        assert scored_both, worker.text()[-3000:]
        # Counted with the scores, in one step: the duplicate's count (before scoring) came first.
        scored = {"scored": 2, "failed": 0, "failed:JudgeServerError": 0, "skipped": 1, "skipped:duplicate": 1}
        assert job_progress(client, "copies-job") == scored
        assert fake_llm.count() == 2  # the copy was not paid for
        assert client.llen("tracescore:dlq") == 0
    finally:
        client.close()


def test_one_503_is_retried_by_the_worker_and_scored(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    """A default judge (no retries of its own) whose provider answers 503 once: the worker's
    transient retry (a second delivery) calls it again and the run is scored, not capped."""
    fake_llm.script(Reply.error(503, "overloaded"))  # the first request only
    env = {**fake_llm_env, "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.2"}
    worker = _start(started, "one503", redis_url, tmp_path, env)
    sink = CelerySink(redis_url)
    sink.send(batch(range(1), ["costly"], salt="one503"))
    sink.close()
    assert wait_for(lambda: [r["error_type"] for r in _records(redis_url)] == [None], 60), worker.text()[-3000:]
    assert fake_llm.count() == 2
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert client.llen("tracescore:dlq") == 0
    finally:
        client.close()


def test_backfill_max_cost_holds_across_redis_workers(
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
    started: list[WorkerProcess],
) -> None:
    """`backfill --broker ... --max-cost`: the workers read the job's limit from Redis; runs past
    it are budget_exhausted, the summary counts them and shows the job's spend."""
    env = {**fake_llm_env, "TRACESCORE_PRICES": PRICES, "TRACESCORE_MODEL_CONCURRENCY": "1"}
    _start(started, "maxcost", redis_url, tmp_path, env)
    examples = Path(__file__).resolve().parents[2] / "examples" / "traces"
    result = CliRunner().invoke(
        cli_main,
        [
            "backfill", str(examples), "--scorers", "tests.worker.budget_scorers", "--scorer", "costly",
            "--broker", redis_url, "--sample", "0.2", "--batch-size", "5", "--max-cost", "0.01", "--json",
            "--wait-timeout", "90",
        ],
        env={"TRACESCORE_REDIS_URL": redis_url, "TRACESCORE_PRICES": PRICES},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    records = _records(redis_url)
    refused = [r for r in records if r["error_type"] == "budget_exhausted"]
    ok = [r for r in records if r["error_type"] is None]
    assert ok
    assert refused
    assert all("--max-cost" in r["error_message"] for r in refused)
    assert summary["failed_by_reason"]["budget_exhausted"] == len(refused)
    total = sum(r["cost_usd"] for r in records)
    assert total >= 0.01
    assert total - max(r["cost_usd"] for r in ok) < 0.01
    assert summary["spend"]["by_scorer"]["costly"] == pytest.approx(total)
    assert fake_llm.count() == len(ok)
