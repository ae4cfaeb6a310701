"""MLflow: each score becomes a feedback assessment on the trace and span it judged.

MLflow's REST API (checked against mlflow 3.17.2, ``mlflow server`` on SQLite). A trace that
MLflow ingested over OTLP (``POST /v1/traces`` with the ``x-mlflow-experiment-id`` header) is
``tr-<32 hex OpenTelemetry trace id>``; its spans keep their 16-hex ids. One assessment per score:

- ``assessment_id``: ``a-`` + the first 32 hex digits of the score id (MLflow's own ids have this
  shape; the column holds 50 characters), so a re-sent score finds its assessment.
- ``assessment_name``: the scorer's name (its id when it has none); ``span_id``: the scored span.
- ``source``: ``LLM_JUDGE`` when a judge model answered any step of the scorer, else ``CODE``;
  ``source_id`` is the scorer id.
- ``feedback.value``: the score; a label-only score: its label; not scorable: null, with the
  reason in ``rationale``. A failed run: ``feedback.error`` (``error_code`` = the error type,
  ``error_message``) and no value; MLflow shows it as an errored assessment.
- ``rationale``: the scorer's reason. ``metadata`` (strings only): score id, scorer version,
  label, source (live / backfill), job and run ids, judge models, the failed step and the scored
  span's deployment environment (``ScoreRecord.environment``) when it has one (an assessment has
  no environment field of its own).

What every database behind MLflow stores: MLflow checks no assessment field itself, its database
does (SQLite stores anything; PostgreSQL refuses a NUL character in text and a name over its
column; MySQL a text over 64 KiB), and MLflow answers a 400 (a dead letter) or, for a NUL on
PostgreSQL, a 500 (retried, then a dead letter). So a NUL becomes U+FFFD, as a lone surrogate
does, and a text over its column is cut, ending in a marker that says so, with the original's
length and the start of its SHA-256 (two long scorer ids alike in their first characters stay
two names): the name and source id to 250 characters (``VARCHAR(250)``), the rationale to 65,535
bytes of UTF-8, and the value, the error and the metadata to 65,535 bytes as MLflow writes them
(``json.dumps``, non-ASCII escaped); each metadata value to ``_METADATA_VALUE_CHARS`` of that.

Why update first: MLflow answers a second create with the same id by HTTP 500 (a constraint
violation), so every send is ``PATCH .../assessments/{id}`` and, when MLflow answers
RESOURCE_DOES_NOT_EXIST, ``POST .../assessments``. An update keeps the source and merges the
metadata: when its answer shows a source or a metadata key the record does not have (a record
that replaced another, as a retryable error scored later does), the assessment is deleted and
created anew (a DELETE refused leaves the update as it landed). A create that says the trace
does not exist is a trace MLflow has not ingested yet (the agent's exporter may be behind):
``Retry`` until ``trace_wait_s`` after scoring, then ``Refused`` (a trace that never reaches
this server, e.g. exported to another one, must not cycle in the outbox for ever).

Other outcomes: 2xx ``Delivered`` when its body holds the assessment (else ``Retry``: a page
or an empty body is not MLflow's); 408/409/425/429/5xx, connection errors and timeouts ``Retry``
(Retry-After honoured); any other 4xx ``Refused`` with MLflow's error code and message,
scrubbed of the token and of the score's own text. Scores go ``parallel`` (4) at a time, as
MLflow has no batch API for assessments. An answer that holds for every score (no answer at all,
the token refused, a URL that is not MLflow's API or that redirects, a 429 or 503) is given to
the rest of the batch without a request each: a down server costs one round of timeouts per
batch, not one per score.

Auth: ``Authorization: Bearer <token>`` when ``token`` is given (MLflow's
``MLFLOW_TRACKING_TOKEN`` convention); user:password in the URL is HTTP basic auth.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from tracing._score_record import ScoreRecord
from tracing.sinks._http import (
    JSON,
    PerScoreSink,
    answer_json,
    answer_text,
    asks_to_wait,
    error_code,
    http_client,
    is_retryable,
    json_body,
    otel_ids,
    record_texts,
    refusal_detail,
    retry_after,
    stored_text,
    unacknowledged,
)
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, shown_endpoint

__all__ = ["MlflowSink"]

log = structlog.get_logger("tracescore.sinks.mlflow")

_NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"
# Statuses by which a URL answering no MLflow JSON error is not MLflow's API at all (a refusal
# for every record); any other (a proxy's 413 for one large record) is this record's.
_NOT_THE_API = frozenset({404, 405, 501})
# Every field an update may change: MLflow keeps the source and the span (see _kept_stale).
_UPDATE_MASK = "assessmentName,feedback,rationale,metadata"
# The metadata keys an assessment of ours may hold (_assessment writes those that have a value).
_METADATA_KEYS = frozenset(
    {"score_id", "scorer_version", "label", "source", "job_id", "run_id", "judge_models", "failed_step"}
    | {"not_scorable", "environment"}
)
# A hint for the drainer: MLflow writes an OTLP batch before it answers the exporter, so a
# missing trace is one the agent has not exported yet.
_NOT_INGESTED_AFTER_S = 2.0

# What the columns of MLflow's assessments table hold on every database it supports
# (mlflow/store/tracking/dbmodels/models.py, SqlAssessments; migration 770bee3ae1dd): name and
# source_id are String(250), counted in characters by PostgreSQL and MySQL alike; value, error,
# rationale and assessment_metadata are Text, which is MySQL's TEXT: 65,535 bytes.
_NAME_CHARS = 250
_TEXT_BYTES = 65_535
# Each metadata value's share of its column, as json.dumps writes it: ten keys stay under
# _TEXT_BYTES whatever their values.
_METADATA_VALUE_CHARS = 6_000
# The longest error code kept (an exception's type name: short unless hostile).
_ERROR_CODE_CHARS = 1_000


class MlflowSink(PerScoreSink):
    """Scores as MLflow feedback assessments (see the module docstring for the mapping)."""

    backend = "MLflow"

    def __init__(
        self,
        tracking_uri: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        trace_wait_s: float = 900.0,
        parallel: int = 4,
    ) -> None:
        if not (trace_wait_s >= 0 and math.isfinite(trace_wait_s)):
            raise ValueError(f"MLflow trace_wait_s must be a non-negative number of seconds, got {trace_wait_s!r}")
        client, secrets = http_client(
            tracking_uri,
            what="MLflow tracking URI",
            setting="TRACESCORE_MLFLOW_URL",
            timeout_s=timeout_s,
            parallel=parallel,
            secret=token,
            credentials={"MLflow token (token / TRACESCORE_MLFLOW_TOKEN)": token},
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )
        super().__init__(client, secrets, parallel)
        self._base = tracking_uri.rstrip("/") + "/api/3.0/mlflow/traces"
        self.endpoint: str | None = shown_endpoint(tracking_uri)
        self._trace_wait_s = trace_wait_s

    def _payload(self, record: ScoreRecord) -> dict[str, Any] | Refused:
        return _assessment(record)

    def _send(self, record: ScoreRecord, assessment: dict[str, Any]) -> tuple[Delivery, bool]:
        trace = assessment["trace_id"]
        url = f"{self._base}/{trace}/assessments"
        updated = self._client.patch(
            f"{url}/{assessment['assessment_id']}",
            content=json_body({"assessment": assessment, "update_mask": _UPDATE_MASK}),
            headers=JSON,
        )
        outcome = self._outcome(updated)
        if isinstance(outcome, Delivered) and _kept_stale(updated, assessment):
            # MLflow keeps an assessment's source and merges its metadata on update: a record
            # that replaced another (a retryable error scored later) kept the error's
            # failed_step and its CODE source. Such an assessment is made anew.
            removed = self._client.delete(f"{url}/{assessment['assessment_id']}")
            gone = self._outcome(removed, answers_assessment=False)
            if isinstance(gone, Retry):
                return gone, asks_to_wait(removed)
            if gone is None and _error_code(removed) != _NOT_FOUND:
                # (a proxy that refuses DELETE: the update landed, only those fields stay stale)
                log.warning("mlflow_stale_assessment_kept", score_id=record.score_id, status=removed.status_code)
                return Delivered(), False
            return self._create(record, trace, assessment)
        if outcome is not None:
            return outcome, asks_to_wait(updated)
        if _error_code(updated) != _NOT_FOUND:
            return self._refused(updated, record)
        return self._create(record, trace, assessment)

    def _create(self, record: ScoreRecord, trace: str, assessment: dict[str, Any]) -> tuple[Delivery, bool]:
        # Not there yet (or the trace is not): create it. A create racing another worker's
        # answers 500 (duplicate id), which is Retry; the next try finds it and updates.
        url = f"{self._base}/{trace}/assessments"
        created = self._client.post(url, content=json_body({"assessment": assessment}), headers=JSON)
        outcome = self._outcome(created)
        if outcome is not None:
            return outcome, asks_to_wait(created)
        if _error_code(created) != _NOT_FOUND:
            return self._refused(created, record)
        waited = time.time() - record.scored_at
        if waited <= self._trace_wait_s:
            return Retry(f"trace {trace} not in MLflow yet (HTTP 404)", after_s=_NOT_INGESTED_AFTER_S), False
        # The trace and the wait in the detail: the reason is what `sinks list` groups letters by
        # and `sinks drop --reason` takes them by, and it keys the one log line a minute.
        refused = Refused(
            f"trace still not in MLflow {self._trace_wait_s:.0f} s after scoring (HTTP 404): was it exported"
            " to this server?",
            detail=f"trace {trace}, {waited:.0f} s after scoring; MLflow said: {self._detail(created, record)}",
        )
        return refused, False

    def _outcome(self, response: httpx.Response, *, answers_assessment: bool = True) -> Delivery | None:
        """Delivered or Retry by status; None for a refusal to look at. A create or an update
        is acknowledged by the assessment it stored (``answers_assessment``), a delete by none."""
        status = response.status_code
        if 200 <= status < 300:
            if not answers_assessment:
                return Delivered()
            return unacknowledged("MLflow", response, _holds_assessment, "TRACESCORE_MLFLOW_URL") or Delivered()
        if is_retryable(status):
            return Retry(f"MLflow answered HTTP {status}", after_s=retry_after(response.headers.get("retry-after")))
        return None

    def _refused(self, response: httpx.Response, record: ScoreRecord) -> tuple[Refused, bool]:
        """The refusal, and whether it holds for every record (the credentials, or the URL)."""
        status = response.status_code
        code = _error_code(response)
        detail = self._detail(response, record)
        if status in (401, 403):
            reason = f"MLflow refused the credentials (HTTP {status}): check TRACESCORE_MLFLOW_TOKEN"
            return Refused(reason, detail=detail), True
        if 300 <= status < 400:  # no redirect is followed (a sink posts where it is told): the URL is wrong
            reason = f"MLflow answered a redirect (HTTP {status}): set TRACESCORE_MLFLOW_URL to where it points"
            return Refused(reason, detail=detail), True
        if code is None and status in _NOT_THE_API:
            reason = f"no MLflow tracking API at this URL (HTTP {status}): check TRACESCORE_MLFLOW_URL"
            return Refused(reason, detail=detail), True
        if code is None:  # a proxy's page about this request (413: this record is too large)
            return Refused(f"MLflow's URL refused the assessment (HTTP {status})", detail=detail), False
        return Refused(f"MLflow refused the assessment (HTTP {status} {code})", detail=detail), False

    def _detail(self, response: httpx.Response, record: ScoreRecord) -> str:
        """MLflow's answer, short, without our credentials or the score's own text."""
        return refusal_detail(answer_text(response), self._secrets, record_texts([record]))


def _assessment(record: ScoreRecord) -> dict[str, Any] | Refused:
    """The assessment of one score, or why it cannot be one (never sent)."""
    ids = otel_ids(record, "MLflow")
    if isinstance(ids, Refused):
        return ids
    trace_id, span_id = ids
    if record.score is not None and not math.isfinite(record.score):
        return Refused("score is not a finite number (JSON cannot carry it)")
    feedback: dict[str, Any]
    rationale = record.reason
    if not record.ok:
        code = stored_text(record.error_type or "", lambda c: len(json.dumps(c)) <= _ERROR_CODE_CHARS)
        message = stored_text(
            record.error_message or "",
            lambda m: len(json.dumps({"error_code": code, "error_message": m, "stack_trace": None})) <= _TEXT_BYTES,
        )
        feedback = {"value": None, "error": {"error_code": code, "error_message": message}}
    elif record.score is None and record.not_scorable is not None:
        feedback = {"value": None}
        rationale = f"not scorable: {record.not_scorable}"
    elif record.score is None:
        feedback = {"value": stored_text(record.label, _json_fits) if record.label is not None else None}
    else:
        feedback = {"value": record.score}
    metadata: dict[str, str | None] = {
        "score_id": record.score_id,
        "scorer_version": record.scorer_version,
        "label": record.label,
        "source": record.source,
        "job_id": record.job_id,
        "run_id": record.run_id,
        "judge_models": ",".join(record.judge_models) or None,
        "failed_step": record.failed_step,
        "not_scorable": record.not_scorable,
        "environment": record.environment or None,
    }
    scored_at = datetime.fromtimestamp(record.scored_at, UTC).isoformat(timespec="milliseconds")
    source = {"source_type": "LLM_JUDGE" if record.judge_models else "CODE", "source_id": _name(record.scorer_id)}
    return {
        "assessment_id": f"a-{record.score_id[:32]}",
        "assessment_name": _name(record.scorer_name or record.scorer_id),
        "trace_id": f"tr-{trace_id}",
        "span_id": span_id,
        "source": source,
        "create_time": scored_at.replace("+00:00", "Z"),
        "feedback": feedback,
        "rationale": stored_text(rationale or "", lambda r: len(r.encode("utf-8", "surrogatepass")) <= _TEXT_BYTES),
        "metadata": {
            key: stored_text(value, lambda v: len(json.dumps(v)) <= _METADATA_VALUE_CHARS)
            for key, value in metadata.items()
            if value is not None
        },
    }


def _name(text: str) -> str:
    """A name or source id as its ``VARCHAR(250)`` column holds it."""
    return stored_text(text, lambda n: len(n) <= _NAME_CHARS)


def _json_fits(text: str) -> bool:
    """Whether ``text`` fits a Text column as MLflow writes it there (``json.dumps``: ASCII)."""
    return len(json.dumps(text)) <= _TEXT_BYTES


def _holds_assessment(answer: Any) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("assessment"), dict)


def _kept_stale(updated: httpx.Response, sent: dict[str, Any]) -> bool:
    """Whether MLflow's answer to an update shows a source or metadata keys the update could not
    replace (an answer it cannot read shows nothing)."""
    answer = answer_json(answer_text(updated))
    held = answer.get("assessment") if isinstance(answer, dict) else None
    if not isinstance(held, dict):
        return False
    source, metadata = held.get("source"), held.get("metadata")
    ours = sent["source"]["source_type"]
    if isinstance(source, dict) and source.get("source_type", ours) != ours:
        return True
    # (only the keys this sink writes: MLflow may add keys of its own)
    return isinstance(metadata, dict) and bool((set(metadata) & _METADATA_KEYS) - set(sent["metadata"]))


def _error_code(response: httpx.Response) -> str | None:
    """MLflow's ``error_code`` (its REST errors are JSON); None for any other answer (a proxy's
    or a web server's page)."""
    return error_code(answer_json(answer_text(response)))
