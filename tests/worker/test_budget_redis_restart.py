"""Redis restarted while a backfill job's judge calls are in flight, with real workers and the real
OpenAI SDK to tests/fakellm: every run is scored once, the job ends, and the job's spend counts
every judge call the fake judge received, but for the writes a worker logged as not counted.

The Redis is this test's own, persistent (``own_redis``: an append-only file fsynced on every
write), as in tests/worker/test_redis_restart.py: what Redis acknowledged survives the restart.
Everything reaches it through ``ReplyCut``, which can kill it at one chosen moment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer
from tests.worker._budget import PRICES, SCORERS
from tests.worker._reply_cut import ReplyCut
from tests.worker._workers import ROOT, TRACESCORE, WorkerProcess, read_scores, run_tracescore, wait_for

TRACES = 40
SCORED = ["plain", "two-steps"]  # one judge call a run, and two (a checkpoint between them)
# As tests/worker/test_redis_restart.py's: a message whose ack the restart lost comes back within
# seconds, and a run (its limit ¾ of the soft one, 9 s) outlives the outage it waits through.
RESTART_LIMITS = {
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "12",
    "TRACESCORE_TASK_TIME_LIMIT": "15",
    "TRACESCORE_VISIBILITY_TIMEOUT": "20",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


def _a_job_spend_write(request: bytes) -> bool:
    """A judge call's write to a job's spend (not the read before a call, which names its limit)."""
    return b"EVALSHA" in request and b"spend:job:" in request and b"budget:job:" not in request


@pytest.mark.parametrize("moment", ["calls_in_flight", "spend_reply_lost"])
def test_redis_restarted_mid_job_scores_every_run_once_and_counts_every_judge_call(
    own_redis: RedisServer, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], tmp_path: Path, moment: str
) -> None:
    """Two workers (threads and prefork) score a backfill of 40 traces with a judge answering in
    0.1 s; once 30 judge calls were made Redis is killed and started again on the same port: at
    once (`calls_in_flight`), or the moment it has run a job's spend write and before its reply
    reached the worker (`spend_reply_lost`). The backfill following the job either rides it out
    or stops naming its `--resume`, which follows the job to its end. Each run and scorer has one
    record, the job's counts say so, and its spend counts every judge call the fake judge
    received, less at most the writes a worker logged as `judge_spend_not_counted` (the spend
    write whose reply was lost, sent again after the reconnect, counted its call twice: 121 of
    120)."""
    proxy = ReplyCut(own_redis, _a_job_spend_write, own_redis.stop)
    url = proxy.url(0)
    scores_path = tmp_path / "scores.jsonl"
    traces = tmp_path / "traces"
    write_otlp_files(traces, TRACES, files=1, compress=False)
    fake_llm.latency_ms = 100
    env = {**fake_llm_env, "TRACESCORE_PRICES": PRICES, **RESTART_LIMITS}
    workers = [
        WorkerProcess(f"spend-{pool}", url, tmp_path, scores_path=scores_path, env=env, pool=pool, concurrency=2,
                      scorers=SCORERS)
        for pool in ("threads", "prefork")
    ]  # fmt: skip
    backfill_env = {**os.environ, **env, "TRACESCORE_BROKER_URL": url, "TRACESCORE_BUDGETS": ""}
    scorers = ["--scorers", SCORERS, *(a for s in SCORED for a in ("--scorer", s))]
    try:
        for worker in workers:
            worker.wait_ready()
        process = subprocess.Popen(
            [TRACESCORE, "backfill", str(traces), *scorers, "--batch-size", "4", "--json", "--wait-timeout", "180"],
            cwd=ROOT, env=backfill_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert wait_for(lambda: fake_llm.count() >= 30 or process.poll() is not None, 120)
            assert process.poll() is None, "the job ended before Redis could be restarted"
            if moment == "spend_reply_lost":
                proxy.arm()  # the next spend write's reply is lost with Redis (SIGKILL)
                assert wait_for(proxy.cut.is_set, 60), "no spend write was made"
            else:
                own_redis.stop()  # SIGKILL, judge calls and their spend writes in flight
            time.sleep(1.0)  # an outage, not a timing assertion
            own_redis.start()
            out, err = process.communicate(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        logs = "\n".join(w.text()[-3000:] for w in workers)
        if process.returncode != 0:  # stopped, naming how to follow the job on
            assert process.returncode == 1, err[-3000:]
            resume = re.search(r"resume with: tracescore backfill --resume (\S+)", err)
            assert resume is not None, err[-3000:]
            followed = run_tracescore(
                "backfill", "--resume", resume.group(1), "--json", "--wait-timeout", "180", env=backfill_env,
                timeout=240,
            )  # fmt: skip
            assert followed.returncode == 0, followed.stderr[-3000:] + logs
            out = followed.stdout
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        assert summary["status"] == "finished", (summary, logs)

        records = [r for r in read_scores(scores_path) if r.get("job_id") == summary["job_id"]]
        ids = [r["score_id"] for r in records]
        assert len(ids) == len(set(ids)), "a run was scored twice"
        assert len(ids) == TRACES * len(SCORED), (len(ids), logs)
        assert [(r["scorer_id"], r["error_type"], r.get("error")) for r in records if r["error_type"]] == []
        assert (summary["scored"], summary["failed"]) == (TRACES * len(SCORED), 0), summary

        # Every call the judge received is in the job's spend, or a worker said it was not.
        assert wait_for(lambda: all(w.proc.poll() is None for w in workers), 1)
        received = fake_llm.count()
        not_counted = sum(w.text().count("judge_spend_not_counted") for w in workers)
        spend = summary["spend"]
        # (at most: a write Redis ran whose reply the restart lost, cut short by its run's stop, is
        # counted and logged)
        assert received - not_counted <= spend["judge_calls"] <= received, (spend, received, not_counted, logs)
        assert received >= TRACES * 3  # (plain: one call a run; two-steps: two)
    finally:
        for worker in workers:
            worker.stop()
        proxy.close()
