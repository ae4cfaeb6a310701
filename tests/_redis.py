"""A private ``redis-server`` per test session: its own port and password.

The machine is shared: a worker left by another test run on the default port would consume our
queue, so no test talks to 127.0.0.1:6379. ``RedisServer`` starts one server, can be stopped and
started again on the same port (the broker-restart tests), and is stopped by its pid only.
``SilentListener`` stands in for a Redis that takes connections and answers nothing.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on a free loopback port with a random password."""

    def __init__(self, port: int | None = None, *, persistent: bool = False, unix_socket: bool = False) -> None:
        """``persistent``: an append-only file fsynced on every write, so data survives a SIGKILL
        of the server (the restart tests); otherwise nothing is kept on disk. ``unix_socket``:
        it also listens on ``socket_path`` (mode 700)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.password = secrets.token_hex(12)
        self._dir = tempfile.TemporaryDirectory(prefix="tracescore-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self._persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
        self.socket_path = str(Path(self._dir.name) / "redis.sock")
        self._socket = ["--unixsocket", self.socket_path, "--unixsocketperm", "700"] if unix_socket else []

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url(db), **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> None:
        log = Path(self._dir.name) / "redis.log"
        self.proc = subprocess.Popen(
            [
                self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--requirepass", self.password, "--save", "", *self._persistence,
                "--dir", self._dir.name, "--logfile", str(log), "--databases", "16", *self._socket,
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def forget(self) -> None:
        """Delete what a stopped server kept on disk: started again it comes back empty, as a
        replica without the data would."""
        if self.proc is not None:
            raise RuntimeError("stop the server before forgetting its data")
        for kept in Path(self._dir.name).iterdir():
            if kept.name.startswith(("appendonly", "dump")):
                shutil.rmtree(kept) if kept.is_dir() else kept.unlink()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentListener:
    """A TCP port (``port``: a free one unless given) that accepts every connection and never says
    a word, as a stalled Redis does; ``close`` shuts the port and every connection it took. A
    subclass answers what it wants to in ``_took``, called with each connection accepted."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = socket.create_server((host, port))
        self.port = int(self._server.getsockname()[1])
        self._taken: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self._taken)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            with self._lock:
                self._taken.append(conn)
            self._took(conn)

    def _took(self, conn: socket.socket) -> None:
        """Called with each connection accepted (on the accepting thread): silent here."""

    def close(self) -> None:
        with contextlib.suppress(OSError):  # (closed already) wakes the accept: close alone does not
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(5)
        with self._lock:
            for conn in self._taken:
                conn.close()
