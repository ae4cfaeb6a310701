"""``ScoreRecord``: one score of one span by one scorer, as stored and as written back.

The score id is deterministic — sha256 of (trace id, span id, scorer id, scorer version) —
so a redelivered or re-run request finds the score it already produced and writes nothing twice.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracing._text import without_lone_surrogates

__all__ = ["ScoreRecord", "score_id_for"]


def _valid_text(value: Any) -> Any:
    if isinstance(value, str):
        return without_lone_surrogates(value)[0]
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def score_id_for(trace_id: str, span_id: str, scorer_id: str, scorer_version: str) -> str:
    """The deterministic id of one score (64 hex characters)."""
    key = "\x1f".join((trace_id, span_id, scorer_id, scorer_version))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


# The fields that hold text (the rest are numbers, booleans and a literal): each passes
# ``_valid_text``; tests/tracing check this list against the model's fields.
_TEXT_FIELDS = (
    "score_id",
    "trace_id",
    "span_id",
    "span_name",
    "scorer_id",
    "scorer_name",
    "scorer_version",
    "label",
    "reason",
    "not_scorable",
    "error_type",
    "error_message",
    "failed_step",
    "judge_models",
    "run_id",
    "environment",
    "job_id",
)


class ScoreRecord(BaseModel):
    """A finished score, or a failed one (``error_type`` set, ``score`` None)."""

    model_config = ConfigDict(frozen=True)

    score_id: str
    trace_id: str
    span_id: str
    span_name: str = ""
    scorer_id: str
    scorer_name: str | None = None
    scorer_version: str = "1"
    score: float | None = None
    label: str | None = None
    reason: str | None = None
    # Set when the scorer declared the run not scorable (the step and its reason).
    not_scorable: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    failed_step: str | None = None
    # The failure was transient (timeouts, 429/5xx) and outlasted the retry budget: a later
    # delivery of the run (e.g. `tracescore dlq retry`) may score it and replace this record.
    retryable: bool = False
    judge_models: list[str] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    # Input tokens the provider served from its prompt cache (a part of input_tokens).
    cached_input_tokens: int = 0
    # What the judge calls cost in US dollars by the price table (None: a model with no price).
    cost_usd: float | None = None
    judge_calls: int = 0
    # The scored span's own start and end (epoch ns), so that write-back stays inside it.
    span_start_ns: int | None = None
    span_end_ns: int | None = None
    run_id: str | None = None
    # Where the scored span ran (``SpanRecord.environment``): Langfuse files the score under it.
    environment: str | None = None
    job_id: str | None = None
    source: Literal["live", "backfill"] = "live"
    created_at: float = Field(default_factory=time.time)
    # Epoch seconds: when the run was handed to the queue, and when scoring finished.
    enqueued_at: float | None = None
    scored_at: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _encodable(self) -> ScoreRecord:
        # A lone surrogate (json.loads of a judge's or an agent's "\ud83d" makes one) would make
        # the record unserialisable: no store could keep it, no sink send it, on every retry.
        # U+FFFD here, once, so every store and sink gets valid UTF-8. One pass over the text
        # fields, not a validator each: records are built per score on the worker's hot path.
        values = self.__dict__
        for name in _TEXT_FIELDS:
            value = values[name]
            if value is None or (value.__class__ is str and value.isascii()):
                continue
            values[name] = _valid_text(value)  # frozen: past validation, set in place
        return self

    @property
    def ok(self) -> bool:
        return self.error_type is None
