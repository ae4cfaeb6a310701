"""What the HTTP score sinks share: which answers are worth another try, Retry-After, the
OpenTelemetry ids a dashboard matches a score by, sending one request per score a few at a time
(``PerScoreSink``), and reading a refusal (one parser, one scrub).

The contract (``_sink.py``): 408/409/425/429 and every 5xx, connection errors and timeouts are
``Retry``; any other 4xx is ``Refused``.
"""

from __future__ import annotations

import contextvars
import hashlib
import html
import json
import math
import re
import ssl
import zlib
from base64 import b64encode
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar
from urllib.parse import unquote, urlsplit

import httpx

from scorers import header_value_problem
from tracing._broker import redact
from tracing._score_record import ScoreRecord
from tracing._text import without_lone_surrogates
from tracing._transport import ExchangeTooSlow, deadline_client, one_delivery, proxy_for, retry_after_s
from tracing.sinks._sink import Delivery, Refused, Retry

__all__ = [
    "ANSWER_ERRORS",
    "DETAIL_CHARS",
    "JSON",
    "Inflater",
    "PerScoreSink",
    "answer_inflater",
    "answer_json",
    "answer_text",
    "asks_to_wait",
    "error_code",
    "http_client",
    "http_url_problem",
    "is_retryable",
    "json_body",
    "otel_ids",
    "otel_span_id",
    "record_texts",
    "refusal_detail",
    "retry_after",
    "scrubbable",
    "server_message",
    "stored_text",
    "transport_retry",
    "unacknowledged",
]

T = TypeVar("T")

_RETRYABLE = frozenset({408, 409, 425, 429})
# A backend asking for more than this is capped: the drainer's own backoff takes over.
_MAX_RETRY_AFTER_S = 600.0
# How much of a backend's answer a Refused keeps (enough to read the error, not a page of HTML).
DETAIL_CHARS = 300
JSON = {"Content-Type": "application/json"}
# A tag holds no "<": a body of "<" and no ">" (a hostile or broken page) is scanned once, where
# "<[^>]*>" scanned the rest of it from every "<" (150 KB held the GIL, every thread, for 8 s).
_TAGS = re.compile(r"<[^<>]*>")
# What of an answer that is not JSON is looked at: a refusal keeps DETAIL_CHARS of it anyway.
_PAGE_CHARS = 16_384
# The longest answer read as JSON. A backend's acknowledgement or error is far shorter (MLflow's,
# echoing an assessment at its column bounds, about 250 KB); parsed, an answer of tiny containers
# ("[{},{},...]") is some 28 times its size in objects: 450 MB for one of 16 MiB, and the sinks
# that send four requests at once parsed four.
_JSON_ANSWER_CHARS = 2**20
# An error code as backends spell them (MLflow's INVALID_PARAMETER_VALUE): anything else in that
# field is a value the backend echoed, possibly ours, and is not shown.
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# A request that got no usable answer: none at all, or one whose body its encoding cannot undo
# (a bad gzip from a proxy). Both are worth another try.
ANSWER_ERRORS = (httpx.TransportError, httpx.DecodingError)
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
# Score text shorter than this is not scrubbed from a refusal (a label like "good" would blank
# every "good" of the backend's message).
_SCRUB_MIN_CHARS = 8
# A refusal's stretch this long found in a rendering of a score text or a credential is an echo
# of it (``_mask_echoes``): long enough that a backend's own words rarely match one by chance.
_ECHO_CHARS = 16


def http_client(
    url: str,
    *,
    what: str,
    setting: str,
    timeout_s: float,
    parallel: int | None = None,
    secret: str | None = None,
    credentials: Mapping[str, str | None] | None = None,
    headers: dict[str, str] | None = None,
    basic_auth: tuple[str, str] | None = None,
) -> tuple[httpx.Client, tuple[str, ...]]:
    """A sink's HTTP client for ``url`` once what the settings gave is checked (a ``ValueError``
    naming ``setting``: ``what`` is e.g. "MLflow tracking URI"; or naming the setting a
    ``credentials`` value came from, by its description, when a header cannot carry it), and the
    secrets its refusals must never show (``secret``, the URL's own password, and the Basic
    credentials sent, as base64). ``parallel``: requests at a time."""
    parts = urlsplit(url)
    backend = what.split()[0]
    problem = http_url_problem(url)
    if problem:
        shown = redact(url, secret) if secret else redact(url)
        raise ValueError(f"{what} {problem}, got {shown!r} ({setting})")
    for source, value in (credentials or {}).items():
        problem = header_value_problem(value) if value else None
        if problem:
            # Here, once: sent as it is, each request failed in h11 ("unreachable") until every
            # score was dead-lettered. The value is not shown.
            raise ValueError(f"the {source} {problem}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"{backend} timeout must be a positive number of seconds, got {timeout_s!r}")
    if parallel is not None and parallel < 1:
        raise ValueError(f"{backend} parallel must be at least 1 request at a time, got {parallel!r}")
    client = deadline_client(
        timeout_s,
        proxy=proxy_for(url),
        limits=httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel) if parallel else None,
        # (only what _Bounded decodes, within its bound: httpx would ask for br and zstd too)
        headers={"Accept": "application/json", "Accept-Encoding": "gzip, deflate", **(headers or {})},
        auth=httpx.BasicAuth(*basic_auth) if basic_auth else None,
        event_hooks={"response": [_bound_answer]},
    )
    password = unquote(parts.password or "")
    secrets = [secret, parts.password, password]
    # What Basic auth sends (httpx's, from basic_auth or the URL's user info): its base64 decodes
    # to the password, and a gateway's 401 may quote it without the "Basic" before it.
    for user, sent in (basic_auth or ("", ""), (unquote(parts.username or ""), password)):
        if sent:
            secrets.append(b64encode(f"{user}:{sent}".encode()).decode())
    return client, tuple(dict.fromkeys(s for s in secrets if s))


# A huge answer took the memory (a 16 MiB gzip answer decompresses to 16 GiB): each body is read
# up to this size, decompressed (and, as every exchange, within ``EXCHANGE_TIMEOUTS``).
MAX_ANSWER_BYTES = 16 * 2**20
# zlib's window bits for each Content-Encoding decoded (32: a zlib or a gzip header).
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS | 32}


class Inflater:
    """A gzip or deflate answer body decompressed a chunk at a time, never more than asked for.
    "deflate" is zlib data by the RFC, but some servers send it raw: read either, as httpx."""

    def __init__(self, encoding: str) -> None:
        self._decoder = zlib.decompressobj(_WBITS[encoding])
        self._raw_fallback = encoding == "deflate"

    def decompress(self, chunk: bytes, max_length: int) -> bytes:
        """``chunk`` decompressed, at most ``max_length`` bytes of it (``more`` tells whether
        there was more); ``httpx.DecodingError`` for a body that is not what it says, or that
        goes on past the end of its compressed data (zlib keeps those bytes, uncounted: an
        endless stream of them was read until the deadline, 60 MiB and 30 s of CPU)."""
        if self._decoder.eof and chunk:
            raise httpx.DecodingError("the answer goes on past the end of its compressed data")
        try:
            data = self._decoder.decompress(chunk, max_length)
        except zlib.error:
            if not self._raw_fallback:
                raise httpx.DecodingError("the answer is not the gzip or deflate it says") from None
            self._raw_fallback = False
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            return self.decompress(chunk, max_length)
        self._raw_fallback = False
        if self._decoder.unused_data:
            raise httpx.DecodingError("the answer goes on past the end of its compressed data")
        return data

    @property
    def more(self) -> bool:
        """Whether the last ``decompress`` stopped at its ``max_length`` with input left."""
        return bool(self._decoder.unconsumed_tail)


def answer_inflater(headers: httpx.Headers) -> Inflater | None:
    """The decoder of an answer's body by its Content-Encoding (None: sent as it is); an
    ``httpx.DecodingError`` for an encoding other than gzip or deflate, which httpx would decode
    unbounded (br, zstd) and none of our clients asks for (Accept-Encoding)."""
    encodings = [e.strip().lower() for e in headers.get("content-encoding", "").split(",") if e.strip()]
    encodings = [e for e in encodings if e != "identity"]
    if len(encodings) > 1 or (encodings and encodings[0] not in _WBITS):
        raise httpx.DecodingError("the answer's Content-Encoding is not gzip or deflate")
    return Inflater(encodings[0]) if encodings else None


class _AnswerTooLarge(httpx.ReadError):
    """The answer's body is over ``MAX_ANSWER_BYTES``, decompressed."""


class _Bounded(httpx.SyncByteStream):
    """An answer's body stream, decompressed here and stopped past ``MAX_ANSWER_BYTES``."""

    def __init__(self, inner: httpx.SyncByteStream, inflater: Inflater | None) -> None:
        self._inner = inner
        self._inflater = inflater

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        for chunk in self._inner:
            if self._inflater is not None:
                # one byte past the room: more than that is over the bound
                chunk = self._inflater.decompress(chunk, MAX_ANSWER_BYTES - size + 1)
                if self._inflater.more:
                    raise _AnswerTooLarge(f"the answer is over {MAX_ANSWER_BYTES:,} bytes")
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise _AnswerTooLarge(f"the answer is over {MAX_ANSWER_BYTES:,} bytes")
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _bound_answer(response: httpx.Response) -> None:
    """An httpx response hook (headers in, body not yet read): the body bounded in size."""
    stream = response.stream
    if not isinstance(stream, httpx.SyncByteStream):
        return
    inflater = answer_inflater(response.headers)
    if inflater is not None:
        del response.headers["content-encoding"]  # decoded in _Bounded, so not again by httpx
    response.stream = _Bounded(stream, inflater)


def otel_ids(record: ScoreRecord, backend: str) -> tuple[str, str] | Refused:
    """The record's trace and span ids as the dashboards key OpenTelemetry data (lowercase hex,
    32 and 16 digits), or why ``backend`` could not match the score to them (never sent)."""
    trace_id = record.trace_id.lower()
    if not _TRACE_ID.fullmatch(trace_id):
        return Refused(f"trace id is not 32 hex digits (an OpenTelemetry trace id); {backend} cannot match it")
    span_id = otel_span_id(record, backend)
    return span_id if isinstance(span_id, Refused) else (trace_id, span_id)


def otel_span_id(record: ScoreRecord, backend: str) -> str | Refused:
    """``otel_ids``' span id alone, for a backend that finds a span by it (Phoenix)."""
    span_id = record.span_id.lower()
    if not _SPAN_ID.fullmatch(span_id):
        return Refused(f"span id is not 16 hex digits (an OpenTelemetry span id); {backend} cannot match it")
    return span_id


def json_body(payload: object) -> bytes:
    """``payload`` as UTF-8 JSON. A lone surrogate (``json.loads`` of a judge's or an agent's
    ``"\\ud800"`` makes one) becomes U+FFFD: as it is, the encoding would fail on every retry."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return without_lone_surrogates(text)[0].encode("utf-8")


def stored_text(text: str, fits: Callable[[str], bool]) -> str:
    """``text`` as a backend's database stores it: a NUL (PostgreSQL's text and JSONB cannot
    hold one; SQLite can, so only a PostgreSQL-backed server refused it) as U+FFFD, as a lone
    surrogate is, and, when it does not ``fit`` its column, its longest start that fits followed
    by a marker naming its length and the start of its SHA-256 (two long texts alike in their
    first characters stay two). ``fits`` of a start must grow with its length."""
    text = text.replace("\x00", "\ufffd")
    if fits(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    marker = f" …[cut by tracescore from {len(text):,} characters, sha256 {digest}]"
    low, high = 0, len(text)
    while low < high:  # the longest start that fits with the marker after it
        middle = (low + high + 1) // 2
        if fits(text[:middle] + marker):
            low = middle
        else:
            high = middle - 1
    return text[:low] + marker


def http_url_problem(url: str) -> str | None:
    """What keeps ``url`` from being an HTTP sink's address; None when nothing does."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be http(s)://host[:port][/path]"
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        # Each sink appends its API's path to the address: after a query string it went into
        # the query, and the request reached the server's root (Phoenix answers its web page).
        return "must be http(s)://host[:port][/path], without a query string or fragment"
    return None


def is_retryable(status: int) -> bool:
    return status in _RETRYABLE or status >= 500


def asks_to_wait(response: httpx.Response) -> bool:
    """Whether the backend asks every request to wait (429 rate limited, 503 overloaded or in
    maintenance, with or without a Retry-After): the rest of a batch then gets the same ``Retry``
    without a request each, rather than hundreds of requests into the window."""
    return response.status_code in (429, 503)


def retry_after(header: str | None) -> float:
    """A Retry-After header's value in seconds (delta or HTTP date), capped; 0 when absent or
    unreadable."""
    return retry_after_s(header, cap_s=_MAX_RETRY_AFTER_S) or 0.0


def unacknowledged(
    backend: str, response: httpx.Response, acknowledges: Callable[[Any], bool], setting: str
) -> Retry | None:
    """None when a 2xx answer's body is the backend's own acknowledgement of the write
    (``acknowledges`` of its JSON); else the ``Retry`` saying it was not. A page, an empty or
    garbled body, or JSON of another shape comes from something in its place (a proxy or a web
    app at a wrong path, a server still starting): what was stored is unknown, so the score stays
    owed (a re-send is an upsert) and, should it stay so, ends as a dead letter naming this."""
    text = answer_text(response)
    parsed = answer_json(text)
    if acknowledges(parsed):
        return None
    if "html" in response.headers.get("content-type", "").lower():
        what = "a web page"
    elif not response.content:
        what = "an empty body"
    elif len(text) > _JSON_ANSWER_CHARS:
        what = f"a body of {len(text):,} characters (over {_JSON_ANSWER_CHARS:,}: no acknowledgement is)"
    elif parsed is None:
        what = "a body that is not JSON"
    else:
        what = "JSON of another shape"
    return Retry(
        f"{backend} answered HTTP {response.status_code} with {what}, not its API's acknowledgement:"
        f" is {setting} its address?"
    )


def transport_retry(backend: str, exc: httpx.TransportError | httpx.DecodingError) -> Retry:
    """The Retry for a request that got no usable answer (``ANSWER_ERRORS``); names the error
    type, never its text (which may quote the URL and its credentials)."""
    if isinstance(exc, httpx.DecodingError):
        return Retry(f"{backend}'s answer could not be decoded ({type(exc).__name__})")
    if isinstance(exc, ExchangeTooSlow | _AnswerTooLarge):
        return Retry(f"{backend}: {exc}")
    tls = _tls_error(exc)
    if tls is not None:  # OpenSSL's reason code (CERTIFICATE_VERIFY_FAILED, ...): no name or URL in it
        return Retry(f"{backend}: TLS failed ({tls.reason or type(tls).__name__})")
    if isinstance(exc, httpx.TimeoutException):
        return Retry(f"{backend} did not answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.LocalProtocolError):  # h11 refused our own request: nothing went out
        return Retry(f"{backend}: the request could not be sent as HTTP ({type(exc).__name__})")
    return Retry(f"{backend} unreachable ({type(exc).__name__})")


def _tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error under ``exc``, if any: httpcore's pool re-raises "from None", so it is
    found as a cause or as the context."""
    seen: BaseException | None = exc
    for _ in range(8):  # (a chain, not a cycle: bounded all the same)
        if seen is None or isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def answer_text(response: httpx.Response) -> str:
    """An answer's body as text, UTF-8 whatever its ``charset`` says: httpx's ``.text`` raises
    on a charset Python cannot decode with ("rot13", "hex"), which a sink must not."""
    return response.content.decode("utf-8", "replace")


def error_code(parsed: Any) -> str | None:
    """A JSON answer's ``error_code`` when it is shaped like one; ``"UNNAMED"`` when the field
    holds something else (not shown: it may echo what was sent); None without one."""
    code = parsed.get("error_code") if isinstance(parsed, dict) else None
    if not isinstance(code, str) or not code:
        return None
    return code if _ERROR_CODE.fullmatch(code) else "UNNAMED"


def answer_json(text: str) -> Any:
    """An answer's JSON value; None when it is not JSON, nested deeper than the parser goes (a
    hostile answer must not crash a sink), or longer than ``_JSON_ANSWER_CHARS``."""
    if len(text) > _JSON_ANSWER_CHARS:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def server_message(text: str) -> str:
    """What a backend said in a refusal, on one line, never the request it may quote.

    JSON answers: the message (``message`` / ``detail`` / ``error``; MLflow's ``error_code``
    first) and, for validation errors (FastAPI's ``detail`` list, Langfuse's zod ``error`` list),
    each problem's field path and message, never its ``input`` or other quoted values. Any other
    answer (a proxy's page): its text without markup."""
    parsed = answer_json(text)
    if parsed is None:
        return " ".join(_TAGS.sub(" ", text[:_PAGE_CHARS]).split())
    if isinstance(parsed, list):
        return "; ".join(i for i in map(_issue, parsed) if i) or "an answer of JSON type list"
    if not isinstance(parsed, dict):
        return f"an answer of JSON type {type(parsed).__name__}"
    message = next((v for k in ("message", "detail", "error") if isinstance(v := parsed.get(k), str) and v), "")
    issues = next((v for k in ("detail", "error", "errors") if isinstance(v := parsed.get(k), list)), [])
    said = ": ".join(p for p in (message, "; ".join(i for i in map(_issue, issues) if i)) if p)
    code = error_code(parsed)
    if code is not None:
        return f"{code}: {said}" if said else code
    return said or "an answer of JSON type dict"


def _issue(item: object) -> str:
    """One validation problem: where (``loc`` / ``path``) and what (``msg`` / ``message``)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return ""
    place = next((v for k in ("loc", "path") if isinstance(v := item.get(k), list)), [])
    where = ".".join(str(p) for p in place if isinstance(p, str | int))
    what = next((v for k in ("msg", "message") if isinstance(v := item.get(k), str)), "")
    return f"{where}: {what}".strip(": ")


def record_texts(records: Sequence[ScoreRecord]) -> list[str]:
    """The score text of ``records`` a refusal must not echo (reasons, messages, labels)."""
    return scrubbable(t for r in records for t in (r.reason, r.error_message, r.not_scorable, r.label))


def scrubbable(texts: Iterable[object]) -> list[str]:
    """The texts long enough to mask in a refusal (see ``_SCRUB_MIN_CHARS``)."""
    return [t for t in texts if isinstance(t, str) and len(t) >= _SCRUB_MIN_CHARS]


def refusal_detail(text: str, secrets: Sequence[str], content: Sequence[str] = ()) -> str:
    """A refusal's detail: ``server_message`` (quoted input fields already left out), with our
    credentials and any score text (``record_texts``) it still echoes masked, cut short: echoed
    whole, or cut, escaped or with its spaces run together (``_mask_echoes``)."""
    said = _mask_echoes(server_message(text), (*secrets, *content))
    for echoed in content:  # exactly: ``redact``'s pattern for any escaping is for credentials
        said = said.replace(echoed, "***")
    return redact(said, *secrets)[:DETAIL_CHARS]


def _renderings(text: str) -> set[str]:
    """How a backend may echo ``text``: as it is, JSON-escaped, HTML-escaped, as a Python repr,
    and each with its runs of whitespace made one space (as ``server_message`` reads a page)."""
    forms = {
        text,
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
        html.escape(text),
        html.escape(text, quote=False),
        repr(text)[1:-1],
    }
    return forms | {" ".join(f.split()) for f in forms}


def _mask_echoes(said: str, texts: Iterable[str]) -> str:
    """``said`` (its first ``_PAGE_CHARS``) with every stretch of ``_ECHO_CHARS`` characters or
    more that is in a rendering of one of ``texts`` made ``***``: a backend that quotes a score
    text cut short (``value 'The agent said…' too long``) or escaped shows none of it. A shorter
    echo is left to the exact match (``redact``). Indexed by ``said``'s stretches, so the memory
    is the answer's, whatever the size of the texts."""
    width, said = _ECHO_CHARS, said[:_PAGE_CHARS]
    starts: dict[str, list[int]] = {}
    for i in range(len(said) - width + 1):
        starts.setdefault(said[i : i + width], []).append(i)
    # Which of said's stretches are echoes first, then their places: a text repeating one stretch
    # ("aaaa…" against a page of "a") marks its places once, not once per repeat.
    echoed = {
        stretch
        for text in texts
        for form in (_renderings(text) if starts else ())
        for j in range(len(form) - width + 1)
        if (stretch := form[j : j + width]) in starts
    }
    if not echoed:
        return said
    hidden = bytearray(len(said))
    for stretch in echoed:
        for i in starts[stretch]:
            hidden[i : i + width] = b"\x01" * width
    out: list[str] = []
    for i, char in enumerate(said):
        if not hidden[i]:
            out.append(char)
        elif i == 0 or not hidden[i - 1]:
            out.append("***")
    return "".join(out)


def _deliver_each(
    items: Sequence[T | Refused],
    attempt: Callable[[T], tuple[Delivery, bool]],
    pool: ThreadPoolExecutor,
    width: int,
) -> list[Delivery]:
    """One outcome per item, in order, for backends that take one score per request.

    A ``Refused`` item (a record the sink cannot send) is its own outcome. The others go through
    ``attempt`` ``width`` at a time on ``pool`` (the backend's round trip, not our CPU, is what a
    batch waits for). ``attempt`` answers the outcome and whether it holds for every score (no
    answer at all, credentials refused, no such API at the URL): then the items not sent yet get
    it without a request each, so a down backend costs one round of timeouts per batch.
    """
    outcomes: list[Delivery | None] = [item if isinstance(item, Refused) else None for item in items]
    todo = [(i, item) for i, item in enumerate(items) if not isinstance(item, Refused)]
    for_all: Delivery | None = None
    # Each request in a copy of the caller's context: the delivery's deadline (``one_delivery``).
    context = contextvars.copy_context()

    def in_context(item: T) -> tuple[Delivery, bool]:
        return context.copy().run(attempt, item)

    for start in range(0, len(todo), width):
        chunk = todo[start : start + width]
        if for_all is not None:
            for i, _ in chunk:
                outcomes[i] = for_all
            continue
        for (i, _), (outcome, everyone) in zip(chunk, pool.map(in_context, [item for _, item in chunk]), strict=True):
            outcomes[i] = outcome
            if everyone and for_all is None:
                for_all = outcome
    done = [o for o in outcomes if o is not None]
    if len(done) != len(items):  # every path above assigns one outcome per item
        raise AssertionError("_deliver_each left an item without an outcome")
    return done


class PerScoreSink:
    """A sink whose backend takes one score per request (Langfuse, MLflow): ``parallel`` requests
    at a time on a pool of its own (``_deliver_each``). A subclass says what a record becomes
    (``_payload``: a JSON object, or ``Refused`` for one the backend cannot take, never sent) and
    how it is sent (``_send``); a request that got no usable answer is a ``Retry`` (decided here)."""

    backend: ClassVar[str]  # "Langfuse": in messages; lowercase, the sink's name

    def __init__(self, client: httpx.Client, secrets: tuple[str, ...], parallel: int) -> None:
        self._client, self._secrets = client, secrets
        self._parallel = parallel
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix=f"tracescore-{self.name}-sink")

    @property
    def name(self) -> str:
        return self.backend.lower()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        """One request per record, ``parallel`` at a time; one outcome per record, in order."""
        items: list[tuple[ScoreRecord, dict[str, Any]] | Refused] = []
        for record in records:
            payload = self._payload(record)
            items.append(payload if isinstance(payload, Refused) else (record, payload))
        with one_delivery():  # (a request past the delivery's bound: the rest get its Retry)
            return _deliver_each(items, self._attempt, self._pool, self._parallel)

    def _attempt(self, item: tuple[ScoreRecord, dict[str, Any]]) -> tuple[Delivery, bool]:
        try:
            return self._send(*item)
        except ANSWER_ERRORS as exc:
            return transport_retry(self.backend, exc), isinstance(exc, httpx.TransportError)

    def _payload(self, record: ScoreRecord) -> dict[str, Any] | Refused:
        raise NotImplementedError

    def _send(self, record: ScoreRecord, payload: dict[str, Any]) -> tuple[Delivery, bool]:
        """The outcome, and whether it holds for every score (no such API at the URL, the
        credentials refused): ``_deliver_each`` then gives it to the rest without a request."""
        raise NotImplementedError
