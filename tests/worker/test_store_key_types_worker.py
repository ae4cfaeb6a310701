"""A real worker meeting keys of the wrong Redis type: a refused key ends the message as one dead
letter naming the key (not redelivered forever, no score stored owed to no sink); keys the store
can rebuild are repaired and the batch is scored and counted once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from tests._redis import RedisServer
from tests.worker._batches import batch, payload
from tests.worker._workers import QUICK_REDELIVERY, WorkerProcess, failed_start, read_scores, wait_for
from tracing import CelerySink
from worker import _keys
from worker.store import UNACKED_MUTEX_EXPIRE_S, DeadLetter


def _dlq(client: redis.Redis) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(raw) for raw in client.lrange(_keys.dlq_key(), 0, -1)]


def test_a_refused_key_dead_letters_the_message_and_a_repaired_one_scores_it(redis_url: str, tmp_path: Path) -> None:
    scores = tmp_path / "scores.jsonl"
    client = redis.Redis.from_url(redis_url)
    queue = _keys.outbox_key("jsonl")
    # Undelivered scores in an older version's shape: never deleted by the worker.
    client.hset(queue, "older", "undelivered")
    worker = WorkerProcess("keytypes", redis_url, tmp_path, scores_path=scores, env={"TRACESCORE_RETRY_BUDGET": "1"})
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["length"], salt="refused", batch_id="refused-batch"))
        sink.close()

        assert wait_for(lambda: len(_dlq(client)) >= 1, 90), worker.text()[-3000:]
        (letter,) = _dlq(client)
        assert letter.batch_id == "refused-batch"
        assert letter.reason == "retry_budget_exhausted"
        assert letter.attempts == 2  # the first delivery and its one retry: not forever
        assert "StoreKeyTypeError" in letter.error
        assert queue in letter.error
        assert client.hgetall(queue) == {b"older": b"undelivered"}
        assert list(client.scan_iter(match=_keys.record_key("*"))) == []  # nothing stored, owed to no one

        # The operator moves the key aside; keys the store rebuilds are of the wrong type too.
        client.rename(queue, "moved-aside")
        later = batch(range(10, 13), ["length"], salt="repaired", job_id="typed")
        client.rpush(_keys.outbox_attempts_key("jsonl"), "not a hash")
        client.set(_keys.trace_key(later.requests[0].trace_id), "not a set")
        sink = CelerySink(redis_url)
        sink.send(later)
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) >= 3, 90), worker.text()[-3000:]
        assert wait_for(lambda: client.hget(_keys.job_key("typed"), "scored") == b"3", 30), worker.text()[-3000:]
        assert len(read_scores(scores)) == 3
        assert "store_keys_repaired" in worker.text()
        assert "not a hash" not in worker.text()  # names of keys, never their values
        assert len(_dlq(client)) == 1
    finally:
        worker.stop()
        client.close()


def test_a_dead_letter_list_of_another_type_holds_the_message_back_until_it_is_moved(
    redis_url: str, tmp_path: Path
) -> None:
    """The dead-letter list itself of another Redis type: a message the task must dead-letter is
    neither dropped nor spun on. Each try logs ``dead_letter_refused`` naming the key and sends
    the message again after a growing backoff; once the list is moved aside, the next try leaves
    exactly one letter and the queue is empty."""
    from tests.worker.test_hostile_messages import QUEUE, envelope, task_body

    client = redis.Redis.from_url(redis_url)
    client.set(_keys.dlq_key(), "someone else's")
    worker = WorkerProcess(
        "dlqtype",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={"TRACESCORE_RETRY_BACKOFF_SECONDS": "0.5"},
    )
    try:
        worker.wait_ready()
        # Valid JSON in a task's shape (the consumer's screen passes it), not a ScoreBatch.
        _, invalid = envelope(task_body([{"batch_id": "bad", "requests": [{"run": 42}]}]))
        client.lpush(QUEUE, invalid)

        def refusals() -> list[str]:
            return [line for line in worker.text().splitlines() if "dead_letter_refused" in line]

        assert wait_for(lambda: len(refusals()) >= 2, 60), worker.text()[-3000:]
        first, second = refusals()[:2]
        assert _keys.dlq_key() in first
        assert "countdown_s=0.5" in first
        assert "countdown_s=1.0" in second  # backing off, not spinning
        assert client.get(_keys.dlq_key()) == b"someone else's"  # never deleted

        client.rename(_keys.dlq_key(), "moved-aside")
        assert wait_for(lambda: len(_dlq(client)) == 1, 60), worker.text()[-3000:]
        (letter,) = _dlq(client)
        assert letter.reason == "invalid_payload"
        assert letter.batch_id == "bad"
        # Its waits for the operator were no tries of its own (the screen takes 1,000 tries at
        # most: a list moved aside after ~8 hours of waits at 30 s found the message refused).
        assert letter.attempts == 1
        assert wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 30)
        assert len(_dlq(client)) == 1
    finally:
        worker.stop()
        client.close()


def test_a_message_held_back_for_a_refused_dead_letter_list_survives_a_redis_restart(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Redis killed (SIGKILL) while a message waits out its backoff for a refused dead-letter
    list, whatever the moment: the retry already sent, or not yet. Once Redis is back and the
    list is moved aside, the message ends as exactly one letter; nothing is lost or doubled.
    (Before: 4 runs in 9 failed. Two lost the message, when Celery could not publish the retry
    and dropped the original; two made two letters, when the original's ack was lost after its
    retry was sent and both came back at different retry counts.)"""
    from tests.worker.test_hostile_messages import QUEUE, envelope, task_body

    url = own_redis.url(0)
    client = redis.Redis.from_url(url)
    client.set(_keys.dlq_key(), "someone else's")
    worker = WorkerProcess(
        "dlqrestart",
        url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={
            "TRACESCORE_RETRY_BACKOFF_SECONDS": "2",
            "TRACESCORE_MAX_ETA_SECONDS": "2",
            **QUICK_REDELIVERY,
        },
    )
    try:
        worker.wait_ready()
        _, invalid = envelope(task_body([{"batch_id": "held", "requests": [{"run": 42}]}]))
        client.lpush(QUEUE, invalid)
        assert wait_for(lambda: "dead_letter_refused" in worker.text(), 60), worker.text()[-3000:]

        own_redis.stop()  # mid-countdown: the retry is in the worker's memory and in Redis' unacked hash
        client.close()
        own_redis.start()
        client = redis.Redis.from_url(url)
        assert client.get(_keys.dlq_key()) == b"someone else's"  # never deleted, even across the restart
        client.rename(_keys.dlq_key(), "moved-aside")

        # Redelivered once the visibility timeout passes (the worker lost its copy with the connection).
        assert wait_for(lambda: len(_dlq(client)) == 1, 90), worker.text()[-3000:]
        assert wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 60), worker.text()[-3000:]
        (letter,) = _dlq(client)
        assert letter.reason == "invalid_payload"
        assert letter.batch_id == "held"
        assert worker.proc.poll() is None
    finally:
        worker.stop()
        client.close()


def test_kombus_keys_of_another_type_are_repaired_not_the_end_of_the_worker(redis_url: str, tmp_path: Path) -> None:
    """kombu's own keys of another Redis type (hand-edited) ended the worker: its binding tables
    with "Unrecoverable error" at start, its ``unacked`` hash after it had taken a message off the
    list, which was then gone. None of them holds a message when of another type: repaired at
    start (where ``kombu_keys``) and while running (where ``unacked``), counted and named, and
    the batches are scored."""
    scores = tmp_path / "scores.jsonl"
    client = redis.Redis.from_url(redis_url)
    for key in ("_kombu.binding.tracescore", "_kombu.binding.celery.pidbox", "unacked_index"):
        client.set(key, "not a set")
    worker = WorkerProcess("kombukeys", redis_url, tmp_path, scores_path=scores)
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(3), ["length"], salt="kombu-keys"))
        assert wait_for(lambda: len(read_scores(scores)) == 3, 60), worker.text()[-3000:]

        client.set("unacked", "not a hash")  # while the worker runs
        sink.send(batch(range(10, 12), ["length"], salt="unacked"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) == 5, 60), worker.text()[-3000:]
        assert worker.proc.poll() is None
        assert wait_for(lambda: client.hlen("unacked") == 0, 30)  # acked: the rebuilt hash is kombu's again
        log = worker.text()
        assert "where=kombu_keys" in log
        assert "where=unacked" in log
        assert "not a set" not in log
        assert "not a hash" not in log
    finally:
        worker.stop()
        client.close()


def test_a_queue_key_of_another_type_stops_the_worker_with_one_line_and_is_kept(redis_url: str) -> None:
    """The queue's own list of another type may be someone's data: the worker does not start,
    says which key and what to do in one line (it ended with "Unrecoverable error" and a
    traceback), and leaves the key as it is."""
    client = redis.Redis.from_url(redis_url)
    client.set("tracescore", "someone else's")
    try:
        done = failed_start(redis_url)
        assert done.returncode == 1, done.stderr[-2000:]
        assert "tracescore worker cannot start: the broker's queue: Redis key tracescore holds a string" in done.stderr
        assert "Traceback" not in done.stderr
        assert client.get("tracescore") == b"someone else's"
    finally:
        client.close()


def test_a_queue_key_that_changes_type_under_a_running_worker_stops_it_and_loses_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """The queue's list replaced by another type while a worker runs (another program's key of
    the same name, set while the queue was empty). The worker ended with "Unrecoverable error"
    and a traceback, and the message it had to put back (a retry it could not publish, or one it
    held for its ETA) was taken out of the unacked record and pushed nowhere: gone. Now it stops
    with the start's one line, the key is left as it is, the message stays in the unacked record
    (named in ``message_restore_held``, never its content), and once the key is moved aside a new
    worker's sweep brings it back: one dead letter, nothing lost, nothing twice."""
    from tests.worker.test_hostile_messages import QUEUE, envelope, task_body

    client = redis.Redis.from_url(redis_url)
    # A refused dead-letter list keeps the message going round (dead_letter_refused, then a
    # retry with an ETA): the retry is in flight whenever the queue key changes.
    client.set(_keys.dlq_key(), "someone else's")
    env = {
        "TRACESCORE_RETRY_BACKOFF_SECONDS": "1",
        "TRACESCORE_MAX_ETA_SECONDS": "2",
        **QUICK_REDELIVERY,
    }
    first = WorkerProcess("queuetype", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl", env=env)
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        _, invalid = envelope(task_body([{"batch_id": "retyped", "requests": [{"run": 42}]}]))
        client.lpush(QUEUE, invalid)
        assert wait_for(lambda: "dead_letter_refused" in first.text(), 60), first.text()[-3000:]
        # Set only while the queue is empty (no list there): nothing of the queue's is overwritten.
        assert wait_for(lambda: bool(client.set(QUEUE, "someone's", nx=True)), 30)

        assert wait_for(lambda: first.proc.poll() is not None, 60), first.text()[-3000:]
        log = first.text()
        assert first.proc.returncode == 1, log[-3000:]
        assert "tracescore worker stopped: the broker's queue: Redis key tracescore holds a string" in log
        assert "Unrecoverable error" not in log
        assert "message_restore_held" in log
        assert "someone's" not in log
        assert '"run": 42' not in log  # the message's content: neither restored nor logged
        assert "Could not restore" not in log
        assert client.get(QUEUE) == b"someone's"  # left as it is
        assert client.hlen("unacked") == 1, log[-3000:]  # the message, kept where the sweep finds it

        client.rename(QUEUE, "queue-moved-aside")
        client.rename(_keys.dlq_key(), "dlq-moved-aside")
        second = WorkerProcess("queuetype2", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl", env=env)
        second.wait_ready()
        assert wait_for(lambda: len(_dlq(client)) == 1, 90), second.text()[-3000:]
        (letter,) = _dlq(client)
        assert letter.reason == "invalid_payload"
        assert letter.batch_id == "retyped"
        assert wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 60), second.text()[-3000:]
        assert len(_dlq(client)) == 1
        assert second.proc.poll() is None
    finally:
        first.stop()
        if second is not None:
            second.stop()
        client.close()


@pytest.mark.parametrize("stuck", ["string without expiry", "hash", "kombu's 300 s"])
def test_a_stuck_restore_lock_is_released_and_a_dead_workers_message_comes_back(
    redis_url: str, tmp_path: Path, stuck: str
) -> None:
    """kombu's ``unacked_mutex`` guards the sweep that puts a dead worker's messages back. A lock
    that can never be taken (a value without expiry, left by an older kombu that set it in two
    commands, or a key of another type) turned the sweep off without a word, and those messages
    stayed in the unacked hash for good. One with kombu's 300 s expiry, left by a sweeper killed
    mid-sweep or by Redis going down under it, held them for 5 minutes (a flake of
    test_multi_run_faults, which waits 120 s after a Redis restart). It guards no data: released
    (``store_keys_repaired``, where ``unacked_mutex``), and the message is scored; the workers'
    own locks live ``UNACKED_MUTEX_EXPIRE_S``."""
    from tests.worker.test_hostile_messages import QUEUE, envelope, task_body

    client = redis.Redis.from_url(redis_url)
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "mutex",
        redis_url,
        tmp_path,
        scores_path=scores,
        env={
            **QUICK_REDELIVERY,
        },
    )
    try:
        worker.wait_ready()
        if stuck == "hash":
            client.hset("unacked_mutex", "someone", "else's")
        elif stuck == "kombu's 300 s":
            client.set("unacked_mutex", "someone else's", ex=300)
        else:
            client.set("unacked_mutex", "someone else's")
        # What a worker SIGKILLed mid-batch leaves: its message in the unacked hash, taken long ago.
        tag, entry = envelope(task_body([payload(range(2), ["length"], salt="orphan")]))
        client.hset("unacked", tag, json.dumps([json.loads(entry), "", QUEUE]))
        client.zadd("unacked_index", {tag: time.time() - 3600})

        assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
        assert wait_for(lambda: client.hlen("unacked") == 0, 30)
        log = worker.text()
        assert "store_keys_repaired" in log
        assert "where=unacked_mutex" in log
        assert "else's" not in log
        assert client.type("unacked_mutex") in (b"none", b"string")
        assert client.ttl("unacked_mutex") != -1  # a lock of kombu's own again, or none
        assert client.pttl("unacked_mutex") <= UNACKED_MUTEX_EXPIRE_S * 1000
    finally:
        worker.stop()
        client.close()


def test_a_jobs_set_of_counted_skips_of_another_type_dead_letters_its_message_counting_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """A job's set of counted skips holding another type was deleted as a repair, and the job
    counted its skips again. A real worker now meets it refused: the message ends as one dead
    letter naming the key, nothing counted for the job, the key left for the operator."""
    client = redis.Redis.from_url(redis_url)
    skips = _keys.job_skips_key("typed")
    client.set(skips, "someone else's")
    worker = WorkerProcess(
        "skipset", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl", env={"TRACESCORE_RETRY_BUDGET": "1"}
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["length"], salt="skips", job_id="typed", batch_id="skips-batch"))
        sink.close()
        assert wait_for(lambda: len(_dlq(client)) >= 1, 90), worker.text()[-3000:]
        (letter,) = _dlq(client)
        assert letter.batch_id == "skips-batch"
        assert "StoreKeyTypeError" in letter.error
        assert skips in letter.error
        assert client.get(skips) == b"someone else's"
        assert client.hgetall(_keys.job_key("typed")) == {}  # counted nothing, twice or once
        assert list(client.scan_iter(match=_keys.record_key("*"))) == []
    finally:
        worker.stop()
        client.close()


@pytest.mark.parametrize("which", ["hash", "uncounted"])
def test_a_backfill_waiting_on_a_job_whose_counts_are_refused_stops_naming_the_key(
    redis_url: str, tmp_path: Path, which: str
) -> None:
    """A job's hash of counters of another type was deleted (its counts and its end lost), and its
    set of uncounted records of another type left its progress read as if nothing was wrong while
    every put of the job was refused: the backfill waited for a total that could not come. Both
    are refused by progress now: the backfill waiting for the job stops at once, exit 1, naming
    the key and how to resume, and the key is left as it was."""
    from click.testing import CliRunner

    from tests.backfill._synth import write_otlp_files
    from worker.cli import cli

    write_otlp_files(tmp_path / "in", 5, files=1)
    env = {"TRACESCORE_BROKER_URL": ""}
    common = ["--broker", redis_url, "--json"]
    started = CliRunner().invoke(
        cli, ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--no-wait", *common], env=env
    )
    assert started.exit_code == 0, started.output
    job_id = json.loads(started.stdout.strip().splitlines()[-1])["job_id"]
    key = _keys.job_key(job_id) if which == "hash" else _keys.job_uncounted_key(job_id)
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(key)
        client.rpush(key, "an older version's")
        followed = CliRunner().invoke(cli, ["backfill", "--resume", job_id, *common, "--wait-timeout", "60"], env=env)
        said = followed.stderr
        assert followed.exit_code == 1, followed.output[-2000:]
        assert f"(Redis key {key}) holds a list" in said, said[-2000:]
        assert f"follow the job with: tracescore backfill --resume {job_id}" in said
        assert "the job's counts are unknown" in said
        assert "Traceback" not in said
        assert client.lrange(key, 0, -1) == [b"an older version's"]
    finally:
        client.close()


def _backfill_enqueued(redis_url: str, tmp_path: Path, traces: int) -> tuple[str, list[str]]:
    """A backfill of ``traces`` traces enqueued without waiting: its job id and the arguments that
    follow it."""
    from click.testing import CliRunner

    from tests.backfill._synth import write_otlp_files
    from worker.cli import cli

    write_otlp_files(tmp_path / "in", traces, files=1)
    common = ["--broker", redis_url, "--json"]
    started = CliRunner().invoke(
        cli,
        ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--no-wait", *common],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert started.exit_code == 0, started.output
    return json.loads(started.stdout.strip().splitlines()[-1])["job_id"], common


def _follow(job_id: str, common: list[str], wait_timeout: int) -> Any:
    from click.testing import CliRunner

    from worker.cli import cli

    args = ["backfill", "--resume", job_id, *common, "--wait-timeout", str(wait_timeout)]
    return CliRunner().invoke(cli, args, env={"TRACESCORE_BROKER_URL": ""})


def _says_counts_unknown(said: str, job_id: str, field: str) -> None:
    key = _keys.job_key(job_id)
    assert f"(Redis key {key})" in said, said[-2000:]
    assert f"field {field} " in said, said[-2000:]
    assert "the job's counts are unknown" in said
    assert f"follow the job with: tracescore backfill --resume {job_id}" in said
    assert "by hand" not in said  # (the value found there is never shown)
    assert "Traceback" not in said
    (line,) = [line for line in said.splitlines() if "counts are unknown" in line]
    assert key in line
    assert f"unreadable:{field}" in line


def test_a_backfill_waiting_on_a_job_whose_counter_is_no_integer_stops_naming_the_field(
    redis_url: str, tmp_path: Path
) -> None:
    """The job's count of scores holding no integer (written by hand, another program) was left
    out of its progress, then deleted by the next put: the backfill following the job waited
    out its --wait-timeout short of the job's total. It stops at once now, exit 1, one line naming
    the key and the field and that the job's counts are unknown; the value is kept aside."""
    job_id, common = _backfill_enqueued(redis_url, tmp_path, 5)
    key = _keys.job_key(job_id)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset(key, "scored", "12, by hand")
        started = time.monotonic()
        followed = _follow(job_id, common, 20)
        assert followed.exit_code == 1, followed.output[-2000:]
        assert time.monotonic() - started < 15  # (not the wait's timeout)
        _says_counts_unknown(followed.stderr, job_id, "scored")
        assert client.hget(key, "unreadable:scored") == "12, by hand"

        # Damaged again before the operator repaired it: the first value kept stays (it was
        # replaced by the second, and the count it held lost), and the line names every field.
        client.hset(key, "scored", "7, by hand again")
        followed = _follow(job_id, common, 20)
        assert followed.exit_code == 1, followed.output[-2000:]
        _says_counts_unknown(followed.stderr, job_id, "scored")
        assert client.hget(key, "unreadable:scored") == "12, by hand"
        assert client.hget(key, "unreadable:scored#2") == "7, by hand again"
        (line,) = [line for line in followed.stderr.splitlines() if "counts are unknown" in line]
        assert "no integer 2 times" in line
        assert f"HDEL {key} unreadable:scored unreadable:scored#2 unreadable:scored#count)" in line
        assert f"HSCAN {key} 0 MATCH unreadable:*" in line
    finally:
        client.close()


def test_a_worker_meeting_a_jobs_counter_that_is_no_integer_stores_every_score_and_the_backfill_says_so(
    redis_url: str, tmp_path: Path
) -> None:
    """A real worker scoring a job whose count of scores holds no integer: every score is stored
    and delivered, none dead-lettered (refusing the job's puts would have dead-lettered them all),
    the job counts them from 0 with the value kept aside, and the backfill following the job
    stops naming the field instead of taking the restarted count for the job's."""
    from worker._registry import load_registry

    job_id, common = _backfill_enqueued(redis_url, tmp_path, 4)
    key = _keys.job_key(job_id)
    n = 4 * len(load_registry("tests.backfill.scorers"))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.hset(key, "scored", "12, by hand")
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("jobfield", redis_url, tmp_path, scores_path=scores, scorers="tests.backfill.scorers")
    try:
        worker.wait_ready()
        assert wait_for(lambda: len(read_scores(scores)) == n, 90), worker.text()[-3000:]

        def counted() -> int:
            return sum(int(client.hget(key, f) or 0) for f in ("scored", "failed", "skipped"))

        assert wait_for(lambda: counted() == n, 30), client.hgetall(key)  # counted from 0, each once
        assert client.hget(key, "unreadable:scored") == "12, by hand"
        assert _dlq(client) == []
        log = worker.text()
        assert f"{key} scored" in log  # the repair named
        assert "by hand" not in log
        followed = _follow(job_id, common, 20)
        assert followed.exit_code == 1, followed.output[-2000:]
        _says_counts_unknown(followed.stderr, job_id, "scored")
    finally:
        worker.stop()
        client.close()
