"""Backfill through Redis (DB 12 of the session's own server) and real `celery -A worker worker` processes.

Two worker processes are started once for the module; every test empties DB 12 first and
reads the scores each worker wrote (JSON Lines writer), filtered by the job id.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from tests._redis import RedisServer
from tests.backfill._late import SECOND_CALL_OF_0, late_llm_call_files, many_late_llm_calls_files
from tests.backfill._synth import trace_id, write_otlp_files
from tests.worker._batches import batch
from tracing import CelerySink
from worker._keys import backfill_runs_key, backfill_state_key, backfill_traces_key, record_key
from worker.cli import cli

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "traces"


REDIS_URL = ""  # set by the ``workers`` fixture: DB 12 of the session's own Redis


def _client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture(scope="module")
def workers(redis_server: RedisServer) -> Iterator[list[Path]]:
    """Two Celery worker processes on DB 12, each writing its scores to its own JSONL file."""
    global REDIS_URL
    REDIS_URL = redis_server.url(12)
    client = _client()
    client.flushdb()
    # Not tmp_path: concurrent pytest sessions prune old basetemp directories while these run.
    holder = tempfile.TemporaryDirectory(prefix="tracescore-backfill-")
    out = Path(holder.name)
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    files: list[Path] = []
    for n in range(2):
        scores = out / f"scores-{n}.jsonl"
        scores.touch()
        files.append(scores)
        env = {
            **os.environ,
            "TRACESCORE_BROKER_URL": REDIS_URL,
            "TRACESCORE_WRITER": "jsonl",
            "TRACESCORE_WRITER_PATH": str(scores),
            "PYTHONPATH": str(ROOT),
        }
        logs.append((out / f"worker-{n}.log").open("wb"))
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "worker",
                    "worker",
                    "--scorers",
                    "tests.backfill.scorers",
                    "--concurrency",
                    "1",
                    "--loglevel",
                    "info",
                    "-n",
                    f"backfill{n}@%h",
                    "--without-heartbeat",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=logs[-1],
            )
        )
    try:
        _wait_for(
            lambda: all(b"ready." in (out / f"worker-{n}.log").read_bytes() for n in range(2)),
            60,
            "the workers to start",
        )
        yield files
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        holder.cleanup()
        client.flushdb()
        client.close()


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A private temporary directory (see ``workers``)."""
    with tempfile.TemporaryDirectory(prefix="tracescore-backfill-") as name:
        yield Path(name)


@pytest.fixture
def db(workers: list[Path]) -> Iterator[redis.Redis]:
    client = _client()
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _worker_logs(files: list[Path]) -> str:
    logs = sorted(files[0].parent.glob("worker-*.log"))
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in logs)


def _records(files: list[Path], job_id: str) -> list[dict[str, Any]]:
    out = []
    for path in files:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("job_id") == job_id:
                out.append(record)
    return out


def _backfill_result(*args: str) -> tuple[dict[str, Any], Result]:
    """``tracescore backfill ARGS`` on DB 12, ``--json``, ended with exit 0: its summary, and
    what it printed (the summary's lines are on stderr)."""
    result = CliRunner().invoke(
        cli,
        ["backfill", *args, "--broker", REDIS_URL, "--json", "--wait-timeout", "120"],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary, result


def _backfill(*args: str) -> dict[str, Any]:
    return _backfill_result(*args)[0]


def test_multi_file_source_through_redis_workers(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """600 traces in 3 gzip files (some split across files) are scored once each by the workers."""
    write_otlp_files(tmp_path, 600, files=3)
    summary = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--batch-size", "50")
    assert summary["mode"] == "redis"
    assert summary["status"] == "finished", _worker_logs(workers)
    assert summary["traces_read"] == 600
    assert summary["runs_enqueued"] == 600
    assert summary["scored"] == 1680
    assert summary["failed_by_reason"] == {"ValueError": 120}  # "confident" refuses every 5th answer
    records = _records(workers, summary["job_id"])
    assert len(records) == 1800
    assert len({r["score_id"] for r in records}) == 1800
    state = json.loads(db.get(f"tracescore:backfill:{summary['job_id']}") or "{}")
    assert state["status"] == "finished"
    assert db.scard(backfill_runs_key(summary["job_id"])) == 600

    again = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--batch-size", "50")
    assert again["status"] == "finished"
    assert again["scored"] == 0
    assert again["scores_skipped"] == {"already_scored": 1800}
    assert _records(workers, again["job_id"]) == []  # a re-run writes nothing twice
    # The score ids its skips were counted by (once each, however often a message is retried)
    # go when it finishes: 1,800 of them here, about 130 bytes each in Redis.
    assert db.exists(f"tracescore:job-skips:{again['job_id']}") == 0


def test_a_late_llm_call_that_is_a_run_of_its_own_is_scored_by_the_workers_once(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """A trace without an agent whose second top-level LLM call comes past its window: the
    workers score that call too (it was counted late and lost), one record per run and scorer,
    and the same input backfilled again scores nothing twice."""
    directory = late_llm_call_files(tmp_path / "in")
    args = (str(directory), "--scorers", "tests.backfill.scorers", "--scorer", "answer-words", "--window-spans", "50")
    summary = _backfill(*args)
    assert summary["status"] == "finished", _worker_logs(workers)
    assert (summary["traces_read"], summary["runs_enqueued"], summary["late_runs"]) == (91, 92, 1)
    assert summary["late_spans"] == 0
    records = _records(workers, summary["job_id"])
    assert len(records) == 92
    assert [r["span_id"] for r in records if r["trace_id"] == trace_id(0)].count(SECOND_CALL_OF_0) == 1

    again = _backfill(*args)
    assert (again["status"], again["scored"]) == ("finished", 0)
    assert again["scores_skipped"] == {"already_scored": 92}
    assert _records(workers, again["job_id"]) == []


def test_embedded_mode_gives_the_same_scores_as_redis(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """The example traces score identically in this process and through the Redis workers."""
    out = tmp_path / "embedded.jsonl"
    embedded = CliRunner().invoke(
        cli,
        ["backfill", str(EXAMPLES), "--scorers", "tests.backfill.scorers", "--out", str(out)],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert embedded.exit_code == 0, embedded.output
    summary = _backfill(str(EXAMPLES), "--scorers", "tests.backfill.scorers")

    def table(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[Any, ...]]:
        return {
            (r["trace_id"], r["span_id"], r["scorer_id"]): (r["score_id"], r["score"], r["reason"], r["error_type"])
            for r in records
        }

    local = table([json.loads(line) for line in out.read_text().splitlines()])
    remote = table(_records(workers, summary["job_id"]))
    assert len(local) == 900
    assert remote == local


def _start_backfill(source: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A Redis-mode backfill of ``source`` in its own process (small batches, low high-water)."""
    env = {**os.environ, "TRACESCORE_BROKER_URL": REDIS_URL, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "backfill"]
    options = ["--scorers", "tests.backfill.scorers", "--batch-size", "20", "--high-water", "2", *extra]
    return subprocess.Popen(
        [*command, str(source), *options], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _job_state_keys(db: redis.Redis) -> list[str]:
    """The Redis keys of backfill job states (not their enqueued-trace sets)."""
    return [k for k in db.scan_iter(backfill_state_key("*")) if not k.endswith(":traces")]


def _enqueued_200(db: redis.Redis) -> str:
    """Once the backfill started on 1,500 traces has enqueued 200 runs: its job's state key."""
    keys: list[str] = []

    def started() -> bool:
        keys[:] = _job_state_keys(db)
        return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 200

    _wait_for(started, 120, "the backfill to enqueue 200 runs")
    return keys[0]


def _kill_when(process: subprocess.Popen[bytes], condition: Any, what: str) -> None:
    """SIGKILL the backfill ``process`` once ``condition`` holds (within 120 s), and reap it."""
    try:
        _wait_for(condition, 120, what)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()


def test_resume_after_sigkill_scores_every_trace_exactly_once(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """A backfill killed with SIGKILL midway resumes with --resume; every trace × scorer is scored once."""
    write_otlp_files(tmp_path / "in", 3000, files=3)
    process = _start_backfill(tmp_path / "in")
    keys: list[str] = []

    def midway() -> bool:
        keys[:] = _job_state_keys(db)
        if not keys:
            return False
        state = json.loads(db.get(keys[0]) or "{}")
        return int(state.get("counters", {}).get("runs_enqueued", 0)) >= 600

    _kill_when(process, midway, "the backfill to enqueue 600 runs")
    job_id = keys[0].rsplit(":", 1)[1]
    before = json.loads(db.get(keys[0]) or "{}")
    assert before["status"] == "reading"
    assert before["counters"]["runs_enqueued"] < 3000

    summary = _backfill("--resume", job_id)
    assert summary["job_id"] == job_id
    assert summary["status"] == "finished"
    records = _records(workers, job_id)
    counts = Counter(r["score_id"] for r in records)
    assert len(counts) == 9000
    assert max(counts.values()) == 1  # written exactly once
    assert summary["scored"] + summary["failed"] == 9000


def test_resume_after_sigkill_past_late_runs_scores_each_once_and_counts_it_once(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """20 traces whose second LLM call comes past the window (a late run each, one a file of 150
    lines, among 2,960 whole traces): the backfill is killed (SIGKILL) once some of the late runs
    are enqueued and not all, then `--resume`d. Every planned run, each late run too, is scored
    once (one record per run and scorer), and the job's summary counts each late run once."""
    directory = tmp_path / "in"
    late = many_late_llm_calls_files(directory, 20)
    late_ids = {f"{t}:{s}" for t, s in late}
    process = _start_backfill(directory, "--window-spans", "50")
    keys: list[str] = []
    enqueued: set[str] = set()

    def some_late_runs_enqueued() -> bool:
        keys[:] = _job_state_keys(db)
        if keys:
            enqueued.update(db.smembers(backfill_runs_key(keys[0].rsplit(":", 1)[1])))
        return len(late_ids & enqueued) >= 3

    _kill_when(process, some_late_runs_enqueued, "the backfill to enqueue 3 late runs")
    job_id = keys[0].rsplit(":", 1)[1]
    at_kill = set(db.smembers(backfill_runs_key(job_id)))
    assert 3 <= len(late_ids & at_kill) < len(late_ids), "the kill came after every late run was enqueued"
    assert json.loads(db.get(keys[0]) or "{}")["status"] == "reading"

    summary = _backfill("--resume", job_id)
    assert (summary["job_id"], summary["status"]) == (job_id, "finished"), _worker_logs(workers)
    runs = 2960 + 2 * 20  # a whole trace's agent run; a late trace's two LLM calls
    assert (summary["traces_read"], summary["runs_enqueued"], summary["late_runs"]) == (2980, runs, 20), summary
    assert summary["late_spans"] == 0
    assert db.scard(backfill_runs_key(job_id)) == runs
    records = _records(workers, job_id)
    counts = Counter(r["score_id"] for r in records)
    assert len(counts) == runs * 3  # (three scorers)
    assert max(counts.values()) == 1  # written exactly once
    assert summary["scored"] + summary["failed"] == runs * 3
    scored_late = Counter(
        f"{r['trace_id']}:{r['span_id']}" for r in records if f"{r['trace_id']}:{r['span_id']}" in late_ids
    )
    assert scored_late == dict.fromkeys(late_ids, 3)


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_leaves_the_job_resumable_and_says_how(
    tmp_path: Path, workers: list[Path], db: redis.Redis, presses: int
) -> None:
    """SIGINT midway: exit 130, the state says interrupted, stderr names the resume command and
    sums up what was enqueued (it printed no count). A second SIGINT, wherever it lands, does not
    cut that (it did while the state was saved). An earlier --out is left as it was, and the
    command says it was not written: it was emptied at the start, for records the job never read
    back (re-score audit)."""
    write_otlp_files(tmp_path / "in", 1500, files=2)
    out = tmp_path / "earlier.jsonl"
    out.write_text('{"an": "earlier record"}\n')
    process = _start_backfill(tmp_path / "in", "--out", str(out))
    state_key = _enqueued_200(db)
    for _ in range(presses):
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)
    _, stderr = process.communicate(timeout=60)
    job_id = state_key.rsplit(":", 1)[1]
    # A press landing once the interpreter is finalizing (its summary and resume line written,
    # Python's handler gone) ends the process by SIGINT itself: a shell reads that as 130 too.
    assert process.returncode in (130, -signal.SIGINT), stderr.decode()[-2000:]
    assert "stopping after the current batch" in stderr.decode()
    assert f"Resume with: tracescore backfill --resume {job_id}" in stderr.decode()
    assert f"backfill {job_id} (redis): interrupted" in stderr.decode()
    enqueued = re.search(r"runs enqueued +([\d,]+)", stderr.decode())
    assert enqueued is not None
    assert 200 <= int(enqueued.group(1).replace(",", "")) < 4500
    assert f"--out {out} was not written (the workers' records are read back at the job's end)" in stderr.decode()
    assert out.read_text() == '{"an": "earlier record"}\n'
    assert json.loads(db.get(state_key) or "{}")["status"] == "interrupted"
    summary = _backfill("--resume", job_id)
    assert summary["scored"] + summary["failed"] == 4500
    assert Counter(r["score_id"] for r in _records(workers, job_id)).most_common(1)[0][1] == 1


def test_out_given_to_a_resume_holds_every_record_of_the_job(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """--out with --resume was refused (it would have held the resumed part alone: run the whole
    backfill again, reading all its input). The resume's --out now holds the job's records, read
    back by its run ids once the workers are done: those scored before the stop and after, each
    once, as the job run without a stop writes them; the per-scorer summary is the same records'."""
    write_otlp_files(tmp_path / "in", 1500, files=2)
    process = _start_backfill(tmp_path / "in")
    job_id = _enqueued_200(db).rsplit(":", 1)[1]
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode in (130, -signal.SIGINT), stderr.decode()[-2000:]
    out = tmp_path / "job.jsonl"
    summary, result = _backfill_result("--resume", job_id, "--out", str(out))
    assert summary["status"] == "finished"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4500
    assert len({r["score_id"] for r in records}) == 4500
    assert {r["job_id"] for r in records} == {job_id}
    assert summary["by_scorer_of"] == "job"
    assert sum(s["scored"] + s["failed"] for s in summary["by_scorer"].values()) == 4500
    assert "the whole job" in result.stderr


def test_a_resumes_out_short_of_records_the_workers_counted_ends_the_job_with_exit_1(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """A finished job followed with --resume --out whose records are not all there (expired, or
    made under another scorer version) wrote a short --out and ended 0; the job's own end says
    exit 1 and names them (missing_records). So does the resume now, its --out holding the rest."""
    write_otlp_files(tmp_path / "in", 40, files=1)
    first = _backfill(str(tmp_path / "in"), "--scorers", "tests.backfill.scorers")
    assert first["status"] == "finished"
    (gone,) = [r for r in _records(workers, first["job_id"]) if r["scorer_id"] == "confident"][:1]
    assert db.delete(record_key(gone["score_id"])) == 1  # (its TTL passed)
    out = tmp_path / "job.jsonl"
    result = CliRunner().invoke(
        cli,
        ["backfill", "--resume", first["job_id"], "--out", str(out), "--broker", REDIS_URL, "--json"],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["missing_records"] == {"confident": 1}
    assert "have no record (confident: 1)" in result.stderr
    assert len(out.read_text().splitlines()) == 119


def test_a_run_read_twice_does_not_keep_the_job_waiting(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """A batch of spans written twice (a collector's retry, past the assembly window) and a file
    named twice: the job counted the copies in its expected scores, the workers scored each run
    once, and the job waited forever. Each run is enqueued once now, and the copies are counted
    (late spans of the traces they repeat)."""
    write_otlp_files(tmp_path / "in", 200, files=2)
    lines = gzip.decompress((tmp_path / "in" / "part-000.jsonl.gz").read_bytes()).decode().splitlines(keepends=True)
    (tmp_path / "in" / "part-000.jsonl.gz").write_bytes(gzip.compress("".join([*lines, lines[0]]).encode()))
    again = str(tmp_path / "in" / "part-001.jsonl.gz")
    options = ["--scorers", "tests.backfill.scorers", "--window-spans", "100", "--batch-size", "20"]
    result = CliRunner().invoke(
        cli,
        ["backfill", str(tmp_path / "in"), again, *options, "--broker", REDIS_URL, "--json", "--wait-timeout", "30"],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished", _worker_logs(workers)
    assert (summary["runs_enqueued"], summary["late_spans"]) == (200, 15)
    assert summary["scored"] + summary["failed"] == summary["scores_expected"] == 600


def test_a_job_ends_once_its_scores_are_in_whatever_else_the_queue_holds(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """Steady live traffic on the job's queue (topped up to 10 messages of 50 runs every 10 ms,
    below the backfill's low water, so its batches still go in): the job waited for the whole
    queue to empty, which such traffic never lets happen, and stopped waiting at --wait-timeout.
    A job counts each of its scores once now, so it ends when they are all counted."""
    write_otlp_files(tmp_path, 60, files=1)
    stop = threading.Event()

    def live_traffic() -> None:
        sink, client, n = CelerySink(REDIS_URL), _client(), 0
        try:
            while not stop.wait(0.01):
                for _ in range(10 - client.llen("tracescore")):
                    sink.send(batch(range(n, n + 50), ["answer-words"], salt="live"))
                    n += 50
        finally:
            sink.close()
            client.close()

    traffic = threading.Thread(target=live_traffic, daemon=True)
    traffic.start()
    try:
        _wait_for(lambda: db.llen("tracescore") > 0, 30, "live traffic on the queue")
        options = ["--scorers", "tests.backfill.scorers", "--batch-size", "20", "--wait-timeout", "60"]
        result = CliRunner().invoke(
            cli,
            ["backfill", str(tmp_path), *options, "--broker", REDIS_URL, "--json"],
            env={"TRACESCORE_BROKER_URL": ""},
        )
    finally:
        stop.set()
        traffic.join(30)
    assert result.exit_code == 0, result.output
    assert "stopped waiting" not in result.stderr, _worker_logs(workers)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished"
    assert summary["scored"] + summary["failed"] == summary["scores_expected"] == 180


def test_no_wait_returns_once_enqueued_and_resume_follows_the_job(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """--no-wait ends after enqueuing (status enqueued); --resume on it only waits for the workers."""
    write_otlp_files(tmp_path, 200, files=2)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")
    assert first["status"] == "enqueued"
    assert first["runs_enqueued"] == 200
    followed = _backfill("--resume", first["job_id"])
    assert followed["status"] == "finished"
    assert followed["traces_read"] == 200  # nothing read twice
    assert followed["scored"] + followed["failed"] == 600


def _status_jobs(*extra: str) -> tuple[list[dict[str, Any]], str]:
    """``tracescore status`` on DB 12, exit 0: its backfill jobs (``--json``) and its text."""
    runner = CliRunner()
    args = ["status", "--broker", REDIS_URL, "--timeout", "0.3"]
    as_json = runner.invoke(cli, [*args, "--json"], env={"TRACESCORE_BROKER_URL": ""})
    assert as_json.exit_code == 0, as_json.output
    text = runner.invoke(cli, args, env={"TRACESCORE_BROKER_URL": ""})
    assert text.exit_code == 0, text.output
    assert "Traceback" not in text.output
    jobs: list[dict[str, Any]] = json.loads(as_json.stdout)["backfill_jobs"]
    return jobs, text.stdout


def _job(jobs: list[dict[str, Any]], job_id: str) -> dict[str, Any]:
    (job,) = (j for j in jobs if j["job_id"] == job_id)
    return job


def test_status_shows_a_no_wait_job_and_its_counts_until_it_is_finished(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """A job started with --no-wait (its terminal gone) was shown nowhere but by its --resume:
    `tracescore status` lists it, enqueued, with its runs, the scores expected and the workers'
    counts so far; once a --resume followed it to its end, finished."""
    write_otlp_files(tmp_path, 200, files=2)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")
    job_id = first["job_id"]
    jobs, text = _status_jobs()
    job = _job(jobs, job_id)
    assert job["status"] == "enqueued"
    assert job["scorers"] == ["answer-words", "mentions-city", "confident"]
    assert job["source"] == first["source"]
    assert (job["runs_enqueued"], job["expected_scores"]) == (200, 600)
    assert job["held"] is False
    assert f"backfill    {job_id}: enqueued, started " in text
    assert "200 runs enqueued, 600 scores expected: " in text

    def all_counted() -> bool:
        job = _job(_status_jobs()[0], job_id)
        return job["scored"] + job["failed"] + job["skipped"] == 600

    _wait_for(all_counted, 120, "the workers' counts to reach 600 in status")
    job = _job(_status_jobs()[0], job_id)
    assert (job["scored"], job["failed"], job["skipped"]) == (560, 40, 0)  # "confident" refuses every 5th
    followed = _backfill("--resume", job_id)
    assert followed["status"] == "finished"
    jobs, text = _status_jobs()
    assert _job(jobs, job_id)["status"] == "finished"
    assert f"backfill    {job_id}: finished" in text
    assert "560 scored, 40 failed, 0 skipped" in text


def test_status_shows_a_jobs_damaged_count_and_how_to_repair_it(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """A count of a job's that is no integer: status shows it unknown (no traceback, exit 0);
    once a script kept it aside (the --resume following the job stops on it), status names the
    field kept aside and gives the repair the stop line gives, never the value."""
    write_otlp_files(tmp_path, 50, files=1)
    job_id = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")["job_id"]

    def all_counted() -> bool:
        job = _job(_status_jobs()[0], job_id)
        return job["scored"] + job["failed"] + job["skipped"] == 150

    _wait_for(all_counted, 120, "the workers' counts to reach 150 in status")
    key = f"tracescore:job:{job_id}"
    db.hset(key, "scored", "12, by hand")
    jobs, text = _status_jobs()
    assert _job(jobs, job_id)["scored"] is None
    assert f"backfill {job_id} scored" in text  # the line naming the counters that are no number
    assert "a backfill job's is kept aside first" in text  # (not started over, as other counters are)
    resumed = CliRunner().invoke(
        cli, ["backfill", "--resume", job_id, "--broker", REDIS_URL], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert resumed.exit_code == 1
    assert "unreadable:scored" in resumed.output
    assert db.hget(key, "unreadable:scored") == "12, by hand"
    jobs, text = _status_jobs()
    job = _job(jobs, job_id)
    assert (job["scored"], job["failed"], job["skipped"]) == (None, None, None)
    damaged = job["counts_unreadable"]
    assert damaged["field"] == "scored"
    assert damaged["kept"] == ["unreadable:scored"]
    assert f"HINCRBY {key} scored <the count it lost>" in damaged["repair"]
    assert damaged["repair"] in resumed.output
    assert "scored, failed and skipped unknown" in text
    assert "counts unknown: Redis key" in text
    assert f"HDEL {key} unreadable:scored" in text
    assert "by hand" not in text


def test_status_drops_a_job_whose_state_expired(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """A job's state gone (expired) takes the job out of status and out of the index."""
    write_otlp_files(tmp_path, 20, files=1)
    job_id = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")["job_id"]
    assert job_id in [j["job_id"] for j in _status_jobs()[0]]
    db.pexpire(backfill_state_key(job_id), 1)
    _wait_for(lambda: not db.exists(backfill_state_key(job_id)), 5, "the job's state to expire")
    jobs, text = _status_jobs()
    assert job_id not in [j["job_id"] for j in jobs]
    assert job_id not in text
    assert db.zscore("tracescore:backfill-jobs", job_id) is None


def test_one_huge_run_does_not_sink_its_neighbours(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """A 10 MB run among 3 MB and small ones, workers at the default 8 MiB message cap: batches
    are cut by bytes, every neighbour is scored, the 10 MB run is one counted reject (job
    state runs_rejected) and nothing is dead-lettered as payload_too_large (the old driver put
    them all in one ~25 MB batch, which the workers dead-lettered whole)."""
    from tests.backfill.test_batch_bytes import big_trace_line
    from worker._keys import dlq_key

    sizes = {2: 3_000_000, 4: 3_000_000, 6: 10_000_000, 8: 3_000_000, 10: 3_000_000}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(big_trace_line(i, sizes.get(i, 0)) for i in range(20)))
    summary = _backfill(str(source), "--scorers", "tests.backfill.scorers")
    assert summary["status"] == "finished", _worker_logs(workers)
    assert summary["runs_enqueued"] == 19
    state = json.loads(db.get(backfill_state_key(summary["job_id"])) or "{}")
    assert state["counters"]["runs_rejected"] == {"too_large": 1}
    assert summary["runs_rejected"] == {"too_large": 1}  # the summary names the reject too
    assert state["counters"]["batches"] >= 2  # 4 x 3 MB cannot share one 8 MiB message
    records = _records(workers, summary["job_id"])
    assert len({r["score_id"] for r in records}) == 19 * 3
    letters = db.lrange(dlq_key(), 0, -1)
    assert not [letter for letter in letters if "payload_too_large" in letter]


def _with_answer(line: str, value: dict[str, Any], *, chat_name: str | None = None) -> str:
    """``line`` (one trace) with its chat span's ``gen_ai.output.messages`` set to the OTLP
    AnyValue ``value`` (and the chat span renamed), ASCII-escaped as a collector writes it."""
    document = json.loads(line)
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["name"].startswith("chat"):
            span["attributes"] = [
                a if a["key"] != "gen_ai.output.messages" else {"key": a["key"], "value": value}
                for a in span["attributes"]
            ]
            span["name"] = chat_name or span["name"]
    return json.dumps(document) + "\n"


def test_text_no_json_can_hold_is_scored_with_replacement_characters(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """Among 12 traces, one answer is an OTLP bytesValue that is not UTF-8, one holds a lone
    surrogate (a ``\\ud800`` escape), one chat span's name does: pydantic could not encode
    their requests, which stopped the job (a resume met the same trace again). Now each is sent
    with U+FFFD in place of the bad byte or surrogate, counted and reported, and every run of
    the job is scored once, as an embedded backfill scores it."""
    import base64

    from tests.backfill.test_batch_bytes import big_trace_line
    from worker._keys import dlq_key

    def answer(text: str) -> str:  # a lone surrogate stays one in the attribute's text
        return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)

    lines = [big_trace_line(i) for i in range(12)]
    broken = answer("Paris BYTE is lovely").encode().replace(b"BYTE", b"\xe9")
    lines[3] = _with_answer(lines[3], {"bytesValue": base64.b64encode(broken).decode()})
    lines[6] = _with_answer(lines[6], {"stringValue": answer("Rome \ud800 is warm")})
    lines[9] = _with_answer(lines[9], {"stringValue": answer("one two three")}, chat_name="chat \udcff")
    source = tmp_path / "hostile.jsonl"
    source.write_text("".join(lines), encoding="ascii")

    summary, result = _backfill_result(str(source), "--scorers", "tests.backfill.scorers")
    assert "  text replaced     3 runs" in result.stderr  # the summary's line
    reports = [line for line in result.stderr.splitlines() if line.startswith("trace ")]
    assert sorted(reports) == sorted(f"trace {trace_id(i)}: {_REPLACED}" for i in (3, 6, 9))
    assert summary["status"] == "finished", _worker_logs(workers)
    assert (summary["runs_enqueued"], summary["runs_text_replaced"], summary["runs_rejected"]) == (12, 3, {})
    state = json.loads(db.get(backfill_state_key(summary["job_id"])) or "{}")
    assert state["counters"]["runs_text_replaced"] == 3
    records = _records(workers, summary["job_id"])
    assert len(records) == len({r["score_id"] for r in records}) == 12 * 3
    # answer-words' reason: "<n> words" of the answer the worker read (U+FFFD is one word).
    words = {r["trace_id"]: r["reason"] for r in records if r["scorer_id"] == "answer-words"}
    assert [words[trace_id(i)] for i in (3, 6, 9)] == ["4 words", "4 words", "3 words"]
    assert db.llen(dlq_key()) == 0


_REPLACED = (
    "a value no queue message can carry as it is, sent replaced (text not valid UTF-8, bytes or lone"
    " surrogates, with U+FFFD; an object of exactly __type__ and __value__ as its JSON text)"
)


def test_an_object_kombu_decodes_costs_neither_its_run_nor_its_batch(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """An OTLP kvlist of exactly ``__type__`` and ``__value__`` in a read attribute: the workers'
    screen refused the message holding it (kombu would decode it), a dead letter of every trace
    batched with it. It is sent as its JSON text, reported and counted, and each run of the job
    is scored once, as an embedded backfill scores it."""
    from tests.backfill.test_batch_bytes import big_trace_line
    from worker._keys import dlq_key

    lines = [big_trace_line(i) for i in range(12)]
    document = json.loads(lines[5])
    typed = {"kvlistValue": {"values": [
        {"key": "__type__", "value": {"stringValue": "uuid"}},
        {"key": "__value__", "value": {"stringValue": "not-a-uuid"}},
    ]}}  # fmt: skip
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["name"].startswith("chat"):
            span["attributes"].append({"key": "gen_ai.prompt.0.meta", "value": typed})
    lines[5] = json.dumps(document) + "\n"
    source = tmp_path / "typed.jsonl"
    source.write_text("".join(lines), encoding="ascii")

    summary, result = _backfill_result(str(source), "--scorers", "tests.backfill.scorers")
    assert [line for line in result.stderr.splitlines() if line.startswith("trace ")] == [
        f"trace {trace_id(5)}: {_REPLACED}"
    ]
    assert summary["status"] == "finished", _worker_logs(workers)
    assert (summary["runs_enqueued"], summary["runs_text_replaced"], summary["runs_rejected"]) == (12, 1, {})
    records = _records(workers, summary["job_id"])
    assert len(records) == len({r["score_id"] for r in records}) == 12 * 3
    out = tmp_path / "embedded.jsonl"
    args = ["backfill", str(source), "--scorers", "tests.backfill.scorers", "--out", str(out)]
    embedded = CliRunner().invoke(cli, args, env={"TRACESCORE_BROKER_URL": ""})
    assert embedded.exit_code == 0, embedded.output

    def table(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[Any, ...]]:
        return {
            (r["trace_id"], r["span_id"], r["scorer_id"]): (r["score"], r["reason"], r["error_type"]) for r in records
        }

    assert table(records) == table([json.loads(line) for line in out.read_text().splitlines()])
    assert db.llen(dlq_key()) == 0


def test_losing_the_broker_mid_job_says_how_to_resume(tmp_path: Path) -> None:
    """Redis going away under a running backfill ended it with "error: ConnectionError: ...
    Connection reset by peer (run with --verbose ...)", no word of the job being resumable. Once
    the job has waited for it as long as the workers do (it never comes back here), it is one
    line now: what happened, and the resume command (never the password)."""
    server = RedisServer()
    server.start()
    try:
        write_otlp_files(tmp_path / "in", 600, files=1)
        env = {**os.environ, "TRACESCORE_BROKER_URL": server.url(3), "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "backfill"]
        options = ["--scorers", "tests.backfill.scorers", "--batch-size", "20", "--high-water", "2"]
        process = subprocess.Popen(
            [*command, str(tmp_path / "in"), *options], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        db = server.client(3, decode_responses=True)
        keys: list[str] = []

        def waiting_for_workers() -> bool:  # no worker runs: it enqueues up to --high-water, then waits
            keys[:] = [k for k in db.scan_iter(backfill_state_key("*")) if not k.endswith(":traces")]
            return bool(keys) and json.loads(db.get(keys[0]) or "{}")["counters"]["runs_enqueued"] >= 40

        _wait_for(waiting_for_workers, 120, "the backfill to enqueue 40 runs")
        server.stop()
        _, stderr = process.communicate(timeout=120)
        said = stderr.decode()
        job_id = keys[0].rsplit(":", 1)[1]
        assert process.returncode == 1, said[-2000:]
        assert "waiting up to" in said, said[-2000:]  # (it waited the workers' budget out first)
        assert "did not come back within" in said, said[-2000:]
        assert "the connection to the broker's Redis was lost" in said, said[-2000:]
        assert f"resume with: tracescore backfill --resume {job_id}" in said
        assert server.password not in said
        assert "Traceback" not in said
    finally:
        server.close()


def test_a_job_state_that_is_not_one_is_named_not_quoted(redis_server: RedisServer) -> None:
    """--resume on a key holding garbage printed pydantic's error quoting the stored value; on a
    key of another type it said "cannot reach Redis ... WRONGTYPE"."""
    db = redis_server.client(13)
    db.set(backfill_state_key("bf-garbage"), "not json sk-live-Secret9")
    db.rpush(backfill_state_key("bf-list"), "x")
    try:
        for job_id, said in (
            ("bf-garbage", "is not a job state this release reads"),
            ("bf-list", "holds a list, where tracescore keeps a string"),
        ):
            result = CliRunner().invoke(cli, ["backfill", "--resume", job_id, "--broker", redis_server.url(13)])
            assert result.exit_code == 1, result.output
            assert said in result.stderr
            assert backfill_state_key(job_id) in result.stderr
            assert "Secret9" not in result.output
            assert redis_server.password not in result.output
    finally:
        db.delete(backfill_state_key("bf-garbage"), backfill_state_key("bf-list"))
        db.close()


def test_workers_running_another_scorer_version_are_named_not_taken_for_done(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """The scorer's version bumped, the workers not restarted: they took every run as already
    scored under their version's ids, and the job ended "finished", exit 0, with no score of the
    new version and none in --out (compare audit). The read-back finds no record for them: the
    command says why and exits 1."""
    write_otlp_files(tmp_path, 40, files=1)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--scorer", "answer-words")
    assert first["scored"] == 40
    out = tmp_path / "new.jsonl"
    args = ["--scorers", "tests.backfill.scorers_v2", "--broker", REDIS_URL, "--json", "--out", str(out)]
    result = CliRunner().invoke(
        cli, ["backfill", str(tmp_path), *args, "--wait-timeout", "120"], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished"
    assert summary["scores_skipped"] == {"already_scored": 40}
    assert summary["missing_records"] == {"answer-words": 40}
    assert (
        "40 score(s) this job asked for have no record (answer-words: 40), although the workers counted"
        " every run done: a worker running another version of a scorer than this module's (answer-words@2)"
    ) in result.stderr
    assert out.read_text() == ""


def test_resume_with_max_cost_raises_the_jobs_limit(tmp_path: Path, workers: list[Path], db: redis.Redis) -> None:
    """`--resume JOB --max-cost USD` was accepted and dropped: a job's limit never resets, so its
    budget-refused runs could not be scored again, by a resume or by `dlq retry` (cost audit).
    It replaces the job's limit now, where the workers read it."""
    from worker._keys import job_budget_key

    write_otlp_files(tmp_path, 50, files=1)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait", "--max-cost", "0.5")
    assert db.get(job_budget_key(first["job_id"])) == "0.5"
    followed = _backfill("--resume", first["job_id"], "--max-cost", "2")
    assert followed["status"] == "finished"
    assert db.get(job_budget_key(first["job_id"])) == "2.0"


def test_a_resumed_jobs_summary_says_which_figures_are_this_runs(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """Stopped, then resumed: the summary's counts are the whole job's (1,500 traces read, 4,500
    scores), and its elapsed time, per-scorer summary and sink lines the resume's alone (1,020
    runs: delivered 3,060), side by side and unsaid (noticed). A line says which is which, and
    --json adds ``resumed`` and ``this_run``. The sink lines are now the job's too (its run ids
    are in Redis: delivered 4,500, ``sinks_of`` "job"), and so is the judge spend (``spend_of``
    "job"; tests/worker/test_budget_resume.py pays for it), the per-scorer summary still this run's."""
    write_otlp_files(tmp_path / "in", 1500, files=2)
    process = _start_backfill(tmp_path / "in")
    state_key = _enqueued_200(db)
    process.send_signal(signal.SIGINT)
    _, first = process.communicate(timeout=60)
    assert "(resumed:" not in first.decode()  # a job's first run: its counts are its own
    job_id = state_key.rsplit(":", 1)[1]
    before = json.loads(db.get(state_key) or "{}")["counters"]
    assert before["runs_enqueued"] < 1500

    summary, result = _backfill_result("--resume", job_id)
    assert (summary["traces_read"], summary["runs_enqueued"], summary["scored"] + summary["failed"]) == (
        1500,
        1500,
        4500,
    )
    assert summary["resumed"] is True
    this_run = summary["this_run"]
    assert this_run["runs_enqueued"] == 1500 - before["runs_enqueued"]
    assert this_run["traces_read"] == summary["traces_read"] - before["traces_read"]
    assert this_run["elapsed_s"] == summary["elapsed_s"]
    # What the line below says: the per-scorer summary covers this run's runs, the sinks the job's.
    assert summary["by_scorer"]["answer-words"]["runs"] == this_run["runs_enqueued"]
    jsonl = summary["sinks"]["jsonl"]
    assert (jsonl["delivered"], jsonl["failed"], jsonl["pending"], jsonl["not_queued"]) == (4500, 0, 0, 0)
    assert summary["sinks_of"] == "job"
    assert summary["spend_of"] == "job"
    assert (
        f"  (resumed: the counts are the whole job's; this run read {this_run['traces_read']:,} traces and enqueued"
        f" {this_run['runs_enqueued']:,} runs, and the elapsed time and per-scorer summary are of those alone)"
    ) in result.stderr
    assert "  sink jsonl        delivered 4,500, failed 0, pending 0" in result.stderr
    assert re.search(r"  elapsed +\S+ \([\d.]+s, this run\)", result.stderr), result.stderr


def test_resuming_a_finished_job_sums_up_its_sinks_and_spend(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """`--resume` of a job already finished enqueues nothing: its summary left out the sink
    lines and the judge spend its first summary had (both were read back from this run's runs,
    none). They are the job's now: the sink lines read back from its run ids in Redis, the spend
    from the job's ledger hash."""
    write_otlp_files(tmp_path, 60, files=1)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers")
    assert first["status"] == "finished", _worker_logs(workers)
    again, result = _backfill_result("--resume", first["job_id"])
    assert again["status"] == "finished"
    assert again["this_run"]["runs_enqueued"] == 0
    assert again["sinks"] == first["sinks"]
    assert again["sinks_of"] == "job"
    assert again["spend"] == first["spend"]
    assert again["spend_of"] == "job"
    assert "  sink jsonl        delivered 180, failed 0, pending 0" in result.stderr
    assert "judge spend" not in result.stderr.split("(resumed:")[1].split(")")[0]  # not of this run alone

    # A job an earlier release started kept its runs as trace ids: its sink lines cannot be had,
    # and the summary says so rather than leaving the keys out. Its spend can: the job's ledger
    # hash, which needs no run ids (it was unknown too, when summed from the records).
    db.sadd(backfill_traces_key(first["job_id"]), trace_id(0))
    old, result = _backfill_result("--resume", first["job_id"])
    assert old["sinks"] is None
    assert (old["spend"], old["spend_of"], "spend_unknown" in old) == (first["spend"], "job", False)
    assert "earlier release" in old["sinks_unknown"]
    assert f"  sink delivery unknown: {old['sinks_unknown']}" in result.stderr


def _figures(by_scorer: dict[str, Any]) -> dict[str, Any]:
    """A per-scorer summary's figures, its worst runs by score alone: which of runs tied on a
    score are shown (and their labels: the agent on the runs a process enqueued, the span's name
    read back by run ids, which keep no agent) depends on the order the records were read in."""
    return {
        scorer: {
            **{k: v for k, v in figures.items() if k != "failure_examples"},
            "worst": [w["score"] for w in figures["worst"]],
            "failure_examples": sorted(figures["failure_examples"]),
        }
        for scorer, figures in by_scorer.items()
    }


def test_resuming_a_finished_job_prints_the_jobs_per_scorer_summary(
    tmp_path: Path, workers: list[Path], db: redis.Redis
) -> None:
    """`--resume` of a job that enqueues nothing (finished already) printed no per-scorer table:
    the table was read back from this run's runs, none, and the job's run ids keep no agent
    label. It is the job's now, read back by its run ids (``by_scorer_of``: ``job``), and the
    resumed line no longer says it is this run's; a job that kept no run ids says why it has none."""
    write_otlp_files(tmp_path, 60, files=1)
    first = _backfill(str(tmp_path), "--scorers", "tests.backfill.scorers")
    assert first["status"] == "finished", _worker_logs(workers)
    again, result = _backfill_result("--resume", first["job_id"])
    assert again["this_run"]["runs_enqueued"] == 0
    assert _figures(again["by_scorer"]) == _figures(first["by_scorer"])
    assert again["by_scorer"]["answer-words"]["runs"] == 60
    assert again["by_scorer_of"] == "job"
    assert "scores by scorer, the whole job (60 runs" in result.stderr
    assert "answer-words" in result.stderr.split("scores by scorer, the whole job")[1]
    resumed_line = result.stderr.split("(resumed:")[1].split(")")[0]
    assert "per-scorer summary" not in resumed_line  # not of this run alone
    assert "elapsed time" in resumed_line

    # A job an earlier release started kept its runs as trace ids: no table, and a line why.
    db.sadd(backfill_traces_key(first["job_id"]), trace_id(0))
    old, result = _backfill_result("--resume", first["job_id"])
    assert old["by_scorer"] is None
    assert "earlier release" in old["by_scorer_unknown"]
    assert f"  per-scorer summary unavailable: {old['by_scorer_unknown']}" in result.stderr


def _damage(db: redis.Redis, keys: list[str]) -> None:
    """Three of ``keys`` (score records) made unreadable: not JSON, JSON but not a record, and
    a key of another Redis type (MGET reads it as absent)."""
    garbled, not_a_record, other_type = keys[:3]
    db.set(garbled, '{"trace_id": "x", "score": 0.')
    db.set(not_a_record, "[1, 2, 3]")
    db.delete(other_type)
    db.hset(other_type, "score", "1")


def test_an_unreadable_record_read_back_is_named_and_counted(
    tmp_path: Path, workers: list[Path], db: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary reads the workers' records back: one that did not validate was skipped with
    a log line and no count, so the per-scorer table and --out were short of it unsaid, and one
    that is no string at all was taken for a record never made (missing). Each is counted now,
    by scorer (``records_unreadable``), in tracescore_store_unreadable_values (key
    score_record), and a line of the summary says how many; here the records are damaged after
    the workers stored them and before the read-back, then again for a resume's read-back."""
    from worker._keys import outbox_key, record_key
    from worker.backfill._job import _Enqueued
    from worker.metrics._instruments import _metrics

    def unreadable_counted() -> float:
        (family,) = _metrics().unreadable.collect()
        return sum(s.value for s in family.samples if s.labels == {"key": "score_record"})

    summary_of = _Enqueued.summary

    def damaged_first(self: _Enqueued, store: Any, *args: Any, **kwargs: Any) -> Any:
        # (once the workers' sink has them: a record damaged before its delivery is a dead letter)
        _wait_for(lambda: db.zcard(outbox_key("jsonl")) == 0, 60, "the jsonl sink to take every record")
        _damage(db, sorted(db.scan_iter(record_key("*"))))
        return summary_of(self, store, *args, **kwargs)

    monkeypatch.setattr(_Enqueued, "summary", damaged_first)
    write_otlp_files(tmp_path / "in", 20, files=1)
    before = unreadable_counted()
    out = tmp_path / "scores.jsonl"
    command = ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--out", str(out)]
    result = CliRunner().invoke(
        cli, [*command, "--broker", REDIS_URL, "--json", "--wait-timeout", "120"], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished", _worker_logs(workers)
    assert sum(summary["records_unreadable"].values()) == 3
    assert "missing_records" not in summary  # the one of another type is not a record never made
    assert sum(s["runs"] for s in summary["by_scorer"].values()) == 60 - 3
    assert len(out.read_text().splitlines()) == 60 - 3
    assert "  unreadable records 3" in result.stderr
    assert unreadable_counted() == before + 3

    again, resumed = _backfill_result("--resume", summary["job_id"])
    assert again["records_unreadable"] == summary["records_unreadable"]
    assert sum(s["runs"] for s in again["by_scorer"].values()) == 60 - 3
    assert "  unreadable records 3" in resumed.stderr
    assert unreadable_counted() == before + 6


def test_a_resume_that_enqueued_runs_counts_an_unreadable_record_once(
    tmp_path: Path, workers: list[Path], db: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume that enqueued runs read its records back twice: this run's (the per-scorer
    summary) and then the job's (its judge spend, 8ce9ac2), which hold this run's again. A
    record of this run that does not read was counted twice in
    tracescore_store_unreadable_values (and logged twice). The job's spend is its ledger hash
    now, so only this run's records are read: each damaged one counted once, and one of the
    runs before the stop not read at all."""
    from worker._keys import outbox_key, record_key
    from worker.backfill._job import _Enqueued
    from worker.metrics._instruments import _metrics

    def unreadable_counted() -> float:
        (family,) = _metrics().unreadable.collect()
        return sum(s.value for s in family.samples if s.labels == {"key": "score_record"})

    write_otlp_files(tmp_path / "in", 1500, files=2)
    process = _start_backfill(tmp_path / "in")
    state_key = _enqueued_200(db)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    job_id = state_key.rsplit(":", 1)[1]
    assert json.loads(db.get(state_key) or "{}")["counters"]["runs_enqueued"] < 1500
    summary_of = _Enqueued.summary
    damaged: list[str] = []

    def damaged_first(self: _Enqueued, store: Any, registry: Any, scorer_ids: list[str], *args: Any) -> Any:
        # (once the workers' sink has them: a record damaged before its delivery is a dead letter)
        _wait_for(lambda: db.zcard(outbox_key("jsonl")) == 0, 60, "the jsonl sink to take every record")
        this_run = {record_key(s) for s in self.score_ids(registry, scorer_ids)}
        earlier = sorted(k for k in db.scan_iter(record_key("*")) if k not in this_run)
        damaged[:] = [*sorted(this_run)[:2], earlier[0]]
        for key in damaged:
            db.set(key, '{"trace_id": "x", "score": 0.')
        return summary_of(self, store, registry, scorer_ids, *args)

    monkeypatch.setattr(_Enqueued, "summary", damaged_first)
    before = unreadable_counted()
    summary, result = _backfill_result("--resume", job_id)
    assert summary["status"] == "finished", _worker_logs(workers)
    assert summary["this_run"]["runs_enqueued"] > 0
    assert summary["spend_of"] == "job"
    assert len(damaged) == 3
    # The per-scorer summary is this run's: its two damaged records.
    assert sum(summary["records_unreadable"].values()) == 2
    assert "  unreadable records 2" in result.stderr
    # Each damaged record of this run counted once; the earlier run's is not read.
    assert unreadable_counted() == before + 2


def test_a_queue_no_worker_reads_is_said_once_with_the_command_that_starts_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting on a queue no worker reads showed "0 scores ... queue 4" until --wait-timeout,
    like a slow job. Scores and queue standing still for STALL_HINT_S is now said once, with the
    worker command for the job's scorers (never the broker's password)."""
    from worker.backfill import _job

    monkeypatch.setattr(_job, "STALL_HINT_S", 1.0)
    server = RedisServer()
    server.start()
    try:
        write_otlp_files(tmp_path / "in", 30, files=1)
        result = CliRunner().invoke(
            cli,
            ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--wait-timeout", "4"],
            env={"TRACESCORE_BROKER_URL": server.url(3)},
        )
        assert result.exit_code == _job.EXIT_WAIT_TIMEOUT, result.output
        hint = "no score done and no message taken from queue 'tracescore' for 1s: if no worker is running"
        assert result.stderr.count(hint) == 1, result.stderr
        assert "start one on this broker: tracescore worker --scorers tests.backfill.scorers" in result.stderr
        assert server.password not in result.output
    finally:
        server.close()


def test_the_worker_command_a_job_on_its_own_queue_names_reads_that_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job on TRACESCORE_QUEUE=jobq named, at its start and once it stalled, the worker command
    without -Q: a worker started as it said reads 'tracescore', and the job waits on."""
    from worker.backfill import _job

    monkeypatch.setattr(_job, "STALL_HINT_S", 1.0)
    server = RedisServer()
    server.start()
    try:
        write_otlp_files(tmp_path / "in", 5, files=1)
        result = CliRunner().invoke(
            cli,
            ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--wait-timeout", "3"],
            env={"TRACESCORE_BROKER_URL": server.url(3), "TRACESCORE_QUEUE": "jobq"},
        )
        assert result.exit_code == _job.EXIT_WAIT_TIMEOUT, result.output
        command = "tracescore worker --scorers tests.backfill.scorers -Q jobq"
        assert f"queue 'jobq'; workers: {command})" in result.stderr, result.stderr
        assert f"start one on this broker: {command}" in result.stderr, result.stderr
    finally:
        server.close()


def test_an_enqueue_held_back_by_a_queue_no_worker_reads_says_so_once(tmp_path: Path) -> None:
    """Backpressure on a queue no worker reads: the backfill showed "waiting for the workers: 2
    batches queued" for good, with no hint (the follow phase had one, this wait none). A queue
    that does not move for STALL_HINT_S is said once here too, with the worker command; Ctrl-C
    then leaves the job resumable."""
    server = RedisServer()
    server.start()
    write_otlp_files(tmp_path / "in", 40, files=1)
    program = (
        "import sys; from worker.backfill import _job; _job.STALL_HINT_S = 1.0;"
        " from worker.cli import cli; sys.argv[0] = 'tracescore'; cli()"
    )
    args = ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--batch-size", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": server.url(3)}
    job = subprocess.Popen(
        [sys.executable, "-c", program, *args, "--high-water", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    hint = "waiting to enqueue: no message taken from queue 'tracescore' for 1s: if no worker is running"
    try:
        assert job.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(job.stderr or []), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not any(hint in line for line in lines) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(hint in line for line in lines), "".join(lines)[-3000:]
        with redis.Redis.from_url(server.url(3)) as broker:
            assert broker.llen("tracescore") == 2  # held back: 40 runs, 2 queued
        job.send_signal(signal.SIGINT)
        job.wait(60)
        reader.join(10)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if job.stderr is not None:
            job.stderr.close()
        server.close()
    stderr = "".join(lines)
    assert job.returncode == 130, stderr[-3000:]
    assert stderr.count(hint) == 1, stderr[-3000:]
    assert "start one on this broker: tracescore worker --scorers tests.backfill.scorers" in stderr
    assert "tracescore backfill --resume" in stderr
    assert server.password not in stderr
