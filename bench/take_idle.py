"""What a trickle of messages costs Redis while consumers wait: the worker's take beside kombu's.

    .venv/bin/python bench/take_idle.py [--messages 30] [--size 262144] [--consumers 1,3]

A worker's wait is a ``BLMOVE`` of the list onto itself (bench/take.py prices the take itself).
Redis serves every client waiting on a list while the list is non-empty, and the rotation leaves
it non-empty, so each idle consumer is sent the message in its wait's reply. Here K consumers
(threads, each its own connection) wait on one queue; a producer sends one message every 200 ms,
so every consumer is idle when it lands; each message is taken and acknowledged once. Measured
on a private redis-server: the bytes it sent per message (as a multiple of the message's size:
kombu's body is base64, 1.33x) and its CPU per message, for the worker's transport and kombu's
(BRPOP). Writes bench/results/take_idle.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kombu import Connection  # noqa: E402

from tests._redis import RedisServer  # noqa: E402
from worker._guard import GuardedRedisTransport  # noqa: E402

TRANSPORTS: dict[str, Any] = {"worker": GuardedRedisTransport, "kombu": "redis"}
QUEUE = "take-idle-bench"


def _redis_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _round(consumers: int, messages: int, size: int, transport: Any) -> dict[str, float]:
    server = RedisServer()
    server.start()
    client = server.client()
    stop = threading.Event()
    taken: list[int] = []

    def consume() -> None:
        with Connection(server.url(0), transport=transport) as conn:
            queue = conn.SimpleQueue(QUEUE)
            while not stop.is_set():
                try:
                    message = queue.get(timeout=0.5)
                except queue.Empty:
                    continue
                taken.append(1)
                message.ack()

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)  # every consumer waiting
        sent_before, cpu_before = client.info("stats")["total_net_output_bytes"], _redis_cpu_s(client)
        with Connection(server.url(0), transport="redis") as producer:
            queue = producer.SimpleQueue(QUEUE)
            for _ in range(messages):
                queue.put({"text": "x" * size})
                time.sleep(0.2)  # a trickle: the consumers are idle again when the next lands
        deadline = time.monotonic() + 60
        while len(taken) < messages and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(taken) != messages:
            raise RuntimeError(f"{len(taken)} of {messages} messages taken")
        sent = client.info("stats")["total_net_output_bytes"] - sent_before
        cpu = _redis_cpu_s(client) - cpu_before
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
        server.close()
    return {
        "sent_per_message_x_size": round(sent / messages / size, 2),
        "redis_ms_per_message": round(cpu * 1000 / messages, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--size", type=int, default=262_144, help="message body in bytes")
    parser.add_argument("--consumers", default="1,3", help="idle consumers, comma-separated")
    args = parser.parse_args()
    result: dict[str, Any] = {"messages": args.messages, "size": args.size, "by_consumers": {}}
    for consumers in (int(k) for k in args.consumers.split(",")):
        rows = {name: _round(consumers, args.messages, args.size, t) for name, t in TRANSPORTS.items()}
        result["by_consumers"][str(consumers)] = rows
        for name, row in rows.items():
            print(
                f"{consumers} idle consumer(s), {name:6}: Redis sent {row['sent_per_message_x_size']:.2f}x the message "
                f"per message, {row['redis_ms_per_message']:.2f} ms of its CPU"
            )
    result["machine"] = f"{platform.machine()}, shared cores"
    result["python"] = platform.python_version()
    out = ROOT / "bench" / "results" / "take_idle.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
