"""Langfuse: each score becomes a Langfuse score on the trace and observation it judged.

``POST {host}/api/public/scores`` (``CreateScoreRequest`` in Langfuse's public API definition,
``fern/apis/server/definition/scores.yml``), Basic auth with the project's public key as user
and secret key as password. Langfuse ingests OpenTelemetry traces under their 32-hex trace id and
their spans as observations under the 16-hex span id, so those are ``traceId`` and
``observationId``. One score per record:

- ``id``: the score id. Langfuse merges a score sent again under its id into the one it holds:
  a field or metadata key left out keeps its old value, so every field and key is sent each
  time (a missing value as null or ""), and a record that replaces another (an error scored
  later) leaves nothing of it behind.
- ``name``: the scorer's name (its id when it has none); ``comment``: the scorer's reason.
- A score: ``dataType`` NUMERIC, ``value`` the number (its label, if any, in metadata). A
  label-only score: CATEGORICAL, ``value`` the label.
- Not scorable: CATEGORICAL ``not scorable``, the reason as comment. A failed run: CATEGORICAL
  ``error``, comment ``"<error type> in <step>: <message>"``. Langfuse keeps scores of one name
  apart by data type, so errors never drag a numeric mean down, yet each run shows why it has
  no number (sending nothing would hide the failure; a fake 0 would lie).
- ``metadata``: scorer id and version, score id, label, source (live / backfill), job and run
  ids, judge models (comma-separated), the error type and failed step.
- ``environment``: the scored span's (``ScoreRecord.environment``), as Langfuse files the trace:
  lowercased, its leading "langfuse" taken off, cut to 40 characters, and ``default`` when not
  made of ``a-z 0-9 - _``. Without it a score went to ``default``, and a view filtered on the
  trace's environment showed the trace without its scores.

Size: Langfuse's score route (``web/src/pages/api/public/scores/index.ts``) sets no body size of
its own, so Next.js reads at most its default 1 MiB ("1mb") of a request and answers a larger one
413 "Body exceeded 1mb limit" before Langfuse looks at it; the definition bounds no field a
score of ours uses. Only the comment (a judge's reason, an error message) can grow that large:
a body over 1,000,000 bytes keeps the start of its comment and ends it with a marker saying
how many characters were cut (logged as ``langfuse_comment_cut``, without the text), so the
score still lands. One still over it without any comment (a label or name that long) is
``Refused`` here, unsent.

Outcomes: 2xx ``Delivered`` when its body holds the score's id (else ``Retry``: a page or an
empty body is not Langfuse's); 408/409/425/429/5xx, connection errors and timeouts ``Retry``
(Retry-After honoured); any other 4xx ``Refused`` with Langfuse's message, never the keys or
the score's text. Scores go ``parallel`` (4) at a time. An answer that holds for every score
(no answer at all, keys refused, no scores API at this URL, a redirect, a 429 or 503) is given
to the rest of the batch without a request each; a 403 saying Langfuse Cloud suspended the
project's ingestion is named as that, not as bad keys. Langfuse answers 200 once it has queued
a score, before it stores it. It accepts a score before its trace arrives (it links them by id),
so there is no "not ingested yet" wait here.
"""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import structlog

from tracing._score_record import ScoreRecord
from tracing.sinks._http import (
    JSON,
    PerScoreSink,
    answer_text,
    asks_to_wait,
    http_client,
    is_retryable,
    json_body,
    otel_ids,
    record_texts,
    refusal_detail,
    retry_after,
    unacknowledged,
)
from tracing.sinks._sink import Delivered, Delivery, Refused, Retry, shown_endpoint

__all__ = ["LangfuseSink"]

log = structlog.get_logger("tracescore.sinks.langfuse")

# Under Next.js's default 1 MiB (1,048,576 bytes) for an API route's body, which Langfuse's
# POST /api/public/scores keeps; a round number below it, for a proxy that counts otherwise.
_MAX_BODY_BYTES = 1_000_000


class LangfuseSink(PerScoreSink):
    """Scores as Langfuse scores (see the module docstring for the mapping)."""

    backend = "Langfuse"

    def __init__(
        self, host: str, public_key: str, secret_key: str, *, timeout_s: float = 10.0, parallel: int = 4
    ) -> None:
        if not public_key or not secret_key:
            missing = "public" if not public_key else "secret"
            raise ValueError(f"Langfuse needs the project's {missing} key (TRACESCORE_LANGFUSE_{missing.upper()}_KEY)")
        client, secrets = http_client(
            host,
            what="Langfuse host",
            setting="TRACESCORE_LANGFUSE_HOST",
            timeout_s=timeout_s,
            parallel=parallel,
            secret=secret_key,
            credentials={
                "Langfuse public key (public_key / TRACESCORE_LANGFUSE_PUBLIC_KEY)": public_key,
                "Langfuse secret key (secret_key / TRACESCORE_LANGFUSE_SECRET_KEY)": secret_key,
            },
            basic_auth=(public_key, secret_key),
        )
        super().__init__(client, secrets, parallel)
        self._url = host.rstrip("/") + "/api/public/scores"
        self.endpoint: str | None = shown_endpoint(host)

    def _payload(self, record: ScoreRecord) -> dict[str, Any] | Refused:
        return _score(record)

    def _send(self, record: ScoreRecord, payload: dict[str, Any]) -> tuple[Delivery, bool]:
        response = self._client.post(self._url, content=json_body(payload), headers=JSON)
        status = response.status_code
        everyone = status in (401, 403, 404) or 300 <= status < 400 or asks_to_wait(response)
        return self._outcome(response, record), everyone

    def _outcome(self, response: httpx.Response, record: ScoreRecord) -> Delivery:
        status = response.status_code
        if 200 <= status < 300:
            # (CreateScoreResponse: the id of the score it queued)
            return unacknowledged("Langfuse", response, _holds_id, "TRACESCORE_LANGFUSE_HOST") or Delivered()
        if is_retryable(status):
            return Retry(f"Langfuse answered HTTP {status}", after_s=retry_after(response.headers.get("retry-after")))
        if status == 403 and "ingestion suspended" in answer_text(response).lower():
            reason = (
                "Langfuse suspended ingestion for this project (HTTP 403, usage threshold exceeded): once it is"
                " lifted, tracescore sinks retry langfuse --all"
            )
        elif status in (401, 403):
            reason = (
                f"Langfuse refused the credentials (HTTP {status}): check TRACESCORE_LANGFUSE_PUBLIC_KEY"
                " and TRACESCORE_LANGFUSE_SECRET_KEY"
            )
        elif status == 404:
            reason = "no Langfuse scores API at this URL (HTTP 404): check TRACESCORE_LANGFUSE_HOST"
        elif 300 <= status < 400:  # no redirect is followed (a sink posts where it is told): the URL is wrong
            reason = f"Langfuse answered a redirect (HTTP {status}): set TRACESCORE_LANGFUSE_HOST to where it points"
        else:
            reason = f"Langfuse refused the score (HTTP {status})"
        return Refused(reason, detail=refusal_detail(answer_text(response), self._secrets, record_texts([record])))


def _holds_id(answer: Any) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("id"), str)


def _score(record: ScoreRecord) -> dict[str, Any] | Refused:
    """The Langfuse score of one record, or why it cannot be one (never sent)."""
    ids = otel_ids(record, "Langfuse")
    if isinstance(ids, Refused):
        return ids
    trace_id, span_id = ids
    value: float | str
    comment = record.reason
    if not record.ok:
        data_type, value = "CATEGORICAL", "error"
        step = f" in {record.failed_step}" if record.failed_step else ""
        message = f": {record.error_message}" if record.error_message else ""
        comment = f"{record.error_type}{step}{message}"
    elif record.score is None and record.not_scorable is not None:
        data_type, value, comment = "CATEGORICAL", "not scorable", record.not_scorable
    elif record.score is None:
        if not record.label:
            return Refused("score has neither a value nor a label (nothing for Langfuse to show)")
        data_type, value = "CATEGORICAL", record.label
    elif not math.isfinite(record.score):
        return Refused("score is not a finite number (JSON cannot carry it)")
    else:
        data_type, value = "NUMERIC", record.score
    metadata = {
        "scorer_id": record.scorer_id,
        "scorer_version": record.scorer_version,
        "score_id": record.score_id,
        "label": record.label,
        "source": record.source,
        "job_id": record.job_id,
        "run_id": record.run_id,
        # (Text: Langfuse stores metadata values as text, and merged a shorter list into a longer.)
        "judge_models": ",".join(record.judge_models),
        "error_type": record.error_type,
        "failed_step": record.failed_step,
    }
    return _within_limit(
        {
            "id": record.score_id,
            "traceId": trace_id,
            "observationId": span_id,
            "name": record.scorer_name or record.scorer_id,
            "value": value,
            "dataType": data_type,
            "comment": comment or None,
            "metadata": {key: "" if val is None else val for key, val in metadata.items()},
            "environment": langfuse_environment(record.environment),
        }
    )


def _within_limit(score: dict[str, Any]) -> dict[str, Any] | Refused:
    """``score``, its comment cut to fit ``_MAX_BODY_BYTES`` when the body is over it; Refused
    when even no comment would fit (never sent: Langfuse would answer 413 on every retry)."""
    size = len(json_body(score))
    if size <= _MAX_BODY_BYTES:
        return score
    comment: str = score["comment"] or ""
    # The body's bytes apart from the comment's text (its JSON string, quotes and escapes).
    rest = size - _json_size(comment if comment else None)
    # The marker's count is at most the comment's length: budget for that many digits.
    room = _MAX_BODY_BYTES - rest - (_json_size(_marker(len(comment))) - 2)
    if not comment or room < 2:
        return Refused(
            f"score is {size:,} bytes, over the {_MAX_BODY_BYTES:,} Langfuse takes (its request body limit,"
            " 1 MiB) even without its comment: its name or label is too long"
        )
    # The longest start of the comment whose JSON string fits ``room`` (escapes and UTF-8 make
    # bytes and characters differ; a JSON string's size grows with its text).
    low, high = 0, min(len(comment), room)  # (a character takes a byte at least)
    while low < high:
        mid = (low + high + 1) // 2
        if _json_size(comment[:mid]) <= room:
            low = mid
        else:
            high = mid - 1
    cut = len(comment) - low
    log.warning("langfuse_comment_cut", score_id=score["id"], kept_chars=low, cut_chars=cut, body_bytes=size)
    return {**score, "comment": comment[:low] + _marker(cut)}


def _marker(cut: int) -> str:
    return f" … [{cut:,} more characters cut by tracescore: Langfuse takes a score of at most 1 MiB]"


def _json_size(text: str | None) -> int:
    """The bytes ``text`` takes in a request body (``json_body``'s encoding)."""
    return len(json_body(text))


_LANGFUSE_PREFIX = re.compile(r"^(?:langfuse[-_]?)+")
_ENVIRONMENT = re.compile(r"[a-z0-9_-]+")


def langfuse_environment(value: str | None) -> str:
    """``value`` as Langfuse files an environment it is given (its ``PublicEnvironmentName``),
    so the score lands where its trace did."""
    name = _LANGFUSE_PREFIX.sub("", (value or "").lower())[:40]
    return name if _ENVIRONMENT.fullmatch(name) else "default"
