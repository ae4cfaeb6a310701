"""Grafana Tempo over HTTP: search a time range, then fetch each trace as OTLP.

- Search: ``GET /api/search?q=<TraceQL>&start=<s>&end=<s>&limit=<n>`` (Tempo's search API). The
  range is walked in fixed windows (one unit each, so a resume restarts at a window); a window
  whose search comes back full (``limit`` results: Tempo may have more) is split in halves
  until each part fits, so no trace is silently missed.
- Fetch: ``GET /api/traces/<id>`` with ``Accept: application/protobuf`` (Tempo's ``Trace``
  message, the OTLP layout); a JSON answer (``{"batches": ...}``, base64 ids) is read too.

Trace ids from search may lack leading zeros; they are padded to 32 hex digits (an entry whose
id is not hex is skipped and reported). Transient failures (connection errors, 429, 5xx, a
garbled HTTP answer) are retried with backoff, a ``Retry-After`` obeyed up to a minute; a
backend that stays down raises ``SourceError``; a single trace that cannot be fetched or decoded
is a ``Malformed`` item, and so is one whose body is over ``TRACESCORE_BACKFILL_MAX_LINE_BYTES``
(read no further). Each request has a deadline as a whole (four times the timeout, which
bounds each read): an answer dripped slower is that trace's ``Malformed`` (the search's: a
``SourceError``), never a job held for hours. A redirect is followed only to the same scheme,
host and port: the request's headers (a token) go with it.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import IO, Any

from tracing._broker import redact
from tracing.otlp import OtlpDecodeError, decode_otlp_protobuf_records, decode_otlp_records
from tracing.sources._base import Malformed, Position, SourceError, SourceItem, SpanBatch, UnitEnd
from tracing.sources._files import DEFAULT_MAX_LINE_BYTES, MAX_LINE_BYTES_ENV, _cap

__all__ = ["TempoSource"]

_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
_NS = 1_000_000_000
_MAX_RETRY_AFTER_S = 60.0
_HEX = frozenset("0123456789abcdefABCDEF")
# What an error keeps of an answer's body (read no further: it may be huge).
_DETAIL_BYTES = 200


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port: urllib would send the
    request's headers (``TRACESCORE_TEMPO_HEADERS``: a token) to wherever it points. Not
    followed, the 3xx answer is the error."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if (old.scheme, old.netloc) != (new.scheme, new.netloc):
            return None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (ASCII digits), capped; None when absent or another form."""
    if value and value.isascii() and value.isdigit() and len(value) < 10:
        return min(float(value), _MAX_RETRY_AFTER_S)
    return None


def _start_ns(value: Any) -> int:
    """A search entry's start (ns), 0 when absent or not a plain integer (kept, unfiltered)."""
    if type(value) is int:
        return value
    if type(value) is str and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return 0


def _trace_id(value: Any) -> str | None:
    """A search entry's trace id as 32 lowercase hex digits; None when it is not hex."""
    if type(value) is str and 0 < len(value) <= 32 and _HEX.issuperset(value):
        return value.lower().rjust(32, "0")
    return None


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _TooLarge(Exception):
    pass


class _Slow(Exception):
    """The answer is still coming past the request's deadline (a server dripping it)."""


def _read_body(response: http.client.HTTPResponse, limit: int | None, deadline: float) -> bytes:
    """The answer's body, read as it comes (``read1``: a read waits for some bytes, not for a
    whole buffer), until ``deadline`` (``_Slow``) or past ``limit`` bytes (``_TooLarge``)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(65536):
        size += len(chunk)
        if limit is not None and size > limit:
            raise _TooLarge
        if time.monotonic() > deadline:
            raise _Slow
        chunks.append(chunk)
    return b"".join(chunks)


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
        self.max_trace_bytes = _cap(max_trace_bytes, MAX_LINE_BYTES_ENV, DEFAULT_MAX_LINE_BYTES)
        self.requests = 0
        self._windows_done = 0
        self._opener = urllib.request.build_opener(_SameOrigin)

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
        try:
            request = urllib.request.Request(url, headers={"Accept": accept, **self.headers})
        except ValueError as exc:  # a header value urllib refuses (a newline in it)
            raise SourceError(f"Tempo request headers refused: {type(exc).__name__}") from None
        delay = 0.2
        for attempt in range(self.retries + 1):
            self.requests += 1
            try:
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    body = _read_body(response, limit, time.monotonic() + 4 * self.timeout_s)
                    return body, response.headers.get("Content-Type", "")
            except _Slow:  # not retried: a server that drips one answer drips the next
                raise _HttpError(
                    0, f"the answer from {redact(url)} took over {4 * self.timeout_s:g} s; not waited for"
                ) from None
            except urllib.error.HTTPError as exc:
                detail = exc.read(_DETAIL_BYTES).decode("utf-8", "replace")
                if exc.code not in _RETRYABLE or attempt == self.retries:
                    # the request's headers (an auth token) are masked too, should Tempo echo them
                    said = redact(detail.strip(), *self.headers.values())
                    raise _HttpError(exc.code, f"HTTP {exc.code} from {redact(url)}: {said}") from None
                wait = _retry_after(exc.headers.get("Retry-After")) or delay
            except http.client.HTTPException as exc:  # a garbled answer: its bytes are not shown
                if attempt == self.retries:
                    raise _HttpError(0, f"no valid HTTP answer from {redact(url)} ({type(exc).__name__})") from None
                wait = delay
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.retries:
                    raise SourceError(f"Tempo at {self._shown} is unreachable: {redact(str(exc))}") from None
                wait = delay
            time.sleep(wait * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def _search(self, start_s: int, end_s: int) -> list[dict[str, Any]]:
        params = {"q": self.query, "start": str(start_s), "end": str(end_s), "limit": str(self.limit)}
        try:
            body, _ = self._get("/api/search", params, limit=self.max_trace_bytes)
        except _HttpError as exc:
            raise SourceError(f"Tempo search failed: {exc}") from None
        except _TooLarge:
            raise SourceError(
                f"Tempo search at {self._shown} answered more than {self.max_trace_bytes:,} bytes"
                f" (lower the search limit, {self.limit}, or raise {MAX_LINE_BYTES_ENV})"
            ) from None
        try:
            found = json.loads(body).get("traces") or []
        except (ValueError, AttributeError, RecursionError):
            raise SourceError(f"Tempo search at {self._shown} did not answer JSON") from None
        if not isinstance(found, list):
            raise SourceError(f"Tempo search at {self._shown} answered 'traces' that is not a list")
        return [t for t in found if isinstance(t, dict) and t.get("traceID")]

    def _window_traces(self, start_s: int, end_s: int) -> Iterator[list[tuple[int, str]] | str]:
        """Lists of (start ns, trace id) of the traces starting in [start_s, end_s), one per
        search that fitted under ``limit`` (so memory stays at one search's worth); a str is a
        warning."""
        found = self._search(start_s, end_s)
        if len(found) >= self.limit:
            if end_s - start_s > 1:
                middle = (start_s + end_s) // 2
                yield from self._window_traces(start_s, middle)
                yield from self._window_traces(middle, end_s)
                return
            yield (
                f"more than {self.limit} traces start within second {start_s}; "
                "some may be missed (raise the search limit)"
            )
        listed: set[tuple[int, str]] = set()
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
            listed.add((begin, trace_id))
        if not_hex:
            yield f"{not_hex} search result(s) with a trace id that is not hex: skipped"
        yield sorted(listed)

    def _fetch(self, trace_id: str) -> SourceItem:  # (trace_id: 32 hex digits, from _trace_id)
        where = f"tempo trace {trace_id}"
        try:
            body, content_type = self._get(
                f"/api/traces/{trace_id}", accept="application/protobuf", limit=self.max_trace_bytes
            )
        except _HttpError as exc:
            return Malformed(Position(0), where, f"cannot fetch: {exc}")
        except _TooLarge:
            return Malformed(
                Position(0),
                where,
                f"the trace is longer than {self.max_trace_bytes:,} bytes; skipped without decoding "
                f"(raise {MAX_LINE_BYTES_ENV} to read it)",
            )
        try:
            if "json" in content_type or body[:1] == b"{":
                spans = decode_otlp_records(json.loads(body), where=where)
            else:
                spans = decode_otlp_protobuf_records(body, where=where)
        except (OtlpDecodeError, ValueError) as exc:
            return Malformed(Position(0), where, str(exc))
        except RecursionError:  # json.loads of a body nested beyond the parser's depth
            return Malformed(Position(0), where, "not JSON (nested too deeply)")
        return SpanBatch(spans, Position(0), where)

    def read(self, start: Position | None = None) -> Iterator[SourceItem]:
        start = start or Position(0)
        first_s = self.since_ns // _NS
        last_s = -(-self.until_ns // _NS)
        unit = 0
        for window_start in range(first_s, last_s, self.window_s):
            window_end = min(window_start + self.window_s, last_s)
            if unit >= start.unit:
                skip = start.line - 1 if unit == start.unit else 0
                index = 0
                for listed in self._window_traces(window_start, window_end):
                    if isinstance(listed, str):
                        yield Malformed(Position(unit), f"tempo search {window_start}..{window_end}", listed)
                        continue
                    for _, trace_id in listed:
                        index += 1  # the order is stable: sub-windows in time order, sorted within
                        if index <= skip:
                            continue
                        item = self._fetch(trace_id)
                        position = Position(unit, index)
                        if isinstance(item, SpanBatch):
                            yield SpanBatch(item.spans, position, item.where)
                        elif isinstance(item, Malformed):
                            yield Malformed(position, item.where, item.reason)
            unit += 1
            self._windows_done = unit
            yield UnitEnd(unit - 1, Position(unit))

    def fraction_done(self) -> float:
        """Share of the time range's windows searched and fetched so far."""
        return min(1.0, self._windows_done / self.window_count())

    def window_count(self) -> int:
        first_s = self.since_ns // _NS
        last_s = -(-self.until_ns // _NS)
        return max(1, -(-(last_s - first_s) // self.window_s))
