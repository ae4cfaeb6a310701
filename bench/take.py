"""What taking a message off the queue costs: kombu's Redis transport beside the worker's.

    .venv/bin/python bench/take.py [--messages 200] [--sizes 65536,1048576] [--rounds 3]

kombu's transport takes a message with BRPOP and then records it as unacknowledged in a MULTI;
Redis dying between the two (or before BRPOP's reply arrived) lost it. The worker's transport
(``worker._guard.GuardedRedisTransport``) waits with a BLMOVE of the list onto itself, takes and
records the message in one script, then moves the record to the message's own tag. This prices
that: for each message size, rounds alternate the two transports on one private redis-server
(no persistence, as bench/backfill.py): the queue is filled, then one consumer takes and acks
every message. Measured: redis-server's CPU per message (INFO cpu) and the consumer process's
(the worker's transport also screens each entry, which kombu's does not). Writes
bench/results/take.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kombu import Connection  # noqa: E402

from tests._redis import RedisServer  # noqa: E402
from worker._guard import GuardedRedisTransport  # noqa: E402

TRANSPORTS: dict[str, Any] = {"kombu": "redis", "worker": GuardedRedisTransport}


def _redis_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _round(url: str, client: Any, transport: Any, messages: int, size: int) -> tuple[float, float]:
    """(redis-server ms, consumer ms) per message taken and acked."""
    client.flushdb()
    body = {"text": "x" * size}
    with Connection(url, transport="redis") as producer:
        queue = producer.SimpleQueue("take-bench")
        for _ in range(messages):
            queue.put(body)
    with Connection(url, transport=transport) as consumer:
        queue = consumer.SimpleQueue("take-bench")
        redis_before, own_before = _redis_cpu_s(client), time.process_time()
        for _ in range(messages):
            queue.get(timeout=30).ack()
        own = time.process_time() - own_before
        redis_cpu = _redis_cpu_s(client) - redis_before
    if client.llen("take-bench") or client.hlen("unacked"):
        raise RuntimeError("a message was left on the list or in the unacked record")
    return redis_cpu * 1000 / messages, own * 1000 / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--sizes", default="65536,1048576", help="message bodies in bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    server = RedisServer()
    server.start()
    client = server.client()
    figures: dict[str, dict[str, dict[str, list[float]]]] = {}
    try:
        for size in sizes:
            rows = figures.setdefault(str(size), {name: {"redis_ms": [], "consumer_ms": []} for name in TRANSPORTS})
            for _ in range(args.rounds):
                for name, transport in TRANSPORTS.items():
                    redis_ms, consumer_ms = _round(server.url(0), client, transport, args.messages, size)
                    rows[name]["redis_ms"].append(round(redis_ms, 3))
                    rows[name]["consumer_ms"].append(round(consumer_ms, 3))
    finally:
        client.close()
        server.close()

    result: dict[str, Any] = {"messages": args.messages, "rounds": args.rounds, "by_size": {}}
    for size, rows in figures.items():
        medians = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
        result["by_size"][size] = {
            **rows,
            "redis_ratio_worker_to_kombu": round(medians["worker"]["redis_ms"] / medians["kombu"]["redis_ms"], 2),
        }
        print(
            f"{int(size):>9} B: redis-server {medians['worker']['redis_ms']:.3f} ms/message with the worker's take "
            f"beside {medians['kombu']['redis_ms']:.3f} with kombu's BRPOP "
            f"({result['by_size'][size]['redis_ratio_worker_to_kombu']}x, medians of {rows['worker']['redis_ms']} "
            f"and {rows['kombu']['redis_ms']}); consumer {medians['worker']['consumer_ms']:.3f} beside "
            f"{medians['kombu']['consumer_ms']:.3f} ms/message"
        )
    result["machine"] = f"{platform.machine()}, shared cores (alternating rounds; compare within a run)"
    result["python"] = platform.python_version()
    path = Path(__file__).resolve().parent / "results" / "take.json"
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
