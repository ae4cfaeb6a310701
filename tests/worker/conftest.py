"""DB 11 of the session's own Redis for the worker tests (every key is removed after each test), and
a Redis of a test's own for the tests that stop and start it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._redis import RedisServer
from tests.worker._workers import WorkerProcess


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """DB 11, emptied before and after the test."""
    client = redis_server.client(11)
    client.flushdb()
    try:
        yield redis_server.url(11)
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, persistent: stopped (even by SIGKILL) and started again, it
    keeps what it acknowledged (the queue, the store)."""
    server = RedisServer(persistent=True)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def started(redis_url: str) -> Iterator[list[WorkerProcess]]:
    """The worker processes a test starts (it appends them), each stopped after it, before
    ``redis_url``'s database is emptied (a worker still running would write to it again)."""
    workers: list[WorkerProcess] = []
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()
