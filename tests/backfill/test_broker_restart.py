"""A Redis backfill whose broker restarts under it (README "Backfill": a short outage is waited
out; one past the workers' reconnect budget stops the job with the `--resume` command; "nothing
it enqueued is lost", and a resume scores and counts each run once). A persistent Redis of the
test's own, SIGKILLed and started again on its port, and a real worker that scores while the
backfill enqueues, so the kill can land mid-publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import redis

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.worker._workers import QUICK_REDELIVERY, ROOT, WorkerProcess, read_scores, wait_for
from tracing.sources import Released
from worker._keys import backfill_rootless_key, backfill_runs_key, backfill_state_key
from worker._reconnect import COMMAND_SLACK_S, RECONNECT_S
from worker.backfill._outage import RideOut
from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore

pytestmark = pytest.mark.redis


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Not pytest's: concurrent sessions prune old basetemp directories while a worker writes."""
    with tempfile.TemporaryDirectory(prefix="tracescore-restart-") as name:
        yield Path(name)


def _backfill(
    url: str, *args: str, stderr: IO[str] | int = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "TRACESCORE_BROKER_URL": url, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "backfill"]
    return subprocess.Popen([*command, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _midway_job(server: RedisServer, tmp_path: Path, n: int) -> tuple[subprocess.Popen[str], str]:
    """A job of ``n`` traces started on ``server``, once it has enqueued 150 runs (a worker
    scoring meanwhile), and its id."""
    write_otlp_files(tmp_path / "in", n, files=2)
    options = ["--scorers", "tests.backfill.scorers", "--batch-size", "10", "--high-water", "3"]
    job = _backfill(server.url(0), str(tmp_path / "in"), *options, "--json", "--wait-timeout", "120")
    db = server.client(0, decode_responses=True)
    keys: list[str] = []

    def midway() -> bool:
        keys[:] = [k for k in db.scan_iter(backfill_state_key("*")) if k.count(":") == 2]
        return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 150

    try:
        assert wait_for(midway, 120), "the backfill did not enqueue 150 runs"
    finally:
        db.close()
    return job, keys[0].rsplit(":", 1)[1]


def _each_run_scored_once(out: str, scores: Path, job_id: str, n: int, *, resent: bool = False) -> None:
    """Every run of the job scored once and counted once. ``resent``: the workers lost Redis for
    longer than their own budget too, and a sink delivery it cut may be sent again (README "To the
    sinks": at least once): a score then appears more than once in the JSONL sink, each time the
    same stored record (a second scoring would differ, in its ``scored_at`` at least)."""
    summary = json.loads(out.strip().splitlines()[-1])
    expected = n * 3  # three scorers
    assert wait_for(lambda: len(read_scores(scores)) >= expected, 60), len(read_scores(scores))
    records = [r for r in read_scores(scores) if r.get("job_id") == job_id]
    counts = Counter(r["score_id"] for r in records)
    if resent:
        copies = {(r["score_id"], json.dumps(r, sort_keys=True)) for r in records}
        assert (len(counts), len(copies)) == (expected, expected)  # each run once, any re-send the same record
    else:
        assert (len(counts), max(counts.values())) == (expected, 1)  # each run once, none twice
    assert (summary["status"], summary["traces_read"], summary["runs_enqueued"]) == ("finished", n, n), summary
    assert summary["scored"] + summary["failed"] == expected, summary


def test_a_broker_restart_of_a_second_mid_job_is_ridden_out_and_scores_each_run_once(tmp_path: Path) -> None:
    """README "Backfill": an outage shorter than the workers' reconnect budget (RECONNECT_S) is
    waited out, with a line saying so. A restart of ~0.5 s ended the job with exit 1 and the
    `--resume` line, 5 runs of 5 (the job's state saves and queue-depth reads had no retry)."""
    server = RedisServer(persistent=True)
    server.start()
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "restart", server.url(0), tmp_path, scores_path=scores, scorers="tests.backfill.scorers", env=QUICK_REDELIVERY
    )
    try:
        worker.wait_ready()
        n = 600
        job, job_id = _midway_job(server, tmp_path, n)
        server.stop()  # SIGKILL, mid-publish or mid-wait
        time.sleep(1.0)  # the outage (the job meets it within its next poll, every 0.05-0.25 s)
        server.start()
        out, said = job.communicate(timeout=180)
        assert job.returncode == 0, said[-3000:]
        assert "waiting up to" in said, said[-3000:]  # (it said why it paused)
        assert server.password not in said
        _each_run_scored_once(out, scores, job_id, n)
    finally:
        worker.stop()
        server.close()


def test_a_broker_outage_past_the_budget_stops_the_job_then_resume_scores_each_run_once(tmp_path: Path) -> None:
    """Redis away for longer than RECONNECT_S: the job waits that long, then stops as before (exit
    1, the `--resume` line; "nothing it enqueued is lost"), and a resume scores and counts each
    run once. Redis stays down until the job has ended: no timing is assumed."""
    server = RedisServer(persistent=True)
    server.start()
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "outage", server.url(0), tmp_path, scores_path=scores, scorers="tests.backfill.scorers", env=QUICK_REDELIVERY
    )
    try:
        worker.wait_ready()
        n = 600
        job, job_id = _midway_job(server, tmp_path, n)
        server.stop()
        _, said = job.communicate(timeout=RECONNECT_S + COMMAND_SLACK_S + 60)
        server.start()
        assert job.returncode == 1, said[-3000:]
        assert "waiting up to" in said, said[-3000:]
        assert "the connection to the broker's Redis was lost" in said, said[-2000:]
        assert f"resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
        # A delivery the outage cut may keep its lease (the sinks' 60 s) before a drainer takes it
        # again: the resume waits for the sinks past it (its default, 30 s, once ended it with
        # exit 4, 30 deliveries pending, 1 run of 7).
        drain = {"TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "120"}
        resumed = _backfill(server.url(0), "--resume", job_id, "--json", "--wait-timeout", "120", env=drain)
        out, said = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, said[-3000:]
        assert server.password not in said
        _each_run_scored_once(out, scores, job_id, n, resent=True)
    finally:
        worker.stop()
        server.close()


def _job_at_high_water(server: RedisServer, tmp_path: Path) -> tuple[subprocess.Popen[str], Path, str]:
    """A job of 300 traces started on ``server`` with no worker running, once it has enqueued 20
    runs: it enqueues up to its high-water mark, then waits, as a job does behind a backlog. The
    process, the file its stderr goes to, and the job's id."""
    write_otlp_files(tmp_path / "in", 300, files=1)
    options = ["--scorers", "tests.backfill.scorers", "--batch-size", "10", "--high-water", "2"]
    said_path = tmp_path / "said.txt"
    with said_path.open("w") as said_file:
        job = _backfill(server.url(0), str(tmp_path / "in"), *options, "--json", stderr=said_file)
    db = server.client(0, decode_responses=True)
    keys: list[str] = []

    def waiting() -> bool:
        keys[:] = [k for k in db.scan_iter(backfill_state_key("*")) if k.count(":") == 2]
        return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 20

    try:
        assert wait_for(waiting, 120), "the backfill did not enqueue 20 runs:\n" + said_path.read_text()[-2000:]
    except BaseException:
        job.kill()
        job.wait(10)
        raise
    finally:
        db.close()
    return job, said_path, keys[0].rsplit(":", 1)[1]


@pytest.mark.parametrize("redis_state", ["answering", "paused"])
def test_sigterm_stops_a_redis_job_resumable_with_exit_130(tmp_path: Path, redis_state: str) -> None:
    """README exit codes: 130 for Ctrl-C or SIGTERM (a Kubernetes Job's stop), the job resumable,
    the workers' counts `null` with --json when Redis does not answer."""
    server = RedisServer()
    server.start()
    try:
        job, said_path, job_id = _job_at_high_water(server, tmp_path)
        assert server.proc is not None
        if redis_state == "paused":
            os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            job.send_signal(signal.SIGTERM)
            out, _ = job.communicate(timeout=90)
        finally:
            if redis_state == "paused":
                os.kill(server.proc.pid, signal.SIGCONT)
        said = said_path.read_text()
        assert job.returncode == 130, said[-2000:]
        assert f"Resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
        assert server.password not in said
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["status"] == "interrupted"
        if redis_state == "paused":
            assert (summary["scored"], summary["failed"]) == (None, None), summary
        else:
            assert (summary["scored"], summary["failed"]) == (0, 0), summary
            db = server.client(0, decode_responses=True)
            assert json.loads(db.get(backfill_state_key(job_id)) or "{}")["status"] == "interrupted"
            db.close()
    finally:
        server.close()


def test_sigterm_while_the_job_waits_for_redis_stops_it_at_once_with_exit_130(tmp_path: Path) -> None:
    """A job waiting out a Redis outage still stops on SIGTERM (a Kubernetes Job's stop) or Ctrl-C
    with exit 130 and the resume line, and before the reconnect budget would have ended the
    wait: the wait looks at the stop between tries, and the stop waits for no Redis."""
    server = RedisServer()
    server.start()
    try:
        job, said_path, job_id = _job_at_high_water(server, tmp_path)
        server.stop()
        assert wait_for(lambda: "waiting up to" in said_path.read_text(), 60), said_path.read_text()[-2000:]
        job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=RECONNECT_S / 2)  # (had it waited the budget out: TimeoutExpired)
        said = said_path.read_text()
        assert job.returncode == 130, said[-2000:]
        assert f"Resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
        assert server.password not in said
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["status"], summary["scored"], summary["failed"]) == ("interrupted", None, None), summary
    finally:
        server.close()


def test_a_save_whose_reply_a_restart_lost_is_sent_again_and_applied_once(private_redis: RedisServer) -> None:
    """The job's save ran, then the connection dropped before its reply (Redis killed between
    the two): sent again by the wait for Redis, it appended the traces read a second time (a
    resume took each for two). The save is applied once, its runs and traces each kept once."""
    client = private_redis.client(0, decode_responses=True)
    store = RedisJobStore(client, ride_out=RideOut())
    real, calls = store._save_if_held, []

    def reply_lost(**kwargs: object) -> object:
        calls.append(real(**kwargs))
        if len(calls) == 1:
            raise redis.exceptions.ConnectionError("Connection reset by peer")
        return calls[-1]

    store._save_if_held = reply_lost
    state = BackfillState(
        job_id="bf-lost-reply",
        source={"kind": "files", "paths": []},
        options=BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"]),
    )
    try:
        traces = [Released(f"{i:032x}", True, False) for i in range(3)]
        assert store.save(state, ["t0:s0", "t1:s1"], traces)
        assert len(calls) == 2  # sent again once Redis answered
        assert client.lrange(backfill_rootless_key(state.job_id), 0, -1) == [f"w:r:{t.trace_id}" for t in traces]
        assert client.smembers(backfill_runs_key(state.job_id)) == {"t0:s0", "t1:s1"}
        assert store.released(state.job_id)[0] == traces
    finally:
        client.close()


def test_a_stop_while_the_broker_refuses_writes_names_the_refusal(tmp_path: Path) -> None:
    """A job waiting out a broker that refuses its batch (a read-only replica: a failover under
    way) and stopped then ends as stopped (exit 130, resumable) and says what the broker did:
    it said only "interrupted", the refusal it was waiting on left unnamed."""
    server = RedisServer()
    server.start()
    job: subprocess.Popen[str] | None = None
    try:
        job, said_path, job_id = _job_at_high_water(server, tmp_path)
        db = server.client(0, decode_responses=True)
        # Paused while its queue is emptied and its Redis turns replica (of nothing: it keeps its
        # keys), so the next thing it writes is a batch the broker refuses.
        job.send_signal(signal.SIGSTOP)
        try:
            db.delete("tracescore")
            db.execute_command("REPLICAOF", "127.0.0.1", "1")
        finally:
            job.send_signal(signal.SIGCONT)
        assert wait_for(
            lambda: "read-only replica, a failover under way?) while publishing" in said_path.read_text(), 60
        ), said_path.read_text()[-2000:]
        job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=60)
        said = said_path.read_text()
        assert job.returncode == 130, said[-2000:]
        assert "when the stop was asked, the broker's Redis endpoint is a read-only replica" in said, said[-2000:]
        assert "resume once it takes writes again" in said, said[-2000:]
        assert f"Resume with: tracescore backfill --resume {job_id}" in said, said[-2000:]
        assert server.password not in said
        assert json.loads(out.strip().splitlines()[-1])["status"] == "interrupted"
        db.close()
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait(10)
        server.close()
