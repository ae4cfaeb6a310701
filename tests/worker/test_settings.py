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


def test_a_score_ttl_of_a_day_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortest score TTL allowed (the refusal above names it) is accepted."""
    monkeypatch.setenv("TRACESCORE_SCORE_TTL_SECONDS", "86400")
    assert load_settings().score_ttl_seconds == 86400


def test_rate_limits_parse_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRACESCORE_RATE_LIMITS is a JSON object of per-model budgets; others use the defaults."""
    monkeypatch.setenv("TRACESCORE_RATE_LIMITS", '{"openai/gpt-4o-mini": {"requests_per_minute": 500}}')
    monkeypatch.setenv("TRACESCORE_DEFAULT_TOKENS_PER_MINUTE", "1000")
    settings = load_settings()
    assert settings.rate_limit("openai/gpt-4o-mini").requests_per_minute == 500
    assert settings.rate_limit("anthropic/x").tokens_per_minute == 1000


def test_a_retry_delay_stays_a_number_past_a_floats_exponent() -> None:
    """A message waiting for an unwritable store counts retries past 1023 (its waits are no tries):
    the delay's doubling (backoff * 2**retries) overflowed a float there, and the task failed."""
    settings = load_settings(retry_backoff_seconds=2.0)
    assert [settings.retry_delay(n) for n in (0, 1, 3, 1024, 10**9)] == [2.0, 4.0, 16.0, 30.0, 30.0]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRACESCORE_MODEL_CONCURRENCY": "lots"}, "TRACESCORE_MODEL_CONCURRENCY"),
        ({"TRACESCORE_RATE_LIMITS": "{not json"}, "TRACESCORE_RATE_LIMITS"),
        # A misspelt key meant no limit at all for the model (README audit).
        (
            {"TRACESCORE_RATE_LIMITS": '{"openai/gpt-4o-mini": {"requests_per_minut": 5}}'},
            "TRACESCORE_RATE_LIMITS at openai/gpt-4o-mini.requests_per_minut: Extra inputs are not permitted",
        ),
        (
            {
                "TRACESCORE_VISIBILITY_TIMEOUT": "100",
                "TRACESCORE_TASK_TIME_LIMIT": "200",
                "TRACESCORE_TASK_SOFT_TIME_LIMIT": "150",
            },
            "TRACESCORE_VISIBILITY_TIMEOUT .100.0. must exceed",
        ),
        # A record that expires before its message comes back: its run scored and paid for again,
        # and counted twice by its job (60 s was allowed, under the 360 s visibility timeout).
        ({"TRACESCORE_SCORE_TTL_SECONDS": "3600"}, "TRACESCORE_SCORE_TTL_SECONDS .3600. must be at least 86400"),
        # The workers' screen refuses a message past 1000 tries (worker._guard): a larger budget
        # ended each message failing for good as a bad_headers letter, not retry_budget_exhausted.
        ({"TRACESCORE_RETRY_BUDGET": "1001"}, "TRACESCORE_RETRY_BUDGET .1001. may be at most 1000"),
        # So does a wait for a score another delivery holds, retried until its claim lapses.
        (
            {"TRACESCORE_MAX_ETA_SECONDS": "0.25"},
            "TRACESCORE_TASK_TIME_LIMIT .300. over TRACESCORE_MAX_ETA_SECONDS .0.25. is 1201 tries",
        ),
        (
            {"TRACESCORE_CLAIM_TTL_SECONDS": "350", "TRACESCORE_MAX_ETA_SECONDS": "0.25"},
            "TRACESCORE_CLAIM_TTL_SECONDS .350. over TRACESCORE_MAX_ETA_SECONDS .0.25. is 1401 tries",
        ),
        # A dead-letter list bounded at 0 bytes (or letters) would keep only its newest letter.
        ({"TRACESCORE_DLQ_MAX_BYTES": "0"}, "TRACESCORE_DLQ_MAX_BYTES"),
        ({"TRACESCORE_DLQ_MAX_BYTES": "lots"}, "TRACESCORE_DLQ_MAX_BYTES"),
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


def test_broker_url_with_query_password_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu cannot read ?password= (it raised a TypeError naming nothing): a clear error that
    says where the password goes, and does not print it."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "redis://10.0.0.5:6379/0?password=hunter2-secret")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "TRACESCORE_BROKER_URL" in str(info.value)
    assert "redis://:PASSWORD@host" in str(info.value)
    assert "hunter2-secret" not in str(info.value)


@pytest.mark.parametrize(
    ("variable", "url", "message"),
    [
        ("TRACESCORE_BROKER_URL", "redis://:hunter2-secret@10.0.0.5:notaport/0", "port that is not a number"),
        ("TRACESCORE_BROKER_URL", "redis://:hunter2-secret@10.0.0.5:99999/0", "port that is not a number"),
        ("TRACESCORE_BROKER_URL", "rediss://:hunter2-secret@[10.0.0.5/0", "port that is not a number"),
        ("TRACESCORE_BROKER_URL", "redis://:hunter2-secret@10.0.0.5:6379/abc", "names database 'abc'"),
        ("TRACESCORE_REDIS_URL", "redis://:hunter2-secret@10.0.0.5:6379/db1", "names database 'db1'"),
        ("TRACESCORE_BROKER_URL", "redis://:hunter2-secret@10.0.0.5:6379/?db=one", "Invalid value for 'db'"),
        ("TRACESCORE_REDIS_URL", "rediss://:hunter2-secret@10.0.0.5/0?health_check_interval=x", "'health_check_int"),
    ],
)
def test_a_redis_url_with_a_bad_port_database_or_query_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, url: str, message: str
) -> None:
    """They failed later as "ValueError: Port could not be cast to integer value" (or, for a
    query value, "Invalid value for 'db' in connection URL."), naming no variable, or (a
    database that is no number) used database 0 in some commands."""
    monkeypatch.setenv(variable, url)
    with pytest.raises(SettingsError, match=message) as info:
        load_settings()
    assert variable in str(info.value)
    assert "hunter2-secret" not in str(info.value)


@pytest.mark.parametrize(
    "url", ["amqp://guest:hunter2-secret@10.0.0.5//", "sentinel://:hunter2-secret@10.0.0.5:26379", "memory://"]
)
def test_a_broker_url_of_another_transport_is_refused(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The message screen is in kombu's Redis transport: RabbitMQ, Sentinel or memory would hand
    hostile messages to Celery unscreened, so the settings refuse them, naming the variable."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", url)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "TRACESCORE_BROKER_URL" in str(info.value)
    assert "redis://, rediss://, redis+socket://" in str(info.value)
    assert "hunter2-secret" not in str(info.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRACESCORE_BROKER_CA_FILE": "/nonexistent/ca.pem"}, "TRACESCORE_BROKER_CA_FILE .* is not a readable file"),
        ({"TRACESCORE_BROKER_TLS_INSECURE": "maybe"}, "TRACESCORE_BROKER_TLS_INSECURE"),
        (
            {"TRACESCORE_BROKER_CA_FILE": __file__, "TRACESCORE_BROKER_TLS_INSECURE": "true"},
            "both set",
        ),
    ],
)
def test_bad_tls_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    """A missing CA file, a non-boolean insecure flag, or both at once fail at start-up."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=message):
        load_settings()


def test_tls_settings_reach_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """rediss:// gets verification (with the CA file) for Celery/kombu, redis-py and the store's
    URL; plain redis:// URLs are left exactly as they were."""
    import ssl

    monkeypatch.setenv("TRACESCORE_BROKER_URL", "rediss://:pw@redis.internal:6380/0")
    monkeypatch.setenv("TRACESCORE_BROKER_CA_FILE", __file__)
    settings = load_settings()
    assert settings.tls.kombu_ssl(settings.broker_url) == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": __file__}
    assert settings.tls.redis_kwargs(settings.broker_url) == {"ssl_cert_reqs": "required", "ssl_ca_certs": __file__}
    assert "ssl_cert_reqs=required" in settings.store_url
    assert "ssl_ca_certs=" in settings.store_url

    from celery import Celery

    from worker._app import configure_app

    app = Celery("tls-settings-test", set_as_current=False)
    configure_app(app, settings)
    assert app.conf.broker_use_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": __file__}
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "redis://127.0.0.1:6379/0")
    plain = load_settings()
    assert plain.store_url == "redis://127.0.0.1:6379/0"
    configure_app(app, plain)
    assert app.conf.broker_use_ssl is None


def test_create_app_carries_its_own_settings_to_task_and_transport(redis_url: str) -> None:
    """Two apps built with different Settings in one process keep their own: the Celery config,
    the registered scoring task, and the guarded transport's entry-size cap; the module-level app
    and the environment are untouched."""
    import os

    from tracing.queue import SCORE_TASK_NAME
    from worker import app as env_app
    from worker._app import create_app
    from worker._guard import envelope_limit

    env_before = dict(os.environ)
    env_conf = (env_app.conf.broker_url, env_app.conf.task_default_queue)
    small = create_app(load_settings(broker_url=redis_url, queue="small", max_payload_bytes=4096))
    large = create_app(load_settings(broker_url=redis_url, queue="large", max_payload_bytes=8 * 1024 * 1024))
    assert (small.settings.queue, large.settings.queue) == ("small", "large")
    assert (small.conf.task_default_queue, large.conf.task_default_queue) == ("small", "large")
    assert small.tasks[SCORE_TASK_NAME].app is small
    assert large.tasks[SCORE_TASK_NAME].app is large
    for app, cap in ((small, 4096), (large, 8 * 1024 * 1024)):
        with app.connection_for_read() as connection:
            assert connection.default_channel._entry_limit() == envelope_limit(cap)
    assert (env_app.conf.broker_url, env_app.conf.task_default_queue) == env_conf
    assert dict(os.environ) == env_before


def test_settings_shown_whole_mask_every_password_in_a_url() -> None:
    """Settings printed whole (a test's failed assertion, a traceback's locals, a debugger, a
    ``log.info(settings=...)``) showed the broker's and the store's URLs with their passwords,
    and a sink's URL with its user's. Each URL is shown as the error messages show it."""
    settings = load_settings(
        broker_url="redis://:broker-hunter2@10.0.0.5:6379/0",
        redis_url="rediss://default:store-hunter2@10.0.0.6:6380/1",
        phoenix_url="https://me:phoenix-hunter2@phoenix.example",
        mlflow_url="https://me:mlflow-hunter2@mlflow.example",
        langfuse_host="https://me:langfuse-hunter2@langfuse.example",
    )
    for shown in (repr(settings), str(settings)):
        assert "hunter2" not in shown
        for where in ("10.0.0.5:6379", "10.0.0.6:6380", "phoenix.example", "mlflow.example", "langfuse.example"):
            assert where in shown
    assert settings.broker_url == "redis://:broker-hunter2@10.0.0.5:6379/0"  # the value itself is whole
