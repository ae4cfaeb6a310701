"""A broker Redis that refuses writes under a real worker: out of memory (``maxmemory`` with
``noeviction``, as deployed: every write refused, and every command inside MULTI), or a failover
that leaves the endpoint on a read-only replica. Nothing may be lost and the worker must wait, not
end, until Redis takes writes again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests._redis import RedisServer
from tests.worker._batches import batch
from tests.worker._workers import QUICK_REDELIVERY, WorkerProcess, read_scores, run_tracescore, wait_for
from tracing import CelerySink


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A Redis of this test's own: its maxmemory and its role (primary, replica) are changed."""
    own = RedisServer()
    own.start()
    try:
        yield own
    finally:
        own.close()


def _fill(client: redis.Redis) -> int:
    """Make Redis full (``noeviction``, ``maxmemory`` 64 KiB under what its data uses) and return
    the limit. The clients' buffers are left out of that use: Redis shrinks idle query buffers on
    its own within seconds, which freed 150-200 KB here (262 KB of client buffers down to 62 KB),
    and a limit 64 KiB under the total let writes through again a few seconds later."""
    memory = client.info("memory")
    limit = max(1, int(memory["used_memory"]) - int(memory["mem_clients_normal"]) - 64 * 1024)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(limit))
    return limit


def test_a_full_broker_loses_nothing_and_the_worker_waits_for_room(server: RedisServer, tmp_path: Path) -> None:
    """Redis fills up while a batch runs and two more wait. The running batch cannot store its
    scores and is left in the unacked record; the next one is not taken (its take is refused
    before it pops); the worker then stops taking messages and reconnects with backoff. Before,
    it ended with "Unrecoverable error" and the message it had taken was gone (one batch in three
    lost). Once Redis has room: every score stored exactly once, the worker still running, the
    queue and the unacked record empty."""
    url = server.url(0)
    client = server.client()
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "full",
        url,
        tmp_path,
        scores_path=scores,
        env={
            "TSTEST_SLOW_S": "1.5",
            **QUICK_REDELIVERY,
        },
    )
    try:
        worker.wait_ready()
        sink = CelerySink(url)
        sink.send(batch(range(2), ["slow"], salt="full"))
        assert wait_for(lambda: client.hlen("unacked") == 1 and client.llen("tracescore") == 0, 30)
        sink.send(batch(range(2, 4), ["slow"], salt="full"))  # wait in the queue (prefetch 1)
        sink.send(batch(range(4, 6), ["slow"], salt="full"))
        sink.close()
        _fill(client)  # well under what is in use: taking a message frees some, and must not make room

        # Full: the worker stays up, and says why it is not consuming.
        assert wait_for(lambda: "Cannot connect" in worker.text(), 60), worker.text()[-3000:]
        assert worker.proc.poll() is None
        assert "at maxmemory; waiting for room" in worker.text()
        # The running batch's message is held or left unacked once its own writes are refused,
        # which may come after the consumer's refused take: waited for, not read at once. (Or its
        # retry, refused by the full broker, asks the consumer to requeue it once the consumer has
        # already lost its connection: it stays in the unacked record, as the end below shows.)
        assert wait_for(
            lambda: any(
                event in worker.text()
                for event in ("message_held_for_requeue", "message_left_unacked", "retry_not_published")
            ),
            60,
        ), worker.text()[-3000:]

        client.config_set("maxmemory", "0")  # room again
        assert wait_for(lambda: len(read_scores(scores)) >= 6, 90), worker.text()[-3000:]
        assert wait_for(lambda: client.llen("tracescore") == 0 and client.hlen("unacked") == 0, 30)
        ids = [record["score_id"] for record in read_scores(scores)]
        assert len(ids) == 6
        assert len(set(ids)) == 6
        assert worker.proc.poll() is None
        log = worker.text()
        assert "Unrecoverable error" not in log
        assert "Frequent restarts" not in log  # backing off, not a restart loop
    finally:
        worker.stop()
        client.close()


def test_a_full_broker_has_nothing_taken_off_its_list_even_by_a_worker_stopped_then(
    server: RedisServer, tmp_path: Path
) -> None:
    """A message arrives when Redis is already full. The worker's take is refused before it pops
    (kombu's BRPOP took it and held it in the worker's memory, where a SIGKILL lost it): the
    message stays on the list, the worker waits for room, and stopped meanwhile it has nothing
    to hand back. Another worker scores it once Redis has room."""
    from tests.worker._batches import payload
    from tests.worker.test_hostile_messages import QUEUE, envelope, task_body

    url = server.url(0)
    client = server.client()
    scores = tmp_path / "scores.jsonl"
    first = WorkerProcess("held", url, tmp_path, scores_path=scores, env=QUICK_REDELIVERY)
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        _, entry = envelope(task_body([payload(range(2), ["length"], salt="held")]))
        client.lpush("staging", entry)
        _fill(client)
        client.rename("staging", QUEUE)  # (a rename is no write Redis refuses): the worker wakes for it
        assert wait_for(lambda: "waiting for room" in first.text(), 30), first.text()[-3000:]
        assert client.llen(QUEUE) == 1
        assert client.hlen("unacked") == 0

        first.stop()  # still full
        assert first.proc.returncode == 0, first.text()[-3000:]
        assert client.llen(QUEUE) == 1
        assert "held_messages" not in first.text()
        assert read_scores(scores) == []

        client.config_set("maxmemory", "0")
        second = WorkerProcess("held2", url, tmp_path, scores_path=scores, env=QUICK_REDELIVERY)
        second.wait_ready()
        assert wait_for(lambda: len(read_scores(scores)) == 2, 30), second.text()[-3000:]
        assert wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 30)
        assert len({record["score_id"] for record in read_scores(scores)}) == 2
    finally:
        first.stop()
        if second is not None:
            second.stop()
        client.close()


def test_status_says_the_broker_is_full_instead_of_unreachable(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full broker answered `tracescore status` with "broker unreachable ... OutOfMemoryError"
    (the worker ping declares a reply queue, a write). Now: exit 0, the figures it can read,
    ``broker_full`` and the memory, the workers unknown."""
    from worker.cli import main

    url = server.url(0)
    client = server.client()
    limit = _fill(client)
    try:
        assert main(["status", "--json", "--timeout", "0.3", "--broker", url]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["broker_full"] is True
        assert status["workers"] is None
        assert status["broker_memory"]["max_bytes"] == limit
        assert status["queue_depth"] == 0
        assert main(["status", "--timeout", "0.3", "--broker", url]) == 0
        text = capsys.readouterr().out
        assert "broker FULL" in text
        assert "workers     unknown" in text
    finally:
        client.config_set("maxmemory", "0")
        client.close()


def test_a_backfill_that_fills_the_broker_says_how_to_resume_and_loses_nothing(
    server: RedisServer, tmp_path: Path
) -> None:
    """No worker yet, and the queue fills the broker's memory partway through a backfill. It
    ended with Redis' bare OutOfMemoryError, quoting the refused command. Now one line says the
    broker is full and how to resume; resumed once there is room and scored by a worker, every
    run has its scores, once."""
    import re

    from tests.backfill._synth import write_otlp_files
    from tests.worker._workers import ROOT

    url = server.url(0)
    client = server.client()
    data = tmp_path / "traces"
    write_otlp_files(data, 300, files=2, traces_per_line=10)
    env = {**os.environ, "TRACESCORE_BROKER_URL": url, "PYTHONPATH": str(ROOT)}
    command = ["backfill", str(data), "--scorers", "bench.backfill_scorers", "--batch-size", "10"]
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    # About 11 of the 30 batches (~37 KB each) fit past the ~390 KB the job's connections, scripts
    # and state take first (measured); with 500 KB one did, then none once the job's save ran a
    # script, and the test's "partway" failed.
    client.config_set("maxmemory", str(used + 900 * 1024))
    worker: WorkerProcess | None = None
    try:
        first = run_tracescore(*command, "--no-wait", env=env)
        assert first.returncode == 1, first.stderr[-2000:]
        assert "the broker's Redis is full" in first.stderr
        assert "OutOfMemoryError" not in first.stderr
        assert client.llen("tracescore") > 0, first.stderr  # partway: some batches were enqueued
        found = re.search(r"resume with: tracescore backfill --resume (\S+)", first.stderr)
        assert found, first.stderr[-2000:]

        client.config_set("maxmemory", "0")
        resumed = run_tracescore("backfill", "--resume", found.group(1), "--no-wait", env=env)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        scores = tmp_path / "scores.jsonl"
        worker = WorkerProcess("backfill", url, tmp_path, scores_path=scores, scorers="bench.backfill_scorers")
        worker.wait_ready()

        def pairs() -> set[tuple[str, str]]:
            return {(r["trace_id"], r["scorer_id"]) for r in read_scores(scores)}

        assert wait_for(lambda: len(pairs()) == 300 * 2, 120), worker.text()[-3000:]
        assert wait_for(lambda: client.llen("tracescore") == 0 and client.hlen("unacked") == 0, 30)
        records = read_scores(scores)
        assert len({r["score_id"] for r in records}) == len(records) == 300 * 2  # none twice
    finally:
        if worker is not None:
            worker.stop()
        client.config_set("maxmemory", "0")
        client.close()


def test_the_sinks_drain_a_full_redis(server: RedisServer) -> None:
    """A sink down for long is the usual way Redis fills up: its undelivered scores wait there.
    Once it is back, its drainer must be able to take and settle them while Redis is still full,
    or nothing frees the memory. Taking a lease (a ZADD first, which a full Redis refuses in a
    script that has not written yet) failed with OutOfMemoryError; now the lease and the ack go
    through, and the sink's queue empties."""
    from worker.store import RedisOutbox

    url = server.url(0)
    client = server.client()
    outbox = RedisOutbox(url, reconnect_s=1.0)
    ids = [f"{n:032x}" for n in range(50)]
    try:
        outbox.register(["otlp"])
        outbox.enqueue("otlp", ids)
        _fill(client)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("anything", "x")  # full indeed

        lease = outbox.lease("otlp", 100, lease_s=30)
        assert sorted(lease.ids) == ids
        assert outbox.ack(lease, lease.ids) == len(ids)
        counts = outbox.counts()["otlp"]
        assert (counts.pending, counts.delivered) == (0, len(ids))
    finally:
        client.config_set("maxmemory", "0")
        outbox.close()
        client.close()


def test_a_failover_that_leaves_the_endpoint_on_a_replica_loses_nothing(
    server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failover: the worker's Redis is demoted to a read-only replica of the new primary while a
    batch runs and two more wait. The batch's writes and its retry's publish were refused, its
    requeue too, and the worker ended with "Unrecoverable error: ReadOnlyError" — or stayed up
    taking nothing, its scores never stored even once the endpoint led to a primary again. Now it
    waits ("read-only replica"; `tracescore status` says so), and once the endpoint is a primary:
    every score stored, once, with the worker still running and nothing queued or unacked."""
    from worker.cli import main

    url = server.url(0)
    client = server.client()
    other = RedisServer()
    other.start()
    replica = other.client()
    scores = tmp_path / "scores.jsonl"
    env = {
        "TSTEST_SLOW_S": "1.5",
        **QUICK_REDELIVERY,
    }
    worker = WorkerProcess("failover", url, tmp_path, scores_path=scores, env=env)
    try:
        # The standby follows the worker's Redis, as a managed Redis' replica does.
        replica.config_set("masterauth", server.password)
        replica.replicaof("127.0.0.1", server.port)
        assert wait_for(lambda: replica.info("replication").get("master_link_status") == "up", 30)
        worker.wait_ready()
        sink = CelerySink(url)
        sink.send(batch(range(2), ["slow"], salt="failover"))
        assert wait_for(lambda: client.hlen("unacked") == 1 and client.llen("tracescore") == 0, 30)
        sink.send(batch(range(2, 4), ["slow"], salt="failover"))
        sink.send(batch(range(4, 6), ["slow"], salt="failover"))
        sink.close()
        assert wait_for(lambda: replica.llen("tracescore") == 2, 30)  # replicated before the switch

        replica.replicaof("NO", "ONE")  # the standby takes over; the worker's Redis follows it
        client.config_set("masterauth", other.password)
        client.replicaof("127.0.0.1", other.port)
        assert wait_for(lambda: client.info("replication").get("master_link_status") == "up", 30)
        assert wait_for(lambda: "read-only replica" in worker.text(), 60), worker.text()[-3000:]
        assert worker.proc.poll() is None
        assert main(["status", "--json", "--timeout", "0.3", "--broker", url]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["broker_read_only"] is True
        assert status["workers"] is None

        client.replicaof("NO", "ONE")  # the endpoint leads to a primary again
        assert wait_for(lambda: len(read_scores(scores)) >= 6, 90), worker.text()[-3000:]
        assert wait_for(lambda: client.llen("tracescore") == 0 and client.hlen("unacked") == 0, 30)
        ids = [record["score_id"] for record in read_scores(scores)]
        assert len(ids) == len(set(ids)) == 6
        assert worker.proc.poll() is None
        assert "Unrecoverable error" not in worker.text()
    finally:
        worker.stop()
        replica.close()
        other.close()
        client.close()


def test_a_redis_filled_by_a_sinks_dead_letters_is_freed_by_the_bound_and_by_sinks_drop(server: RedisServer) -> None:
    """A sink refusing every score filled Redis with its dead letters (a release before the bound
    kept them all, without their order). The next letter a drainer buries while Redis is still
    full orders the old ones and drops the oldest past TRACESCORE_SINK_MAX_DEAD_LETTERS, so Redis
    takes writes again; and drop_dead_letters (`sinks drop`) removes letters from a full Redis."""
    from worker import _keys
    from worker.store import RedisOutbox, SinkDeadLetter

    url = server.url(0)
    client = server.client()
    outbox = RedisOutbox(url, reconnect_s=1.0, max_dead_letters=10)
    try:
        outbox.register(["phoenix"])
        with client.pipeline(transaction=False) as pipe:
            for n in range(300):  # as the previous release left them: the hash alone
                letter = SinkDeadLetter(
                    score_id=f"{n:064x}", sink="phoenix", reason="http_404", detail="x" * 900, failed_at=n
                )
                pipe.hset(_keys.outbox_dead_key("phoenix"), letter.score_id, letter.model_dump_json())
            pipe.execute()
        outbox.enqueue("phoenix", ["f" * 64])
        lease = outbox.lease("phoenix", 10, lease_s=30)
        _fill(client)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("anything", "x")  # full indeed

        assert outbox.dead(lease, [SinkDeadLetter(score_id="f" * 64, sink="phoenix", reason="http_404")]) == 1
        counts = outbox.counts()["phoenix"]
        assert (counts.failed, counts.dead_letters_dropped) == (10, 291)
        kept = sorted(x.score_id for x in outbox.dead_letters("phoenix"))
        assert kept == sorted([f"{n:064x}" for n in range(291, 300)] + ["f" * 64])

        def room() -> bool:
            try:
                return bool(client.set("anything", "x"))
            except redis.exceptions.OutOfMemoryError:
                return False

        # Room again: the letters' memory is free at once; the buffers of the clients that read
        # them count in Redis' memory until Redis shrinks them (idle, within seconds; see _fill).
        assert wait_for(room, 15)

        _fill(client)
        assert len(list(outbox.drop_dead_letters("phoenix"))) == 10
        assert outbox.counts()["phoenix"].failed == 0
    finally:
        client.config_set("maxmemory", "0")
        outbox.close()
        client.close()
