"""The node's drainer of a sink SIGKILLed mid-delivery, with real prefork workers, Redis and an
OTLP receiver: another process of the node takes the sink over, and every score reaches it.

The README: one drainer per sink per node (the holder of a lock file in the temp directory),
another taking over within a second when it ends; a drainer that dies mid-delivery leaves its ids
to come back when its lease runs out, so each score reaches the sink at least once. The holder is
found as production would have it, by the lock (``/proc/locks``), and only that pid is killed.
tests/worker/test_outbox.py covers a holder that exits cleanly.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import redis

from tests._otlp_receiver import OtlpReceiver
from tests.worker._batches import batch
from tests.worker._workers import QUICK_REDELIVERY, WorkerProcess, queue_and_unacked, wait_for
from tracing import CelerySink, score_id_for
from tracing.queue import ScoreBatch
from worker import _keys
from worker.store import RedisOutbox

LEASE_S = 3.0
TAKEOVER_S = 1.0  # the README's "within a second" (a drainer's poll)
SLACK_S = 10.0  # a loaded two-core machine: the bound beyond what the README names


class Producer(threading.Thread):
    """Sends a batch of four runs every ``every_s`` until stopped."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.sent: list[ScoreBatch] = []
        self.halt = threading.Event()

    def run(self) -> None:
        sink = CelerySink(self.url)
        n = 0
        try:
            while not self.halt.is_set():
                b = batch(range(n * 4, n * 4 + 4), ["slow"], salt="takeover", batch_id=f"takeover-{n}")
                n += 1
                sink.send(b)
                self.sent.append(b)
                time.sleep(self.every_s)
        finally:
            sink.close()


def _holders(lock_dir: Path) -> list[int]:
    """The pids holding a drainer's lock file in ``lock_dir`` (POSIX locks, as the kernel lists them)."""
    inodes = {f":{p.stat().st_ino} " for p in lock_dir.glob("tracescore-drainer-*.lock")}
    with open("/proc/locks") as locks:
        return [int(line.split()[4]) for line in locks if any(i in line for i in inodes)]


def _children(pid: int) -> set[int]:
    tasks = Path(f"/proc/{pid}/task")
    kids: set[int] = set()
    for task in tasks.iterdir() if tasks.exists() else []:
        kids |= {int(k) for k in (task / "children").read_text().split()}
    return kids


def _stored(url: str) -> set[str]:
    prefix = _keys.record_key("")
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return {key[len(prefix) :] for key in client.scan_iter(match=f"{prefix}*", count=1000)}


def test_the_drainer_holder_sigkilled_mid_delivery_is_taken_over_and_loses_no_score(
    redis_url: str, tmp_path: Path
) -> None:
    lock_dir = tmp_path / "tmpdir"  # the workers' temp directory: this node's drainer locks, ours only
    lock_dir.mkdir()
    receiver = OtlpReceiver().start()
    env = {
        **QUICK_REDELIVERY,
        "TMPDIR": str(lock_dir),
        "TSTEST_SLOW_S": "0.3",
        "TRACESCORE_SINKS": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2",
        "TRACESCORE_SINK_LEASE_SECONDS": str(LEASE_S),
        "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2",
        "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "0.5",
        "TRACESCORE_SINK_MAX_ATTEMPTS": "1000",
    }
    workers = [
        WorkerProcess(
            name, redis_url, tmp_path, scores_path=tmp_path / "unused.jsonl", env=env, pool="prefork", concurrency=2
        )
        for name in ("takeover-a", "takeover-b")
    ]
    producer = Producer(redis_url)
    try:
        for worker in workers:
            worker.wait_ready()
        producer.start()
        logs = lambda: "\n----\n".join(w.text()[-3000:] for w in workers)  # noqa: E731
        assert wait_for(lambda: len(receiver.score_ids()) >= 16, 60), logs()

        # A delivery in flight: the receiver holds the next request, the holder's lease on its ids.
        receiver.hang.clear()
        asked = receiver.requests
        assert wait_for(lambda: receiver.requests > asked, 30), logs()
        holders = _holders(lock_dir)
        assert len(holders) == 1, holders  # one drainer of the sink on the node
        victim = holders[0]
        owner = next(w for w in workers if victim in {w.proc.pid, *_children(w.proc.pid)})
        survivor = next(w for w in workers if w is not owner)
        receiver.status = 503  # the held request is never taken: its ids come back by the lease alone
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        stored = _stored(redis_url)  # every score stored by now is owed to the sink
        owed = stored - set(receiver.score_ids())
        held = receiver.requests
        receiver.hang.set()
        assert wait_for(lambda: receiver.answered >= held, 10)
        receiver.status = 200
        assert owed, "nothing was owed to the sink as its drainer died: the test would prove nothing"

        # Another process of the node holds the turn: one of the surviving worker's.
        survivors = lambda: {survivor.proc.pid, *_children(survivor.proc.pid)}  # noqa: E731
        assert wait_for(lambda: bool(set(_holders(lock_dir)) & survivors()), TAKEOVER_S + SLACK_S), (
            f"no process took the sink over from {victim}: holders {_holders(lock_dir)}\n{logs()}"
        )
        # What was stored when the holder died, its leased ids among them, reaches the sink
        # within a lease plus the bound.
        assert wait_for(lambda: stored <= set(receiver.score_ids()), LEASE_S + SLACK_S), (
            f"{len(stored - set(receiver.score_ids()))} of {len(stored)} stored scores not delivered "
            f"{time.monotonic() - killed_at:.1f} s after the kill\n{logs()}"
        )
        # And scores keep reaching it: the runs sent since, and the killed worker's messages
        # (back after the visibility timeout), scored by the survivor.
        sent = len(producer.sent)
        assert wait_for(lambda: len(producer.sent) >= sent + 10, 30)
        producer.halt.set()
        producer.join(10)
        expected = {
            score_id_for(r.trace_id, t, "slow", "1")
            for b in producer.sent
            for r in b.requests
            for t in r.target_span_ids
        }
        assert wait_for(lambda: expected <= set(receiver.score_ids()), 90), (
            f"{len(expected - set(receiver.score_ids()))} of {len(expected)} scores never reached the sink\n{logs()}"
        )
        assert wait_for(lambda: queue_and_unacked(redis_url, "tracescore") == (0, 0), 60), logs()
        outbox = RedisOutbox(redis_url)
        try:
            assert wait_for(lambda: outbox.counts()["otlp"].pending == 0, 30), outbox.counts()
            assert outbox.counts()["otlp"].failed == 0, outbox.dead_letters("otlp")
        finally:
            outbox.close()
        # At least once each, nothing but what was sent.
        assert set(receiver.score_ids()) == expected
        assert survivor.proc.poll() is None, logs()
    finally:
        producer.halt.set()
        receiver.hang.set()
        for worker in workers:
            worker.stop()
        receiver.stop()
