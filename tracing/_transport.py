"""Our HTTP clients' transport (the score sinks', the Tempo source's): one deadline for a whole
exchange, not only for each read.

httpx bounds each socket operation, not the exchange: a server (or a proxy) sending its status
line or headers a byte just inside every read timeout held a drainer, and the lease it kept
renewing, or a backfill, for as long as it liked. ``DeadlineTransport`` gives each request a
deadline from its start; every read and write of that request, from the connect to the last
byte of the body, waits no longer than what is left of it (nor longer than its own httpx
timeout). Past it, the request fails as ``ExchangeTooSlow`` and its connection is closed.
``deadline_client`` builds the client our HTTP clients use: each exchange is given
``EXCHANGE_TIMEOUTS`` timeouts. Within ``one_delivery`` (a sink's ``deliver``), every exchange
also ends by the first one's deadline, however many a sink makes.

httpx's ``HTTPTransport`` keeps its connection pool private, so this one builds the pool from
httpcore's public API, with a network backend that reads the deadline of the request on the
calling thread. Its proxy is the one httpx would take from the environment for the client's
origin (``proxy_for``): ``deadline_client`` builds its client with ``trust_env=False``, or httpx
would mount its own transports, without the deadline, for the proxied schemes.
"""

from __future__ import annotations

import datetime
import math
import ssl
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpcore
import httpx

__all__ = [
    "EXCHANGE_EXTENSION",
    "EXCHANGE_TIMEOUTS",
    "DeadlineTransport",
    "ExchangeTooSlow",
    "deadline_client",
    "one_delivery",
    "proxy_for",
    "retry_after_s",
]

# A whole exchange (connect to the answer's last byte) gets this many of a client's timeouts.
EXCHANGE_TIMEOUTS = 4
# A request's own exchange deadline in seconds, in its extensions, over the transport's.
EXCHANGE_EXTENSION = "tracescore.exchange_s"


class ExchangeTooSlow(httpx.ReadTimeout):
    """A request whose answer was not all in by its deadline (``DeadlineTransport``)."""


class _Deadline(NamedTuple):
    at: float  # time.monotonic()
    seconds: float
    what: str = "the answer"  # what was not finished in time, for the error


# The deadline of the request under way on this thread (httpcore's sync pool does every socket
# operation of a request on the thread that sent it).
_DEADLINE: ContextVar[_Deadline | None] = ContextVar("tracescore_http_deadline", default=None)


class _Delivery:
    """The delivery under way in a context (``one_delivery``): its first exchange's deadline,
    which every later one keeps to. (One object, so that the copies of the context its requests
    run in share it.)"""

    first: _Deadline | None = None


_DELIVERY: ContextVar[_Delivery | None] = ContextVar("tracescore_delivery", default=None)


@contextmanager
def one_delivery() -> Iterator[None]:
    """Every exchange made within it, on this thread or on one running a copy of its context,
    ends by the first one's deadline; one that would start past it fails at once
    (``ExchangeTooSlow``). A sink re-sending a refused batch a record at
    a time took a whole deadline for each record: a drainer, or a command waiting for its last
    delivery, held 101 exchanges long."""
    token = _DELIVERY.set(_Delivery())
    try:
        yield
    finally:
        _DELIVERY.reset(token)


_SLACK_S = 0.01
# httpcore's errors as httpx's, most specific first (httpx's own mapping is private).
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def _left(timeout: float | None, past: type[httpcore.TimeoutException]) -> float | None:
    """The timeout for one socket operation: ``timeout``, cut to what is left of the request's
    deadline; ``past`` raised when nothing is."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline.at - time.monotonic()
    if left <= 0:
        raise past("past the exchange's deadline")
    return left if timeout is None else min(timeout, left)


@contextmanager
def _within(deadline: _Deadline) -> Iterator[None]:
    """Run a step of the request under ``deadline``, its httpcore errors raised as httpx's."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    except Exception as exc:
        # (a read cut to the deadline times out at it, give or take the poll's rounding)
        if isinstance(exc, httpcore.TimeoutException) and time.monotonic() >= deadline.at - _SLACK_S:
            raise ExchangeTooSlow(f"{deadline.what} was not finished within {round(deadline.seconds, 1):g} s") from exc
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc)) from exc
        raise
    finally:
        _DEADLINE.reset(token)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sync backend, each stream's operations cut to the request's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """An answer's body, each read under its request's deadline."""

    def __init__(self, inner: Iterable[bytes], deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            with _within(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            with _within(self._deadline):
                close()


def _core_url(url: httpx.URL) -> httpcore.URL:
    return httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)


class DeadlineTransport(httpx.BaseTransport):
    """An httpx transport whose every request, answer body included, is over within
    ``seconds`` of its start (``ExchangeTooSlow``), or within its own ``EXCHANGE_EXTENSION``
    seconds when its extensions give them. HTTP/1.1, through ``proxy`` when given (http
    or https); ``ssl_context`` defaults to httpx's (certifi's roots; ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` instead when set)."""

    def __init__(
        self,
        seconds: float,
        *,
        limits: httpx.Limits,
        proxy: httpx.Proxy | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._seconds = seconds
        common: dict[str, Any] = {
            "ssl_context": ssl_context or httpx.create_ssl_context(trust_env=True),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
            "network_backend": _Backend(),
        }
        pool: httpcore.ConnectionPool
        if proxy is None:
            pool = httpcore.ConnectionPool(**common)
        else:
            pool = httpcore.HTTPProxy(
                proxy_url=_core_url(proxy.url),
                proxy_auth=proxy.raw_auth,
                proxy_headers=proxy.headers.raw,
                proxy_ssl_context=proxy.ssl_context,
                **common,
            )
        self._pool = pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        seconds = request.extensions.get(EXCHANGE_EXTENSION, self._seconds)
        now, delivery = time.monotonic(), _DELIVERY.get()
        deadline = _Deadline(now + seconds, seconds)
        if delivery is not None:
            first = delivery.first
            if first is None:
                delivery.first = deadline
            elif first.at < deadline.at:
                deadline = first._replace(what="the delivery")
                if deadline.at <= now:
                    raise ExchangeTooSlow(f"the delivery was not finished within {round(first.seconds, 1):g} s")
        core_request = httpcore.Request(
            method=request.method,
            url=_core_url(request.url),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _within(deadline):
            answer = self._pool.handle_request(core_request)
        assert isinstance(answer.stream, Iterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream, deadline),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def deadline_client(
    timeout_s: float,
    *,
    proxy: httpx.Proxy | None,
    limits: httpx.Limits | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **options: Any,
) -> httpx.Client:
    """An ``httpx.Client`` (``options``: its headers, auth, event hooks) whose requests go
    through a ``DeadlineTransport``: each read and write within ``timeout_s``, each exchange
    within ``EXCHANGE_TIMEOUTS`` of them; through ``proxy`` (``proxy_for``); no redirect followed
    (a caller that follows one decides where)."""
    transport = DeadlineTransport(
        EXCHANGE_TIMEOUTS * timeout_s, limits=limits or httpx.Limits(), proxy=proxy, ssl_context=ssl_context
    )
    return httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport, trust_env=False, **options)


def proxy_for(url: str) -> httpx.Proxy | None:
    """The proxy the environment names for ``url``'s origin, as httpx reads it: the scheme's own
    (``HTTPS_PROXY``, ``HTTP_PROXY``) before ``ALL_PROXY``, none for a host ``NO_PROXY`` lists.
    A ``ValueError`` naming the variable for one that is not an http(s) proxy URL (its value is
    not shown: it may hold a password)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    # (host:port: a NO_PROXY entry may name either; no userinfo)
    if not proxies or urllib.request.proxy_bypass(parts.netloc.rpartition("@")[2]):
        return None
    for scheme in (parts.scheme, "all"):
        value = proxies.get(scheme)
        if value:
            break
    else:
        return None
    variable = f"{scheme.upper()}_PROXY"
    if "://" not in value:
        value = f"http://{value}"  # as httpx reads a bare host:port
    try:
        proxy = httpx.Proxy(value)
    except (ValueError, httpx.InvalidURL):
        raise ValueError(f"{variable} (or {variable.lower()}) is not a proxy URL like http://host:port") from None
    if proxy.url.scheme not in ("http", "https"):
        raise ValueError(
            f"{variable} (or {variable.lower()}) names a {proxy.url.scheme} proxy; tracescore's HTTP "
            "clients go through http(s) proxies only"
        )
    return proxy


def retry_after_s(header: str | None, *, cap_s: float) -> float | None:
    """A ``Retry-After``'s wait in seconds, at most ``cap_s``: delay-seconds, or an HTTP-date
    (RFC 9110: IMF-fixdate, or the obsolete RFC 850 and asctime forms, all GMT: the asctime form
    names no zone and was read as the machine's local time). A date past is no wait, as is a
    negative delay. None when absent or unreadable (a word, a NaN, a date no calendar holds)."""
    value = (header or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), cap_s)
