"""A traceback in tracescore's logs names the code, never the data: structlog's default
formatter (rich, when installed) printed every frame's local variables, which in a scoring
process hold prompts, answers and score reasons."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from tests._redis import RedisServer
from worker.cli import main

ROOT = Path(__file__).resolve().parents[2]

# A function whose local variable holds agent content, logging the exception it raised.
_FAIL_AND_LOG = """
import structlog

def write(records):
    answer = "SECRET-ANSWER-TEXT"
    raise RuntimeError("the writer failed")

try:
    write(["SECRET-RECORD"])
except RuntimeError:
    structlog.get_logger("t").exception("score_write_failed", records=1)
"""


def test_a_worker_process_logs_tracebacks_without_local_variables() -> None:
    """What ``celery -A worker worker`` imports configures it."""
    pytest.importorskip("rich")  # the formatter that printed locals; without it nothing did
    done = subprocess.run(
        [sys.executable, "-c", "import worker._app\n" + _FAIL_AND_LOG],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout + done.stderr
    assert "score_write_failed" in out
    assert "Traceback" in out
    assert "RuntimeError: the writer failed" in out
    assert "SECRET" not in out


def test_the_cli_logs_tracebacks_without_local_variables(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    structlog.reset_defaults()  # as a fresh process has it: the command must configure it
    assert main(["scores", "--help"]) == 0
    capsys.readouterr()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    exec(compile(_FAIL_AND_LOG, "<fail>", "exec"), {})
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert "RuntimeError: the writer failed" in err
    assert "SECRET" not in err


def test_the_start_line_names_the_sinks_the_worker_delivers_to(redis_server: RedisServer, tmp_path: Path) -> None:
    """It logged the older TRACESCORE_WRITER (writer=otlp) whatever --sink said (README audit);
    each sink with where it writes, as every line naming a sink."""
    from structlog.testing import capture_logs

    from worker._app import _check_start, create_app
    from worker._settings import load_settings

    settings = load_settings(
        broker_url=redis_server.url(9),
        scorers="tests.worker.sample_scorers",
        sinks="jsonl",
        jsonl_path=str(tmp_path / "scores.jsonl"),
        probe_dir=str(tmp_path / "probe"),
    )
    with capture_logs() as logs:
        _check_start(create_app(settings))
    (started,) = [e for e in logs if e["event"] == "worker_starting"]
    assert started["sinks"] == "jsonl"
    assert started["endpoints"] == {"jsonl": str(tmp_path / "scores.jsonl")}
    assert "writer" not in started
