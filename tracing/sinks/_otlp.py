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

The session sends through our HTTP transport (``tracing._transport``), as every sink does: one
deadline for the whole exchange, the environment's proxy read alike, the exporter's certificate
settings kept (a ``REQUESTS_CA_BUNDLE`` does not override them), and no redirect followed
whichever exporter version posts (the oldest allowed one let requests follow them).
"""

from __future__ import annotations

import hashlib
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
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from tracing._markers import ROLE_ATTRIBUTE
from tracing._score_record import ScoreRecord
from tracing._transport import EXCHANGE_EXTENSION, EXCHANGE_TIMEOUTS, deadline_client, proxy_for
from tracing.sinks._http import (
    answer_inflater,
    is_retryable,
    record_texts,
    refusal_detail,
    retry_after,
    transport_retry,
)
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry

__all__ = [
    "CARRIER_SPAN_NAME",
    "EVALUATION_EVENT",
    "ROLE_ATTRIBUTE",
    "ROLE_SCORE_WRITER",
    "OtlpSink",
    "carrier_spans",
    "evaluation_attributes",
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
    """The carrier's (start, end) in epoch ns: the scored span's, else a zero-length fallback."""
    if record.span_start_ns is not None and record.span_end_ns is not None:
        return record.span_start_ns, max(record.span_start_ns, record.span_end_ns)
    at = int((record.enqueued_at or record.scored_at) * 1e9)
    return at, at


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
    headers = ",".join(
        os.environ.get(v, "") for v in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
    )
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


def _requests_error(exc: httpx.TransportError) -> requests.RequestException:
    """An httpx failure as the requests exception the exporter reads (a connection error or a
    timeout: retried within the exporter's own timeout)."""
    said = str(exc) or type(exc).__name__
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
            content = _read_answer(answer)
        finally:
            answer.close()
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.reason_phrase
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


def _read_answer(answer: httpx.Response) -> bytes:
    """Up to ``_ANSWER_BYTES`` of the answer's body, decompressed (gzip or deflate); what came
    of a body that broke, could not be decoded or was not finished by the exchange's deadline.
    An answer in another encoding (none was asked for) reads as empty."""
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
    except (httpx.TransportError, httpx.DecodingError):  # what came of it is the detail
        pass
    return b"".join(parts)


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
        return response


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

            self._session = _WatchedSession()
            span_exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s, session=self._session)
        self._exporter = span_exporter
        self._resource = Resource.create({"service.name": service_name})

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        if not records:
            return []
        outcomes: dict[int, Delivery] = {}
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
        already); a request refused for its content (400, 413, 422) is split in halves and
        re-sent, so only the record the endpoint cannot take is refused. A 400/422 both halves
        get alike is no one record's doing (a missing header): every record gets it, without
        splitting further."""
        outcome, status = known or self._export([records[i] for i in which])
        if not (isinstance(outcome, Refused) and status in _ABOUT_CONTENT and len(which) > 1):
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
        if status != 413 and first_answer[0] == outcome:
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
        try:
            result = self._exporter.export(carrier_spans(records, self._resource))
        except Exception as exc:  # an exporter must not raise; one that does is down for now
            return self._unanswered() or Retry(f"otlp_export_raised:{type(exc).__name__}"), None
        status = getattr(self._session.last, "status", None) if self._session is not None else None
        if result is SpanExportResult.SUCCESS and not (status is not None and 300 <= status < 400):
            return Delivered(), None
        return self._failure(records, status), status

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
