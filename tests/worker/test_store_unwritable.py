"""A score store (TRACESCORE_REDIS_URL, a Redis of its own) that refuses every write under a real
worker: full (``maxmemory`` with ``noeviction``) or a read-only replica. Its message used to be
requeued at once and come back every few milliseconds (a second apart for a read-only one, after
the client's own retries) for as long as that lasted. It waits with a growing delay now, and
nothing is lost once the store takes writes again."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests._redis import RedisServer, free_port
from tests.worker._batches import batch, kombu_entry, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.test_broker_unwritable import _fill
from tests.worker.test_metrics import scrape, series
from tracing import CelerySink
from tracing.queue import SCORE_TASK_NAME

# The task's count of a message's waits for the store, on the message.
STORE_WAITS = "tracescore_store_waits"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@pytest.fixture
def store() -> Iterator[RedisServer]:
    """The score store's own Redis (its maxmemory and role change); the broker is the suite's."""
    with RedisServer() as own:
        yield own


def _countdowns(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"store_unwritable .*?countdown_s=([0-9.]+)", text)]


@pytest.mark.parametrize("refusal", ["full", "read_only"])
def test_a_store_refusing_writes_backs_off_and_loses_nothing(
    store: RedisServer, redis_url: str, tmp_path: Path, refusal: str
) -> None:
    client = store.client()
    client.set("tstest:ballast", "x" * 200_000)  # room to fill well under what is in use
    scores = tmp_path / "scores.jsonl"
    port = free_port()
    worker = WorkerProcess(
        "unwritable",
        redis_url,
        tmp_path,
        scores_path=scores,
        env={
            "TRACESCORE_REDIS_URL": store.url(0),
            "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.2",
            "TRACESCORE_METRICS_PORT": str(port),
            "TRACESCORE_METRICS_HOST": "127.0.0.1",
            "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
        },
    )
    try:
        worker.wait_ready()
        if refusal == "full":
            _fill(client)
        else:
            client.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica of nothing: read-only
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["length"], salt=refusal))
        sink.close()
        # Named, and sent again after a growing delay (0.2, 0.4, 0.8 s...), not at once (a read-only
        # store takes the client's reconnect budget per delivery as well).
        assert wait_for(lambda: len(_countdowns(worker.text())) >= 3, 120), worker.text()[-3000:]
        countdowns = _countdowns(worker.text())[:3]
        assert countdowns == sorted(countdowns), countdowns
        assert countdowns[-1] >= 4 * countdowns[0], countdowns
        assert "batch_requeued" not in worker.text()
        assert read_scores(scores) == []
        # Counted: each delivery's two runs, left for the next one.
        left = series(scrape(port), "tracescore_runs_total", outcome="retry", reason="store_unwritable")
        assert sum(left.values()) >= 2 * 3, left

        if refusal == "full":
            client.config_set("maxmemory", "0")
        else:
            client.execute_command("REPLICAOF", "NO", "ONE")
        assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
        broker = redis.Redis.from_url(redis_url)
        try:
            assert wait_for(lambda: broker.llen("tracescore") == 0 and broker.hlen("unacked") == 0, 30)
        finally:
            broker.close()
        assert len({s["score_id"] for s in read_scores(scores)}) == 2
    finally:
        worker.stop()


def test_waiting_for_the_store_spends_none_of_the_messages_tries(
    store: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    """A store full for longer than the retry budget: once it takes writes, the message's next
    delivery is not its last try. It was: each wait counted as a retry, so a passing failure
    after the store came back (a judge's timeout) was final, an error record and a letter."""
    client = store.client()
    worker, scores = _budget_of_one(store, redis_url, tmp_path, "unwritable-tries")
    try:
        worker.wait_ready()
        _fill(client)
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["flaky_once"], salt="tries"))
        sink.close()
        assert wait_for(lambda: len(_countdowns(worker.text())) >= 3, 120), worker.text()[-3000:]
        _scored_on_their_last_try(client, worker, scores)
    finally:
        worker.stop()


def _budget_of_one(
    store: RedisServer, redis_url: str, tmp_path: Path, name: str, **env: str
) -> tuple[WorkerProcess, Path]:
    """A worker with a retry budget of 1 whose store is ``store``, ballast in it to fill it with."""
    store.client().set("tstest:ballast", "x" * 200_000)
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        name,
        redis_url,
        tmp_path,
        scores_path=scores,
        env={
            "TRACESCORE_REDIS_URL": store.url(0),
            "TRACESCORE_RETRY_BACKOFF_SECONDS": "0.1",
            "TRACESCORE_RETRY_BUDGET": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
            **env,
        },
    )
    return worker, scores


def _scored_on_their_last_try(client: redis.Redis, worker: WorkerProcess, scores: Path) -> None:
    """Once the store takes writes: flaky_once fails each run's first call, and with one try
    left of a budget of 1 (the waits were no tries), both runs are scored, no letter."""
    client.config_set("maxmemory", "0")
    assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
    records = read_scores(scores)
    assert [(r["score"], r.get("error_type")) for r in records] == [(1.0, None), (1.0, None)], records
    assert client.llen("tracescore:dlq") == 0


def test_a_store_outage_past_a_thousand_waits_keeps_the_message_waiting(
    store: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    """A message that has waited 1500 times for the store (a day of a full store at a 60 s
    delay, its retries header 1500) is sent again, not dead-lettered, and scored once the store
    takes writes, its tries still its own. The screen refused every retries header over 1000 as
    ``bad_headers``: a store refusing writes for ~8 hours (30 s apart) turned every message in
    flight into a dead letter. (And 2**retries of the delay overflowed a float past 1023.)"""
    client = store.client()
    worker, scores = _budget_of_one(store, redis_url, tmp_path, "unwritable-long", TRACESCORE_MAX_ETA_SECONDS="0.5")
    try:
        worker.wait_ready()
        _fill(client)
        task_id = str(uuid.uuid4())
        body = json.dumps([[payload(range(2), ["flaky_once"], salt="long")], {}, _EMBED]).encode()
        headers = {
            "lang": "py", "task": SCORE_TASK_NAME, "id": task_id, "root_id": task_id, "parent_id": None,
            "group": None, "retries": 1500, STORE_WAITS: 1500, "timelimit": [None, None], "origin": "test",
        }  # fmt: skip
        broker = redis.Redis.from_url(redis_url)
        try:
            broker.lpush("tracescore", json.dumps(kombu_entry(body, headers, task_id)))
        finally:
            broker.close()
        assert wait_for(lambda: len(_countdowns(worker.text())) >= 3, 60), worker.text()[-3000:]
        assert _countdowns(worker.text())[:3] == [0.5, 0.5, 0.5]
        _scored_on_their_last_try(client, worker, scores)
        assert "message_refus" not in worker.text()
    finally:
        worker.stop()
