"""``OtlpSink``: scores as span events on a carrier span, exported over OTLP synchronously.

For each score the sink builds one carrier span, a child of the scored span that links to it,
holding that score's ``gen_ai.evaluation.result`` event (OpenTelemetry GenAI semantic
conventions), and hands the batch to the span exporter's ``export()`` itself: its SUCCESS or
FAILURE is the delivery outcome (no batch processor in between that could lose it). One carrier
per score, not per scored span: TraceQL metrics (``count_over_time``, ``rate``) count matching
spans, so only then does a dashboard's count of evaluation events count scores.

Times: the carrier lies inside the scored span (``span_start_ns``..``span_end_ns`` of the record)
and its events sit at the scored span's end, so no backend draws the trace longer than it was;
when scoring really happened is the event attribute ``tracescore.scored_at`` (epoch seconds).
A record without the scored span's times (stored before they were kept) gets a zero-length
carrier at the time its run was handed to the queue (``enqueued_at``), else at ``scored_at``.

The carrier's span id is derived from its score's id, so a re-send is the same span again. It
is marked ``tracescore.role=score_writer`` so the capture exporter never scores it (loop guard).

The default exporter is the OTLP/HTTP one, configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables; its HTTP session is watched so that a refusal (4xx other than 408/409/425/429) is
``Refused`` with the endpoint's status and answer instead of being retried for ever, and a
``Retry-After`` longer than the exporter's own timeout is the drainer's wait. A batch
refused for its content (400, 413, 422) is split in halves and re-sent, so one record the
endpoint cannot take does not refuse its neighbours; a single record's 413 names its size.
An acceptance is read too: one whose ``partial_success`` rejects every span sent refuses each
record with the endpoint's message; one rejecting some is split alike to find them (a re-send
is an upsert). One whose body is not all in (cut, too slow, undecodable), or is no
ExportTraceServiceResponse (a web page, a proxy's ``OK``), is a ``Retry``: what the endpoint
stored is unknown. Exporter headers no HTTP header can carry stop the sink's
construction (``OTEL_EXPORTER_OTLP_*HEADERS`` named, never the value).

The session sends through our HTTP transport (``tracing._transport``), as every sink does: one
deadline for the whole exchange, the environment's proxy read alike, the exporter's certificate
settings kept (a ``REQUESTS_CA_BUNDLE`` does not override them), and no redirect followed
whichever exporter version posts (the oldest allowed one let requests follow them).
"""

from __future__ import annotations

import hashlib
import http
import logging
import os
import ssl
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import certifi
import httpx
import requests
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.re import parse_env_headers

from scorers import header_value_problem
from tracing._markers import ROLE_ATTRIBUTE
from tracing._run import MAX_TIME_NS, otlp_time
from tracing._score_record import ScoreRecord
from tracing._transport import EXCHANGE_EXTENSION, EXCHANGE_TIMEOUTS, deadline_client, one_delivery, proxy_for
from tracing.sinks._http import (
    ANSWER_ERRORS,
    answer_inflater,
    answer_json,
    is_retryable,
    record_texts,
    refusal_detail,
    retry_after,
    transport_retry,
)
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, shown_endpoint

__all__ = [
    "CARRIER_SPAN_NAME",
    "EVALUATION_EVENT",
    "ROLE_ATTRIBUTE",
    "ROLE_SCORE_WRITER",
    "OtlpSink",
    "carrier_spans",
    "evaluation_attributes",
    "otlp_headers_problem",
]

EVALUATION_EVENT = "gen_ai.evaluation.result"
CARRIER_SPAN_NAME = "tracescore.evaluation"
ROLE_SCORE_WRITER = "score_writer"
SCOPE_NAME = "tracescore.score_writer"

# Of the endpoint's answer kept to read a refusal from (enough to parse a JSON error whole).
_ANSWER_CHARS = 64_000
# What of the answer is read at all (decompressed): the rest is left unread, the connection closed.
_ANSWER_BYTES = 4 * _ANSWER_CHARS
# Refusals about a request's content (bad, too large, invalid): split and re-sent, as Phoenix's.
_ABOUT_CONTENT = frozenset({400, 413, 422})
# The status ``_export`` gives an accepted export whose answer rejected some of its spans, not
# all (OTLP's partial_success): split and re-sent as a refusal for content is, to find which.
_SOME_REJECTED = -1
# Where the exporter reads the headers it sends: the first of these set.
_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")


def evaluation_attributes(record: ScoreRecord) -> dict[str, Any]:
    """The attributes of one ``gen_ai.evaluation.result`` event (None values left out)."""
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": record.scorer_name or record.scorer_id,
        "tracescore.score.id": record.score_id,
        "tracescore.scorer.id": record.scorer_id,
        "tracescore.scorer.version": record.scorer_version,
        "tracescore.source": record.source,
        "tracescore.scored_at": record.scored_at,
    }
    optional: dict[str, Any] = {
        "gen_ai.evaluation.score.value": record.score,
        "gen_ai.evaluation.score.label": record.label,
        "gen_ai.evaluation.explanation": record.reason or record.not_scorable or record.error_message,
        "error.type": record.error_type,
        "tracescore.judge.model": ",".join(record.judge_models) or None,
        "gen_ai.usage.input_tokens": record.input_tokens or None,
        "gen_ai.usage.output_tokens": record.output_tokens or None,
        "gen_ai.usage.cache_read.input_tokens": record.cached_input_tokens or None,
        "tracescore.judge.cost_usd": record.cost_usd,
        "tracescore.judge.calls": record.judge_calls or None,
        "tracescore.job.id": record.job_id,
        "tracescore.run.id": record.run_id,
        "tracescore.failed_step": record.failed_step,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    return attributes


def _times(record: ScoreRecord) -> tuple[int, int]:
    """The carrier's (start, end) in epoch ns: the scored span's, else a zero-length fallback at
    the time its run was queued, else scored. A time OTLP cannot carry (fixed64: a hand-made
    message's, or an app's clock in the wrong unit) is passed over: its encoding failed the
    whole batch, every record beside it retried until dead-lettered."""
    start, end = record.span_start_ns, record.span_end_ns
    if start is not None and end is not None and otlp_time(start) and otlp_time(end):
        return start, max(start, end)
    for seconds in (record.enqueued_at, record.scored_at):
        if seconds is not None and 0 <= seconds < MAX_TIME_NS // 10**9:  # (NaN is neither)
            at = int(seconds * 1e9)
            return at, at
    return 0, 0


def carrier_spans(records: Sequence[ScoreRecord], resource: Resource | None = None) -> list[ReadableSpan]:
    """One finished carrier span per record (a pure function)."""
    scope = InstrumentationScope(SCOPE_NAME)
    spans = []
    for record in records:
        scored = SpanContext(
            trace_id=int(record.trace_id, 16),
            span_id=int(record.span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(1),
        )
        carrier_id = int.from_bytes(hashlib.sha256(record.score_id.encode()).digest()[:8], "big") or 1
        start_ns, end_ns = _times(record)
        spans.append(
            ReadableSpan(
                CARRIER_SPAN_NAME,
                context=SpanContext(
                    trace_id=scored.trace_id, span_id=carrier_id, is_remote=False, trace_flags=TraceFlags(1)
                ),
                parent=scored,
                resource=resource,
                kind=SpanKind.INTERNAL,
                links=[Link(scored, {"tracescore.link": "scored_span"})],
                attributes={
                    ROLE_ATTRIBUTE: ROLE_SCORE_WRITER,
                    "tracescore.scored.span_id": record.span_id,
                    "tracescore.scored.span_name": record.span_name,
                    "tracescore.scored_at": record.scored_at,
                },
                events=[Event(EVALUATION_EVENT, evaluation_attributes(record), timestamp=end_ns)],
                start_time=start_ns,
                end_time=end_ns,
                instrumentation_scope=scope,
            )
        )
    return spans


def _scrubbed(answer: str, records: Sequence[ScoreRecord]) -> str:
    """The endpoint's answer without the exporter's header values (tokens) or the scores' own
    text, should the endpoint echo either (the HTTP sinks' one refusal scrub)."""
    headers = ",".join(os.environ.get(v, "") for v in _HEADER_VARIABLES)
    secrets = [unquote(pair.partition("=")[2]).strip() for pair in headers.split(",") if "=" in pair]
    return refusal_detail(answer, secrets, record_texts(records))


# The exporters' own default timeout (OTEL_EXPORTER_OTLP_TIMEOUT), for a request without one.
_DEFAULT_TIMEOUT_S = 10.0


def _seconds(timeout: Any) -> float:
    """The longest of a requests timeout (seconds, or a (connect, read) pair): each socket
    operation's bound; the exchange gets ``EXCHANGE_TIMEOUTS`` of it."""
    if isinstance(timeout, tuple):
        timeout = max((t for t in timeout if t is not None), default=None)
    return float(timeout) if timeout else _DEFAULT_TIMEOUT_S


def _ssl_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext:
    """What requests would check the endpoint's certificate against: ``verify`` is True
    (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, else certifi's roots, as requests), False
    (nothing checked), or a CA file or directory (``OTEL_EXPORTER_OTLP_CERTIFICATE``); ``cert``
    the client's own."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif verify is True:  # (the session reads no environment: these two are read here)
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        context = ssl.create_default_context(cafile=bundle or certifi.where())
    elif os.path.isdir(verify):
        context = ssl.create_default_context(capath=verify)
    else:
        context = ssl.create_default_context(cafile=verify)
    if isinstance(cert, tuple):
        context.load_cert_chain(cert[0], cert[1])
    elif cert:
        context.load_cert_chain(cert)
    return context


def otlp_headers_problem(variables: Sequence[str]) -> str | None:
    """What is wrong with the headers an OTLP exporter reads from the first of ``variables`` that
    is set (the signal's own, then ``OTEL_EXPORTER_OTLP_HEADERS``), naming the variable and the
    header but never the value; None when the exporter can send them all. The exporter itself
    drops an entry it cannot read (sending, say, no authorization) with a warning that quotes
    it, and requests refuses a value no HTTP header can carry on every export."""
    variable = next((v for v in variables if os.environ.get(v)), None)
    if variable is None:
        return None
    raw = os.environ[variable]
    # (read as the exporter reads them, its warning about an entry it drops silenced: it quotes
    # the value; the entry is named below instead)
    otel_log = logging.getLogger("opentelemetry.util.re")
    was_disabled, otel_log.disabled = otel_log.disabled, True
    try:
        headers = parse_env_headers(raw, liberal=True)
    finally:
        otel_log.disabled = was_disabled
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        name, sep, _ = entry.partition("=")
        name = unquote(name).strip().lower()
        if not sep or name not in headers:
            which = f"the entry for {name[:40]!r}" if sep and name else "an entry that is not name=value"
            return (
                f"the OTLP exporter's headers ({variable}) hold {which}, which the exporter cannot read and"
                " would drop: write each as name=value, the value percent-encoded (%0A for a line break, %2C"
                " for a comma); the value is not shown"
            )
    for name, value in headers.items():
        problem = header_value_problem(value)
        if problem:
            return f"the OTLP exporter's {name!r} header ({variable}) {problem}"
    return None


def _standard_phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:  # (a code of the endpoint's own)
        return ""


def _requests_error(exc: httpx.TransportError | httpx.DecodingError) -> requests.RequestException:
    """An httpx failure as the requests exception the exporter reads (a connection error or a
    timeout: retried within the exporter's own timeout). Its text is the sink's own naming of it
    (``transport_retry``), never httpx's: the exporter logs it, and a malformed answer's bytes
    are quoted in h11's."""
    said = transport_retry("OTLP endpoint", exc).reason
    if isinstance(exc, httpx.DecodingError):
        return requests.exceptions.ContentDecodingError(said)
    if isinstance(exc, httpx.ConnectTimeout):
        return requests.exceptions.ConnectTimeout(said)
    if isinstance(exc, httpx.TimeoutException):
        return requests.exceptions.ReadTimeout(said)
    if isinstance(exc, httpx.ProxyError):
        return requests.exceptions.ProxyError(said)
    return requests.exceptions.ConnectionError(said)  # (a refused certificate too: its message says so)


class _DeadlineAdapter(requests.adapters.BaseAdapter):
    """The OTLP exporter's session sends through ``DeadlineTransport``: the whole exchange,
    connect to the answer's last byte read, within ``EXCHANGE_TIMEOUTS`` of the request's
    timeout. requests bounds each read, not the exchange, so an endpoint (or a proxy) dripping
    its status line, headers or body held the drainer, and the lease it kept renewing.

    Of the answer, at most ``_ANSWER_BYTES`` (decompressed) is read, only to explain a refusal:
    the status alone is the outcome. The certificates checked are requests' (``verify``,
    ``cert``); the proxy is the environment's, read as for every sink (``proxy_for``)."""

    def __init__(self, last: threading.local) -> None:
        super().__init__()
        self._last = last  # the session's record of the last answer, per thread
        # By (origin, verify, cert): in practice one. The environment is read once per origin,
        # as each sink reads it once (it was three scans of os.environ a request).
        self._clients: dict[tuple[object, ...], httpx.Client] = {}
        self._lock = threading.Lock()

    def _client(self, url: str, verify: bool | str, cert: str | tuple[str, str] | None) -> httpx.Client:
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc, verify, cert)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                try:
                    proxy = proxy_for(url)
                except ValueError as exc:  # names the variable, never its value
                    raise requests.exceptions.InvalidSchema(str(exc)) from None
                # (each request brings its own timeout and exchange deadline: EXCHANGE_EXTENSION)
                client = self._clients[key] = deadline_client(
                    _DEFAULT_TIMEOUT_S, proxy=proxy, ssl_context=_ssl_context(verify, cert)
                )
            return client

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: Any = None,
    ) -> requests.Response:
        assert request.url is not None
        assert request.method is not None
        seconds = _seconds(timeout)
        client = self._client(request.url, verify, cert)
        headers = {k: v.decode("latin-1") if isinstance(v, bytes) else v for k, v in request.headers.items()}
        # (only what is decoded below, bounded: requests would ask for br and zstd too)
        headers["Accept-Encoding"] = "gzip, deflate"
        body = request.body
        if isinstance(body, str):
            body = body.encode()
        elif body is not None and not isinstance(body, bytes):  # (the exporters post bytes)
            raise TypeError(f"the OTLP exporter's body is {type(body).__name__}, not bytes")
        outgoing = client.build_request(
            request.method,
            request.url,
            headers=headers,
            content=body,
            timeout=seconds,
            extensions={EXCHANGE_EXTENSION: EXCHANGE_TIMEOUTS * seconds},
        )
        try:
            answer = client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            # The drainer's Retry, named as the HTTP sinks name theirs (kept, not the exception:
            # its traceback would hold the request's body until the next export)
            self._last.unanswered = transport_retry("OTLP endpoint", exc)
            raise _requests_error(exc) from None
        try:
            content, broke = _read_answer(answer)
        finally:
            answer.close()
        if broke is not None and answer.is_success:
            # An acceptance not all in (cut, too slow, undecodable) is not one: what the endpoint
            # stored is unknown, and a re-send is the same span. Of a refusal, what came of its
            # body is only the explanation.
            self._last.unanswered = transport_retry("OTLP endpoint", broke)
            raise _requests_error(broke) from None
        response = requests.Response()
        response.status_code = answer.status_code
        # The code's standard phrase, never the endpoint's own words: the exporter logs them,
        # and an endpoint that quotes the request put its Authorization header in the log.
        response.reason = _standard_phrase(answer.status_code)
        response.headers = requests.structures.CaseInsensitiveDict(answer.headers.items())
        response.headers.pop("content-encoding", None)  # decoded already
        response.encoding = requests.utils.get_encoding_from_headers(response.headers)
        response.url = request.url
        response.request = request
        response._content = content
        return response

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _read_answer(answer: httpx.Response) -> tuple[bytes, httpx.TransportError | httpx.DecodingError | None]:
    """Up to ``_ANSWER_BYTES`` of the answer's body, decompressed (gzip or deflate), and the error
    that cut it short, if any: the body broke, could not be decoded or was not finished by the
    exchange's deadline (the bytes are then what came before). An answer in another encoding
    (none was asked for) is undecodable, with no bytes."""
    parts: list[bytes] = []
    size = 0
    try:
        inflater = answer_inflater(answer.headers)
        for chunk in answer.iter_raw():
            if inflater is not None:
                chunk = inflater.decompress(chunk, _ANSWER_BYTES - size)
            parts.append(chunk[: _ANSWER_BYTES - size])
            size += len(parts[-1])
            if size >= _ANSWER_BYTES:
                break
    except ANSWER_ERRORS as exc:
        return b"".join(parts), exc
    return b"".join(parts), None


# The media types an ExportTraceServiceResponse comes in as protobuf: the specification's, and
# what a receiver that names no type or a generic one sends its bytes as.
_PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf", "application/octet-stream", ""})


def _export_answer(answer: requests.Response) -> tuple[str | None, int, str]:
    """An acceptance's body read as OTLP/HTTP's ExportTraceServiceResponse: what it was instead
    when it is none (None when it is one), how many spans its partial_success says were rejected,
    and its error message.

    One is an empty body (a full success's protobuf is zero bytes: what the Collector's
    otlpreceiver, and so Tempo and Jaeger, Phoenix and MLflow answer), a JSON object (proto3 JSON
    ignores fields it does not know; Langfuse answers ``{}`` even to a protobuf export), or bytes
    that parse as the message when sent as protobuf or as no type at all. Anything else (a web
    page, a proxy's ``OK`` in text/plain, bytes protobuf cannot read) came from something other
    than an OTLP receiver at that URL."""
    content_type = answer.headers.get("content-type", "")
    media = content_type.split(";")[0].strip().lower()
    if "html" in media:
        return "a web page", 0, ""
    if not answer.content:
        return None, 0, ""
    parsed = answer_json(answer.content.decode("utf-8", "replace"))
    if isinstance(parsed, dict):
        rejected, message = _rejected_json(parsed)
        return None, rejected, message
    if media in _PROTOBUF_TYPES:
        reply = ExportTraceServiceResponse()
        try:
            reply.ParseFromString(answer.content)
        except Exception:  # protobuf's DecodeError (no type stubs here to name it by)
            pass
        else:
            return None, max(reply.partial_success.rejected_spans, 0), reply.partial_success.error_message
    shown = media[:40] if media and media.isprintable() else "no content type"
    return f"a body that is not an ExportTraceServiceResponse ({shown})", 0, ""


def _rejected_json(parsed: Any) -> tuple[int, str]:
    """The rejected spans and error message of an OTLP/JSON answer: proto3's JSON, camelCase or
    the field names, the int64 count a string or a number."""
    partial = _field(parsed, "partialSuccess", "partial_success")
    count = _field(partial, "rejectedSpans", "rejected_spans")
    message = _field(partial, "errorMessage", "error_message")
    try:
        rejected = int(count) if isinstance(count, str | int) and not isinstance(count, bool) else 0
    except ValueError:
        rejected = 0
    return max(rejected, 0), message if isinstance(message, str) else ""


def _field(parsed: Any, *names: str) -> Any:
    return next((parsed[n] for n in names if n in parsed), None) if isinstance(parsed, dict) else None


class _WatchedSession(requests.Session):
    """The HTTP exporter's session, sending through ``_DeadlineAdapter`` and keeping the last
    answer (status, a short body, Retry-After), or why the last exchange got none
    (``unanswered``), per thread."""

    def __init__(self) -> None:
        super().__init__()
        # The adapter reads the proxy and the CA bundle variables itself: requests would scan
        # the environment (and ~/.netrc) on every request, for settings the adapter ignores.
        self.trust_env = False
        self.last = threading.local()
        adapter = _DeadlineAdapter(self.last)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        # Older exporters post with requests' default, following redirects: a 3xx is the
        # endpoint's answer here, whichever exporter (see OtlpSink._failure).
        kwargs["allow_redirects"] = False
        response = super().request(*args, **kwargs)
        # (UTF-8 whatever the charset says: requests' .text raises on one Python cannot decode)
        text = response.content.decode("utf-8", "replace")[:_ANSWER_CHARS]
        self.last.status, self.last.text = response.status_code, text
        self.last.retry_after = retry_after(response.headers.get("retry-after"))
        # (the body read is already bounded: _ANSWER_BYTES)
        if 200 <= response.status_code < 300:
            self.last.instead, self.last.rejected, self.last.rejection = _export_answer(response)
        return response


def _traces_endpoint(endpoint: str | None = None) -> str:
    """The URL the default OTLP/HTTP span exporter posts to: ``endpoint``, else
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` with
    ``/v1/traces`` appended, else the specification's default (localhost:4318)."""
    if endpoint:
        return endpoint
    signal = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if signal:
        return signal
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


class OtlpSink:
    """Carrier spans with evaluation events, exported synchronously by ``span_exporter``
    (default: OTLP/HTTP from the ``OTEL_EXPORTER_OTLP_*`` variables; pass an in-memory one to
    test). A custom exporter's FAILURE is a ``Retry`` (it tells no status)."""

    name = "otlp"

    def __init__(
        self,
        span_exporter: SpanExporter | None = None,
        *,
        endpoint: str | None = None,
        timeout_s: float | None = None,
        service_name: str = "tracescore-worker",
    ) -> None:
        """``endpoint`` (the full ``.../v1/traces`` URL) and ``timeout_s`` override the
        ``OTEL_EXPORTER_OTLP_*`` variables for the default exporter."""
        self._session: _WatchedSession | None = None
        if span_exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            problem = otlp_headers_problem(_HEADER_VARIABLES)
            if problem:
                raise ValueError(problem)
            self._session = _WatchedSession()
            span_exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s, session=self._session)
        self._exporter = span_exporter
        self._resource = Resource.create({"service.name": service_name})
        # Where the default exporter posts, resolved as the OTLP exporter specification says
        # (not read from the exporter's private fields); a custom exporter tells none.
        self.endpoint: str | None = shown_endpoint(_traces_endpoint(endpoint)) if self._session is not None else None

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        if not records:
            return []
        outcomes: dict[int, Delivery] = {}
        with one_delivery():  # (the halves of a refused export: within one exchange's bound)
            self._send(records, list(range(len(records))), outcomes)
        return [outcomes[i] for i in range(len(records))]

    def _send(
        self,
        records: Sequence[ScoreRecord],
        which: list[int],
        outcomes: dict[int, Delivery],
        known: tuple[Delivery, int | None] | None = None,
    ) -> None:
        """Export ``records[i]`` for ``i`` in ``which`` (``known``: that export's answer, had
        already); a request refused for its content (400, 413, 422), or accepted with some of its
        spans rejected, is split in halves and re-sent, so only the record the endpoint cannot
        take is refused. A 400/422 both halves get alike is no one record's doing (a missing
        header): every record gets it, without splitting further."""
        outcome, status = known or self._export([records[i] for i in which])
        split = status in _ABOUT_CONTENT or status == _SOME_REJECTED
        if not (isinstance(outcome, Refused) and split and len(which) > 1):
            if isinstance(outcome, Refused) and status == 413:
                size = len(encode_spans(carrier_spans([records[i] for i in which], self._resource)).SerializeToString())
                outcome = Refused(
                    outcome.reason, f"one score's carrier span is {size:,} bytes, over the endpoint's size limit"
                )
            for i in which:
                outcomes[i] = outcome
            return
        first, second = which[: len(which) // 2], which[len(which) // 2 :]
        first_answer = self._export([records[i] for i in first])
        second_answer: tuple[Delivery, int | None] | None = None
        if status in (400, 422) and first_answer[0] == outcome:
            second_answer = self._export([records[i] for i in second])
            if second_answer[0] == outcome:
                for i in which:
                    outcomes[i] = outcome
                return
        self._send(records, first, outcomes, first_answer)
        self._send(records, second, outcomes, second_answer)

    def _export(self, records: Sequence[ScoreRecord]) -> tuple[Delivery, int | None]:
        """One export: its outcome for every record, and the endpoint's status when known."""
        if self._session is not None:
            last = self._session.last
            last.status, last.text, last.retry_after, last.unanswered = None, "", 0.0, None
            last.rejected, last.rejection, last.instead = 0, "", None
        try:
            result = self._exporter.export(carrier_spans(records, self._resource))
        except Exception as exc:  # an exporter must not raise; one that does is down for now
            return self._unanswered() or Retry(f"otlp_export_raised:{type(exc).__name__}"), None
        status = getattr(self._session.last, "status", None) if self._session is not None else None
        if result is SpanExportResult.SUCCESS and not (status is not None and 300 <= status < 400):
            return self._accepted(records)
        return self._failure(records, status), status

    def _accepted(self, records: Sequence[ScoreRecord]) -> tuple[Delivery, int | None]:
        """An export the endpoint accepted: Delivered, unless its answer was no
        ExportTraceServiceResponse (a ``Retry``: something else answered, a proxy or a web app,
        which stored nothing we know of) or rejected spans (OTLP's partial_success: those were
        not stored). All of them: each record is refused; some: ``_SOME_REJECTED``, for
        ``_send`` to find which."""
        last = self._session.last if self._session is not None else None
        instead = getattr(last, "instead", None)
        if instead is not None:
            status = getattr(last, "status", None)
            return Retry(
                f"OTLP endpoint answered HTTP {status} with {instead}, not an OTLP acknowledgement:"
                " is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT its address?"
            ), None
        rejected = getattr(last, "rejected", 0)
        if not rejected:
            return Delivered(), None
        said = _scrubbed(self._session.last.rejection, records) if self._session is not None else ""
        refused = Refused("otlp_spans_rejected", said or "the endpoint rejected the spans without saying why")
        return refused, (_SOME_REJECTED if rejected < len(records) else None)

    def _unanswered(self) -> Retry | None:
        """The Retry naming why the last exchange got no answer (unreachable, too slow), as the
        HTTP sinks name it; None when it was not that."""
        unanswered: Retry | None = getattr(self._session.last, "unanswered", None) if self._session else None
        return unanswered

    def _failure(self, records: Sequence[ScoreRecord], status: int | None) -> Delivery:
        if status is None:
            return self._unanswered() or Retry("otlp_export_failed")
        if 300 <= status < 400:
            # The exporter calls a 3xx SUCCESS and follows no redirect: nothing was stored.
            return Refused(
                f"otlp_http_{status}",
                "the endpoint redirects elsewhere; set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT to where it points",
            )
        if is_retryable(status):
            # The exporter honours Retry-After only within its own timeout: past it, the drainer waits.
            return Retry(f"otlp_http_{status}", after_s=self._session.last.retry_after if self._session else 0.0)
        return Refused(f"otlp_http_{status}", _scrubbed(self._session.last.text if self._session else "", records))

    def close(self) -> None:
        self._exporter.shutdown()
