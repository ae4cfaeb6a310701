"""Real dashboard servers for the integration tests, each started from its own venv.

``bash tests/integration/servers.sh`` (called by ``.ci/run``) installs every server into
``.venv-servers/<name>/``. ``Server`` is one such server process: a free loopback port, a temp
working directory (its SQLite database lives there, so a restart keeps the data), its own
environment, a readiness poll with a deadline, its output captured to a log file, and stopped
by its pid (its process group) only. A launcher per server (``phoenix_server`` here) fills in
the command, environment and readiness URL; add one per backend beside it.

Tests skip with a clear message only when a server's venv is missing (a laptop that never ran
``servers.sh``); with ``TRACESCORE_REQUIRE_SERVERS=1`` (set it in CI) a missing venv fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVERS_VENVS = ROOT / ".venv-servers"
REQUIRE_ENV = "TRACESCORE_REQUIRE_SERVERS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable(message: str) -> NoReturn:
    """Skip for want of an installed server or browser (fail when ``TRACESCORE_REQUIRE_SERVERS=1``)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(message)
    pytest.skip(message)


def server_executable(venv: str, executable: str) -> Path:
    """``.venv-servers/<venv>/bin/<executable>``, or skip (fail when servers are required)."""
    path = SERVERS_VENVS / venv / "bin" / executable
    if not path.exists():
        unavailable(
            f"{path.relative_to(ROOT)} is missing: run `bash tests/integration/servers.sh` to install the servers"
        )
    return path


class Server:
    """One server process on 127.0.0.1; ``start`` waits until ``ready_url`` answers 2xx."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        ready_path: str,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 180.0,
    ) -> None:
        """``workdir`` (a new temp dir, removed by ``close``) is the process's cwd: put its
        database and files there (``env`` may be updated before ``start``)."""
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.ready_path = ready_path
        self.ready_timeout_s = ready_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix=f"tracescore-{name}-"))
        self.env = {**os.environ, **(env or {})}
        self.log_path = self.workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, tail: int = 4000) -> str:
        """The end of the server's output (all starts, appended)."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def start(self) -> Server:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n--- start {self.starts}: {' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(
                self.argv, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"{self.name} did not answer {self.ready_path} within {self.ready_timeout_s}s:\n{self.log()}"
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, *, kill: bool = False, timeout_s: float = 20.0) -> None:
        """SIGTERM (SIGKILL with ``kill=True``, or when it outlives ``timeout_s``) to its process group."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    @contextmanager
    def running(self) -> Iterator[Server]:
        """Started; closed on leaving (stopped, its directory and database removed)."""
        try:
            yield self.start()
        finally:
            self.close()

    @contextmanager
    def up_after(self) -> Iterator[Server]:
        """For a test that stops this (session-wide) server: started again on leaving if it is
        down, however the test ends; the session's other tests need it."""
        try:
            yield self
        finally:
            if self.proc is None:
                self.start()

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port, directory and database."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def phoenix_server(*, ready_timeout_s: float = 180.0, env: dict[str, str] | None = None) -> Server:
    """``phoenix serve`` (arize-phoenix, .venv-servers/phoenix) on SQLite in its temp dir, not started.

    OTLP over HTTP goes to ``{url}/v1/traces``; gRPC gets its own free port. ``env`` adds
    settings (e.g. ``PHOENIX_ENABLE_AUTH``)."""
    server = Server(
        "phoenix",
        [str(server_executable("phoenix", "phoenix")), "serve"],
        port=free_port(),
        ready_path="/healthz",
        ready_timeout_s=ready_timeout_s,
    )
    server.env.update(
        {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(server.port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_WORKING_DIR": str(server.workdir),
            "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{server.workdir / 'phoenix.db'}",
            "PHOENIX_TELEMETRY_ENABLED": "false",
            **(env or {}),
        }
    )
    return server


def mlflow_server(*, ready_timeout_s: float = 180.0) -> Server:
    """``mlflow server`` (mlflow, .venv-servers/mlflow) on SQLite in its temp dir, not started.

    One worker process (the tests are small; the machine's cores are shared); OTLP over HTTP goes to
    ``{url}/v1/traces`` with the ``x-mlflow-experiment-id`` header."""
    port = free_port()
    server = Server(
        "mlflow",
        [str(server_executable("mlflow", "mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        port=port,
        ready_path="/health",
        ready_timeout_s=ready_timeout_s,
    )  # fmt: skip
    server.argv += [
        "--backend-store-uri", f"sqlite:///{server.workdir / 'mlflow.db'}",
        "--default-artifact-root", str(server.workdir / "artifacts"),
    ]  # fmt: skip
    # No telemetry; no job runner (it starts seven huey consumers for features the tests do not use).
    server.env.update({"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    return server
