"""The consumer's screen refuses a message while the Redis holding the dead letters restarts
(SIGKILLed, started again from its append-only file some seconds later), its client connected
before: the message is neither lost nor acked unrecorded, and becomes one dead letter.

The guard's push (``SyncRedisDeadLetters``) keeps redis-py's own retry (about 1-3 s in all against
a refused connection), not the workers' reconnect budget: a restart longer than that reaches the
guard, which logs ``message_refusal_not_recorded`` (no content, a line a minute with the count of
messages held back), hands the message back and pauses (``worker._guard``). It logged one line a
second while the store was away."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests._redis import RedisServer
from tests.worker._workers import WorkerProcess, queue_and_unacked, wait_for
from tests.worker.test_hostile_messages import MARKER, QUEUE, envelope
from worker._guard import _STORE_DOWN_PAUSE_S
from worker.store import DeadLetter


@pytest.fixture
def store() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as s:
        yield s


def _letters(url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


def test_a_message_refused_while_the_store_restarts_is_one_dead_letter(
    store: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    """The broker stays up; the message arrives while the store is down, and the screen's push
    fails until it is back. (A broker that is the store goes and comes back with it: a message
    queued just before is screened once both are back, no restart in between to test.)"""
    store_url, broker_url = store.url(11), redis_url
    worker = WorkerProcess("store-restart", store_url, tmp_path, scores_path=tmp_path / "scores.jsonl",
                           broker=broker_url)  # fmt: skip
    try:
        worker.wait_ready()
        client = redis.Redis.from_url(broker_url)
        try:
            first, entry = envelope(json.dumps(MARKER))
            client.lpush(QUEUE, entry)  # (the guard's client connects)
            assert wait_for(lambda: len(_letters(store_url)) == 1, 30), worker.text()[-3000:]
            second, entry = envelope(json.dumps(MARKER))
            store.stop()
            client.lpush(QUEUE, entry)
            # The screen met the store away (else this tests no restart): its push failed. Kept
            # away for three of the guard's pauses, so the message comes back and fails again.
            failed = lambda: worker.text().count("message_refusal_not_recorded")  # noqa: E731
            assert wait_for(lambda: failed() >= 1, 30), worker.text()[-3000:]
            time.sleep(3 * _STORE_DOWN_PAUSE_S)
            assert failed() == 1, worker.text()[-3000:]  # one line a minute, not one a try
        finally:
            client.close()
        store.start()
        keys = Counter({f"msg:{first}": 1, f"msg:{second}": 1})
        assert wait_for(lambda: Counter(x.message_key for x in _letters(store_url)) == keys, 60), worker.text()[-3000:]
        # Once recorded, the line says how many tries were held back since the first line.
        told = [line for line in worker.text().splitlines() if "message_refusal_not_recorded" in line]
        assert len(told) == 2, told
        assert int(re.findall(r"since_start=(\d+)", told[1])[0]) >= 2, told
        assert wait_for(lambda: queue_and_unacked(broker_url, QUEUE) == (0, 0), 30), worker.text()[-3000:]
        assert worker.proc.poll() is None
        assert all(x.reason == "bad_body" for x in _letters(store_url))
        assert MARKER not in worker.text()
    finally:
        worker.stop()
