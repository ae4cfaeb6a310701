"""A worker started while its broker or score store does not answer waits for it, as for one that refuses.

A Redis that is unreachable in a way that times out (a black-holed route, a firewall dropping
packets, a stalled Redis, a Kubernetes Service whose pod is not ready) used to end the start
check with ``redis.TimeoutError``: "tracescore worker cannot start: Timeout reading from
127.0.0.1:PORT", exit 1, where a refused connection is left to Celery (the broker) or the
store's clients, which wait. Under a supervisor that was a crash loop instead of a wait.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._redis import RedisServer, SilentListener
from tests.worker._batches import batch, send
from tests.worker._workers import ROOT, WorkerProcess, wait_for
from tracing._score_record import score_id_for
from worker._settings import silent_to_tls
from worker.store import RedisOutbox

TRACESCORE = str(Path(sys.executable).with_name("tracescore"))


@pytest.mark.parametrize("target", ["broker", "score store"])
def test_a_worker_waits_for_a_redis_that_does_not_answer(target: str, redis_url: str, tmp_path: Path) -> None:
    """A worker whose broker (or score store) port accepts and never answers: the start check
    timed out and the worker exited 1 within seconds ("cannot start: Timeout reading from ...").
    It now starts: with the broker silent, Celery keeps its own connection waiting (a second
    connection reaches the port); with the store silent, the worker gets ready. Once a Redis
    answers on that port, a batch sent is scored and its records stored. Its output (Celery's
    "Cannot connect ... Trying again" too) never shows the password."""
    listener = SilentListener()
    server = RedisServer(port=listener.port)
    silent_url = server.url(0)
    broker_url = silent_url if target == "broker" else redis_url
    worker = WorkerProcess(
        f"silent-{target.replace(' ', '-')}",
        silent_url,  # the store: the broker's Redis, or a Redis of its own
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        broker=broker_url,
        env={"TRACESCORE_WRITER": "none"},
    )
    outbox: RedisOutbox | None = None
    try:
        running = worker.proc
        if target == "broker":  # the start check's connection, then Celery's own
            started = wait_for(lambda: listener.accepted >= 2 or running.poll() is not None, 60)
        else:
            started = wait_for(lambda: " ready." in worker.text() or running.poll() is not None, 60)
        assert started, worker.text()[-3000:]
        assert running.poll() is None, f"exit {running.returncode}, {listener.accepted} connection(s):\n{worker.text()}"

        listener.close()
        server.start()
        b = batch(range(3), ["length"], salt=target, batch_id=f"silent-{target.replace(' ', '-')}")
        send(broker_url, b)
        ids = [score_id_for(r.trace_id, t, "length", "1") for r in b.requests for t in r.target_span_ids]
        outbox = RedisOutbox(silent_url)
        store = outbox
        assert wait_for(lambda: len(store.records(ids)) == len(ids), 60), worker.text()[-3000:]
        assert running.poll() is None, worker.text()[-3000:]
        text = worker.text()
        if target == "broker":  # (the connection the listener dropped, logged and retried)
            assert "Trying again" in text, text[-3000:]
            # the README's "100 tries ... then the worker stops for its supervisor"
            assert "/100)" in text.split("Trying again", 1)[1].split("\n", 1)[0], text[-3000:]
            assert f":**@127.0.0.1:{listener.port}/0" in text, text[-3000:]
        assert server.password not in text
    finally:
        listener.close()
        if outbox is not None:
            outbox.close()
        worker.stop()
        server.close()


class SynDroppingPort:
    """A TCP port whose connects time out, as through a black-holed route or a firewall dropping
    SYNs (loopback cannot drop them without root): it listens with a backlog of 0 and never
    accepts, and its accept queue is filled here, so Linux drops every further SYN. Checked on
    the way in: a connect must time out, else the test would prove nothing."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind((host, port))
        self._server.listen(0)
        self.port = int(self._server.getsockname()[1])
        self._fillers: list[socket.socket] = []
        for _ in range(8):
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(0.5)
            try:
                conn.connect((host, self.port))
            except TimeoutError:
                conn.close()
                return  # the queue is full: connects now time out
            self._fillers.append(conn)
        self.close()
        raise AssertionError("connects to a full accept queue did not time out on this machine")

    def close(self) -> None:
        for conn in self._fillers:
            conn.close()
        self._server.close()


def test_a_worker_waits_for_a_rediss_broker_it_cannot_reach(tmp_path: Path) -> None:
    """A worker whose rediss:// broker cannot be reached, the TCP connect timing out (a
    black-holed route, a managed Redis whose TLS endpoint is not up yet): the start check took the
    timeout for a plain Redis silent to the TLS handshake and exited 1 ("cannot start: TLS with
    the broker ... got no answer ...: use redis://"), a crash loop with a wrong hint. It now waits
    as for a redis:// broker: Celery's "Cannot connect ... Trying again" line appears (the URL
    masked) and the process is still running. (The plain-Redis case still exits 1 with the hint:
    test_rediss_to_a_redis_without_tls_says_to_use_redis in test_tls_and_auth.py.)"""
    port = SynDroppingPort()
    password = "unreachable-pass-5Rt8"
    url = f"rediss://:{password}@127.0.0.1:{port.port}/0"
    worker = WorkerProcess(
        "unreachable", url, tmp_path, scores_path=tmp_path / "scores.jsonl", env={"TRACESCORE_WRITER": "none"}
    )
    try:
        running, output = worker.proc, worker.text
        assert wait_for(lambda: "Trying again" in output() or running.poll() is not None, 90), output()[-3000:]
        assert running.poll() is None, f"exit {running.returncode}:\n{output()[-3000:]}"
        text = output()
        assert "Cannot connect" in text, text[-3000:]
        assert f":**@127.0.0.1:{port.port}/0" in text, text[-3000:]  # (Celery names the transport, not rediss)
        assert "use redis://" not in text, text[-3000:]
        assert password not in text
    finally:
        worker.stop()
        port.close()


def test_status_names_no_plain_redis_for_a_rediss_broker_it_cannot_reach() -> None:
    """`tracescore status` against a rediss:// broker whose TCP connect times out said "cannot
    reach the broker ...: Timeout connecting to server; rediss:// asks for TLS: if that Redis
    serves plain text, use redis://", sending its user to change a URL that was right. The hint
    is now for a port that takes the connection and answers no TLS only (kept:
    test_rediss_to_a_redis_without_tls_says_to_use_redis[status])."""
    port = SynDroppingPort()
    password = "unreachable-pass-7Qw2"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")}
    env["PYTHONPATH"] = str(ROOT)
    try:
        url = f"rediss://:{password}@127.0.0.1:{port.port}/0"
        done = subprocess.run(
            [TRACESCORE, "status", "--broker", url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        port.close()
    assert done.returncode == 1, done
    assert f"cannot reach the broker at rediss://:***@127.0.0.1:{port.port}/0" in done.stderr, done.stderr
    assert "use redis://" not in done.stderr, done.stderr
    assert password not in done.stdout + done.stderr


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str] | threading.Event]]:
    """A resolver for the name ``redis.test``: the loopback addresses listed under it, in that
    order (or, given an Event, one that hangs until the Event is set, as a DNS server that does
    not answer); other names are resolved as usual. /etc/hosts is not ours to write."""
    answers: dict[str, list[str] | threading.Event] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        answer = answers.get(host)
        if answer is None:
            return real(host, port, *args, **kwargs)
        if isinstance(answer, threading.Event):
            answer.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port))) for a in answer]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield answers
    for answer in answers.values():
        if isinstance(answer, threading.Event):
            answer.set()


def test_the_tls_probe_of_a_name_with_several_addresses_keeps_to_its_timeout(
    resolved: dict[str, list[str] | threading.Event],
) -> None:
    """``silent_to_tls`` (the probe behind "use redis://") connected with
    ``socket.create_connection``, which gives each address the whole timeout: a name whose
    first two addresses drop the SYN and whose third is a plain Redis (a listener that accepts
    and says nothing) took a timeout for each connect that failed, then the handshake's own: 3 s
    for a 1 s probe.
    One deadline is now shared by the addresses and the handshake: the plain Redis is still
    found silent, within the timeout (and the probe says not silent, within it, when every
    address drops the SYN)."""
    silent = SilentListener("127.0.0.3")
    dropping = [SynDroppingPort("127.0.0.1", silent.port), SynDroppingPort("127.0.0.2", silent.port)]
    try:
        resolved["redis.test"] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        url = f"rediss://:pw@redis.test:{silent.port}/0"
        started = time.monotonic()
        assert silent_to_tls(url, 1.0)
        elapsed = time.monotonic() - started
        assert elapsed < 1.5, elapsed  # (the timeout, and a little for the machine: 3.0 s before)
        assert silent.accepted == 1

        resolved["redis.test"] = ["127.0.0.1", "127.0.0.2"]
        started = time.monotonic()
        assert not silent_to_tls(url, 1.0)
        elapsed = time.monotonic() - started
        assert elapsed < 1.5, elapsed  # (2.0 s before)
    finally:
        silent.close()
        for port in dropping:
            port.close()


def test_the_tls_probe_keeps_to_its_timeout_when_the_name_does_not_resolve_in_time(
    resolved: dict[str, list[str] | threading.Event],
) -> None:
    """The probe's DNS lookup (inside ``socket.create_connection``) had no bound of its own: a
    resolver that does not answer held the probe, and the worker's start or a command's error
    line, for as long as the system's resolver retries (here until the test lets it go, 30 s).
    The probe now gives up with its timeout: not silent (nothing was reached)."""
    resolved["redis.test"] = threading.Event()
    started = time.monotonic()
    assert not silent_to_tls("rediss://:pw@redis.test:6379/0", 1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed


def test_a_slow_lookup_leaves_the_handshake_time_to_be_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's lookup drew on the deadline the handshake is judged by: a name resolved in
    0.8 s of a 1 s probe left the handshake 0.1 s, and a TLS port that answers in 0.3 s (here by
    closing the connection: any answer is one) was called silent, which at a worker's start is an
    exit with "use redis://" for a URL that is right. The lookup now gets half the timeout at
    most (a slower one: not silent, nothing was reached in time); the connect and handshake share
    the rest."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])

    def answer_late() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            time.sleep(0.3)
            conn.close()

    answering = threading.Thread(target=answer_late, daemon=True)
    answering.start()
    real = socket.getaddrinfo

    def slow_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "redis.test":
            return real(host, port, *args, **kwargs)
        time.sleep(0.8)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    try:
        started = time.monotonic()
        assert not silent_to_tls(f"rediss://:pw@redis.test:{port}/0", 1.0)
        assert time.monotonic() - started < 1.5
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        answering.join(5)
