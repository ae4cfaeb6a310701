"""Our HTTP clients' transport (tracing/_transport.py), in a client built as the sinks build it
and under the OTLP sink's requests session: the environment's proxy still taken (the client no
longer lets httpx read it), the whole-exchange deadline kept through a proxy, TLS (the OTLP
exporter's certificate settings, a client certificate), and a proxy variable it cannot use
named without its value."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests._drip import drip
from tracing import ScoreRecord, score_id_for
from tracing._transport import ExchangeTooSlow, retry_after_s
from tracing.sinks import Delivered, LangfuseSink, OtlpSink, Retry
from tracing.sinks._http import http_client

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class _Server:
    """A local HTTP server recording the request targets it saw; ``dripping``: its answer dripped
    a byte every 0.2 s (until stopped). A GET is answered "answered"; a POST (the OTLP sink's
    export) as an OTLP receiver answers a full success: an empty protobuf body."""

    def __init__(self, dripping: bool = False) -> None:
        self.targets: list[str] = []
        self.authorizations: list[str | None] = []
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.targets.append(self.path)
                server.authorizations.append(self.headers.get("Authorization"))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if dripping:
                    drip(self.wfile, server.stop)
                    return
                body = b"answered" if self.command == "GET" else b""
                self.send_response(200)
                if self.command == "POST":
                    self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                return None

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def proxy() -> Iterator[_Server]:
    server = _Server()
    yield server
    server.close()


def test_a_sink_goes_through_the_proxy_the_environment_names(proxy: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY routes a sink's requests as httpx itself would have: the proxy is asked for the
    absolute URL (the sink's host does not resolve: only the proxy can answer)."""
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client, _ = http_client("http://sink.invalid:6006", what="Phoenix base URL", setting="X", timeout_s=5)
    with client:
        answer = client.get("http://sink.invalid:6006/v1/projects")
    assert (answer.status_code, answer.text) == (200, "answered")
    assert proxy.targets == ["http://sink.invalid:6006/v1/projects"]


@pytest.mark.parametrize("variable", ["ALL_PROXY", "all_proxy"])
def test_all_proxy_serves_a_scheme_without_its_own(
    variable: str, proxy: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, proxy.url.removeprefix("http://"))  # a bare host:port, as httpx reads it
    client, _ = http_client("http://sink.invalid:6006", what="Phoenix base URL", setting="X", timeout_s=5)
    with client:
        assert client.get("http://sink.invalid:6006/").text == "answered"
    assert proxy.targets == ["http://sink.invalid:6006/"]


@pytest.mark.parametrize("listed", ["host", "host:port"])
def test_no_proxy_sends_a_listed_host_direct(listed: str, proxy: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _Server()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv(
            "NO_PROXY", "localhost,127.0.0.1" if listed == "host" else backend.url.removeprefix("http://")
        )
        client, _ = http_client(backend.url, what="Phoenix base URL", setting="X", timeout_s=5)
        with client:
            assert client.get(f"{backend.url}/v1/projects").text == "answered"
    finally:
        backend.close()
    assert backend.targets == ["/v1/projects"]
    assert proxy.targets == []


def test_the_deadline_holds_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy dripping its answer is cut at four timeouts from the request's start, as a
    server is: each read came well within the 0.5 s timeout, for 7.6 s in all."""
    dripping = _Server(dripping=True)
    monkeypatch.setenv("HTTP_PROXY", dripping.url)
    client, _ = http_client("http://sink.invalid:6006", what="Phoenix base URL", setting="X", timeout_s=0.5)
    failure: list[BaseException] = []

    def get() -> None:
        try:
            client.get("http://sink.invalid:6006/")
        except BaseException as exc:
            failure.append(exc)

    started = time.monotonic()
    caller = threading.Thread(target=get)
    caller.start()
    try:
        caller.join(30)
        assert not caller.is_alive(), "still reading the dripped answer"
    finally:
        dripping.close()
        caller.join(30)
        client.close()
    (exc,) = failure
    assert isinstance(exc, ExchangeTooSlow)
    assert isinstance(exc, httpx.TimeoutException)  # what every sink already reads as a Retry
    assert str(exc) == "the answer was not finished within 2 s"
    assert time.monotonic() - started < 7.6, "the whole drip was read"
    assert dripping.targets == ["http://sink.invalid:6006/"]


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("HTTPS_PROXY", "socks5://user:hunter22@proxy.example:1080", "names a socks5 proxy"),
        ("HTTP_PROXY", "http://user:hunter22@[::1", "is not a proxy URL"),
    ],
)
def test_a_proxy_it_cannot_use_is_named_without_its_value(
    variable: str, value: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    scheme = "https" if variable.startswith("HTTPS") else "http"
    with pytest.raises(ValueError, match=named) as raised:
        http_client(f"{scheme}://sink.example", what="Phoenix base URL", setting="X", timeout_s=5)
    assert variable in str(raised.value)
    assert "hunter22" not in str(raised.value)


def _certificate(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A self-signed (key, certificate) for 127.0.0.1."""
    import subprocess

    key, cert = tmp_path / f"{name}-key.pem", tmp_path / f"{name}-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


def _tls(server: _Server, key: Path, cert: Path, client_ca: Path | None = None) -> str:
    """Serve ``server`` over TLS (asking for a client certificate signed by ``client_ca``);
    returns its https URL."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    server._http.socket = context.wrap_socket(server._http.socket, server_side=True)
    return server.url.replace("http://", "https://")


def test_a_sink_speaks_tls_and_trusts_ssl_cert_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS goes through the transport's own streams (the handshake under the deadline too), and
    the certificates are checked as httpx checks them: SSL_CERT_FILE names the trusted ones, an
    untrusted server is refused, and a sink's Retry says it was TLS that failed."""
    key, cert = _certificate(tmp_path, "server")
    server = _Server()
    url = _tls(server, key, cert)
    try:
        client, _ = http_client(url, what="Langfuse host", setting="X", timeout_s=5)
        with client, pytest.raises(httpx.ConnectError):  # not trusted: certifi's roots only
            client.get(url)
        untrusted = LangfuseSink(url, "pk-lf-1", "sk-lf-1", timeout_s=5)
        try:
            (outcome,) = untrusted.deliver([_record()])
        finally:
            untrusted.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        client, _ = http_client(url, what="Langfuse host", setting="X", timeout_s=5)
        with client:
            answer = client.get(f"{url}/api/public/health")
    finally:
        server.close()
    assert (answer.status_code, answer.text) == (200, "answered")
    assert server.targets == ["/api/public/health"]
    assert outcome == Retry("Langfuse: TLS failed (CERTIFICATE_VERIFY_FAILED)")  # was "unreachable (ConnectError)"


def test_a_sink_trusts_the_certificates_in_ssl_cert_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSL_CERT_DIR (a directory of hashed certificates, as ``openssl rehash`` makes) is trusted
    when SSL_CERT_FILE is not set, as the README says: a private CA there is not a TLS failure."""
    import shutil
    import subprocess

    key, cert = _certificate(tmp_path, "server")
    hashed = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(cert)], check=True, capture_output=True, text=True
    ).stdout.strip()
    trusted = tmp_path / "certs"
    trusted.mkdir()
    shutil.copy(cert, trusted / f"{hashed}.0")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(trusted))
    server = _Server()
    url = _tls(server, key, cert)
    try:
        client, _ = http_client(url, what="Langfuse host", setting="X", timeout_s=5)
        with client:
            answer = client.get(f"{url}/api/public/health")
    finally:
        server.close()
    assert (answer.status_code, answer.text) == (200, "answered")


def test_the_otlp_sink_sends_no_credentials_from_netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint without an Authorization header of OTEL_EXPORTER_OTLP_HEADERS' own: requests
    would add the ~/.netrc login for its host (a machine's credentials for another tool, sent to
    a collector); the README says ~/.netrc is not read."""
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-secret-0123456789\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        monkeypatch.delenv(name, raising=False)
    server = _Server()
    sink = OtlpSink(endpoint=f"{server.url}/v1/traces", timeout_s=5)
    try:
        assert sink.deliver([_record()]) == [Delivered()]
    finally:
        sink.close()
        server.close()
    assert server.targets == ["/v1/traces"]
    assert server.authorizations == [None]


def _record() -> ScoreRecord:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    return ScoreRecord(
        score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s", score=0.5
    )


def test_the_otlp_sink_goes_through_the_proxy_the_environment_names(
    proxy: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP exporter's session sends through the transport: HTTP_PROXY is read as for every
    sink (the collector's host does not resolve: only the proxy can answer)."""
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    sink = OtlpSink(endpoint="http://collector.invalid:4318/v1/traces", timeout_s=5)
    try:
        assert sink.deliver([_record()]) == [Delivered()]
    finally:
        sink.close()
    assert proxy.targets == ["http://collector.invalid:4318/v1/traces"]


def test_the_otlp_sink_checks_certificates_as_its_exporter_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE names the trusted server certificate, and the
    client's own certificate and key are shown to an endpoint that asks for them (mutual TLS);
    without either, the exchange fails, a Retry naming the TLS failure (nothing was stored). A REQUESTS_CA_BUNDLE in
    the environment (set on many machines for other tools) does not override the exporter's
    own certificate setting, as requests let it."""
    import certifi

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    key, cert = _certificate(tmp_path, "server")
    client_key, client_cert = _certificate(tmp_path, "client")
    server = _Server()
    url = f"{_tls(server, key, cert, client_ca=client_cert)}/v1/traces"
    outcomes = []
    try:
        for trusted, shown in ((False, True), (True, False), (True, True)):
            for variable, value, given in (
                ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", cert, trusted),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", client_cert, shown),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", client_key, shown),
            ):
                if given:
                    monkeypatch.setenv(variable, str(value))
                else:
                    monkeypatch.delenv(variable, raising=False)
            sink = OtlpSink(endpoint=url, timeout_s=2)
            try:
                outcomes.extend(sink.deliver([_record()]))
            finally:
                sink.close()
    finally:
        server.close()
    untrusted, unshown, delivered = outcomes
    assert untrusted == Retry("OTLP endpoint: TLS failed (CERTIFICATE_VERIFY_FAILED)")
    assert isinstance(unshown, Retry)
    assert unshown.reason.startswith("OTLP endpoint: TLS failed (")  # (TLS 1.3: TLSV13_ALERT_CERTIFICATE_REQUIRED)
    assert delivered == Delivered()
    assert server.targets == ["/v1/traces"]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "America/Los_Angeles"])
def test_a_retry_after_date_is_read_as_gmt_whatever_the_machines_zone(
    monkeypatch: pytest.MonkeyPatch, zone: str
) -> None:
    """An HTTP-date is GMT by definition, its asctime form too, which names no zone: read as the
    machine's local time, 30 s ahead was 9 hours past in Tokyo (no wait) and 8 hours ahead in
    Los Angeles (the cap)."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        ahead = time.time() + 30
        for form in ("%a, %d %b %Y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y"):
            header = time.strftime(form, time.gmtime(ahead))
            waited = retry_after_s(header, cap_s=600.0)
            assert waited is not None, form
            assert 20 < waited <= 30, (form, waited)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("soon", None),
        ("²", None),
        ("nan", None),
        ("inf", None),
        ("12", 12.0),
        (" 12 ", 12.0),
        ("1.5", 1.5),
        ("-5", 0.0),
        ("99999999999999999999", 60.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
        ("Sun, 06 Nov 2094 08:49:37 GMT", 60.0),
        ("Sun, 06 Nov 99999 08:49:37 GMT", None),
    ],
)
def test_a_retry_after_is_read_as_seconds_or_a_date_capped(header: str | None, expected: float | None) -> None:
    """One reader of Retry-After for our HTTP clients (the sinks', Tempo's): delay-seconds or an
    HTTP-date, capped, None when absent or unreadable."""
    assert retry_after_s(header, cap_s=60.0) == expected
