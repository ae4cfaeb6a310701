"""Arize Phoenix: each score becomes a span annotation on the span it judged.

``POST {base}/v1/span_annotations?sync=true`` with ``{"data": [annotation, ...]}`` (Phoenix's
REST API; checked against arize-phoenix 20.26). One annotation per score:

- ``name``: the scorer's name (its id when it has none); ``annotator_kind``: ``LLM`` when a judge
  model answered any step of the scorer, else ``CODE``.
- ``result``: ``{label, score, explanation}``. A score: its label, value and reason. Not
  scorable: label ``not scorable``, no score, the scorer's reason. A failed run: label ``error``,
  no score, ``"<error type>: <message>"``. Phoenix shows all three beside the span.
- ``metadata``: scorer id and version, score id, source (live / backfill), job and run ids, the
  judge models and the error type, so an annotation can be traced back to its score record; the
  scored span's deployment environment (``ScoreRecord.environment``) when it has one, as it is:
  an annotation has no environment field, and the metadata is what Phoenix filters and shows.
- ``identifier``: ``tracescore:<score id>``. Phoenix upserts on (name, span, identifier), so a
  re-sent score updates its annotation instead of adding a second one.

Why ``sync=true``: without it Phoenix answers 200 before writing anything (its bulk inserter
runs later and drops annotations of spans it never sees), so "delivered" would mean nothing.
Synchronously, Phoenix checks the spans first and answers 404 "Spans with IDs ... do not exist."
for the whole batch when any is missing: Phoenix ingests OTLP asynchronously and the scores of
a live trace can arrive before its spans. Those records are ``Retry`` and the others are sent
again without them. Other outcomes: 2xx ``Delivered`` when its body holds an inserted
annotation's id for each one sent (else ``Retry``: a page or an empty body is not Phoenix's);
408/409/425/429/5xx, connection errors and timeouts ``Retry`` (Retry-After honoured); any other
4xx ``Refused`` with Phoenix's answer.
A batch refused for its content (400, 413, 422) is re-sent one record at a time, so one bad
record does not refuse its neighbours; a batch answered 500 is halved (``_halve``), as Phoenix
writes a batch in one transaction; a 401 or 403 refuses the batch at once. Phoenix's
validation answers quote the request, i.e. the score's reason: only their field paths and
messages are kept.

What Phoenix stores on PostgreSQL (SQLite takes anything): each NUL of a text is sent as U+FFFD
(PostgreSQL's text and JSONB refuse it), and the name is cut to ``_NAME_BYTES`` with a marker
saying so (``stored_text``; the unique index on name, span and identifier holds 2,704 bytes an
entry). Phoenix answered either with a 500 for the whole batch.

Auth: ``Authorization: Bearer <api key>`` (Phoenix's system or user API keys) when
``api_key`` is given; it never appears in a reason or detail.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from tracing._score_record import ScoreRecord
from tracing._transport import one_delivery
from tracing.sinks._http import (
    ANSWER_ERRORS,
    JSON,
    answer_text,
    http_client,
    is_retryable,
    json_body,
    otel_span_id,
    refusal_detail,
    retry_after,
    scrubbable,
    server_message,
    stored_text,
    transport_retry,
    unacknowledged,
)
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, shown_endpoint

__all__ = ["PhoenixSink"]

_MISSING_SPANS = re.compile(r"^Spans with IDs (?P<ids>.+) do not exist\.?$")
# Refusals about a request's content (bad request, too large, invalid): a batch refused so is
# re-sent record by record. Others (401, 403, an unknown route) refuse every record alike.
_ABOUT_CONTENT = frozenset({400, 413, 422})
# Scores per request: Phoenix checks each span and upserts row by row in one transaction.
_BATCH = 100
_URL_SETTING = "TRACESCORE_PHOENIX_URL"
# A hint for the drainer: Phoenix's bulk inserter writes received spans within about a second.
_NOT_INGESTED_AFTER_S = 1.0
# The most of an annotation's name sent, in UTF-8 bytes. Phoenix's span_annotations table is
# unique on (name, span, identifier) (phoenix/db/models.py, SpanAnnotation): on PostgreSQL a
# B-tree entry holds at most 2,704 bytes, and a longer name failed the insert, an HTTP 500 for
# the whole batch. The identifier (75 bytes) and the entry's own bytes fit beside this.
_NAME_BYTES = 2_000


class PhoenixSink:
    """Scores as Phoenix span annotations (see the module docstring for the mapping)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> None:
        self._client, self._secrets = http_client(
            base_url,
            what="Phoenix URL",
            setting=f"{_URL_SETTING} / --phoenix-url",
            timeout_s=timeout_s,
            secret=api_key,
            credentials={"Phoenix API key (api_key / TRACESCORE_PHOENIX_API_KEY)": api_key},
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )
        self._url = base_url.rstrip("/") + "/v1/span_annotations"
        self.endpoint: str | None = shown_endpoint(base_url)

    @property
    def name(self) -> str:
        return "phoenix"

    def close(self) -> None:
        self._client.close()

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        """Annotate the records' spans; one outcome per record, in order."""
        outcomes: list[Delivery | None] = [None] * len(records)
        sendable: list[tuple[int, dict[str, Any]]] = []
        for i, record in enumerate(records):
            annotation = _annotation(record)
            if isinstance(annotation, Refused):
                outcomes[i] = annotation
            else:
                sendable.append((i, annotation))
        with one_delivery():  # (records sent one by one after a refusal: within one exchange's bound)
            for start in range(0, len(sendable), _BATCH):
                self._send(sendable[start : start + _BATCH], outcomes)
        done = [o for o in outcomes if o is not None]
        if len(done) != len(records):  # every path above assigns one outcome per record
            raise AssertionError("PhoenixSink.deliver left a record without an outcome")
        return done

    def _send(
        self,
        batch: list[tuple[int, dict[str, Any]]],
        outcomes: list[Delivery | None],
        known: Delivered | Retry | tuple[int, str] | None = None,
    ) -> None:
        """Send ``batch`` (``known``: Phoenix's answer to it, had already), one outcome per
        record into ``outcomes``."""
        pending = batch
        # Each round either ends or removes at least one span id (reported missing) from the batch.
        while pending:
            answer, known = known or self._post([annotation for _, annotation in pending]), None
            if isinstance(answer, Delivered | Retry):
                for i, _ in pending:
                    outcomes[i] = answer
                return
            status, body = answer
            if status == 500:
                self._halve(pending, outcomes)
                return
            missing = _missing_spans(status, body, {a["span_id"] for _, a in pending})
            if missing:
                not_yet = Retry(
                    f"span not in Phoenix yet (it ingests traces asynchronously; HTTP {status})",
                    after_s=_NOT_INGESTED_AFTER_S,
                )
                for i, annotation in pending:
                    if annotation["span_id"] in missing:
                        outcomes[i] = not_yet
                pending = [(i, a) for i, a in pending if a["span_id"] not in missing]
                continue
            if len(pending) > 1 and status in _ABOUT_CONTENT:
                # Refused as a whole for what some record holds: find which, one request each.
                for item in pending:
                    self._send([item], outcomes)
                return
            refused = Refused(_refusal_reason(status), detail=self._detail(body, [a for _, a in pending]))
            for i, _ in pending:
                outcomes[i] = refused
            return

    def _halve(self, batch: list[tuple[int, dict[str, Any]]], outcomes: list[Delivery | None]) -> None:
        """A batch Phoenix answered HTTP 500: its halves sent apart. Phoenix upserts a batch in
        one transaction, so one annotation its database cannot take (a kind ``_annotation`` does
        not foresee) failed every other one with it, each retried until a dead letter. A half
        that goes in is Delivered and the failing one halved again, down to the record; both
        halves failing is Phoenix's own trouble (or two such records): every record is Retry,
        three requests for the batch."""
        failed = Retry("Phoenix answered HTTP 500")
        first, second = batch[: len(batch) // 2], batch[len(batch) // 2 :]
        first_answer = self._post([annotation for _, annotation in first])
        second_answer = self._post([annotation for _, annotation in second])
        if all(_failed(answer) for answer in (first_answer, second_answer)):
            for i, _ in batch:
                outcomes[i] = failed
            return
        self._send(first, outcomes, first_answer)
        self._send(second, outcomes, second_answer)

    def _post(self, data: list[dict[str, Any]]) -> Delivered | Retry | tuple[int, str]:
        """Delivered, Retry, or (status, body) of a refusal to look at (a 500 to a batch of more
        than one too: ``_halve``)."""
        try:
            response = self._client.post(
                self._url, params={"sync": "true"}, content=json_body({"data": data}), headers=JSON
            )
        except ANSWER_ERRORS as exc:
            return transport_retry("Phoenix", exc)
        status = response.status_code
        if 200 <= status < 300:
            # (sync: one inserted annotation's id per annotation sent)
            def inserted(answer: Any) -> bool:
                ids = answer.get("data") if isinstance(answer, dict) else None
                return isinstance(ids, list) and len(ids) == len(data)

            return unacknowledged("Phoenix", response, inserted, _URL_SETTING) or Delivered()
        if status == 500 and len(data) > 1:
            return status, answer_text(response)
        if is_retryable(status):  # incl. Phoenix's 507: storage full, writes locked for now
            return Retry(f"Phoenix answered HTTP {status}", after_s=retry_after(response.headers.get("retry-after")))
        return status, answer_text(response)

    def _detail(self, body: str, sent: list[dict[str, Any]]) -> str:
        """Phoenix's answer, short, without our credentials or the scores' own text."""
        texts = scrubbable(t for a in sent for t in (a["result"]["explanation"], a["result"]["label"]))
        return refusal_detail(body, self._secrets, texts)


def _annotation(record: ScoreRecord) -> dict[str, Any] | Refused:
    """The span annotation of one score, or why it cannot be one (never sent)."""
    span_id = otel_span_id(record, "Phoenix")
    if isinstance(span_id, Refused):
        return span_id
    name = record.scorer_name or record.scorer_id
    if name == "note":
        return Refused("Phoenix reserves the annotation name 'note' for span notes; rename the scorer")
    if record.score is not None and not math.isfinite(record.score):
        return Refused("score is not a finite number (JSON cannot carry it)")
    if not record.ok:
        # The error tree's messages already name the scorer and the step (also in the metadata).
        message = f": {record.error_message}" if record.error_message else ""
        result: dict[str, Any] = {"label": "error", "score": None, "explanation": f"{record.error_type}{message}"}
    elif record.score is None and record.not_scorable is not None:
        result = {"label": "not scorable", "score": None, "explanation": record.not_scorable}
    else:
        result = {"label": record.label, "score": record.score, "explanation": record.reason}
    result = {key: _text(value) for key, value in result.items()}
    metadata = {
        "scorer_id": record.scorer_id,
        "scorer_version": record.scorer_version,
        "score_id": record.score_id,
        "source": record.source,
        "job_id": record.job_id,
        "run_id": record.run_id,
        "judge_models": record.judge_models or None,
        "error_type": record.error_type,
        "failed_step": record.failed_step,
        "environment": record.environment or None,
    }
    return {
        "span_id": span_id,
        "name": stored_text(name, lambda n: len(n.encode("utf-8", "surrogatepass")) <= _NAME_BYTES),
        "annotator_kind": "LLM" if record.judge_models else "CODE",
        "result": result,
        "metadata": {key: _text(value) for key, value in metadata.items() if value is not None},
        "identifier": f"tracescore:{record.score_id}",
    }


def _text(value: Any) -> Any:
    """``value`` (a text, a list of texts, or no text) as PostgreSQL stores it: each NUL as
    U+FFFD (``stored_text``): its text columns and its JSONB refused one, an HTTP 500 for the
    whole batch. Phoenix's other columns hold texts whole."""
    if isinstance(value, str):
        return stored_text(value, lambda _: True)
    if isinstance(value, list | tuple):
        return [_text(item) for item in value]
    return value


def _failed(answer: Delivered | Retry | tuple[int, str]) -> bool:
    """Whether ``answer`` is a 500 (to a batch, or as the Retry of a lone record)."""
    if isinstance(answer, Retry):
        return answer.reason == "Phoenix answered HTTP 500"
    return isinstance(answer, tuple) and answer[0] == 500


def _missing_spans(status: int, body: str, sent: set[str]) -> set[str]:
    """The span ids of a 404 "Spans with IDs ... do not exist." answer, if that is what it is.

    Any other 404 (a wrong base URL, a Phoenix without this route) is a refusal, not a wait."""
    if status != 404:
        return set()
    # Phoenix answers its HTTPExceptions in plain text; a proxy in front might wrap it in JSON.
    match = _MISSING_SPANS.match(server_message(body).strip())
    if match is None:
        return set()
    missing = {part.strip() for part in match["ids"].split(",")}
    return missing if missing and missing <= sent else set()


def _refusal_reason(status: int) -> str:
    if status in (401, 403):
        return f"Phoenix refused the credentials (HTTP {status}): check TRACESCORE_PHOENIX_API_KEY"
    if status == 404:
        return "Phoenix has no span annotations API at this URL (HTTP 404): check TRACESCORE_PHOENIX_URL"
    if 300 <= status < 400:
        return f"Phoenix answered a redirect (HTTP {status}): set TRACESCORE_PHOENIX_URL to where it points"
    return f"Phoenix refused the annotation (HTTP {status})"
