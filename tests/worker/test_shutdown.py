"""SIGTERM mid-batch: the worker finishes what it can within TRACESCORE_SHUTDOWN_GRACE_SECONDS,
requeues the rest with their claims released and exits; a second worker scores what was left.
Every run is scored exactly once (score records, and scorer invocations that finished), nothing
is dead-lettered, and the requeued deliveries do not count as crashes (no batch is split)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, complete_lines, read_scores, wait_for
from tracing import CelerySink
from worker._keys import claim_key

GRACE_S = 3.0
PACE_S = 0.5
# Runs per batch: run n's answer has n % 30 words, so it takes PACE_S × n s to score. With
# SIGTERM about 1 s into a batch and a 3 s grace period, runs up to ~4 s finish, later ones are
# cut off and requeued.
RUNS = range(1, 13)
BATCHES = 4
# Past the grace period: cancelling, releasing claims, requeueing, flushing and exiting.
EXIT_SLACK_S = 10.0


def _calls(path: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    started: collections.Counter[str] = collections.Counter()
    done: collections.Counter[str] = collections.Counter()
    for line in complete_lines(path):
        kind, run_id, _ = line.split()
        (started if kind == "start" else done)[run_id] += 1
    return started, done


def _claims(redis_url: str) -> int:
    """Score claims held in the store (worker._keys.claim_key: ``<prefix>claim:<score id>``)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in client.scan_iter(match=claim_key("*")))
    finally:
        client.close()


def _dlq_size(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen("tracescore:dlq"))
    finally:
        client.close()


@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("threads", 4), ("solo", 1)])
def test_sigterm_mid_batch_requeues_the_rest_and_scores_every_run_once(
    redis_url: str, tmp_path: Path, pool: str, concurrency: int
) -> None:
    """A real worker scoring slow batches gets SIGTERM (its main process only, as Kubernetes sends
    it); it exits within the grace period (plus slack); a second worker finishes; every run has
    one score record and one finished scorer invocation; no dead letter, no split batch."""
    scores = tmp_path / "scores.jsonl"
    calls = tmp_path / "calls.txt"
    env = {
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "TSTEST_CALLS_FILE": str(calls),
        "TSTEST_PACE_S": str(PACE_S),
    }
    first = WorkerProcess(
        "draining", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
        scorers="tests.worker.shutdown_scorers", env=env,
    )  # fmt: skip
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        batches = [batch(RUNS, ["paced"], salt=f"{pool}-{b}", batch_id=f"{pool}-{b}") for b in range(BATCHES)]
        run_ids = {run_id for b in batches for r in b.requests for run_id in r.run_ids()}
        sink = CelerySink(redis_url)
        for b in batches:
            sink.send(b)
        sink.close()

        # Mid-batch: runs have started, none of the slow ones can have finished.
        assert wait_for(lambda: sum(_calls(calls)[0].values()) >= len(RUNS), 60), first.text()[-3000:]
        time.sleep(1.0)
        sent_at = time.monotonic()
        os.kill(first.proc.pid, signal.SIGTERM)
        try:
            first.proc.wait(GRACE_S + EXIT_SLACK_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {GRACE_S + EXIT_SLACK_S} s of SIGTERM:\n{first.text()[-3000:]}")
        took = time.monotonic() - sent_at
        assert took <= GRACE_S + EXIT_SLACK_S
        # A clean warm shutdown: not killed by a signal, no crash on the way out.
        assert first.proc.returncode == 0, f"exit status {first.proc.returncode}:\n{first.text()[-3000:]}"
        first_log = first.text()
        assert "batch_requeued_at_shutdown" in first_log, first_log[-3000:]
        started, done = _calls(calls)
        cut_off = {run for run in started if done[run] == 0}
        assert cut_off, "SIGTERM came mid-batch: some runs should have been cut off"
        assert sum(done.values()) < len(run_ids)
        # The cut-off runs' claims were released on the way out: the next worker need not wait
        # out their TTL (the task's hard time limit, 300 s).
        assert _claims(redis_url) == 0

        second = WorkerProcess(
            "finishing", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
            scorers="tests.worker.shutdown_scorers", env=env,
        )  # fmt: skip
        second.wait_ready()
        assert wait_for(lambda: len(read_scores(scores)) >= len(run_ids), 120), second.text()[-3000:]
        # Let any stray duplicate surface before counting.
        time.sleep(1.0)

        per_run = collections.Counter(f"{s['trace_id']}:{s['span_id']}" for s in read_scores(scores))
        assert set(per_run) == run_ids
        assert set(per_run.values()) == {1}, {k: v for k, v in per_run.items() if v != 1}
        assert all(s["error_type"] is None for s in read_scores(scores))
        started, done = _calls(calls)
        assert set(done) == run_ids
        assert set(done.values()) == {1}, {k: v for k, v in done.items() if v != 1}
        assert cut_off <= set(started)  # the cut-off runs were started again, and finished once
        assert _dlq_size(redis_url) == 0
        assert "batch_split" not in second.text(), second.text()[-3000:]
    finally:
        first.stop()
        if second is not None:
            second.stop()
