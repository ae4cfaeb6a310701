"""SIGTERM mid-batch while Redis is down (killed, its port refusing connections: a restart or a
failover under way as the platform stops the worker). The worker can store nothing, release no
claim and requeue nothing, yet it must leave cleanly within the grace period plus the cleanup time
(and Celery's own teardown after it), and lose nothing: once Redis is back, what it held comes
back as after a SIGKILL (kombu's sweep of unacknowledged messages, claims lapsing) and another
worker scores every run once. tests/worker/test_shutdown_hung_redis.py covers an idle worker and a Redis that hangs."""

from __future__ import annotations

import collections
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.worker._batches import batch, send
from tests.worker._workers import WorkerProcess, complete_lines, queue_and_unacked, read_scores, wait_for
from worker._app import EXIT_SHUTDOWN_OVERRAN
from worker._loop import EXIT_ALLOWANCE_S

GRACE_S, CLEANUP_S = 1.0, 2.0
PACE_S = 0.3
RUNS = range(1, 9)  # run n takes PACE_S × n s: some finish within the grace period, some do not
# Time limits that fit the slowest run, and a sweep that gives an abandoned message back quickly.
ENV = {
    "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
    "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S),
    "TSTEST_PACE_S": str(PACE_S),
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "8",
    "TRACESCORE_TASK_TIME_LIMIT": "10",
    "TRACESCORE_VISIBILITY_TIMEOUT": "15",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_sigterm_mid_batch_with_redis_down_exits_in_time_and_loses_nothing(
    own_redis: RedisServer, tmp_path: Path, pool: str, concurrency: int
) -> None:
    """Redis is killed while two batches are being scored, then the worker gets SIGTERM: it is gone
    within its budget; Redis comes back; a second worker scores
    every run of both batches, one record each, no error record, no dead letter, queue settled."""
    url = own_redis.url(0)
    scores, calls = tmp_path / "scores.jsonl", tmp_path / "calls.txt"
    env = {**ENV, "TSTEST_CALLS_FILE": str(calls)}
    first = WorkerProcess(
        "term-redis-down", url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
        scorers="tests.worker.shutdown_scorers", env=env,
    )  # fmt: skip
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        batches = [batch(RUNS, ["paced"], salt=f"down-{pool}-{b}", batch_id=f"down-{pool}-{b}") for b in range(2)]
        run_ids = {run_id for b in batches for r in b.requests for run_id in r.run_ids()}
        send(url, *batches)
        started = lambda: sum(line.startswith("start ") for line in complete_lines(calls))  # noqa: E731
        # Both batches mid-scoring: a process still marking its delivery begun when Redis goes
        # waits out the store's reconnect past the cleanup deadline (the backstop's exit 71; left
        # in the closing note of 2026-12-07), which this test does not cover.
        assert wait_for(lambda: started() >= len(run_ids), 30), first.text()[-3000:]

        own_redis.stop()  # SIGKILL: connections drop, the port refuses new ones
        sent_at = time.monotonic()
        os.kill(first.proc.pid, signal.SIGTERM)
        # Polled to the platform's kill, so that a late exit is reported with its time.
        gone = wait_for(lambda: first.proc.poll() is not None, GRACE_S + CLEANUP_S + EXIT_ALLOWANCE_S, interval=0.02)
        took = time.monotonic() - sent_at
        own_redis.start()
        said = first.text()
        assert gone, f"still running {took:.1f} s after SIGTERM:\n{said[-3000:]}"
        # Every wait after the grace period (the cancelled runs' cleanup, marking the deliveries
        # ended) draws on the one cleanup deadline, and handing a message back fails at once
        # (left unacked): the worker leaves by itself, not by the backstop (exit 71, logged as an
        # overrun), even with Redis refusing connections throughout.
        overran = f"left by the backstop after {took:.1f} s:\n{said[-3000:]}"  # (its log, to say where it waited)
        assert first.proc.returncode != EXIT_SHUTDOWN_OVERRAN, overran
        # (No bound on the seconds it took: the exit code says whether it overran. Measured on a
        # quiet machine: 3.1 s threads, 4.5-4.6 s prefork, where Celery's teardown after the
        # deadline takes ~1.5 s; before, marking the deliveries ended waited 2 s of its own past
        # the deadline: 5.1 s and 6.6 s, the latter 0.4 s before the backstop's exit 71.)
        assert first.proc.returncode == 0, f"exit {first.proc.returncode} after {took:.1f} s:\n{said[-3000:]}"
        # A message it could not hand back is left for the sweep without alarm: kombu logged
        # "Couldn't reject" at CRITICAL with a 170-line traceback per message, read as a crash
        # that lost it.
        assert "Couldn't reject" not in said, said[-3000:]
        assert "CRITICAL" not in said, said[-3000:]
        # Nor does a run cancelled while its records were being stored leave asyncio's "Future
        # exception was never retrieved" (ERROR, a traceback each) on the way out.
        assert "never retrieved" not in said, said[-3000:]
        # Every scoring process keeps to the cleanup time set: a prefork child's went back to
        # the 10 s default at its first task (and outlasted the main process's backstop).
        cleanups = [float(c) for c in re.findall(r"worker_process_draining\s+cleanup_s=([0-9.]+)", said)]
        assert cleanups or pool != "prefork", said[-3000:]
        assert set(cleanups) <= {CLEANUP_S}, cleanups

        second = WorkerProcess(
            "after-redis-down", url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
            scorers="tests.worker.shutdown_scorers", env=env,
        )  # fmt: skip
        second.wait_ready()
        logs = lambda: first.text()[-3000:] + "\n----\n" + second.text()[-3000:]  # noqa: E731
        assert wait_for(lambda: {f"{s['trace_id']}:{s['span_id']}" for s in read_scores(scores)} >= run_ids, 90), (
            f"{len(read_scores(scores))} of {len(run_ids)} runs scored\n{logs()}"
        )
        assert wait_for(lambda: queue_and_unacked(url, "tracescore") == (0, 0), 60), logs()
        time.sleep(1.0)  # let a stray duplicate surface before counting
        records = read_scores(scores)
        per_run = collections.Counter(f"{s['trace_id']}:{s['span_id']}" for s in records)
        assert set(per_run) == run_ids
        assert set(per_run.values()) == {1}, {k: v for k, v in per_run.items() if v != 1}
        assert [s for s in records if s["error_type"]] == []
        with own_redis.client(0) as client:
            assert client.llen("tracescore:dlq") == 0, client.lrange("tracescore:dlq", 0, -1)
        # Neither worker's log, full of the outage's connection errors, shows the Redis password.
        assert own_redis.password not in first.text() + second.text()
    finally:
        first.stop()
        if second is not None:
            second.stop()
