"""How the worker's transport takes messages (worker/_guard.py: a wait on the first queue's list,
then one script that takes and records): every list kombu would read is read, and consumers
racing for one list each get every message exactly once, all recorded until acked."""

from __future__ import annotations

import threading

import redis
from kombu import Connection

from tests._redis import RedisServer
from tests.worker._workers import queue_and_unacked
from worker._guard import GuardedRedisTransport


def test_a_message_on_a_priority_list_is_taken_though_the_wait_watches_the_first(own_redis: RedisServer) -> None:
    """kombu puts a message with a priority on a list of its own; the wait blocks on the queue's
    first list only, so that message is found by the take that follows the wait's timeout."""
    url = own_redis.url(0)
    with Connection(url, transport="redis") as sender:
        sender.SimpleQueue("prio").put({"n": 1}, priority=6)
    client = redis.Redis.from_url(url)
    try:
        assert client.llen("prio") == 0  # (on kombu's list for priority 6, not the queue's first)
        with Connection(url, transport=GuardedRedisTransport) as taker:
            message = taker.SimpleQueue("prio").get(timeout=10)
            assert message.payload == {"n": 1}
            assert client.hlen("unacked") == 1  # recorded until acked
            message.ack()
        assert client.hlen("unacked") == 0
        assert client.zcard("unacked_index") == 0
    finally:
        client.close()


def test_consumers_racing_for_one_list_take_each_message_once(own_redis: RedisServer) -> None:
    """Three consumers wait on the same list while 300 messages arrive: each message is taken by
    exactly one of them, and none is left on the list or in the unacked record."""
    url = own_redis.url(0)
    total, consumers = 300, 3
    taken: list[list[int]] = [[] for _ in range(consumers)]
    done = threading.Event()
    errors: list[BaseException] = []

    def consume(index: int) -> None:
        try:
            with Connection(url, transport=GuardedRedisTransport) as connection:
                queue = connection.SimpleQueue("race")
                while not done.is_set():
                    try:
                        message = queue.get(timeout=0.5)
                    except queue.Empty:
                        continue
                    taken[index].append(message.payload["n"])
                    message.ack()
                    if sum(len(t) for t in taken) >= total:
                        done.set()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(consumers)]
    for thread in threads:
        thread.start()
    with Connection(url, transport="redis") as sender:
        queue = sender.SimpleQueue("race")
        for n in range(total):
            queue.put({"n": n})
    assert done.wait(60), [len(t) for t in taken]
    for thread in threads:
        thread.join(10)
    assert errors == []
    everything = sorted(n for t in taken for n in t)
    assert everything == list(range(total))
    assert queue_and_unacked(url, "race") == (0, 0)
