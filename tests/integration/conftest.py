"""Integration fixtures: real dashboard servers (tests/integration/_servers.py), one per session."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.integration._servers import Server, mlflow_server, phoenix_server


@pytest.fixture(scope="session")
def phoenix() -> Iterator[Server]:
    """One Phoenix server for the session (SQLite in a temp dir); tests keep to their own project."""
    server = phoenix_server().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def project(request: pytest.FixtureRequest) -> str:
    """A project name of this test's own (its traces and annotations are kept apart by it)."""
    return "ts-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]


@pytest.fixture(scope="session")
def mlflow() -> Iterator[Server]:
    """One MLflow tracking server for the session (SQLite in a temp dir); tests keep to their own experiment."""
    server = mlflow_server().start()
    try:
        yield server
    finally:
        server.close()
