"""How long the visibility sweep keeps a worker's event loop busy with a backlog of due messages.

    .venv/bin/python bench/sweep.py [--messages 10000,100000]

After a mass outage kombu's ``unacked`` hash holds many messages taken by workers that died; the
sweep (``_GuardedQoS.restore_visible``) puts them back, and it runs on the consumer's event loop:
while one call of it runs, the worker takes no message, acks nothing and answers no control
command. Here N due records (kombu's own shape, each to be put back on a queue of their own) are
seeded on a private redis-server and the worker's transport sweeps them, called as the event loop
calls it (one call a turn, SWEEP_PAUSE_S apart: the loop's pause between a pass's slices), until
the hash is empty. Printed
and written to bench/results/sweep.json: the longest single call (the longest the loop is held),
the number of calls, and the total time to put every message back; each message is checked to be
back in its queue exactly once. With ``--worker``, the same backlog under a real worker
(``celery -A worker worker``, solo pool, sweep every second): a batch sent as soon as the sweep
has begun, and the time until it is scored (the worker's own work waiting on the sweep).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kombu import Connection  # noqa: E402

from tests._redis import RedisServer  # noqa: E402
from tests.worker._batches import seed_due_unacked  # noqa: E402
from worker._guard import SWEEP_PAUSE_S, GuardedRedisTransport  # noqa: E402

QUEUE = "sweep-bench"


def _round(messages: int) -> dict[str, Any]:
    server = RedisServer()
    server.start()
    client = server.client()
    try:
        tags = seed_due_unacked(client, messages, QUEUE)
        with Connection(server.url(0), transport=GuardedRedisTransport) as conn:
            qos = conn.default_channel.qos
            calls: list[float] = []
            began = time.perf_counter()
            while client.zcard("unacked_index") and len(calls) < 1_000_000:
                t0 = time.perf_counter()
                qos.restore_visible(num=None, interval=1)  # as kombu's timer calls it (throttle 1)
                calls.append(time.perf_counter() - t0)
                time.sleep(SWEEP_PAUSE_S)  # (the worker's loop goes on with the pass this much later)
            total = time.perf_counter() - began
        back = [json.loads(raw)["properties"]["delivery_tag"] for raw in client.lrange(QUEUE, 0, -1)]
        assert sorted(back) == sorted(tags), "a message lost or put back twice"
        assert client.hlen("unacked") == 0
        return {
            "messages": messages,
            "longest_call_s": round(max(calls), 4),
            "calls": len(calls),
            "total_s": round(total, 3),
            "per_message_ms": round(total / messages * 1e3, 4),
        }
    finally:
        client.close()
        server.close()


def _worker_round(messages: int) -> dict[str, Any]:
    import tempfile

    from tests.worker._batches import batch, send
    from tests.worker._workers import QUICK_REDELIVERY, WorkerProcess, read_scores, wait_for

    server = RedisServer()
    server.start()
    client = server.client()
    tmp = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    scores = tmp / "scores.jsonl"
    worker = WorkerProcess("sweep-bench", server.url(0), tmp, scores_path=scores, env=QUICK_REDELIVERY)
    try:
        worker.wait_ready()
        seed_due_unacked(client, messages, QUEUE)
        began = time.perf_counter()
        assert wait_for(lambda: client.llen(QUEUE) > 0, 60, interval=0.005)
        sent = time.perf_counter()
        send(server.url(0), batch(range(2), ["length"], salt="bench"))
        assert wait_for(lambda: len(read_scores(scores)) == 2, 600, interval=0.01)
        scored = time.perf_counter()
        still_due = int(client.zcard("unacked_index"))
        assert wait_for(lambda: client.zcard("unacked_index") == 0, 600, interval=0.01)
        drained = time.perf_counter()
        assert client.llen(QUEUE) == messages
        return {
            "messages": messages,
            "batch_scored_after_s": round(scored - sent, 3),
            "still_due_when_scored": still_due,
            "all_back_s": round(drained - began, 3),
        }
    finally:
        worker.stop()
        client.close()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", default="10000,100000")
    parser.add_argument("--worker", action="store_true", help="also under a real worker process")
    args = parser.parse_args()
    rounds = []
    for messages in (int(m) for m in args.messages.split(",")):
        row = _round(messages)
        rounds.append(row)
        print(
            f"{messages:>7} due: loop held at most {row['longest_call_s'] * 1e3:9.1f} ms, "
            f"{row['calls']:>5} calls, all back in {row['total_s']:7.2f} s ({row['per_message_ms']} ms each)"
        )
    workers = []
    for messages in (int(m) for m in args.messages.split(",")) if args.worker else ():
        row = _worker_round(messages)
        workers.append(row)
        print(
            f"{messages:>7} due, real worker: a batch sent as the sweep began scored "
            f"{row['batch_scored_after_s']:7.2f} s later ({row['still_due_when_scored']} still due), "
            f"all back in {row['all_back_s']:7.2f} s"
        )
    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rounds": rounds,
        "worker_rounds": workers,
    }
    out = ROOT / "bench" / "results" / "sweep.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
