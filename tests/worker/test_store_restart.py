"""A score store of its own (``TRACESCORE_REDIS_URL``, a second Redis) SIGKILLed and started again
on the same port while the broker stays up and a real worker scores a stream of batches.

The README promises that every Redis connection a worker holds reconnects after a Redis restart
(commands retried for 15 s, then the message is requeued, never acknowledged and dropped), that a
run is scored once while its record is kept, and that a Redis without persistence comes back
empty, the scores with it. So: with an append-only store every score of every batch reaches the
sink and every run is scored once; with a store that comes back empty, a score is missing from the
sink, or a run scored again, only if its record was in the store when it died (gone with the
data). Either way nothing is dead-lettered for the outage, the worker lives on and its output
never shows either Redis's password.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, complete_lines, queue_and_unacked, read_scores, wait_for
from tracing import CelerySink
from tracing._score_record import score_id_for
from tracing.queue import ScoreBatch
from worker import _keys
from worker._reconnect import RECONNECT_S

ENV = {
    "TSTEST_PACE_S": "0.03",  # paced: 0.03 s a word of the run's answer (at most 29 words)
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "12",
    "TRACESCORE_TASK_TIME_LIMIT": "15",
    "TRACESCORE_VISIBILITY_TIMEOUT": "20",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


class Producer(threading.Thread):
    """Sends a batch of four runs every ``every_s`` to the broker (which stays up) until stopped."""

    def __init__(self, url: str, every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.sent: list[ScoreBatch] = []
        self.failed = 0
        self.halt = threading.Event()

    def run(self) -> None:
        sink = CelerySink(self.url)
        n = 0
        try:
            while not self.halt.is_set():
                b = batch(range(n * 4, n * 4 + 4), ["paced"], salt="store-restart", batch_id=f"store-restart-{n}")
                n += 1
                try:
                    sink.send(b)
                    self.sent.append(b)
                except Exception:
                    self.failed += 1
                time.sleep(self.every_s)
        finally:
            sink.close()


@pytest.fixture(params=[True, False], ids=["kept", "empty"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[RedisServer, bool]]:
    """The score store's own Redis, and whether it keeps its data: append-only (comes back with
    it) or not (comes back empty, as a Redis without persistence does)."""
    with RedisServer(persistent=request.param) as own:
        yield own, request.param


def _score_id(run: str) -> str:
    """The ``paced`` score id of a run (``<trace id>:<span id>``, as the scorer logs it)."""
    trace, span = run.split(":")
    return score_id_for(trace, span, "paced", "1")


def _record_ids(store: RedisServer) -> set[str]:
    prefix = _keys.record_key("")
    with store.client(0, decode_responses=True) as client:
        return {key[len(prefix) :] for key in client.scan_iter(match=f"{prefix}*", count=1000)}


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_score_store_restarted_under_load_loses_no_batch(
    store: tuple[RedisServer, bool], redis_server: RedisServer, redis_url: str, tmp_path: Path, pool: str
) -> None:
    """Away for a second: within the workers' reconnect (15 s) and the batches' soft time limit."""
    _restart_under_load(*store, redis_server, redis_url, tmp_path, pool, outage_s=1.0)


def test_a_score_store_away_past_the_soft_time_limit_loses_no_batch(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    """Away for 20 s, past the reconnect (15 s) and the batches' soft time limit (12 s): a batch
    mid-scoring is requeued when its limit passes with the store away (not a try: it used to be
    retried), as are the deliveries after it. A run whose record could not be
    stored is scored again (README: its calls are paid again when Redis is away), so a run
    scored twice must have begun before the store came back; nothing is lost or dead-lettered."""
    with RedisServer(persistent=True) as store_server:
        _restart_under_load(store_server, True, redis_server, redis_url, tmp_path, "threads", outage_s=20.0)


def _restart_under_load(
    store_server: RedisServer,
    kept: bool,
    redis_server: RedisServer,
    redis_url: str,
    tmp_path: Path,
    pool: str,
    *,
    outage_s: float,
) -> None:
    scores, calls = tmp_path / "scores.jsonl", tmp_path / "calls.txt"
    worker = WorkerProcess(
        "store-restart", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=2,
        scorers="tests.worker.shutdown_scorers",
        env={**ENV, "TRACESCORE_REDIS_URL": store_server.url(0), "TSTEST_CALLS_FILE": str(calls)},
    )  # fmt: skip
    producer = Producer(redis_url)
    try:
        worker.wait_ready()
        producer.start()
        assert wait_for(lambda: len(read_scores(scores)) >= 40, 60), worker.text()[-3000:]

        def scoring_now() -> bool:
            lines = complete_lines(calls)
            done = {x.split()[1] for x in lines if x.startswith("done ")}
            return bool({x.split()[1] for x in lines if x.startswith("start ")} - done)

        # Polled, not read once: under a loaded machine's pauses a single look could fall between
        # two runs (the test failed its own precondition, not the product).
        assert wait_for(scoring_now, 30), "no run was being scored as the store went: the test would prove nothing"
        lost: set[str] = set()
        if not kept:
            # What dies with the data: the records stored when the store went. Writes are held
            # (CLIENT PAUSE WRITE) while they are read, so none lands between the read and the kill.
            with store_server.client(0) as client:
                client.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
            lost = _record_ids(store_server)
            assert lost, "nothing stored before the restart: the test would prove nothing"
        store_server.stop()  # SIGKILL: the worker's store connections drop mid-command
        before = len(producer.sent)
        time.sleep(outage_s)  # an outage, not a timing assertion
        store_server.start()
        began = {x.split()[1] for x in complete_lines(calls) if x.startswith("start ")}  # before it was back
        assert wait_for(lambda: len(producer.sent) >= before + 30, 60), f"producer stuck: {producer.failed} failed"
        producer.halt.set()
        producer.join(10)
        assert producer.failed == 0  # the broker stayed up: every send was acknowledged

        runs = {f"{r.trace_id}:{t}" for b in producer.sent for r in b.requests for t in r.target_span_ids}
        expected = {_score_id(run) for run in runs}
        delivered = lambda: {s["score_id"] for s in read_scores(scores)}  # noqa: E731
        logs = lambda: worker.text()[-4000:]  # noqa: E731
        # Every score reaches the sink but those that died with an empty store before it took them.
        assert wait_for(lambda: expected - lost <= delivered(), 90), (
            f"{len(expected - lost - delivered())} of {len(expected)} scores missing\n{logs()}"
        )
        assert wait_for(lambda: queue_and_unacked(redis_url, "tracescore") == (0, 0), 60), logs()
        time.sleep(1.0)  # let a stray re-score surface before counting
        records = read_scores(scores)
        assert {s["score_id"] for s in records} <= expected
        assert [s for s in records if s["error_type"]] == [], logs()

        # Scored once (the scorer's own count, in a file: the store's counts die with it), but a
        # run whose record went with the data, which a redelivery may score again, and after an
        # outage past the reconnect, one begun while the store was away.
        done = collections.Counter(line.split()[1] for line in complete_lines(calls) if line.startswith("done "))
        assert set(done) >= {run for run in runs if _score_id(run) not in lost}
        twice = {run for run, n in done.items() if n > 1}
        assert {_score_id(run) for run in twice} <= lost | (
            {_score_id(run) for run in began} if outage_s > RECONNECT_S else set()
        ), twice

        # No dead letter for an outage: neither a message's (in the store) nor a sink's.
        with store_server.client(0) as client:
            assert client.llen(_keys.dlq_key()) == 0, client.lrange(_keys.dlq_key(), 0, -1)
            sinks = [k for k in client.scan_iter(match=_keys.outbox_dead_key("*")) if not k.endswith(b":order")]
            assert [k for k in sinks if client.hlen(k)] == []
        with redis_server.client(11) as client:
            assert client.llen(_keys.dlq_key()) == 0
        assert worker.proc.poll() is None, logs()
        said = worker.text()
        assert store_server.password not in said
        assert redis_server.password not in said
    finally:
        producer.halt.set()
        worker.stop()
