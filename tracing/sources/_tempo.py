"""Grafana Tempo over HTTP: search a time range, then fetch each trace as OTLP.

- Search: ``GET /api/search?q=<TraceQL>&start=<s>&end=<s>&limit=<n>`` (Tempo's search API). The
  range is walked in fixed windows (one unit each, so a resume restarts at a window); a window
  whose search comes back full (``limit`` results: Tempo may have more) is split in halves
  until each part fits, and a second still full is searched again with a larger limit, so no
  trace is silently missed (a second holding more, or a Tempo capping its results, is said).
- Fetch: ``GET /api/traces/<id>`` with ``Accept: application/protobuf`` (Tempo's ``Trace``
  message, the OTLP layout); a JSON answer (``{"batches": ...}``, base64 ids) is read too.

Trace ids from search may lack leading zeros; they are padded to 32 hex digits (an entry whose id
is not hex, or all zeros, is skipped and reported); an id listed again is fetched once. Transient
failures (connection errors, 429, 5xx, a garbled HTTP answer) are retried with backoff, a
``Retry-After`` obeyed up to a minute (a date already past: the backoff); a backend that stays down
raises ``SourceError`` (fetches too: ``_DOWN_AFTER`` traces in a row failed on Tempo's side, not
yielded, so a resume fetches them); a single trace that cannot be fetched or decoded is a
``Malformed`` item, and so is one whose body is over ``TRACESCORE_BACKFILL_MAX_LINE_BYTES`` (read
no further). Each request has a deadline as a whole (four times the timeout, which bounds each
read; ``tracing._transport``), its status line and headers included: an answer dripped slower is
that trace's ``Malformed`` (the search's: a ``SourceError``), never a job held for hours. A
redirect is followed only to the same scheme, host and port: the request's headers (a token) go
with it. Connections are kept open from one request to the next; certificates are checked against
the system's store, as Python's own clients check them.
"""

from __future__ import annotations

import json
import random
import re
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from tracing._broker import redact
from tracing._errors import json_error
from tracing._transport import EXCHANGE_TIMEOUTS, ExchangeTooSlow, deadline_client, proxy_for, retry_after_s
from tracing.otlp import OtlpDecodeError, decode_otlp_protobuf_records, decode_otlp_records
from tracing.sources._base import Malformed, Position, SourceError, SourceItem, SpanBatch, UnitEnd
from tracing.sources._compressed import byte_cap
from tracing.sources._files import DEFAULT_MAX_LINE_BYTES, MAX_LINE_BYTES_ENV

__all__ = ["TempoSource"]

_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
# Statuses that speak of Tempo (or a gateway before it) rather than of the trace asked for.
_UNAVAILABLE = frozenset({408, 429, 502, 503, 504})
# Fetches in a row that find Tempo down (those statuses, answers dripped past their deadline or
# not HTTP, once retried) before the read stops as a SourceError: a Tempo whose queriers are down
# while its search answers failed every trace alone, one after another, and a job "finished"
# past traces a resume would no longer read.
_DOWN_AFTER = 3
# A one-second window still full is searched again with this many times its limit, up to
# _MAX_GROWTH times the source's limit (64,000 traces in a second at the default limit).
_GROWTH = 4
_MAX_GROWTH = 64
_NS = 1_000_000_000
_MAX_RETRY_AFTER_S = 60.0
_HEX = frozenset("0123456789abcdefABCDEF")
# What an error keeps of an answer's body (read no further: it may be huge).
_DETAIL_BYTES = 200
_MAX_REDIRECTS = 10
# What a header's name (an HTTP token) and value (printable ASCII: no CR, LF or NUL to inject a
# header of its own, nothing httpx cannot encode) may hold.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def _start_ns(value: Any) -> int:
    """A search entry's start (ns), 0 when absent or not a plain integer (kept, unfiltered)."""
    if type(value) is int:
        return value
    if type(value) is str and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return 0


def _trace_id(value: Any) -> str | None:
    """A search entry's trace id as 32 lowercase hex digits; None when it is not hex (or all
    zeros: no trace's id)."""
    if type(value) is str and 0 < len(value) <= 32 and _HEX.issuperset(value) and value.strip("0"):
        return value.lower().rjust(32, "0")
    return None


class _HttpError(Exception):
    def __init__(self, status: int, message: str, *, down: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.down = down or status in _UNAVAILABLE  # Tempo failing, not the trace


class _Down(Malformed):
    """A trace not fetched because Tempo failed (``_HttpError.down``): held back by ``_read``."""


class _TooLarge(Exception):
    pass


def _asked_wait(header: str | None) -> float | None:
    """The wait a ``Retry-After`` asks for, or None for the backoff: absent, unreadable, or a
    date already past (a clock behind, a cached answer), which names no wait (it was taken as
    "now", and a Tempo sending one was asked again at once, every attempt). A delay of 0 is a
    wait asked for: none."""
    asked = retry_after_s(header, cap_s=_MAX_RETRY_AFTER_S)
    if asked == 0.0 and header is not None:
        try:
            float(header)
        except ValueError:  # an HTTP-date
            return None
    return asked


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _read_body(response: httpx.Response, limit: int | None, cut: bool) -> bytes:
    """The answer's body as sent (nothing decoded), read as it comes; past ``limit`` bytes it
    is ``_TooLarge``, or, when ``cut``, its first ``limit`` bytes (read no further)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if limit is not None and size > limit:
            if not cut:
                raise _TooLarge
            break
    return b"".join(chunks)[:limit]


def _answered(content_type: str, size: int, as_json: bool) -> str:
    """What the answer said it was, for an error (an HTML page read as protobuf said only
    "Wire format was corrupt"); nothing of its body."""
    given = content_type.split(";")[0].strip().lower()
    if not (given and _HEADER_VALUE.fullmatch(given) and len(given) <= 64):
        given = "no Content-Type" if not given else "another Content-Type"
    return f" (Tempo answered {size:,} bytes of {given}, read as {'JSON' if as_json else 'protobuf'})"


class TempoSource:
    """Traces stored in Grafana Tempo, between ``since_ns`` and ``until_ns``.

    ``until_ns`` defaults to now and ``since_ns`` to 24 hours before it; both are fixed when the
    source is made, so a resumed job reads the same range.
    """

    def __init__(
        self,
        url: str,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        query: str | None = None,
        window_s: int = 3600,
        limit: int = 1000,
        timeout_s: float = 30.0,
        retries: int = 5,
        headers: Mapping[str, str] | None = None,
        max_trace_bytes: int | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SourceError(f"{redact(url)!r} is not a Tempo URL; expected e.g. tempo+http://localhost:3200")
        self.url = url.rstrip("/")
        self._shown = redact(self.url)  # what messages print: never the URL's password
        self.until_ns = until_ns if until_ns is not None else time.time_ns()
        self.since_ns = since_ns if since_ns is not None else self.until_ns - 24 * 3600 * _NS
        if self.since_ns >= self.until_ns:
            raise SourceError("--since must be before --until")
        if window_s < 1 or limit < 1:
            raise SourceError("the Tempo search window and limit must be positive")
        self.query = query or "{}"
        self.window_s = window_s
        self.limit = limit
        self.timeout_s = timeout_s
        self.retries = retries
        self.headers = dict(headers or {})
        # One fetched trace is one record: the same cap as a file's line (from the environment).
        self.max_trace_bytes = byte_cap(max_trace_bytes, MAX_LINE_BYTES_ENV, DEFAULT_MAX_LINE_BYTES)
        for index, (name, value) in enumerate(self.headers.items(), 1):
            if not (_HEADER_NAME.fullmatch(name) and _HEADER_VALUE.fullmatch(value)):
                # (neither is shown: a header may hold a token)
                raise SourceError(
                    f"Tempo request header {index} refused: not an HTTP header name and a printable ASCII value"
                )
        try:
            self._proxy = proxy_for(self.url)
        except ValueError as exc:
            raise SourceError(f"Tempo at {self._shown}: {exc}") from None
        self.requests = 0
        self._windows_done = 0
        self._client: httpx.Client | None = None

    @classmethod
    def from_description(
        cls, description: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> TempoSource:
        return cls(
            description["url"],
            since_ns=description["since_ns"],
            until_ns=description["until_ns"],
            query=description.get("query"),
            window_s=description.get("window_s", 3600),
            limit=description.get("limit", 1000),
            headers=headers,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "tempo",
            "url": self.url,
            "since_ns": self.since_ns,
            "until_ns": self.until_ns,
            "query": self.query,
            "window_s": self.window_s,
            "limit": self.limit,
        }

    def label(self) -> str:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.since_ns / _NS))
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.until_ns / _NS))
        return f"Tempo {self._shown} {self.query} from {start} to {end} UTC"

    # --- HTTP ---------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        """The client, opened for a ``read`` (closed at its end) or a single request."""
        if self._client is None:
            self._client = deadline_client(
                self.timeout_s,
                proxy=self._proxy,
                ssl_context=ssl.create_default_context(),
                headers={"Accept-Encoding": "identity"},  # nothing decoded past the size cap
            )
        return self._client

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _get(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        accept: str = "application/json",
        limit: int | None = None,
    ) -> tuple[bytes, str]:
        """The body and its content type; ``_TooLarge`` past ``limit`` bytes (not read further)."""
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        delay = 0.2
        for attempt in range(self.retries + 1):
            self.requests += 1
            try:
                status, headers, body = self._exchange(url, accept, limit)
            except ExchangeTooSlow:  # not retried: a server that drips one answer drips the next
                raise _HttpError(
                    0,
                    f"the answer from {redact(url)} took over {EXCHANGE_TIMEOUTS * self.timeout_s:g} s; not waited for",
                    down=True,
                ) from None
            except httpx.ProtocolError as exc:  # a garbled answer: its bytes are not shown
                if attempt == self.retries:
                    raise _HttpError(
                        0, f"no valid HTTP answer from {redact(url)} ({type(exc).__name__})", down=True
                    ) from None
                wait = delay
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise SourceError(f"Tempo at {self._shown} is unreachable: {redact(str(exc))}") from None
                wait = delay
            else:
                if 200 <= status < 300:
                    encoding = headers.get("Content-Encoding", "identity").strip().lower()
                    if encoding not in ("", "identity"):
                        # (its bytes read as protobuf said "Wire format was corrupt"; a proxy's doing)
                        shown = encoding if _HEADER_NAME.fullmatch(encoding) and len(encoding) <= 32 else "another"
                        raise _HttpError(
                            status,
                            f"the answer from {redact(url)} came in Content-Encoding {shown}, though none was"
                            " asked for (Accept-Encoding: identity): not decoded",
                        )
                    return body, headers.get("Content-Type", "")
                if status not in _RETRYABLE or attempt == self.retries:
                    # the request's headers (an auth token) are masked too, should Tempo echo them
                    said = redact(body.decode("utf-8", "replace").strip(), *self.headers.values())
                    raise _HttpError(status, f"HTTP {status} from {redact(url)}: {said}")
                asked = _asked_wait(headers.get("Retry-After"))
                if asked is not None:  # as asked: jittered, it came half of it early, or past the cap
                    time.sleep(asked)
                    delay = min(delay * 2, 10.0)
                    continue
                wait = delay
            time.sleep(wait * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def _exchange(self, url: str, accept: str, limit: int | None) -> tuple[int, httpx.Headers, bytes]:
        """One GET, redirects to the same origin followed: the status, the headers and the body
        (an error's first ``_DETAIL_BYTES``; a success's, ``_TooLarge`` past ``limit``)."""
        client = self._http()
        request = client.build_request("GET", url, headers={"Accept": accept, **self.headers})
        for _ in range(_MAX_REDIRECTS + 1):
            response = client.send(request, stream=True)
            try:
                follow = response.next_request if response.is_redirect else None
                if follow is not None and _origin(follow.url) == _origin(request.url):
                    request = follow
                    continue
                ok = 200 <= response.status_code < 300
                body = _read_body(response, limit if ok else _DETAIL_BYTES, cut=not ok)
                return response.status_code, response.headers, body
            finally:
                response.close()
        raise _HttpError(0, f"more than {_MAX_REDIRECTS} redirects from {redact(url)}")  # a loop: not retried

    def _search(self, start_s: int, end_s: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The search's entries, and the size of its answer in bytes."""
        params = {"q": self.query, "start": str(start_s), "end": str(end_s), "limit": str(limit)}
        try:
            body, _ = self._get("/api/search", params, limit=self.max_trace_bytes)
        except _HttpError as exc:
            raise SourceError(f"Tempo search failed: {exc}") from None
        except _TooLarge:
            raise SourceError(
                f"Tempo search at {self._shown} answered more than {self.max_trace_bytes:,} bytes"
                f" for at most {limit:,} traces (raise {MAX_LINE_BYTES_ENV})"
            ) from None
        try:
            found = json.loads(body).get("traces") or []
        except (ValueError, AttributeError, RecursionError):
            raise SourceError(f"Tempo search at {self._shown} did not answer JSON") from None
        if not isinstance(found, list):
            raise SourceError(f"Tempo search at {self._shown} answered 'traces' that is not a list")
        return [t for t in found if isinstance(t, dict) and t.get("traceID")], len(body)

    def _window_traces(self, start_s: int, end_s: int) -> Iterator[list[tuple[int, str]] | str]:
        """Lists of (start ns, trace id) of the traces starting in [start_s, end_s), one per
        search that fitted under ``limit`` (so memory stays at one search's worth); a str is a
        warning."""
        found, size = self._search(start_s, end_s, self.limit)
        if len(found) >= self.limit:
            if end_s - start_s > 1:
                middle = (start_s + end_s) // 2
                yield from self._window_traces(start_s, middle)
                yield from self._window_traces(middle, end_s)
                return
            found, warning = self._crowded_second(start_s, end_s, found, size)
            if warning is not None:
                yield warning
        # Each trace once, at its earliest start: a search listing one id many times (with other
        # starts) had it fetched once per entry.
        listed: dict[str, int] = {}
        not_hex = 0
        for entry in found:
            trace_id = _trace_id(entry["traceID"])
            if trace_id is None:
                not_hex += 1
                continue
            begin = _start_ns(entry.get("startTimeUnixNano"))
            # Tempo's end bound is inclusive at second granularity: keep each trace in one window.
            if begin and not (start_s * _NS <= begin < end_s * _NS):
                continue
            if begin and not (self.since_ns <= begin < self.until_ns):
                continue
            if trace_id not in listed or begin < listed[trace_id]:
                listed[trace_id] = begin
        if not_hex:
            yield f"{not_hex} search result(s) with a trace id that is not hex (or all zeros): skipped"
        yield sorted((begin, trace_id) for trace_id, begin in listed.items())

    def _crowded_second(
        self, start_s: int, end_s: int, found: list[dict[str, Any]], size: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A one-second window whose search came back full (``found``, ``size`` bytes): nothing
        is left to split, and Tempo cut the oldest, so it is searched again with a limit
        ``_GROWTH`` times larger until it fits, up to ``_MAX_GROWTH`` times the limit and an
        answer under the byte cap. Its entries, and a warning when some may still be missing."""
        limit = self.limit
        while len(found) >= limit:
            larger = limit * _GROWTH
            if larger > self.limit * _MAX_GROWTH or size * _GROWTH > self.max_trace_bytes:
                return found, (
                    f"more than {len(found):,} traces start within second {start_s}; some may be missed"
                    f" (searched for up to {limit:,}; a narrower --query lists fewer)"
                )
            more, size = self._search(start_s, end_s, larger)
            if len(more) <= len(found):  # asked for more, listed no more: Tempo caps a search
                return found, (
                    f"more than {len(found):,} traces start within second {start_s}; some may be missed:"
                    f" Tempo listed {len(more):,} when asked for {larger:,} (its query_frontend.search."
                    "max_result_limit caps a search)"
                )
            found, limit = more, larger
        return found, None

    def _fetch(self, trace_id: str) -> Iterator[SpanBatch | Malformed]:  # (trace_id: 32 hex, from _trace_id)
        """The trace's spans, or why there are none; spans of other traces are named, not read."""
        where = f"tempo trace {trace_id}"
        try:
            body, content_type = self._get(
                f"/api/traces/{trace_id}", accept="application/protobuf", limit=self.max_trace_bytes
            )
        except _HttpError as exc:
            yield (_Down if exc.down else Malformed)(Position(0), where, f"cannot fetch: {exc}")
            return
        except _TooLarge:
            yield Malformed(
                Position(0),
                where,
                f"the trace is longer than {self.max_trace_bytes:,} bytes; skipped without decoding "
                f"(raise {MAX_LINE_BYTES_ENV} to read it)",
            )
            return
        as_json = "json" in content_type or body.lstrip()[:1] == b"{"
        try:
            document = json.loads(body) if as_json else None
        except (ValueError, RecursionError) as exc:  # not JSON, or nested past the parser's depth
            yield Malformed(
                Position(0), where, f"not JSON ({json_error(exc)}){_answered(content_type, len(body), True)}"
            )
            return
        try:
            if as_json:
                spans = decode_otlp_records(document, where=where)
            else:
                spans = decode_otlp_protobuf_records(body, where=where)
        except OtlpDecodeError as exc:  # (its text would name the trace twice: ``where`` says it)
            said = exc.reason + (f" at {exc.field}" if exc.field else "")
            yield Malformed(Position(0), where, f"{said}{_answered(content_type, len(body), as_json)}")
            return
        # Tempo answers 200 with nothing (empty protobuf, {}, no batches) for a trace it listed but
        # no longer holds (retention, compaction): that trace is lost, so it is said, not skipped.
        mine = [s for s in spans if s.trace_id == trace_id]
        if len(mine) < len(spans):
            other = len(spans) - len(mine)
            yield Malformed(Position(0), where, f"Tempo answered {other:,} span(s) of other traces: skipped")
        if not mine:
            yield Malformed(Position(0), where, f"Tempo answered no spans for trace {trace_id}")
            return
        yield SpanBatch(mine, Position(0), where)

    def read(self, start: Position | None = None) -> Iterator[SourceItem]:
        try:
            yield from self._read(start or Position(0))
        finally:
            self._close()

    def _read(self, start: Position) -> Iterator[SourceItem]:
        first_s = self.since_ns // _NS
        last_s = -(-self.until_ns // _NS)
        unit = 0
        # From the first of the traces Tempo failed (``_Down``) in a row, what is not yet yielded
        # (window ends too): a read that stops over them leaves its position before them, so a
        # resume fetches them again.
        held: list[SourceItem] = []
        down = 0
        for window_start in range(first_s, last_s, self.window_s):
            window_end = min(window_start + self.window_s, last_s)
            if unit >= start.unit:
                skip = start.line - 1 if unit == start.unit else 0
                index = 0
                for listed in self._window_traces(window_start, window_end):
                    if isinstance(listed, str):
                        # At the position of the trace after it: a read from inside the window
                        # (a resume) searches it again, and gives the warning again only when it
                        # comes at or past the start, or the job counted it twice.
                        if index < skip:
                            continue
                        where = f"tempo search {window_start}..{window_end}"
                        warning = Malformed(Position(unit, index + 1), where, listed)
                        if held:
                            held.append(warning)
                        else:
                            yield warning
                        continue
                    for _, trace_id in listed:
                        index += 1  # the order is stable: sub-windows in time order, sorted within
                        if index <= skip:
                            continue
                        position = Position(unit, index)
                        for item in self._fetch(trace_id):
                            if isinstance(item, _Down):
                                held.append(Malformed(position, item.where, item.reason))
                                down += 1
                                if down >= _DOWN_AFTER:
                                    raise SourceError(
                                        f"Tempo at {self._shown} failed {down} traces in a row; the last:"
                                        f" {item.reason.removeprefix('cannot fetch: ')}"
                                    )
                                continue
                            yield from held  # (fewer in a row: those traces' failures alone)
                            held.clear()
                            down = 0
                            if isinstance(item, SpanBatch):
                                yield SpanBatch(item.spans, position, item.where)
                            else:
                                yield Malformed(position, item.where, item.reason)
            unit += 1
            self._windows_done = unit
            if held:
                held.append(UnitEnd(unit - 1, Position(unit)))
            else:
                yield UnitEnd(unit - 1, Position(unit))
        yield from held

    def fraction_done(self) -> float:
        """Share of the time range's windows searched and fetched so far."""
        return min(1.0, self._windows_done / self.window_count())

    def window_count(self) -> int:
        first_s = self.since_ns // _NS
        last_s = -(-self.until_ns // _NS)
        return max(1, -(-(last_s - first_s) // self.window_s))
