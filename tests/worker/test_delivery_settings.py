"""Which sinks the settings and options configure, and what a sink without its address says."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.worker._workers import failed_start
from tracing.sinks import ConsoleSink, JsonlSink, OtlpSink
from worker._delivery import DrainPolicy, build_sinks
from worker._settings import SettingsError, load_settings
from worker.cli import cli


def test_sinks_setting_and_its_older_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SINKS is a comma list (order kept, repeats dropped, none = store only); unset, WRITER is read."""
    for name in ("TRACESCORE_SINKS", "TRACESCORE_WRITER", "TRACESCORE_WRITER_PATH", "TRACESCORE_JSONL_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().sink_names == ("otlp",)
    assert load_settings(writer="none").sink_names == ()
    assert load_settings(sinks="none").sink_names == ()
    assert load_settings(sinks=" console, otlp ,console").sink_names == ("console", "otlp")
    monkeypatch.setenv("TRACESCORE_WRITER", "jsonl")
    monkeypatch.setenv("TRACESCORE_WRITER_PATH", str(tmp_path / "s.jsonl"))
    settings = load_settings()
    assert settings.sink_names == ("jsonl",)
    assert settings.jsonl_file == str(tmp_path / "s.jsonl")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sinks": "otlp,splunk"}, "TRACESCORE_SINKS names unknown sink.*splunk"),
        ({"sinks": "phoenix"}, "phoenix sink .*needs TRACESCORE_PHOENIX_URL"),
        ({"sinks": "mlflow"}, "needs TRACESCORE_MLFLOW_URL"),
        ({"sinks": "langfuse", "langfuse_host": "http://lf"}, "needs TRACESCORE_LANGFUSE_PUBLIC_KEY"),
        ({"sinks": "jsonl"}, "needs TRACESCORE_JSONL_PATH"),
        ({"sinks": "otlp", "sink_max_attempts": 0}, "TRACESCORE_SINK_MAX_ATTEMPTS"),
    ],
)
def test_a_sink_without_what_it_needs_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, object], message: str
) -> None:
    """Settings refuse an unknown sink or one without its address, by the variable's name."""
    for name in ("TRACESCORE_WRITER_PATH", "TRACESCORE_JSONL_PATH", "TRACESCORE_PHOENIX_URL", "TRACESCORE_MLFLOW_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SettingsError, match=message):
        load_settings(**overrides)


def test_build_sinks_makes_the_named_sinks(tmp_path: Path) -> None:
    """build_sinks: one sink per name, in order, with the settings' addresses and knobs."""
    settings = load_settings(
        sinks="otlp,jsonl,console", jsonl_path=str(tmp_path / "s.jsonl"), sink_max_attempts=3, sink_lease_seconds=9
    )
    sinks = build_sinks(settings)
    assert [type(s) for s in sinks] == [OtlpSink, JsonlSink, ConsoleSink]
    assert [s.name for s in sinks] == ["otlp", "jsonl", "console"]
    for sink in sinks:
        sink.close()
    policy = DrainPolicy.of(settings)
    assert (policy.max_attempts, policy.lease_s) == (3, 9)
    assert 0.8 <= policy.delay(1, 0.0) <= 1.2
    assert policy.delay(30, 0.0) <= settings.sink_backoff_max_seconds * 1.2
    # A sink down through more attempts than a float's exponent holds (a high
    # TRACESCORE_SINK_MAX_ATTEMPTS): 2.0 ** attempts overflowed and the drainer failed the batch.
    assert settings.sink_backoff_max_seconds * 0.8 <= policy.delay(5000, 0.0) <= settings.sink_backoff_max_seconds * 1.2
    assert policy.delay(1, after_s=42.0) == 42.0


def test_worker_option_for_a_sink_without_its_address_is_one_line() -> None:
    """`tracescore worker --sink mlflow` without --mlflow-url stops before starting, naming what is missing."""
    result = CliRunner().invoke(
        cli,
        ["worker", "--scorers", "tests.worker.sample_scorers", "--sink", "mlflow"],
        env={"TRACESCORE_MLFLOW_URL": ""},
    )
    assert result.exit_code == 1
    assert "needs TRACESCORE_MLFLOW_URL" in result.output


def test_console_sink_as_configured_writes_lines() -> None:
    """The console sink answers Delivered for what it printed (the CLI's --sink console)."""
    from tests.tracing.test_sinks import _rec

    out = io.StringIO()
    assert len(ConsoleSink(out).deliver([_rec("a", score=0.5)])) == 1
    assert "scorer=a 0.500" in out.getvalue()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TRACESCORE_PHOENIX_API_KEY": "phx-key-1234\n"},
            r"the Phoenix API key \(api_key / TRACESCORE_PHOENIX_API_KEY\) ends with a line break",
        ),
        ({"HTTPS_PROXY": "socks5://127.0.0.1:1080"}, "HTTPS_PROXY .* names a socks5 proxy"),
    ],
)
def test_a_sink_that_cannot_be_built_stops_the_workers_start(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """What a sink refuses when it is built (a key read from a file with its newline, a proxy it
    cannot use) stops the start naming the setting, never the key: the worker started, then
    every task failed to build its sinks, and every score waited for a sink that never came."""
    monkeypatch.setenv("TRACESCORE_SINKS", "phoenix")
    monkeypatch.setenv("TRACESCORE_PHOENIX_URL", "https://phoenix.invalid:6006")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    done = failed_start(redis_url)
    assert done.returncode == 1, done.stderr[-2000:]
    assert re.search(f"tracescore worker cannot start: .*{message}", done.stderr), done.stderr[-2000:]
    assert "phx-key-1234" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["--sink", "phoenix", "--phoenix-url", "http://127.0.0.1:9"],
            {"TRACESCORE_PHOENIX_API_KEY": "key-0123456789\n"},
            "Error: the phoenix sink: the Phoenix API key (api_key / TRACESCORE_PHOENIX_API_KEY) ends with a line",
        ),
        (
            ["--sink", "mlflow"],
            {"TRACESCORE_MLFLOW_URL": "ftp://x"},
            "Error: the mlflow sink: MLflow tracking URI must be",
        ),
    ],
)
def test_a_value_a_sink_refuses_is_one_error_line_of_backfill(args: list[str], env: dict[str, str], said: str) -> None:
    """They went through the crash handler ("error: ValueError: ... run with --verbose"; README
    audit): a settings error of the command, one line, exit 1, the key never shown."""
    result = CliRunner().invoke(
        cli,
        ["backfill", "examples/traces", "--scorers", "examples.scorers", "--sample", "0.01", *args],
        env={"TRACESCORE_BROKER_URL": "", **env},
    )
    assert result.exit_code == 1, result.output
    assert said in result.stderr
    assert "--verbose" not in result.stderr
    assert "0123456789" not in result.stderr


@pytest.mark.parametrize("option", ["--phoenix-url", "--mlflow-url", "--langfuse-host"])
@pytest.mark.parametrize("command", ["backfill", "worker"])
def test_a_backend_address_option_that_is_no_http_url_is_a_usage_error(option: str, command: str) -> None:
    """It exited 1 as a settings error (sink audit), where the README's table makes a bad option
    value a usage error, exit 2; the URL's password is not shown."""
    source = ["examples/traces"] if command == "backfill" else []
    result = CliRunner().invoke(
        cli, [command, *source, "--scorers", "examples.scorers", option, "ftp://bob:pw-0123456789@host"]
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': must be http(s)://host[:port][/path], got 'ftp://bob:***@host'" in (
        result.stderr
    )
    assert "0123456789" not in result.stderr


@pytest.mark.parametrize("option", ["--phoenix-url", "--mlflow-url", "--langfuse-host"])
@pytest.mark.parametrize("url", ["http://host:6006/?project=a", "http://host:6006#x"])
def test_a_backend_address_with_a_query_string_is_a_usage_error(option: str, url: str) -> None:
    """Each sink appends its API's path to the address: after a query string the path went into
    the query, and the scores were posted to the server's root (an audit left it)."""
    result = CliRunner().invoke(cli, ["backfill", "examples/traces", "--scorers", "examples.scorers", option, url])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': must be http(s)://host[:port][/path], without a query string" in (
        result.stderr
    )


def test_a_sink_named_by_sink_without_its_address_names_the_option_too() -> None:
    result = CliRunner().invoke(
        cli,
        ["backfill", "examples/traces", "--scorers", "examples.scorers", "--sink", "phoenix"],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_PHOENIX_URL": ""},
    )
    assert result.exit_code == 1, result.output
    assert "the phoenix sink (--sink or TRACESCORE_SINKS) needs TRACESCORE_PHOENIX_URL or --phoenix-url" in (
        result.stderr
    )
