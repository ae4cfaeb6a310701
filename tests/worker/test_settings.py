"""Worker settings from TRACESCORE_* variables: defaults, parsing, clear errors."""

from __future__ import annotations

import pytest

from worker._settings import SettingsError, load_settings


def test_defaults_are_consistent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults: local Redis broker, store = broker, claims lapse before a redelivery."""
    for var in ("TRACESCORE_BROKER_URL", "TRACESCORE_REDIS_URL", "TRACESCORE_WRITER"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings()
    assert settings.broker_url == "redis://127.0.0.1:6379/0"
    assert settings.store_url == settings.broker_url
    assert settings.claim_ttl < settings.visibility_timeout
    assert settings.task_soft_time_limit < settings.task_time_limit < settings.visibility_timeout


def test_rate_limits_parse_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRACESCORE_RATE_LIMITS is a JSON object of per-model budgets; others use the defaults."""
    monkeypatch.setenv("TRACESCORE_RATE_LIMITS", '{"openai/gpt-4o-mini": {"requests_per_minute": 500}}')
    monkeypatch.setenv("TRACESCORE_DEFAULT_TOKENS_PER_MINUTE", "1000")
    settings = load_settings()
    assert settings.rate_limit("openai/gpt-4o-mini").requests_per_minute == 500
    assert settings.rate_limit("anthropic/x").tokens_per_minute == 1000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRACESCORE_MODEL_CONCURRENCY": "lots"}, "TRACESCORE_MODEL_CONCURRENCY"),
        ({"TRACESCORE_RATE_LIMITS": "{not json"}, "TRACESCORE_RATE_LIMITS"),
        (
            {
                "TRACESCORE_VISIBILITY_TIMEOUT": "100",
                "TRACESCORE_TASK_TIME_LIMIT": "200",
                "TRACESCORE_TASK_SOFT_TIME_LIMIT": "150",
            },
            "TRACESCORE_VISIBILITY_TIMEOUT .100.0. must exceed",
        ),
        ({"TRACESCORE_WRITER": "jsonl"}, "TRACESCORE_WRITER_PATH"),
        ({"TRACESCORE_WRITER": "kafka"}, "TRACESCORE_WRITER"),
    ],
)
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    """A bad value raises SettingsError naming the variable and what it expects."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=message):
        load_settings()
