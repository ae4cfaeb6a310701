"""How long the store's Lua scripts hold Redis at their worst, at the shipped defaults.

    .venv/bin/python bench/store_scripts.py [--port 27400] [--only NAME,...]

Redis runs one script at a time and serves nobody else meanwhile: the workers' score writes, the
broker's deliveries, heartbeats. The scripts whose work grows with a key (not with the call) are
priced here on a private redis-server, each case from a freshly filled store:

- ``dlq_recount``: 256 MiB of dead letters (256 of 1 MiB, ``DLQ_MAX_BYTES``) and their byte
  counter lost (deleted, or a list left by a release before the counter): the next push sums it.
- ``dlq_bytes_lowered``: the same list, ``DLQ_MAX_BYTES`` lowered to 16 MiB: 240 letters go.
- ``dlq_letters_lowered``: 100,000 small letters (``DLQ_MAX_LETTERS``), the bound lowered to
  1,000: 99,000 go.
- ``dlq_take_oldest``: ``dlq drop``/``dlq retry`` of the 2,000 oldest of 100,000 letters (each
  read a page at a time from the oldest, and taken).
- ``dlq_take_by_id``: ``dlq retry <id>``/``dlq drop <id>`` of the oldest of 256 letters of 1 MiB.
- ``dlq_list``: ``dlq list`` (50 letters, its default) of 256 letters of 1 MiB.
- ``sink_old_order``: 100,000 sink dead letters of the release before (no order entry), bound
  50,000: the first new letter orders them and drops 50,001.
- ``sink_lowered``: 100,000 ordered sink dead letters, ``SINK_MAX_DEAD_LETTERS`` lowered to 1,000.
- ``sinks_drop_all``: ``sinks drop --all`` of 100,000 letters (pages of 500).
- ``sinks_redrive_all``: ``sinks retry --all`` of 100,000 letters (their ids read at once).

Measured per case, each on a fresh redis-server (its memory peak is never reset): the longest
single command (SLOWLOG: what a second client waits at most), the longest PING a second client
saw while it ran (polled in a thread of this process: an upper bound, it waits for the GIL too),
the operation's whole time, and Redis's memory
(``used_memory_peak`` over the case's start, an upper bound: filling the store counts too;
``used_memory_vm_eval``: the Lua heap after). Writes bench/results/store_scripts.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._redis import RedisServer  # noqa: E402
from worker import _keys  # noqa: E402
from worker.store import DeadLetter, Lease, RedisDeadLetters, RedisOutbox, SinkDeadLetter  # noqa: E402

MIB = 1024 * 1024
SINK = "bench"


class PingPoller:
    """A second client PINGing in a loop: the longest answer it waited for."""

    def __init__(self, server: RedisServer) -> None:
        self._client = server.client()
        self._stop = threading.Event()
        self.longest_ms = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self._client.ping()
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - started) * 1000)
            time.sleep(0.001)

    def __enter__(self) -> PingPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


def _letter_json(i: int, payload_bytes: int) -> str:
    return DeadLetter(reason="handler_error", payload="x" * payload_bytes, failed_at=1_000_000 + i).model_dump_json()


def _fill_dlq(client: Any, letters: int, payload_bytes: int, *, counter: bool) -> None:
    pipe = client.pipeline(transaction=False)
    total = 0
    for i in range(letters):
        raw = _letter_json(i, payload_bytes)
        total += len(raw.encode())
        pipe.lpush(_keys.dlq_key(), raw)
        if i % 16 == 15:
            pipe.execute()
    pipe.hset(_keys.dlq_reasons_key(), "handler_error", letters)
    if counter:
        pipe.set(_keys.dlq_bytes_key(), total)
    pipe.execute()


def _fill_sink(client: Any, letters: int, *, ordered: bool) -> None:
    dead, order = _keys.outbox_dead_key(SINK), _keys.outbox_dead_order_key(SINK)
    client.sadd(_keys.outbox_sinks_key(), SINK)
    for start in range(0, letters, 5000):
        pipe = client.pipeline(transaction=False)
        mapping = {}
        scores = {}
        for i in range(start, min(letters, start + 5000)):
            sid = f"score-{i:07d}"
            mapping[sid] = SinkDeadLetter(
                score_id=sid, sink=SINK, reason="refused", detail="d" * 200, failed_at=1_000_000 + i
            ).model_dump_json()
            scores[sid] = (1_000_000 + i) * 1000
        pipe.hset(dead, mapping=mapping)
        if ordered:
            pipe.zadd(order, scores)
        pipe.execute()


def _bury_one(outbox: RedisOutbox, client: Any) -> None:
    """One new dead letter through a lease, as a drainer buries it."""
    client.zadd(_keys.outbox_key(SINK), {"new-score": 0})
    lease = outbox.lease(SINK, 1, 60)
    if not isinstance(lease, Lease) or not lease.ids:
        raise RuntimeError("the new score was not leased")
    outbox.dead(lease, [SinkDeadLetter(score_id="new-score", sink=SINK, reason="refused")])


def _dlq_push(url: str, **bounds: int) -> None:
    async def go() -> None:
        letters = RedisDeadLetters(url, **bounds)  # type: ignore[arg-type]
        try:
            await letters.push(DeadLetter(reason="handler_error", payload="new"))
        finally:
            await letters.close()

    asyncio.run(go())


def _sinks_drop_all(url: str) -> None:
    outbox = RedisOutbox(url)
    try:
        for _ in outbox.drop_dead_letters(SINK):
            pass
    finally:
        outbox.close()


def _sink_bury(url: str, client: Any, bound: int) -> None:
    outbox = RedisOutbox(url, max_dead_letters=bound)
    try:
        _bury_one(outbox, client)
    finally:
        outbox.close()


CASES = (
    "dlq_recount",
    "dlq_bytes_lowered",
    "dlq_letters_lowered",
    "dlq_take_oldest",
    "dlq_take_by_id",
    "dlq_list",
    "sink_old_order",
    "sink_lowered",
    "sinks_drop_all",
    "sinks_redrive_all",
)


def _dlq_take_oldest(url: str, count: int) -> None:
    """``dlq drop``'s way: read the oldest letters a page at a time and take each."""

    async def go() -> None:
        letters = RedisDeadLetters(url)
        try:
            taken = 0
            async for letter in letters.each():
                await letters.take(letter.id)
                taken += 1
                if taken >= count:
                    break
        finally:
            await letters.close()

    asyncio.run(go())


def _dlq_take_by_id(url: str, client: Any) -> None:
    """``dlq retry <id>``/``dlq drop <id>``'s way: a letter taken by its id alone (the oldest)."""
    oldest = DeadLetter.model_validate_json(client.lindex(_keys.dlq_key(), -1))

    async def go() -> None:
        letters = RedisDeadLetters(url)
        try:
            if await letters.take(oldest.id) is None:
                raise RuntimeError("the oldest letter was not taken")
        finally:
            await letters.close()

    asyncio.run(go())


def _dlq_list(url: str) -> None:
    """``dlq list``: the 50 newest letters (its default ``--limit``)."""

    async def go() -> None:
        letters = RedisDeadLetters(url)
        try:
            if len(await letters.latest(50)) != 50:
                raise RuntimeError("dlq list did not list 50 letters")
        finally:
            await letters.close()

    asyncio.run(go())


def _sinks_redrive_all(url: str) -> None:
    outbox = RedisOutbox(url)
    try:
        if outbox.redrive(SINK) != 100_000:
            raise RuntimeError("not every letter was redriven")
    finally:
        outbox.close()


def cases(url: str, client: Any) -> dict[str, tuple[Any, Any, Any]]:
    """name -> (fill, operation, check of the end state)."""
    dlq_len = lambda: int(client.llen(_keys.dlq_key()))  # noqa: E731

    def dlq_bytes() -> dict[str, Any]:
        counter = client.get(_keys.dlq_bytes_key())
        listed = sum(len(x) for x in client.lrange(_keys.dlq_key(), 0, -1))
        return {
            "letters_after": dlq_len(),
            "bytes_counter": int(counter or -1),
            "bytes_exact": listed == int(counter or -1),
        }

    sink_len = lambda: int(client.hlen(_keys.outbox_dead_key(SINK)))  # noqa: E731
    return {
        "dlq_recount": (
            lambda: _fill_dlq(client, 256, MIB - 300, counter=False),
            lambda: _dlq_push(url),
            dlq_bytes,
        ),
        "dlq_bytes_lowered": (
            lambda: _fill_dlq(client, 256, MIB - 300, counter=True),
            lambda: _dlq_push(url, max_bytes=16 * MIB),
            lambda: {**dlq_bytes(), "dropped": client.hgetall(_keys.dlq_dropped_key())},
        ),
        "dlq_letters_lowered": (
            lambda: _fill_dlq(client, 100_000, 100, counter=True),
            lambda: _dlq_push(url, max_letters=1_000),
            lambda: {**dlq_bytes(), "dropped": client.hgetall(_keys.dlq_dropped_key())},
        ),
        "dlq_take_oldest": (
            lambda: _fill_dlq(client, 100_000, 100, counter=True),
            lambda: _dlq_take_oldest(url, 2_000),
            dlq_bytes,
        ),
        "dlq_take_by_id": (
            lambda: _fill_dlq(client, 256, MIB - 300, counter=True),
            lambda: _dlq_take_by_id(url, client),
            dlq_bytes,
        ),
        "dlq_list": (
            lambda: _fill_dlq(client, 256, MIB - 300, counter=True),
            lambda: _dlq_list(url),
            dlq_bytes,
        ),
        "sink_old_order": (
            lambda: _fill_sink(client, 100_000, ordered=False),
            lambda: _sink_bury(url, client, 50_000),
            lambda: {"letters_after": sink_len(), "order_after": client.zcard(_keys.outbox_dead_order_key(SINK))},
        ),
        "sink_lowered": (
            lambda: _fill_sink(client, 100_000, ordered=True),
            lambda: _sink_bury(url, client, 1_000),
            lambda: {"letters_after": sink_len(), "order_after": client.zcard(_keys.outbox_dead_order_key(SINK))},
        ),
        "sinks_drop_all": (
            lambda: _fill_sink(client, 100_000, ordered=True),
            lambda: _sinks_drop_all(url),
            lambda: {"letters_after": sink_len(), "order_after": client.zcard(_keys.outbox_dead_order_key(SINK))},
        ),
        "sinks_redrive_all": (
            lambda: _fill_sink(client, 100_000, ordered=True),
            lambda: _sinks_redrive_all(url),
            lambda: {"letters_after": sink_len(), "order_after": client.zcard(_keys.outbox_dead_order_key(SINK))},
        ),
    }


def measure(server: RedisServer, client: Any, fill: Any, operation: Any, check: Any) -> dict[str, Any]:
    fill()
    client.config_set("slowlog-log-slower-than", 1000)  # microseconds
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    client.memory_purge()
    memory = client.info("memory")
    base_used = int(memory["used_memory"])
    with PingPoller(server) as poller:
        started = time.perf_counter()
        operation()
        whole_ms = (time.perf_counter() - started) * 1000
    slow = client.slowlog_get(100_000)
    memory = client.info("memory")
    longest = max(slow, key=lambda e: e["duration"], default=None)
    return {
        "longest_command_ms": round(longest["duration"] / 1000, 1) if longest else 0.0,
        "longest_command": (longest["command"].decode(errors="replace")[:60] if longest else ""),
        "commands_over_1ms": len(slow),
        "longest_ping_ms": round(poller.longest_ms, 1),
        "whole_ms": round(whole_ms, 1),
        "used_memory_before_mib": round(base_used / MIB, 1),
        "used_memory_peak_mib": round(int(memory["used_memory_peak"]) / MIB, 1),
        "peak_over_before_mib": round((int(memory["used_memory_peak"]) - base_used) / MIB, 1),
        "used_memory_vm_eval_mib": round(int(memory.get("used_memory_vm_eval", memory["used_memory_lua"])) / MIB, 1),
        "end": {k: (v if isinstance(v, int) else str(v)) for k, v in check().items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None, help="the private redis-server's port (else a free one)")
    parser.add_argument("--only", default="", help="cases to run, comma-separated")
    args = parser.parse_args()

    result: dict[str, Any] = {"cases": {}}
    for name in CASES:
        if args.only and name not in args.only.split(","):
            continue
        # A server per case: used_memory_peak is never reset, and an earlier case's would hide this one's.
        server = RedisServer(args.port)
        server.start()
        client = server.client()
        try:
            fill, operation, check = cases(server.url(0), client)[name]
            got = measure(server, client, fill, operation, check)
            result["cases"][name] = got
            print(
                f"{name:>20}: longest command {got['longest_command_ms']} ms ({got['longest_command']!r}), "
                f"longest PING {got['longest_ping_ms']} ms, whole {got['whole_ms']} ms, "
                f"{got['commands_over_1ms']} commands over 1 ms; memory peak +{got['peak_over_before_mib']} MiB "
                f"over {got['used_memory_before_mib']}, Lua heap after {got['used_memory_vm_eval_mib']} MiB; "
                f"end {got['end']}"
            )
        finally:
            client.close()
            server.close()
    result["redis"] = "7.0 (redis-server on PATH), no persistence"
    result["machine"] = f"{platform.machine()}, 2 shared cores"
    result["python"] = platform.python_version()
    path = Path(__file__).resolve().parent / "results" / "store_scripts.json"
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
