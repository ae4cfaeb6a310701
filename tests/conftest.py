"""Shared fixtures: the fake LLM server plugin, and this session's own Redis server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._redis import RedisServer

pytest_plugins = ["tests.fakellm.plugin"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """This session's own Redis (own port, own password); tests use separate DBs on it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
