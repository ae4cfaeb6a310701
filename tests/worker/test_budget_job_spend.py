"""A backfill job's judge spend means the same through Redis (a real worker) as in process: the
ledger's tally of every judge call sent for the job (failed ones and a retry delivery's too),
USD per scorer and per model called, and the calls to models without a price per model. Judge
calls through the real OpenAI SDK to tests/fakellm, priced by tests/worker/_budget.PRICES."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._budget import PRICES, SCORERS, budget_worker
from tests.worker._workers import WorkerProcess, run_tracescore
from worker._budget import TOTAL, RedisLedger, job_spend
from worker._keys import judge_calls_key, spend_key

# (`retrying` fails twice, then its run is refused and recorded: a short test)
worker = budget_worker("job-spend", TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN="2")


def _backfill(traces: Path, broker_url: str, fake_llm_env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """A backfill of ``traces`` with `plain`, `two-models` and `retrying` (through the workers on
    ``broker_url``, or in process when it is empty): its --json summary and its text."""
    env = {
        **os.environ,
        **fake_llm_env,
        "TRACESCORE_BROKER_URL": broker_url,
        "TRACESCORE_PRICES": PRICES,
        "TRACESCORE_BUDGETS": "",
        "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.2",
        "TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN": "2",
    }
    scorers = ["--scorers", SCORERS, "--scorer", "plain", "--scorer", "two-models", "--scorer", "retrying"]
    result = run_tracescore("backfill", str(traces), *scorers, "--json", "--wait-timeout", "120", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished"
    assert (summary["scored"], summary["failed_by_reason"]) == (2, {"JudgeRateLimitError": 1}), summary
    return summary, result.stderr


def test_a_redis_jobs_spend_counts_every_call_per_model_called_as_in_process(
    fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], worker: WorkerProcess, redis_url: str, tmp_path: Path
) -> None:
    """One run: `plain`'s judge answers 503 once (the run is retried: a second delivery through
    Redis, the batch's retry in process), `two-models` asks a priced model then one without a
    price, `retrying`'s judge always answers 429 (two calls, its cap, then a failure). Through
    Redis the summary summed the records: the 503 missing (a record holds its last try's calls),
    the two-model run's cost under "openai/fake-judge+openai/fake-judge-2" as `unpriced_runs`.
    Now both paths show the same: 6 calls, USD per scorer and model called (none for a scorer or
    model whose calls all failed), the unpriced model's one call in `unpriced_calls`."""
    traces = tmp_path / "traces"
    write_otlp_files(traces, 1, files=1, compress=False)
    spends: list[dict[str, Any]] = []
    for broker in (redis_url, ""):
        fake_llm.reset()
        fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
        fake_llm.rule(Reply.rate_limited(retry_after="0"), user_contains="RETRY")
        summary, text = _backfill(traces, broker, fake_llm_env)
        assert [r.user_text.split()[0] for r in fake_llm.requests].count("PLAIN") == 2
        spend = summary["spend"]
        assert spend["judge_calls"] == len(fake_llm.requests) == 6, (broker, spend)
        assert set(spend["by_model"]) == {"openai/fake-judge"}, (broker, spend)
        assert set(spend["by_scorer"]) == {"plain", "two-models"}, (broker, spend)
        assert spend["unpriced_calls"] == {"openai/fake-judge-2": 1}, (broker, spend)
        assert "unpriced_runs" not in spend
        assert f"judge spend       {spend['total_usd']:.4f} USD   (6 judge calls)" in text
        assert "model  openai/fake-judge-2: unpriced (1 calls;" in text
        spends.append(spend)
    through_redis, in_process = spends
    assert through_redis.keys() == in_process.keys()
    for key, value in in_process.items():
        assert through_redis[key] == (pytest.approx(value) if isinstance(value, float | dict) else value), key


@pytest.mark.parametrize("write", ["answered", "failed"])
def test_a_spend_write_whose_reply_redis_lost_is_counted_once(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """Redis runs a judge call's spend script (fsynced: appendfsync always) and dies before its
    reply reaches the worker; the client reconnects once Redis is back and sends the command
    again. The call is one call: the job's spend hash counts it once (it counted it twice, and
    its cost twice, for every write a restart cut so), and the day's spend the same."""
    ledger = RedisLedger(own_redis.url(0), reconnect_s=15.0)
    parse = aioredis.Redis.parse_response
    armed, killed = threading.Event(), []

    async def reply_lost_with_redis(self: Any, connection: Any, command_name: Any, **options: Any) -> Any:
        response = await parse(self, connection, command_name, **options)
        if armed.is_set() and not killed and str(command_name).upper() == "EVALSHA":
            killed.append(str(command_name))
            own_redis.stop()  # SIGKILL: what the script did is on disk
            threading.Timer(0.5, own_redis.start).start()
            raise redis.exceptions.ConnectionError("the reply was lost with the server")
        return response

    async def one_call(job_id: str) -> None:
        if write == "answered":
            await ledger.add("2026-12-06", ["scorer:plain", TOTAL], 0.25, job_id, ["scorer:plain", TOTAL])
        else:
            await ledger.note_failure(f"t:{job_id}:plain", "1", "JudgeServerError: 503", 3600, job_id)

    async def calls() -> None:
        try:
            await one_call("bf-before")  # (its script loaded: as in a worker that has made calls)
            armed.set()
            await one_call("bf-lost")
        finally:
            await ledger.close()

    monkeypatch.setattr(aioredis.Redis, "parse_response", reply_lost_with_redis)
    asyncio.run(calls())
    assert killed, "no script ran"
    with own_redis.client(0, decode_responses=True) as client:
        spend = job_spend(client, "bf-lost").as_json()
        assert spend["judge_calls"] == 1, spend
        if write == "answered":
            assert spend["total_usd"] == pytest.approx(0.25), spend
            assert float(client.hget(spend_key("2026-12-06"), TOTAL) or 0) == pytest.approx(0.5)
        else:
            assert client.hget(judge_calls_key("t:bf-lost:plain"), "1") == "1"
