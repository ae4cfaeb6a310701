"""Shared fixtures: the fake LLM server plugin, this session's own Redis server, and structlog
configured as it was before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from tests._redis import RedisServer

pytest_plugins = ["tests.fakellm.plugin"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """This session's own Redis (own port, own password); tests use separate DBs on it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own (own port and password, nothing kept on disk), for a test that
    changes its configuration, stops it (SIGSTOP too: it is killed at the end whatever its state)
    or must not share its keys with another test."""
    with RedisServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _structlog_config_restored() -> Iterator[None]:
    """A command run in-process (``main([...])``) points structlog at the stderr pytest captured
    for that test, closed after it: a later test's log line failed writing there ("I/O operation
    on closed file"), in an order the full suite does not happen to run."""
    configured, config = structlog.is_configured(), structlog.get_config()
    yield
    if configured:
        structlog.configure(**config)
    else:  # unconfigured again, as a fresh process: the next command configures its own
        structlog.reset_defaults()
