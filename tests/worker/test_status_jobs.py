"""`tracescore status` lists the backfill jobs Redis keeps, from their index (Redis DB 11; the
jobs run by workers: tests/backfill/test_redis.py)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from worker._keys import backfill_jobs_key, backfill_state_key, job_key
from worker.backfill._state import BackfillOptions, BackfillState, JobHold, RedisJobStore
from worker.cli import main


@pytest.fixture
def env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """TRACESCORE_* pointing at DB 11 for in-process commands."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    monkeypatch.delenv("TRACESCORE_REDIS_URL", raising=False)
    return redis_url


def _save(url: str, job_id: str, started: float, label: str = "2 files under /data") -> None:
    """A job's state saved as a backfill saves it (no hold: as written by a job's first save)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        state = BackfillState(
            job_id=job_id,
            created_at=started,
            source={"kind": "files", "paths": ["/data"]},
            source_label=label,
            options=BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["length", "confident"]),
        )
        state.counters.runs_enqueued = 7
        assert RedisJobStore(client).save(state)
    finally:
        client.close()


def _status(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["status", "--timeout", "0.3", *extra]) == 0
    return capsys.readouterr().out


def test_a_no_wait_job_the_workers_counted_through_says_what_ends_it(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --no-wait job stays "enqueued" once the workers counted every score (no process follows
    it to mark it finished): the text says so and names the command that sums it up."""
    _save(env, "bf-done-1", time.time())
    client = redis.Redis.from_url(env, decode_responses=True)
    try:
        state = RedisJobStore(client).load("bf-done-1")
        assert state is not None
        state.status = "enqueued"
        assert RedisJobStore(client).save(state)
        client.hset(job_key("bf-done-1"), mapping={"scored": 10, "failed": 3, "skipped": 0})
        assert "all counted" not in _status(capsys)
        client.hset(job_key("bf-done-1"), mapping={"skipped": 1, "skipped:loop_guard": 1})
        assert "all counted: tracescore backfill --resume bf-done-1 sums it up" in _status(capsys)
    finally:
        client.close()


def test_a_start_no_clock_reads_in_the_index_is_unknown_not_a_traceback(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index's score is a job's start; one written by hand past any date (``inf``, 1e20)
    raised OverflowError from status, a health check. It is shown unknown, the job listed."""
    _save(env, "bf-when-1", time.time())
    _save(env, "bf-when-2", time.time())
    client = redis.Redis.from_url(env)
    try:
        client.zadd(backfill_jobs_key(), {"bf-when-1": float("inf"), "bf-when-2": 1e20})
        jobs = {j["job_id"]: j for j in json.loads(_status(capsys, "--json"))["backfill_jobs"]}
        assert (jobs["bf-when-1"]["started"], jobs["bf-when-2"]["started"]) == (None, None)
        assert jobs["bf-when-1"]["status"] == "reading"
        assert "bf-when-1: reading, started (unknown)" in _status(capsys)
    finally:
        client.close()


def test_status_lists_at_most_ten_jobs_and_says_how_many_more(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Twelve jobs: the text shows the ten newest, newest first, and says two more; --json all twelve."""
    now = time.time()
    for n in range(12):
        _save(env, f"bf-job-{n:02d}", now - 3600 + n)
    jobs = json.loads(_status(capsys, "--json"))["backfill_jobs"]
    assert [j["job_id"] for j in jobs] == [f"bf-job-{n:02d}" for n in range(11, -1, -1)]
    first = jobs[0]
    assert first["status"] == "reading"
    assert first["source"] == "2 files under /data"
    assert first["scorers"] == ["length", "confident"]
    assert (first["runs_enqueued"], first["expected_scores"]) == (7, 14)
    assert (first["scored"], first["failed"], first["skipped"]) == (0, 0, 0)
    assert first["held"] is False
    assert first["counts_unreadable"] is None
    assert first["started"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600 + 11))
    text = _status(capsys)
    assert "backfill    bf-job-11: reading, started " in text
    assert "7 runs enqueued, 14 scores expected: 0 scored, 0 failed, 0 skipped" in text
    assert "bf-job-02: reading" in text
    assert "bf-job-01" not in text
    assert "and 2 more" in text
    client = redis.Redis.from_url(env)
    hold = JobHold(client, "bf-job-11")
    assert hold.acquire()
    try:
        jobs = json.loads(_status(capsys, "--json"))["backfill_jobs"]
        assert [j["held"] for j in jobs[:2]] == [True, False]
        assert "bf-job-11: reading, started " in _status(capsys)
        assert ", running now (a process holds it)" in _status(capsys)
    finally:
        hold.release()
        client.close()


def test_status_with_no_job_says_so(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No job saved: an empty list, and a line saying there is none."""
    assert json.loads(_status(capsys, "--json"))["backfill_jobs"] == []
    assert "backfill    no job in Redis" in _status(capsys)


def test_a_job_whose_state_expired_leaves_the_list_and_the_index(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A job's state expires (7 days after its last save): status no longer lists it, and takes
    its id out of the index, so the index stays as large as the jobs Redis keeps."""
    _save(env, "bf-old", time.time() - 60)
    _save(env, "bf-new", time.time())
    client = redis.Redis.from_url(env, decode_responses=True)
    try:
        assert client.zscore(backfill_jobs_key(), "bf-old") is not None
        client.pexpire(backfill_state_key("bf-old"), 1)
        deadline = time.monotonic() + 5
        while client.exists(backfill_state_key("bf-old")) and time.monotonic() < deadline:
            time.sleep(0.01)
        jobs = json.loads(_status(capsys, "--json"))["backfill_jobs"]
        assert [j["job_id"] for j in jobs] == ["bf-new"]
        assert client.zscore(backfill_jobs_key(), "bf-old") is None
        assert client.zrange(backfill_jobs_key(), 0, -1) == ["bf-new"]
    finally:
        client.close()


def test_an_index_of_another_type_is_named_and_a_save_repairs_it(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The index holding another Redis type: status shows the jobs unknown (``null``) and names
    the key under refused_keys, exit 0, leaving it as it is; a job's next save repairs it (an
    index guards no data) and lists the job again."""
    client = redis.Redis.from_url(env, decode_responses=True)
    try:
        client.set(backfill_jobs_key(), "someone else's")
        status = json.loads(_status(capsys, "--json"))
        assert status["backfill_jobs"] is None
        assert any(backfill_jobs_key() in k and "holds a string" in k for k in status["refused_keys"])
        assert f"refused key the index of backfill jobs: Redis key {backfill_jobs_key()}" in _status(capsys)
        assert client.get(backfill_jobs_key()) == "someone else's"
        _save(env, "bf-after", time.time())
        assert client.type(backfill_jobs_key()) == "zset"
        assert [j["job_id"] for j in json.loads(_status(capsys, "--json"))["backfill_jobs"]] == ["bf-after"]
    finally:
        client.close()


def test_a_source_label_from_redis_is_shown_without_its_control_characters(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's id and source label are text from Redis: an escape sequence in one is shown as
    U+FFFD, as every other Redis text status prints."""
    _save(env, "bf-evil\x1b[2J", time.time(), label="files \x1b]0;PWNED\x07")
    text = _status(capsys)
    assert "bf-evil\ufffd[2J: reading" in text
    assert "source files \ufffd]0;PWNED\ufffd;" in text
    assert "\x1b" not in text
    assert "\x07" not in text


def test_a_deleted_job_leaves_the_index_too(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``RedisJobStore.delete`` removed the job's keys but left its id in the index of jobs, which
    only a later ``status`` took out (a ZREM of its own, after a read of every state it lists).
    The job's id now leaves the index in the same step as its keys."""
    _save(env, "bf-gone", time.time() - 60)
    _save(env, "bf-kept", time.time())
    client = redis.Redis.from_url(env, decode_responses=True)
    try:
        RedisJobStore(client).delete("bf-gone")
        assert not client.exists(backfill_state_key("bf-gone"))
        assert client.zrange(backfill_jobs_key(), 0, -1) == ["bf-kept"]
        assert [j["job_id"] for j in json.loads(_status(capsys, "--json"))["backfill_jobs"]] == ["bf-kept"]
    finally:
        client.close()
