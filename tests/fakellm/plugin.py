"""pytest fixtures for the fake LLM server (loaded for every test by tests/conftest.py).

- ``fake_llm_server`` (session): one running :class:`FakeLLMServer` for the whole session.
- ``fake_llm``: that server, reset (no script, no rules, no latency, no recorded requests), with
  ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``
  pointing the real SDKs at it for the test.
- ``fake_llm_env``: just the environment variables, as a dict (for subprocesses).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakellm._server import FakeLLMServer

FAKE_OPENAI_KEY = "sk-fakellm-test"
FAKE_ANTHROPIC_KEY = "sk-ant-fakellm-test"


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    """One fake LLM server for the session, on a free loopback port."""
    server = FakeLLMServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_llm_env(fake_llm_server: FakeLLMServer) -> dict[str, str]:
    """The SDK environment variables that point at the fake server."""
    return {
        "OPENAI_BASE_URL": fake_llm_server.openai_base_url,
        "OPENAI_API_KEY": FAKE_OPENAI_KEY,
        "ANTHROPIC_BASE_URL": fake_llm_server.anthropic_base_url,
        "ANTHROPIC_API_KEY": FAKE_ANTHROPIC_KEY,
    }


@pytest.fixture
def fake_llm(
    fake_llm_server: FakeLLMServer, fake_llm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeLLMServer]:
    """The session's fake server, reset, with the SDK env vars set for this test."""
    fake_llm_server.reset()
    for key, value in fake_llm_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    yield fake_llm_server
    fake_llm_server.reset()
