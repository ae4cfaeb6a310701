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
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import requests
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from tracing._markers import ROLE_ATTRIBUTE
from tracing._score_record import ScoreRecord
from tracing._transport import EXCHANGE_TIMEOUTS
from tracing.sinks._http import is_retryable, record_texts, refusal_detail, retry_after
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


def _read_answer(response: requests.Response, timeout: Any) -> bytes:
    """Up to ``_ANSWER_BYTES`` of the answer's body, decompressed, read within ``EXCHANGE_TIMEOUTS``
    of the request's timeout: requests reads a whole body however large, and bounds each read,
    not the whole, so an endpoint (a proxy) dripping its answer held the drainer and its lease.
    The status alone is the outcome; the body only explains a refusal."""
    seconds = max(timeout) if isinstance(timeout, tuple) else float(timeout or 10.0)
    deadline = time.monotonic() + EXCHANGE_TIMEOUTS * seconds
    raw = response.raw
    read = getattr(raw, "read1", None) or raw.read  # read1: what one receive gives (urllib3 >= 2)
    parts: list[bytes] = []
    size, ended = 0, False
    try:
        while size < _ANSWER_BYTES and time.monotonic() < deadline:
            chunk = read(_ANSWER_BYTES - size, decode_content=True)
            if not chunk:
                ended = True
                break
            parts.append(chunk)
            size += len(chunk)
    except Exception:  # a broken or undecodable body: what came of it is the detail
        pass
    if ended:
        raw.release_conn()  # read to its end: the connection is kept for the next export
    else:
        response.close()
    return b"".join(parts)


class _WatchedSession(requests.Session):
    """The HTTP exporter's session, keeping the last answer (status, a short body, Retry-After)
    per thread."""

    def __init__(self) -> None:
        super().__init__()
        self.last = threading.local()

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["stream"] = True
        response = super().request(*args, **kwargs)
        body = _read_answer(response, kwargs.get("timeout"))
        # requests' own cache of the body: whatever the exporter reads of the answer (an older
        # one logs .text) comes from here, never from the socket, which may be closed.
        response._content = body
        # (UTF-8 whatever the charset says: requests' .text raises on one Python cannot decode)
        text = body.decode("utf-8", "replace")[:_ANSWER_CHARS]
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
            self._session.last.status, self._session.last.text, self._session.last.retry_after = None, "", 0.0
        try:
            result = self._exporter.export(carrier_spans(records, self._resource))
        except Exception as exc:  # an exporter must not raise; one that does is down for now
            return Retry(f"otlp_export_raised:{type(exc).__name__}"), None
        status = getattr(self._session.last, "status", None) if self._session is not None else None
        if result is SpanExportResult.SUCCESS and not (status is not None and 300 <= status < 400):
            return Delivered(), None
        return self._failure(records, status), status

    def _failure(self, records: Sequence[ScoreRecord], status: int | None) -> Delivery:
        if status is None:
            return Retry("otlp_export_failed")
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
