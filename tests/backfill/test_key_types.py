"""A backfill job's own Redis keys holding another Redis type, or a state that does not read.

Each key of a job (its state, the set of runs it enqueued, an earlier release's set of trace
ids, the list of traces read without their root, its hold) was read with plain commands: a key
of another type made ``tracescore backfill`` (a first run or ``--resume``) end on redis's raw
``WRONGTYPE`` error (``error: ResponseError: ...``), naming neither the key nor what to do. Now
a key holding what the job cannot rebuild is refused, left exactly as it is, and named by its
role and type (never its value), nothing written or enqueued, exit 1; the operator deletes or
renames it and the resume goes on. The hold (a lock, guarding no data) is repaired instead.

Real Redis (a server of this module's own) and the command line as a user runs it, with
``--no-wait`` (no workers: the runs wait in the queue).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from worker._keys import (
    backfill_hold_key,
    backfill_rootless_key,
    backfill_runs_key,
    backfill_state_key,
    backfill_traces_key,
)
from worker.cli import cli

pytestmark = pytest.mark.redis

SCORERS = "tests.backfill.scorers"
QUEUE = "tracescore"  # TRACESCORE_QUEUE's default
SECRET = "sk-live-Secret9"  # in every damaged value: never printed


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
def db(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client(0, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _backfill(server: RedisServer, *args: str) -> Result:
    return CliRunner().invoke(
        cli,
        ["backfill", *args, "--broker", server.url(0), "--no-wait", "--json"],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_QUEUE": QUEUE},
    )


def _killed_job(tmp_path: Path, server: RedisServer, db: redis.Redis) -> str:
    """A job whose state is as a SIGKILL before its first batch leaves it: reading, from the
    start (its runs are in the queue and its set already, as after a kill past a batch)."""
    write_otlp_files(tmp_path / "in", 20, files=1)
    first = _backfill(server, str(tmp_path / "in"), "--scorers", SCORERS)
    assert first.exit_code == 0, first.output
    job_id: str = json.loads(first.stdout.strip().splitlines()[-1])["job_id"]
    state = json.loads(db.get(backfill_state_key(job_id)) or "")
    state.update(status="reading", checkpoint=[0, 0, 0], read_through={}, counters={})
    db.set(backfill_state_key(job_id), json.dumps(state), keepttl=True)
    # Before its first batch it had saved no trace it read (it read them all as late spans).
    db.delete(backfill_rootless_key(job_id))
    return job_id


def _damage(db: redis.Redis, key: str, kind: str) -> None:
    db.delete(key)
    if kind == "string":
        db.set(key, SECRET)
    elif kind == "hash":
        db.hset(key, "x", SECRET)
    elif kind == "list":
        db.rpush(key, SECRET)
    elif kind == "set":
        db.sadd(key, SECRET)
    else:
        raise AssertionError(kind)


def _snapshot(server: RedisServer, job_id: str) -> dict[str, Any]:
    """Every key of the job as it is (type and content), and the queue's length."""
    keys = [
        backfill_state_key(job_id),
        backfill_runs_key(job_id),
        backfill_traces_key(job_id),
        backfill_rootless_key(job_id),
    ]
    raw = server.client(0)
    read = {
        "none": lambda key: None,
        "string": raw.get,
        "list": lambda key: raw.lrange(key, 0, -1),
        "set": lambda key: sorted(raw.smembers(key)),
        "hash": raw.hgetall,
    }
    try:
        found = {key: raw.type(key).decode() for key in keys}
        return {key: (kind, read[kind](key)) for key, kind in found.items()} | {"queue": raw.llen(QUEUE)}
    finally:
        raw.close()


def _refused_well(result: Result, key: str, role: str, found: str) -> None:
    """One clear line: the key's role, name and type, what to do; no value, no raw error."""
    assert result.exit_code == 1, result.output
    said = result.stderr
    assert f"its {role} (Redis key {key}) holds a {found}" in said, said
    assert "delete" in said or "rename" in said, said
    for raw in ("Traceback", "WRONGTYPE", "ResponseError"):
        assert raw not in result.output, said
    assert SECRET not in result.output


# (key of the job, its role as the error names it, the type it is turned into)
REFUSED = [
    (backfill_runs_key, "set of the runs it enqueued", "string"),
    (backfill_runs_key, "set of the runs it enqueued", "list"),
    (backfill_rootless_key, "list of the traces it read", "hash"),
    (backfill_rootless_key, "list of the traces it read", "string"),
    (backfill_traces_key, "set of the traces an earlier release enqueued", "hash"),
    (backfill_state_key, "state", "list"),
    (backfill_state_key, "state", "hash"),
]


@pytest.mark.parametrize(("key_of", "role", "kind"), REFUSED)
def test_a_resume_refuses_a_job_key_of_another_type_and_goes_on_once_it_is_removed(
    tmp_path: Path, server: RedisServer, db: redis.Redis, key_of: Any, role: str, kind: str
) -> None:
    job_id = _killed_job(tmp_path, server, db)
    key = key_of(job_id)
    state_before = db.get(backfill_state_key(job_id))
    _damage(db, key, kind)
    before = _snapshot(server, job_id)

    result = _backfill(server, "--resume", job_id)
    _refused_well(result, key, role, kind)
    assert _snapshot(server, job_id) == before  # nothing written, nothing enqueued, the key as it was
    assert db.get(backfill_hold_key(job_id)) is None  # the hold released

    # The operator does what the line says: the resume goes on (a state moved aside is the job
    # gone, which the next line says).
    db.rename(key, f"{key}:aside")
    if key_of is backfill_state_key:
        gone = _backfill(server, "--resume", job_id)
        assert gone.exit_code == 1, gone.output
        assert "no backfill job" in gone.stderr
        db.delete(key)
        db.set(key, state_before or "", ex=3600)
    again = _backfill(server, "--resume", job_id)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "enqueued"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (f"not json {SECRET}", "not a job state this release reads"),
        (json.dumps({"job_id": SECRET, "source": [1]}), "not a job state this release reads"),
        (json.dumps([SECRET]), "not a job state this release reads"),
    ],
)
def test_a_state_that_does_not_read_is_named_counted_and_left(
    tmp_path: Path, server: RedisServer, db: redis.Redis, value: str, problem: str
) -> None:
    from worker.metrics._instruments import _metrics

    def unreadable_counted() -> float:
        (family,) = _metrics().unreadable.collect()
        return sum(s.value for s in family.samples if s.labels == {"key": "backfill_state"})

    job_id = _killed_job(tmp_path, server, db)
    key = backfill_state_key(job_id)
    db.set(key, value, keepttl=True)
    before, counted = _snapshot(server, job_id), unreadable_counted()
    result = _backfill(server, "--resume", job_id)
    assert result.exit_code == 1, result.output
    assert f"its state {key} is {problem}" in result.stderr, result.stderr
    assert "delete" in result.stderr or "rename" in result.stderr, result.stderr
    assert SECRET not in result.output
    assert "Traceback" not in result.output
    assert _snapshot(server, job_id) == before
    assert unreadable_counted() == counted + 1


@pytest.mark.parametrize("kind", ["list", "hash", "set"])
def test_a_hold_of_another_type_is_repaired_and_counted(
    tmp_path: Path, server: RedisServer, db: redis.Redis, kind: str
) -> None:
    """The hold guards no data and no holder can ever release a key of another type: it held
    the job off for good (the raw WRONGTYPE); it is deleted (a repair, counted) and taken."""
    from worker.metrics._instruments import _metrics

    def repairs() -> float:
        (family,) = _metrics().key_repairs.collect()
        return sum(
            s.value for s in family.samples if s.name.endswith("_total") and s.labels == {"where": "backfill_hold"}
        )

    job_id = _killed_job(tmp_path, server, db)
    _damage(db, backfill_hold_key(job_id), kind)
    counted = repairs()
    result = _backfill(server, "--resume", job_id)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["status"] == "enqueued"
    assert repairs() == counted + 1
    assert db.exists(backfill_hold_key(job_id)) == 0  # released at the end


@pytest.mark.parametrize(
    ("key_of", "role", "kind"),
    [
        (backfill_runs_key, "set of the runs it enqueued", "string"),
        (backfill_rootless_key, "list of the traces it read", "hash"),
        (backfill_state_key, "state", "list"),
    ],
)
def test_a_first_run_meeting_a_key_of_another_type_enqueues_nothing(
    tmp_path: Path,
    server: RedisServer,
    db: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    key_of: Any,
    role: str,
    kind: str,
) -> None:
    """A new job whose id finds keys of another type (left under that id): refused before any
    batch, nothing enqueued, the key as it was."""
    monkeypatch.setattr("worker.cli._backfill.new_job_id", lambda: "bf-reused")
    key = key_of("bf-reused")
    _damage(db, key, kind)
    before = _snapshot(server, "bf-reused")
    write_otlp_files(tmp_path / "in", 20, files=1)
    result = _backfill(server, str(tmp_path / "in"), "--scorers", SCORERS)
    _refused_well(result, key, role, kind)
    assert "run the backfill again" in result.stderr
    assert _snapshot(server, "bf-reused") == before
    assert db.exists(backfill_hold_key("bf-reused")) == 0  # released


def test_following_a_finished_job_whose_runs_set_is_of_another_type(
    tmp_path: Path, server: RedisServer, db: redis.Redis
) -> None:
    """A finished job followed again (``--resume``, waiting): its last save meets the runs set of
    another type, says so and saves nothing; once the set is moved aside the job sums up."""
    from worker._keys import job_key

    job_id = _killed_job(tmp_path, server, db)
    state = json.loads(db.get(backfill_state_key(job_id)) or "")
    state.update(status="enqueued", counters={"runs_enqueued": 20, "traces_read": 20})
    db.set(backfill_state_key(job_id), json.dumps(state), keepttl=True)
    db.hset(job_key(job_id), "scored", 60)  # as the workers count the job's 20 runs x 3 scorers
    key = backfill_runs_key(job_id)
    _damage(db, key, "string")
    before = _snapshot(server, job_id)
    follow = ["backfill", "--resume", job_id, "--broker", server.url(0), "--json", "--wait-timeout", "30"]
    result = CliRunner().invoke(cli, follow, env={"TRACESCORE_BROKER_URL": ""})
    _refused_well(result, key, "set of the runs it enqueued", "string")
    assert _snapshot(server, job_id) == before

    db.rename(key, f"{key}:aside")
    again = CliRunner().invoke(cli, follow, env={"TRACESCORE_BROKER_URL": ""})
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "finished"


def test_a_read_back_by_run_ids_names_a_runs_set_of_another_type(server: RedisServer, db: redis.Redis) -> None:
    """The per-scorer summary read back by a job's run ids said "cannot read the scores back
    (WRONGTYPE ...)"; it names the key and its type now."""
    from worker.backfill._job import _job_by_scorer, load_scorers
    from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore

    state = BackfillState(
        job_id="bf-readback",
        source={"kind": "files", "paths": []},
        options=BackfillOptions(scorers_module=SCORERS, scorer_ids=["answer-words"]),
        status="finished",
    )
    _damage(db, backfill_runs_key("bf-readback"), "string")
    summary: dict[str, Any] = {}
    assert _job_by_scorer(summary, RedisJobStore(db), state, load_scorers(SCORERS), 3) is None
    assert summary["by_scorer"] is None
    said = summary["by_scorer_unknown"]
    assert f"{backfill_runs_key('bf-readback')} holds a string" in said
    assert "WRONGTYPE" not in said


def test_the_workers_keys_of_a_job_are_named_by_their_role() -> None:
    """The job's counters and its sets the workers keep, read while the backfill waits (its
    progress) and at its end: when the store refuses one of another type, the line names it as the
    job's own, says its counts are unknown (its state stands), with the resume line."""
    from worker._keys import job_key, job_skips_key, job_uncounted_key
    from worker.backfill._job import _refused_key
    from worker.store import StoreKeyTypeError

    for key, role in (
        (job_key("bf-w"), "hash of counters"),
        (job_skips_key("bf-w"), "set of the scores it counted as skipped"),
        (job_uncounted_key("bf-w"), "set of the records stored after it finished"),
    ):
        line = _refused_key(StoreKeyTypeError(key, "list", "hash"), "bf-w", "tracescore backfill --resume bf-w").message
        assert line.startswith(
            f"backfill bf-w: its {role} (Redis key {key}) holds a list, where tracescore keeps a hash"
        )
        # (the job's state stands as saved: only its counts are unknown, so nothing says "nothing was saved")
        assert "the job's counts are unknown" in line
        assert "nothing was saved" not in line
        assert line.endswith("follow the job with: tracescore backfill --resume bf-w")


def test_each_save_renews_the_jobs_runs_and_rootless_traces(db: redis.Redis) -> None:
    """The runs set and the rootless list were given their TTL only when a save added to them,
    the state at every save: a job paused for days, resumed and saved again kept its state while
    they expired under it (its resume then enqueued runs again and took late roots for traces)."""
    from tracing.sources import Released
    from worker.backfill._state import JOB_TTL_SECONDS, BackfillOptions, BackfillState, RedisJobStore

    state = BackfillState(
        job_id="bf-ttl",
        source={"kind": "files"},
        source_label="f",
        options=BackfillOptions(scorers_module="m", scorer_ids=["s"]),
    )
    store = RedisJobStore(db)
    assert store.save(state, ["t:s"], [Released("t2", False, False)])
    for key in (backfill_runs_key("bf-ttl"), backfill_rootless_key("bf-ttl")):
        db.expire(key, 60)  # (days of a pause, later)
    assert store.save(state)  # nothing new to add
    for key in (backfill_runs_key("bf-ttl"), backfill_rootless_key("bf-ttl")):
        assert db.ttl(key) > JOB_TTL_SECONDS - 60, key
