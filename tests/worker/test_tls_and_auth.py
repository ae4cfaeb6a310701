"""Broker secrets and TLS: passwords never printed, ``rediss://`` verified everywhere, and a
refused password or certificate stops ``tracescore worker`` at once with a clear message.

A real ``redis-server --tls-port`` runs with a certificate from a CA made here (openssl), so
verification fails without that CA and succeeds with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests._redis import RedisServer, free_port
from tests.worker._batches import batch
from tests.worker._workers import ROOT, read_scores, wait_for
from tracing import CelerySink
from tracing._broker import CA_FILE_ENV, INSECURE_ENV, BrokerTLS, redact
from worker._settings import get_settings, load_settings
from worker.backfill._submit import RedisSubmitter
from worker.cli._common import CliError
from worker.cli._status import collect_status

TRACESCORE = str(Path(sys.executable).with_name("tracescore"))
PASSWORD = "tls-pass-7Hq2x9Lk"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class TlsRedis:
    """redis-server speaking only TLS, with a server certificate signed by a fresh test CA."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                 "-days", "2", "-subj", "/CN=tracescore test CA", cwd=tmp)  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=localhost", cwd=tmp)  # fmt: skip
        (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=tmp)  # fmt: skip
        self.ca_file = str(tmp / "ca.pem")
        self.port = free_port()
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--tls-cert-file", "server.pem", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.pem",
             "--tls-auth-clients", "no", "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
             "--dir", str(tmp), "--logfile", "redis.log"],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        client = self.client()
        try:
            assert wait_for(self._pings(client), 10), (tmp / "redis.log").read_text()
        finally:
            client.close()

    def _pings(self, client: redis.Redis) -> object:
        def ping() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        return ping

    def url(self, db: int = 0) -> str:
        return f"rediss://:{PASSWORD}@127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db), ssl_ca_certs=self.ca_file)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    server = TlsRedis(tmp_path_factory.mktemp("tls-redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No broker/TLS variables from outside; the settings cache is cleared around the test."""
    for var in ("TRACESCORE_BROKER_URL", "TRACESCORE_REDIS_URL", CA_FILE_ENV, INSECURE_ENV):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")}
    return {**env, "PYTHONPATH": str(ROOT), "TRACESCORE_WRITER": "none", **extra}


def _run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TRACESCORE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# --- redaction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:s3cret@h/0", "redis://user:***@h/0"),
        ("rediss://:s3cret@h:6380/0", "rediss://:***@h:6380/0"),
        ("redis://:p@ss@h/0", "redis://:***@h/0"),
        ("redis://s3cret@h/0", "redis://***@h/0"),
        ("redis://h:6379/0?password=s3cret&db=1", "redis://h:6379/0?password=***&db=1"),
        ("redis://h/0?db=1&PASSWORD=s3cret", "redis://h/0?db=1&PASSWORD=***"),
        ("sentinel://:s3cret@h1:26379;sentinel://:other@h2:26379", "sentinel://:***@h1:26379;sentinel://:***@h2:26379"),
        (
            "cannot reach redis://:s3cret@a/0 nor redis://b/0?sentinel_password=other",
            "cannot reach redis://:***@a/0 nor redis://b/0?sentinel_password=***",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_hides_every_password(text: str, expected: str) -> None:
    """user-info passwords, ?password= parameters, several URLs in one string: all masked."""
    assert redact(text) == expected


def test_worker_banner_redacts_a_query_password(redis_server: RedisServer, redis_url: str, tmp_path: Path) -> None:
    """A store URL with ?password= works, and neither the banner nor the logs print it."""
    store_url = f"redis://127.0.0.1:{redis_server.port}/11?password={redis_server.password}"
    env = _env(TRACESCORE_BROKER_URL=redis_url, TRACESCORE_REDIS_URL=store_url)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [TRACESCORE, "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            assert wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 60), log.read_text()
        finally:
            _stop(proc)
    text = log.read_text()
    assert " ready." in text, text
    assert "password=***" in text
    assert redis_server.password not in text


def test_status_redacts_a_query_password(redis_url: str, clean_env: pytest.MonkeyPatch) -> None:
    """`tracescore status` with an unreachable store given as ?password=: the error names the
    store without the password."""
    store = f"redis://127.0.0.1:{free_port()}/0?password=sup3r-s3cret"
    result = _run_cli(["status"], _env(TRACESCORE_BROKER_URL=redis_url, TRACESCORE_REDIS_URL=store))
    assert result.returncode == 1, result
    assert "cannot reach the score store at" in result.stderr
    assert "password=***" in result.stderr
    assert "sup3r-s3cret" not in result.stdout + result.stderr


# --- rediss:// verifies certificates ------------------------------------------------------


def test_status_verifies_rediss(tls_redis: TlsRedis, clean_env: pytest.MonkeyPatch) -> None:
    """status: without the CA the certificate is refused with a clear error; with
    TRACESCORE_BROKER_CA_FILE it connects; TRACESCORE_BROKER_TLS_INSECURE lets it through."""
    clean_env.setenv("TRACESCORE_BROKER_URL", tls_redis.url(3))
    with pytest.raises(CliError) as info:
        collect_status(0.2)
    assert "certificate verify failed" in str(info.value.message)
    assert PASSWORD not in str(info.value.message)

    clean_env.setenv(CA_FILE_ENV, tls_redis.ca_file)
    get_settings.cache_clear()
    status = collect_status(0.2)
    assert status["broker"] == f"rediss://:***@127.0.0.1:{tls_redis.port}/3"
    assert status["dead_letters"] == 0

    clean_env.delenv(CA_FILE_ENV)
    clean_env.setenv(INSECURE_ENV, "true")
    get_settings.cache_clear()
    assert collect_status(0.2)["queue_depth"] == 0


def test_celery_sink_verifies_rediss(tls_redis: TlsRedis, clean_env: pytest.MonkeyPatch) -> None:
    """CelerySink refuses a certificate it cannot verify (kombu alone accepts any); with the CA
    (argument or TRACESCORE_BROKER_CA_FILE) or insecure asked by name, the batch is queued."""
    broker = tls_redis.client(4)
    broker.flushdb()
    try:
        sink = CelerySink(tls_redis.url(4), queue="tls-q")
        with pytest.raises(Exception, match=r"(?i)certificate verify failed"):
            sink.send(batch(range(1), ["length"], salt="tls0"))
        sink.close()
        assert broker.llen("tls-q") == 0

        sink = CelerySink(tls_redis.url(4), queue="tls-q", tls=BrokerTLS(ca_file=tls_redis.ca_file))
        sink.send(batch(range(1), ["length"], salt="tls1"))
        sink.close()
        clean_env.setenv(CA_FILE_ENV, tls_redis.ca_file)
        sink = CelerySink(tls_redis.url(4), queue="tls-q")
        sink.send(batch(range(1), ["length"], salt="tls2"))
        sink.close()
        clean_env.delenv(CA_FILE_ENV)
        clean_env.setenv(INSECURE_ENV, "1")
        sink = CelerySink(tls_redis.url(4), queue="tls-q")
        sink.send(batch(range(1), ["length"], salt="tls3"))
        sink.close()
        assert broker.llen("tls-q") == 3
    finally:
        broker.flushdb()
        broker.close()


def test_backfill_submitter_verifies_rediss(tls_redis: TlsRedis, clean_env: pytest.MonkeyPatch) -> None:
    """The backfill's submitter: refused without the CA, submits with TRACESCORE_BROKER_CA_FILE."""
    refused = RedisSubmitter(load_settings(broker_url=tls_redis.url(5)))
    try:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            refused.ping_broker()
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            refused.ping_store()  # (the store is the broker's Redis here, over TLS too)
    finally:
        refused.close()
    submitter = RedisSubmitter(load_settings(broker_url=tls_redis.url(5), broker_ca_file=tls_redis.ca_file))
    try:
        submitter.ping_broker()
        submitter.ping_store()
        submitter.submit(batch(range(2), ["length"], salt="tls-bf"))
        assert submitter.pending() == 1
        assert submitter.progress("no-such-job") == {}
    finally:
        submitter.store.flushdb()
        submitter.close()


def test_worker_over_rediss_scores_with_the_ca_file(tls_redis: TlsRedis, tmp_path: Path) -> None:
    """`tracescore worker` on a rediss:// broker and store with TRACESCORE_BROKER_CA_FILE:
    it consumes a batch and stores/writes its score (broker, store and limiter all verified)."""
    tls_redis.client(6).flushdb()
    scores = tmp_path / "scores.jsonl"
    env = _env(
        TRACESCORE_BROKER_URL=tls_redis.url(6),
        TRACESCORE_BROKER_CA_FILE=tls_redis.ca_file,
        TRACESCORE_QUEUE="tls-worker",
        TRACESCORE_WRITER="jsonl",
        TRACESCORE_WRITER_PATH=str(scores),
    )
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [TRACESCORE, "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            assert wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 60), log.read_text()
            assert proc.poll() is None, log.read_text()
            sink = CelerySink(tls_redis.url(6), queue="tls-worker", tls=BrokerTLS(ca_file=tls_redis.ca_file))
            sink.send(batch(range(3), ["length"], salt="tls-w"))
            sink.close()
            assert wait_for(lambda: len(read_scores(scores)) == 3, 60), log.read_text()[-3000:]
        finally:
            _stop(proc)
    assert all(s["scorer_id"] == "length" and s["score"] is not None for s in read_scores(scores))
    assert PASSWORD not in log.read_text()
    tls_redis.client(6).flushdb()


def test_worker_refuses_an_unverified_certificate(tls_redis: TlsRedis) -> None:
    """Without the CA, `tracescore worker` exits 1 within seconds naming the certificate
    problem and the setting that fixes it (before: kombu connected without verifying)."""
    started = time.monotonic()
    result = _run_cli(
        ["worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"],
        _env(TRACESCORE_BROKER_URL=tls_redis.url(7)),
        timeout=60,
    )
    assert result.returncode == 1, result
    assert time.monotonic() - started < 30
    assert "certificate" in result.stderr, result.stderr
    assert CA_FILE_ENV in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["status", "worker"])
def test_rediss_to_a_redis_without_tls_says_to_use_redis(redis_server: RedisServer, command: str) -> None:
    """rediss:// to a Redis serving plain text (a letter too many): the TLS handshake waits for an
    answer that never comes. `status` said "cannot reach the broker ...: Timeout connecting to
    server" and the worker "cannot start: Timeout connecting to server", naming neither the URL
    nor TLS. Both now say that rediss:// asks for TLS and a plain Redis takes redis://."""
    url = f"rediss://:{redis_server.password}@127.0.0.1:{redis_server.port}/11"
    args = ["status"] if command == "status" else ["worker", "--scorers", "tests.worker.sample_scorers"]
    started = time.monotonic()
    result = _run_cli([*args, "--broker", url], _env(), timeout=90)
    assert result.returncode == 1, result
    assert time.monotonic() - started < 30
    assert f"rediss://:***@127.0.0.1:{redis_server.port}/11" in result.stderr, result.stderr
    assert "rediss:// asks for TLS: if that Redis serves plain text, use redis://" in result.stderr, result.stderr
    assert redis_server.password not in result.stdout + result.stderr


class SilentTlsListener:
    """A port that completes the TLS handshake with the test CA's server certificate and then says
    nothing, as a TLS proxy whose Redis behind it is not up (or a stalled Redis over TLS)."""

    def __init__(self, certs: Path) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certs / "server.pem", certs / "server.key")
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def handshakes(self) -> int:
        with self._lock:
            return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            conn.settimeout(10)
            try:
                tls = self._context.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._held.append(tls)

    def close(self) -> None:
        self._server.close()
        self._thread.join(15)
        with self._lock:
            for conn in self._held:
                conn.close()


def test_worker_waits_for_a_rediss_broker_silent_after_the_handshake(tls_redis: TlsRedis, tmp_path: Path) -> None:
    """rediss:// to an endpoint that completes the TLS handshake (its certificate verifies) and
    then answers nothing, as a TLS proxy whose Redis is not up: the start check's PING timed out
    and the worker exited 1 with the plain-Redis hint ("use redis://"), wrong and a crash loop.
    TLS answered, so it is an outage: the worker now waits, Celery's own connection reaching the
    port (a second handshake) while the process runs."""
    listener = SilentTlsListener(tls_redis.dir)
    url = f"rediss://:{PASSWORD}@127.0.0.1:{listener.port}/0"
    env = _env(TRACESCORE_BROKER_URL=url, TRACESCORE_BROKER_CA_FILE=tls_redis.ca_file)
    log = tmp_path / "worker.log"
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [TRACESCORE, "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                # the check's PING, its handshake probe (_silent_to_tls), then Celery's connection
                assert wait_for(lambda: listener.handshakes >= 3 or proc.poll() is not None, 90), log.read_text()
                assert proc.poll() is None, f"exit {proc.returncode}:\n{log.read_text()[-3000:]}"
            finally:
                _stop(proc)
    finally:
        listener.close()
    text = log.read_text()
    assert "use redis://" not in text, text[-3000:]
    assert PASSWORD not in text


CELERY = str(Path(sys.executable).with_name("celery"))


@pytest.mark.parametrize("command", ["tracescore", "celery"])
@pytest.mark.parametrize("case", ["wrong broker password", "no broker password", "wrong store password"])
def test_worker_exits_on_a_wrong_password(redis_server: RedisServer, case: str, command: str) -> None:
    """A refused password (wrong, or missing) on the broker or the store: `tracescore worker` and
    `celery -A worker worker` exit 1 within seconds naming the authentication problem and the
    variable to fix, printing neither the wrong password nor the right one."""
    wrong = "not-the-password-4242"
    host = f"127.0.0.1:{redis_server.port}/11"
    env = {
        "wrong broker password": {"TRACESCORE_BROKER_URL": f"redis://:{wrong}@{host}"},
        "no broker password": {"TRACESCORE_BROKER_URL": f"redis://{host}"},
        "wrong store password": {
            "TRACESCORE_BROKER_URL": redis_server.url(11),
            "TRACESCORE_REDIS_URL": f"redis://:{wrong}@{host}",
        },
    }[case]
    started = time.monotonic()
    args = ["worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo"]
    if command == "tracescore":
        result = _run_cli(args, _env(**env), 90)
    else:
        result = subprocess.run(
            [CELERY, "-A", "worker", *args], cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=90
        )
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert elapsed < 30, elapsed
    assert "authentication failed" in result.stderr, output
    variable = "TRACESCORE_REDIS_URL" if "store" in case else "TRACESCORE_BROKER_URL"
    assert variable in result.stderr
    assert wrong not in output
    assert redis_server.password not in output


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker this test started (its own process group), gracefully then by force."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
