"""SIGTERM while runs wait on the judge, with real workers and the fake judge server: a judge
rate-limiting (429 with Retry-After), a multi-step scorer's last call hanging, a run's retry held
for its ETA after the judge failed. Each wait is cut short by the grace period; the worker exits
in time; nothing is stored as a failure, dead-lettered or lost; the message is back on the queue;
the next worker scores every run once and pays for no answered judge step again."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch, send
from tests.worker._workers import WorkerProcess, queue_and_unacked, read_scores, wait_for

GRACE_S = 2.0
CLEANUP_S = 3.0
# Past grace and cleanup: Celery's own teardown and the interpreter's exit.
EXIT_SLACK_S = 8.0
# Longer than the grace period, and than any single wait the worker could cut short by luck.
RETRY_AFTER_S = 20
RUNS = range(3)


def _dlq_size(redis_url: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen("tracescore:dlq"))
    finally:
        client.close()


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_sigterm_while_the_judge_rate_limits_requeues_and_exits_in_time(
    redis_url: str, tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], pool: str, concurrency: int
) -> None:
    """Kubernetes sends SIGTERM in a rate-limit storm: the worker is gone within grace + cleanup
    (plus slack), exit 0; no error record, no dead letter; the message is back on the queue; a
    second worker scores each run once once the judge answers."""
    scores = tmp_path / "scores.jsonl"
    limited = {"on": True}
    fake_llm.rule(Reply.rate_limited(retry_after=str(RETRY_AFTER_S)), match=lambda _req: limited["on"])
    env = {
        **fake_llm_env,
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S),
    }
    first = WorkerProcess(
        "limited", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
        scorers="tests.worker.sample_scorers", env=env,
    )  # fmt: skip
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        message = batch(RUNS, ["judged"], salt=f"rl-term-{pool}")
        run_ids = {run_id for r in message.requests for run_id in r.run_ids()}
        send(redis_url, message)

        # Every run has been refused once: each is now waiting out the judge's Retry-After.
        assert wait_for(lambda: fake_llm.count() >= len(RUNS), 30), first.text()[-3000:]
        time.sleep(0.5)
        sent_at = time.monotonic()
        os.kill(first.proc.pid, signal.SIGTERM)
        try:
            first.proc.wait(GRACE_S + CLEANUP_S + EXIT_SLACK_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"no exit within {GRACE_S + CLEANUP_S + EXIT_SLACK_S} s of SIGTERM while the judge"
                f" rate-limits:\n{first.text()[-3000:]}"
            )
        took = time.monotonic() - sent_at
        assert took < RETRY_AFTER_S, took
        assert first.proc.returncode == 0, f"exit status {first.proc.returncode}:\n{first.text()[-3000:]}"
        # Nothing final came of the rate limit: no record, no letter, the message back on the queue.
        assert read_scores(scores) == []
        assert _dlq_size(redis_url) == 0
        assert queue_and_unacked(redis_url, "tracescore") == (1, 0), first.text()[-3000:]

        limited["on"] = False
        second = WorkerProcess(
            "answered", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
            scorers="tests.worker.sample_scorers", env=env,
        )  # fmt: skip
        second.wait_ready()
        # The 429's pause is shared through Redis, so the second worker may wait out what is left of it.
        assert wait_for(lambda: len(read_scores(scores)) >= len(run_ids), RETRY_AFTER_S + 60), second.text()[-3000:]
        time.sleep(1.0)  # let a stray duplicate surface before counting
        records = read_scores(scores)
        per_run = collections.Counter(f"{s['trace_id']}:{s['span_id']}" for s in records)
        assert set(per_run) == run_ids
        assert set(per_run.values()) == {1}, per_run
        assert all(s["error_type"] is None for s in records), records
        assert _dlq_size(redis_url) == 0
        assert "batch_split" not in second.text()
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_sigterm_mid_judge_steps_pays_no_answered_step_again(
    redis_url: str, tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], pool: str, concurrency: int
) -> None:
    """A multi-step judge scorer whose last step's call hangs when SIGTERM comes: the grace period
    cancels it; the worker that takes the message next resumes from the checkpoint, so the
    answered steps (PRE, SCORE) are asked once per run over both workers, and each run has one
    record."""
    scores = tmp_path / "scores.jsonl"
    hanging = {"on": True}
    fake_llm.rule(Reply.hang(seconds=30), match=lambda req: hanging["on"] and "REASON:" in req.user_text)
    env = {
        **fake_llm_env,
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S),
    }
    first = WorkerProcess(
        "steps-cut", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
        scorers="tests.worker.sample_scorers", env=env,
    )  # fmt: skip
    second: WorkerProcess | None = None

    def asked(prefix: str) -> int:
        return sum(r.user_text.startswith(prefix) for r in fake_llm.requests)

    try:
        first.wait_ready()
        message = batch(RUNS, ["judged_steps"], salt=f"steps-term-{pool}")
        run_ids = {run_id for r in message.requests for run_id in r.run_ids()}
        send(redis_url, message)

        # Every run is in its last step, its first two answered (and checkpointed) already.
        assert wait_for(lambda: asked("REASON:") >= len(RUNS), 30), first.text()[-3000:]
        sent_at = time.monotonic()
        os.kill(first.proc.pid, signal.SIGTERM)
        try:
            first.proc.wait(GRACE_S + CLEANUP_S + EXIT_SLACK_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {GRACE_S + CLEANUP_S + EXIT_SLACK_S} s of SIGTERM:\n{first.text()[-3000:]}")
        assert time.monotonic() - sent_at < GRACE_S + CLEANUP_S + EXIT_SLACK_S
        assert first.proc.returncode == 0, f"exit status {first.proc.returncode}:\n{first.text()[-3000:]}"
        assert read_scores(scores) == []
        assert queue_and_unacked(redis_url, "tracescore") == (1, 0), first.text()[-3000:]
        assert (asked("PRE:"), asked("SCORE:")) == (len(RUNS), len(RUNS))

        hanging["on"] = False
        second = WorkerProcess(
            "steps-resumed", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
            scorers="tests.worker.sample_scorers", env=env,
        )  # fmt: skip
        second.wait_ready()
        assert wait_for(lambda: len(read_scores(scores)) >= len(run_ids), 60), second.text()[-3000:]
        time.sleep(1.0)  # let a stray duplicate surface before counting
        records = read_scores(scores)
        per_run = collections.Counter(f"{s['trace_id']}:{s['span_id']}" for s in records)
        assert set(per_run) == run_ids
        assert set(per_run.values()) == {1}, per_run
        assert all(s["error_type"] is None for s in records), records
        # The steps answered before SIGTERM were not paid for again.
        assert (asked("PRE:"), asked("SCORE:")) == (len(RUNS), len(RUNS)), second.text()[-3000:]
        assert asked("REASON:") >= 2 * len(RUNS)
        assert _dlq_size(redis_url) == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_sigterm_while_a_retry_waits_for_its_eta_puts_it_back_on_the_queue(
    redis_url: str, tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]
) -> None:
    """A run failed transiently (the judge down through its retries) is sent again with a
    countdown; the worker that takes the retry holds it, unacknowledged, until its ETA. SIGTERM
    then: the held retry is not lost with the worker; it is on the queue when the worker has gone
    (not left for the visibility sweep), and the next worker scores the run once."""
    scores = tmp_path / "scores.jsonl"
    down = {"on": True}
    fake_llm.rule(Reply.error(503, "down for maintenance"), match=lambda _req: down["on"])
    env = {
        **fake_llm_env,
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S),
        "TRACESCORE_RETRY_BACKOFF_SECONDS": "25",  # the retry's ETA, well past the SIGTERM below
        "TRACESCORE_MAX_ETA_SECONDS": "30",
    }
    first = WorkerProcess("eta-held", redis_url, tmp_path, scores_path=scores, pool="threads", concurrency=2, env=env)
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        message = batch(range(1), ["judged"], salt="eta-term")
        run_ids = {run_id for r in message.requests for run_id in r.run_ids()}
        send(redis_url, message)
        # The run failed for now and its retry was sent, taken and is held for its ETA.
        # (Celery logs "retry: Retry in" once the retry is published; the taken retry is the one
        # unacknowledged message, with the list empty.)
        held = lambda: "retry: Retry in" in first.text() and queue_and_unacked(redis_url, "tracescore") == (0, 1)  # noqa: E731
        assert wait_for(held, 60), first.text()[-3000:]
        time.sleep(1.0)
        assert held(), first.text()[-3000:]
        assert read_scores(scores) == []
        os.kill(first.proc.pid, signal.SIGTERM)
        try:
            first.proc.wait(GRACE_S + CLEANUP_S + EXIT_SLACK_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {GRACE_S + CLEANUP_S + EXIT_SLACK_S} s of SIGTERM:\n{first.text()[-3000:]}")
        assert first.proc.returncode == 0, f"exit status {first.proc.returncode}:\n{first.text()[-3000:]}"
        assert queue_and_unacked(redis_url, "tracescore") == (1, 0), first.text()[-3000:]
        assert _dlq_size(redis_url) == 0

        down["on"] = False
        second = WorkerProcess("eta-next", redis_url, tmp_path, scores_path=scores, pool="threads", env=env)
        second.wait_ready()
        assert wait_for(lambda: len(read_scores(scores)) >= 1, 60), second.text()[-3000:]
        time.sleep(1.0)
        records = read_scores(scores)
        assert {f"{s['trace_id']}:{s['span_id']}" for s in records} == run_ids
        assert len(records) == 1, records
        assert records[0]["error_type"] is None, records
        assert _dlq_size(redis_url) == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()
