"""The visibility sweep over a large backlog (after a mass outage: many workers died holding
messages) runs on the worker's event loop: it must leave the worker serving its own work, and put
every due message back exactly once (worker/_guard.py, ``_GuardedQoS.restore_visible``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis
from kombu import Connection

from tests.worker._batches import batch, seed_due_unacked, send
from tests.worker._workers import QUICK_REDELIVERY, WorkerProcess, read_scores, wait_for
from worker._guard import SWEEP_PAGE, GuardedRedisTransport

BACKLOG = "sweep-backlog"  # where the seeded messages go back: a queue the worker does not consume


def _back_in(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["properties"]["delivery_tag"] for raw in client.lrange(queue, 0, -1)]


def test_a_worker_scores_its_batch_while_a_large_backlog_is_put_back(redis_url: str, tmp_path: Path) -> None:
    """30,000 due records land in kombu's unacked hash (one transaction) under a running worker.
    Once its sweep has begun putting them back, a batch is sent to the worker's queue: it is
    scored while due records are still in the hash (the sweep goes on in slices, the loop taking
    and acking between them). Before, one sweep call put all of them back on the event loop
    (4.5 s for 10,000), and the batch was scored only once the hash was empty. Then every seeded
    message is back on its queue exactly once, and the batch was scored once."""
    client = redis.Redis.from_url(redis_url)
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("sweeper", redis_url, tmp_path, scores_path=scores, env=QUICK_REDELIVERY)
    try:
        worker.wait_ready()
        tags = seed_due_unacked(client, 30_000, BACKLOG)
        assert wait_for(lambda: client.llen(BACKLOG) > 0, 30), worker.text()[-3000:]  # the sweep began
        send(redis_url, batch(range(2), ["length"], salt="during-sweep"))
        assert wait_for(lambda: len(read_scores(scores)) == 2, 120), worker.text()[-3000:]
        still_due = client.zcard("unacked_index")
        assert still_due > 0, "the batch was scored only after the whole backlog was put back"

        assert wait_for(lambda: client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0, 180)
        back = _back_in(client, BACKLOG)
        assert len(back) == len(tags)  # none put back twice
        assert sorted(back) == sorted(tags)  # none lost
        assert len(read_scores(scores)) == 2
        assert "sweep_failed" not in worker.text()
    finally:
        worker.stop()
        client.close()


def test_a_pass_goes_past_pages_of_held_records(redis_url: str) -> None:
    """Records the sweep must leave in place (their queue's key holds another Redis type:
    ``message_restore_held``) fill the first pages of a pass (the newest due): the pass counts
    them and goes past, putting back the older ones behind them, each once, in slices, and ends."""
    client = redis.Redis.from_url(redis_url)
    try:
        held = seed_due_unacked(client, 3 * SWEEP_PAGE, "sweep-wrongtype", prefix="held")
        client.set("sweep-wrongtype", "not a list")
        fine = seed_due_unacked(client, 2 * SWEEP_PAGE, BACKLOG, prefix="fine")
        # taken an hour before every held record: behind them in the sweep's order (newest first)
        client.zadd("unacked_index", {tag: float(client.zscore("unacked_index", tag) or 0) - 3600 for tag in fine})
        with Connection(redis_url, transport=GuardedRedisTransport) as connection:
            qos = connection.default_channel.qos
            qos.restore_visible(num=None, interval=1)
            calls, deadline = 1, time.monotonic() + 60
            while qos._sweep_ceil is not None and time.monotonic() < deadline:  # (no event loop: a slice a call)
                qos.restore_visible(num=None, interval=1)
                calls += 1
            assert qos._sweep_ceil is None, f"the pass never ended ({calls} calls)"
        assert sorted(_back_in(client, BACKLOG)) == sorted(fine)
        assert client.zcard("unacked_index") == len(held)
        assert sorted(t.decode() for t in client.hkeys("unacked")) == sorted(held)
    finally:
        client.close()
