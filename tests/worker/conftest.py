"""Redis DB 11 for the worker tests; every key is removed after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

REDIS_URL = os.environ.get("TRACESCORE_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")


@pytest.fixture
def redis_url() -> Iterator[str]:
    """DB 11, emptied before and after the test (never db 0, never FLUSHALL)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("needs a Redis server on 127.0.0.1:6379")
    client.flushdb()
    try:
        yield REDIS_URL
    finally:
        client.flushdb()
        client.close()
