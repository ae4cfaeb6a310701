"""A backfill job's judge spend across a stop and a `--resume` that enqueues the rest of its runs,
with a real worker, real Redis and tests/fakellm: the resumed summary's spend is the job's, and a
`--max-cost` given at the resume holds the job's spend before the stop too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer
from tests.worker._budget import PRICES, SCORERS, budget_worker
from tests.worker._workers import ROOT, TRACESCORE, WorkerProcess, read_scores, run_tracescore, wait_for
from worker._keys import backfill_state_key, job_spend_key

TRACES = 80

# One judge call at a time: a job's --max-cost is passed by at most one call's cost.
worker = budget_worker("spend", TRACESCORE_MODEL_CONCURRENCY="1")


def _stopped_job(client: redis.Redis, redis_url: str, source: Path, worker: WorkerProcess, *extra: str) -> str:
    """A job of ``source`` (the ``costly`` judge scorer; ``extra`` options) stopped with Ctrl-C
    once the workers have paid for some of its runs and before it has enqueued them all; its id."""
    env = {**os.environ, "TRACESCORE_BROKER_URL": redis_url, "TRACESCORE_PRICES": PRICES, "PYTHONPATH": str(ROOT)}
    options = [
        "--scorers",
        SCORERS,
        "--scorer",
        "costly",
        "--batch-size",
        "2",
        "--high-water",
        "1",
        *extra,
    ]
    process = subprocess.Popen(
        [TRACESCORE, "backfill", str(source), *options],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    jobs: list[str] = []

    def paid() -> bool:
        jobs[:] = [k.rsplit(":", 1)[1] for k in client.scan_iter(backfill_state_key("*"))]
        return len(jobs) == 1 and float(client.hget(job_spend_key(jobs[0]), "total") or 0) > 0

    try:
        assert wait_for(paid, 60), worker.text()[-3000:]
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err.decode(errors="replace")[-2000:]
    state = json.loads(client.get(backfill_state_key(jobs[0])) or "{}")
    assert 0 < state["counters"]["runs_enqueued"] < TRACES
    return jobs[0]


def _job_cost(records: list[dict[str, Any]], job_id: str) -> float:
    return sum(r["cost_usd"] or 0.0 for r in records if r.get("job_id") == job_id)


@pytest.mark.parametrize("first_limit", [[], ["--max-cost", "1000"]], ids=["no-limit-first", "limit-first"])
def test_a_resumed_jobs_spend_is_the_jobs_and_its_max_cost_counts_the_spend_before_the_stop(
    fake_llm: FakeLLMServer, worker: WorkerProcess, redis_url: str, tmp_path: Path, first_limit: list[str]
) -> None:
    """Stopped after paying for some runs, then resumed with a `--max-cost` a few calls above what
    it had spent: the limit holds the job's whole spend (the calls before the stop count), and the
    resumed summary's judge spend is the job's, as its counts are. A job started without a limit
    was remembered so by the worker, which never read the limit the resume gave it (it paid for
    every run, 1.31 USD against 0.14); and the summary's spend was this run's part alone."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    fake_llm.latency_ms = 40  # (the workers pace the backfill: it is stopped midway)
    write_otlp_files(tmp_path / "in", TRACES, files=1)
    try:
        job_id = _stopped_job(client, redis_url, tmp_path / "in", worker, *first_limit)
        # Everything it enqueued scored before the resume: what was spent before it is settled.
        enqueued = json.loads(client.get(backfill_state_key(job_id)) or "{}")["counters"]["runs_enqueued"]
        assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == enqueued, 60), worker.text()[-3000:]
        before = read_scores(tmp_path / "scores.jsonl")
        spent_before = _job_cost(before, job_id)
        per_call = max(r["cost_usd"] for r in before)
        assert spent_before == pytest.approx(float(client.hget(job_spend_key(job_id), "total") or 0))
        limit = spent_before + 2.5 * per_call

        env = {**os.environ, "TRACESCORE_BROKER_URL": redis_url, "TRACESCORE_PRICES": PRICES}
        result = run_tracescore(
            "backfill", "--resume", job_id, "--max-cost", repr(limit), "--json", "--wait-timeout", "120", env=env
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["status"] == "finished"
        assert summary["this_run"]["runs_enqueued"] > 0

        records = read_scores(tmp_path / "scores.jsonl")
        job_cost = _job_cost(records, job_id)
        # The limit counts the spend before the stop: a few calls more, not the limit again.
        assert job_cost <= limit + per_call + 1e-9, (spent_before, limit, job_cost)
        assert summary["failed_by_reason"].get("budget_exhausted", 0) > 0
        assert float(client.hget(job_spend_key(job_id), "total") or 0) == pytest.approx(job_cost)

        # The summary's spend is the job's, not this run's part of it.
        assert summary["spend"]["total_usd"] == pytest.approx(job_cost)
        assert summary["spend"]["judge_calls"] == sum(r["judge_calls"] for r in records if r["job_id"] == job_id)
        assert summary["spend_of"] == "job"
        assert "judge spend" not in result.stderr.split("(resumed:")[1].split(")")[0]
        assert f"  judge spend       {job_cost:.4f} USD" in result.stderr
    finally:
        client.close()
