"""A resumed job sends the rest of its runs to the queue it started on, and the commands that
end before the job does say how to follow it with the broker they were given (README audit)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from worker._keys import backfill_rootless_key, backfill_runs_key, backfill_state_key
from worker.cli import cli


def _backfill(private_redis: RedisServer, *args: str, queue: str | None = None) -> tuple[dict[str, object], str]:
    env = {"TRACESCORE_BROKER_URL": "", "TRACESCORE_QUEUE": queue}
    result = CliRunner().invoke(cli, ["backfill", *args, "--broker", private_redis.url(0), "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_a_resume_sends_the_rest_to_the_jobs_queue(tmp_path: Path, private_redis: RedisServer) -> None:
    """A job started with TRACESCORE_QUEUE=nightly and resumed without it sent the rest of its
    runs to the queue 'tracescore', where no worker of the job listens."""
    write_otlp_files(tmp_path, 40, files=1)
    first, said = _backfill(
        private_redis, str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait", queue="nightly"
    )
    db = private_redis.client(0, decode_responses=True)
    assert first["runs_enqueued"] == 40
    assert db.llen("nightly") > 0
    assert db.llen("tracescore") == 0
    # Follow-up hints name the broker the command was given: without it, copying one failed
    # ("--resume needs the Redis the job ran with").
    assert f"Follow with: tracescore backfill --resume {first['job_id']} --broker redis://:PASSWORD@" in said

    # As if it had been stopped before enqueuing anything: the resume reads it all again.
    job = str(first["job_id"])
    state = json.loads(db.get(backfill_state_key(job)) or "{}")
    stopped = {**state, "status": "interrupted", "checkpoint": [0, 0, 0], "counters": {}}
    db.set(backfill_state_key(job), json.dumps(stopped))
    db.delete(backfill_runs_key(job), backfill_rootless_key(job), "nightly")
    resumed, said = _backfill(private_redis, "--resume", job, "--no-wait")
    assert resumed["runs_enqueued"] == 40
    assert "the job's queue is 'nightly' (TRACESCORE_QUEUE says 'tracescore'): using the job's" in said
    assert db.llen("tracescore") == 0
    assert db.llen("nightly") > 0


@pytest.mark.parametrize("variable", ["same", "another"])
def test_the_follow_hint_names_the_broker_unless_the_variable_names_it(
    tmp_path: Path, private_redis: RedisServer, variable: str
) -> None:
    """With TRACESCORE_BROKER_URL set, the hint left --broker out even when --broker had
    overridden it: followed with the same environment, it looked in the other Redis and said the
    job was not there (re-score audit)."""
    write_otlp_files(tmp_path, 10, files=1)
    env = {"TRACESCORE_BROKER_URL": private_redis.url(0 if variable == "same" else 1)}
    args = ["backfill", str(tmp_path), "--scorers", "tests.backfill.scorers", "--broker", private_redis.url(0)]
    result = CliRunner().invoke(cli, [*args, "--no-wait", "--json"], env=env)
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout.strip().splitlines()[-1])["job_id"]
    hint = f"Follow with: tracescore backfill --resume {job}"
    if variable == "same":
        assert f"{hint}\n" in result.stderr
    else:
        assert f"{hint} --broker redis://:PASSWORD@127.0.0.1:{private_redis.port}/0" in result.stderr


def test_a_job_is_run_by_one_process_at_a_time(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `--resume` of one job at once both enqueued its runs and each ended "finished" with
    counts of the other's scores (queue-fault audit). A second process on a job waits for the
    first's hold to lapse, and is refused while it is renewed; a holder that died on this host
    (a SIGKILLed backfill) is taken over at once."""
    import subprocess
    import sys

    from worker.backfill._state import JobHold, _this_host

    monkeypatch.setattr(JobHold, "HOLD_S", 1.0)
    write_otlp_files(tmp_path, 20, files=1)
    first, _ = _backfill(private_redis, str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")
    job = str(first["job_id"])
    assert private_redis.client(0).exists(f"tracescore:backfill-hold:{job}") == 0  # released at the end

    running = JobHold(private_redis.client(0), job)  # another process running the job, renewing its hold
    running.token = "another-host:1:x"
    assert running.acquire()
    try:
        result = CliRunner().invoke(
            cli,
            ["backfill", "--resume", job, "--no-wait", "--broker", private_redis.url(0)],
            env={"TRACESCORE_BROKER_URL": ""},
        )
        assert result.exit_code == 1, result.output
        assert f"backfill {job} is held by another process: waiting up to 3 s" in result.stderr
        assert f"backfill {job} is being run by another process (a start or a --resume)" in result.stderr
    finally:
        running.release()

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    private_redis.client(0).set(f"tracescore:backfill-hold:{job}", f"{_this_host()}:{gone.stdout.strip()}:x", ex=600)
    again, said = _backfill(private_redis, "--resume", job, "--no-wait")  # a holder gone from this host: at once
    assert again["job_id"] == job
    assert "waiting" not in said


def test_resuming_a_job_redis_no_longer_holds_says_what_to_do(private_redis: RedisServer) -> None:
    """After a Redis without persistence restarted, the interrupt had said "nothing enqueued is
    lost ... resume with", and the resume said only that job states expire after 7 days."""
    result = CliRunner().invoke(
        cli, ["backfill", "--resume", "bf-gone", "--broker", private_redis.url(0)], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert result.exit_code == 1, result.output
    assert "no backfill job 'bf-gone'" in result.stderr
    assert "a Redis restarted without persistence has lost it; run the backfill again" in result.stderr
    # A mistyped id (a digit off, as copied by hand) was told only of expiry and lost state.
    assert "or the id is not the job's: tracescore status lists the jobs this Redis keeps" in result.stderr


def test_a_resume_that_waited_goes_on_from_what_the_holder_left(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state read before waiting for the hold was the one used after it: what the holder did
    meanwhile was read again (counted as read again, not enqueued) and its state overwritten
    with the stale one (review)."""
    import threading

    from worker.backfill._state import JobHold, RedisJobStore

    monkeypatch.setattr(JobHold, "HOLD_S", 5.0)
    write_otlp_files(tmp_path, 20, files=1)
    first, _ = _backfill(private_redis, str(tmp_path), "--scorers", "tests.backfill.scorers", "--no-wait")
    job = str(first["job_id"])
    running = JobHold(private_redis.client(0), job)
    running.token = "another-host:1:x"
    assert running.acquire()
    loads: list[str] = []
    load = RedisJobStore.load

    def counted(self: RedisJobStore, job_id: str) -> object:
        loads.append(job_id)
        return load(self, job_id)

    monkeypatch.setattr(RedisJobStore, "load", counted)

    def holder_finishes() -> None:  # once the resume has read the state and waits
        deadline = time.monotonic() + 30
        while not loads and time.monotonic() < deadline:
            time.sleep(0.05)
        db = private_redis.client(0, decode_responses=True)
        state = json.loads(db.get(backfill_state_key(job)) or "{}")
        db.set(backfill_state_key(job), json.dumps({**state, "elapsed_s": 1000.0}))
        running.release()

    helper = threading.Thread(target=holder_finishes)
    helper.start()
    try:
        again, said = _backfill(private_redis, "--resume", job, "--no-wait")
    finally:
        helper.join(30)
    assert "is held by another process: waiting up to 7 s" in said
    assert len(loads) == 2  # before waiting, and once held
    state = json.loads(private_redis.client(0, decode_responses=True).get(backfill_state_key(job)) or "{}")
    assert state["elapsed_s"] >= 1000.0  # the holder's, not overwritten by the stale state
    assert again["runs_enqueued"] == 20


def test_a_hold_taken_by_another_is_known_lost(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its renewal swallowed every Redis error, so a process whose lock had lapsed (paused past
    it, or Redis lost it) and was taken went on running the job beside the new holder (review).
    Now the renewal that finds the lock another's marks the hold lost, and the job stops."""
    from worker.backfill._state import JobHold

    monkeypatch.setattr(JobHold, "HOLD_S", 0.6)
    mine, theirs = JobHold(private_redis.client(0), "bf-x"), JobHold(private_redis.client(0), "bf-x")
    assert mine.acquire()
    private_redis.client(0).delete("tracescore:backfill-hold:bf-x")  # lapsed
    assert theirs.acquire()
    deadline = time.monotonic() + 10
    while not mine.lost.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mine.lost.is_set()
    assert not theirs.lost.is_set()
    mine.release()
    assert private_redis.client(0).exists("tracescore:backfill-hold:bf-x") == 1  # the other's, kept
    theirs.release()


def _two_holders(tmp_path: Path, db: Any, job: str) -> tuple[Any, Any, Any]:
    """This process holding ``job`` over 60 traces (batches of 10), and another's hold that will
    take it; the renewal never turns during a test, so only Redis can say the hold was taken."""
    from tracing.sources import FileSource
    from worker.backfill._state import BackfillOptions, BackfillState, JobHold

    write_otlp_files(tmp_path, 60, files=1, traces_per_line=5)
    mine, theirs = JobHold(db, job), JobHold(db, job)
    assert mine.acquire()
    state = BackfillState(
        job_id=job,
        source=FileSource([tmp_path]).describe(),
        options=BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], batch_size=10),
    )
    return mine, theirs, state


def test_a_process_whose_hold_was_taken_sends_and_saves_nothing_more(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill paused past its hold (SIGSTOP) while a --resume took the job over, then woken,
    went on reading: it sent the rest of its input and saved its state twice over the new
    holder's ("enqueued", then "finished", with its own counts), exiting 0 (concurrency audit).
    Its renewer marks the hold lost only at its next turn, so the process itself asks Redis
    before each batch, and a save writes only while the hold is its own."""
    from tests.backfill._doubles import CapturingSubmitter
    from tracing.sources import FileSource
    from worker.backfill._driver import Backfill
    from worker.backfill._state import JobHold, RedisJobStore

    monkeypatch.setattr(JobHold, "HOLD_S", 600.0)
    db = private_redis.client(0)
    job = "bf-stale"
    mine, theirs, state = _two_holders(tmp_path, db, job)

    class TakenAfterTheFirstBatch(CapturingSubmitter):
        def submit(self, batch: Any, requests_json: Any = None) -> None:
            super().submit(batch, requests_json)
            if len(self.sent) == 1:  # the hold lapses and a --resume takes the job and saves
                db.delete(mine.key)
                assert theirs.acquire()
                RedisJobStore(db, theirs).save(state.model_copy(update={"elapsed_s": 1000.0}))

    submitter = TakenAfterTheFirstBatch()
    backfill = Backfill(FileSource([tmp_path]), state, submitter, job_store=RedisJobStore(db, mine))
    try:
        with pytest.raises(KeyboardInterrupt):
            backfill.run()
        assert len(submitter.sent) == 1  # nothing sent once the hold was the other's
        assert mine.lost.is_set()
        saved = json.loads(db.get(backfill_state_key(job)) or "{}")
        assert saved["elapsed_s"] == 1000.0  # the new holder's state, not overwritten
        assert db.scard(backfill_runs_key(job)) == 0  # (the new holder enqueued none yet)
        backfill.interrupted()  # the summing up of a stop: not written either
        assert json.loads(db.get(backfill_state_key(job)) or "{}")["elapsed_s"] == 1000.0
    finally:
        mine.release()
        theirs.release()


def test_a_hold_taken_between_batches_stops_the_next_one_before_it_is_sent(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save after a batch refuses once the hold is another's; taken after that save, before
    the next batch, only the driver's question to Redis stops that batch from reaching the queue
    beside the new holder's copy (review)."""
    from tests.backfill._doubles import CapturingSubmitter
    from tracing.sources import FileSource
    from worker.backfill._driver import Backfill
    from worker.backfill._state import BackfillState, JobHold, RedisJobStore

    monkeypatch.setattr(JobHold, "HOLD_S", 600.0)
    db = private_redis.client(0)
    mine, theirs, state = _two_holders(tmp_path, db, "bf-between")

    class TakenAfterTheFirstSave(RedisJobStore):
        def save(self, state: BackfillState, newly_enqueued: Any = (), *rootless: Any) -> bool:
            saved = super().save(state, newly_enqueued, *rootless)
            if saved and newly_enqueued and not theirs.lost.is_set() and theirs._renewer is None:
                db.delete(mine.key)  # lapsed while this process was paused; a --resume takes it
                assert theirs.acquire()
            return saved

    submitter = CapturingSubmitter()
    backfill = Backfill(FileSource([tmp_path]), state, submitter, job_store=TakenAfterTheFirstSave(db, mine))
    try:
        with pytest.raises(KeyboardInterrupt):
            backfill.run()
        assert len(submitter.sent) == 1
        assert mine.lost.is_set()
    finally:
        mine.release()
        theirs.release()
