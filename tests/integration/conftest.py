"""Integration fixtures: real dashboard servers (tests/integration/_servers.py), one per session;
a project of the test's own; the fake LLM as the scorers' judge; and the worker tests' Redis DB."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.fakellm import FakeLLMServer, Reply
from tests.integration._servers import Server, mlflow_server, phoenix_server
from tests.integration._traces import JUDGE_SCORE

# The worker tests' fixture (DB 11 of the session's Redis, emptied before and after each test):
# the integration tests' workers need nothing else of it.
from tests.worker.conftest import redis_url as redis_url


@pytest.fixture(scope="session")
def phoenix() -> Iterator[Server]:
    """One Phoenix server for the session (SQLite in a temp dir); tests keep to their own project."""
    with phoenix_server().running() as server:
        yield server


@pytest.fixture
def project(request: pytest.FixtureRequest) -> str:
    """A project name of this test's own (its traces and annotations are kept apart by it)."""
    return "ts-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]


@pytest.fixture(scope="session")
def mlflow() -> Iterator[Server]:
    """One MLflow tracking server for the session (SQLite in a temp dir); tests keep to their own experiment."""
    with mlflow_server().running() as server:
        yield server


@pytest.fixture
def judge_env(fake_llm_server: FakeLLMServer, fake_llm_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment pointing the scorers' judge (tests/integration/phoenix_scorers.py) at the
    fake LLM, which rates every answer JUDGE_SCORE; other chat calls (an agent app's) are not
    given that rule."""
    fake_llm_server.reset()
    fake_llm_server.rule(Reply.json({"score": JUDGE_SCORE}), system_contains="You grade a support agent")
    yield fake_llm_env
    fake_llm_server.reset()
