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


def test_a_worker_writes_its_log_lines_to_stderr_never_stdout(redis_url: str, tmp_path: Path) -> None:
    """README: log lines, the workers' too, go to stderr. tracescore's (structlog) and Celery's
    own log lines are checked; Celery prints its banner and shutdown notices to stdout itself
    (``sys.__stdout__``), which the README says."""
    import os
    import re
    import signal

    from tests.worker._workers import TRACESCORE, wait_for

    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, "TRACESCORE_BROKER_URL": redis_url, "PYTHONPATH": str(ROOT), "TRACESCORE_SINKS": "none"}
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [TRACESCORE, "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"],
            cwd=ROOT, env=env, stdout=o, stderr=e, start_new_session=True,
        )  # fmt: skip
        try:
            assert wait_for(lambda: " ready." in err.read_text() or proc.poll() is not None, 60), err.read_text()
            assert proc.poll() is None, err.read_text()[-2000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    logged = err.read_text()
    assert "worker_starting" in logged  # structlog's line
    assert "tracescore worker: broker redis://:***@" in logged  # the command's own start line
    assert "worker_draining" in logged  # the same logger as it stops
    stdout = out.read_text()
    # structlog's console lines ("2026-01-01 00:00:00 [info     ] event") and Celery's
    # ("[2026-01-01 00:00:00,000: INFO/MainProcess] ...")
    log_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[|^\[\d{4}-\d\d-\d\d [\d:,]+: [A-Z]+/", re.M)
    assert not log_line.search(stdout), stdout
    assert "worker_" not in stdout, stdout
    assert "tracescore worker:" not in stdout, stdout
