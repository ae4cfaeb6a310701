"""A backfill job's state: what it reads, with which options, how far it got, what it counted.

In Redis mode the state lives under ``tracescore:backfill:<job id>`` (JSON) beside the set of
trace ids already enqueued (``...:traces``), both with a TTL. The checkpoint is the earliest
input position whose traces are not all enqueued yet, so ``--resume`` starts reading there, and
the set keeps the few traces read again past that point from being enqueued twice.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from tracing.sources import Position
from worker._keys import backfill_state_key, backfill_traces_key

__all__ = [
    "BackfillOptions",
    "BackfillState",
    "JobCounters",
    "RedisJobStore",
    "new_job_id",
]

JOB_TTL_SECONDS = 7 * 24 * 3600
MAX_MALFORMED_KEPT = 50


def new_job_id() -> str:
    """Short, sortable by time, unique enough: ``bf-<yyyymmdd-hhmmss>-<6 hex>``."""
    return time.strftime("bf-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


class BackfillOptions(BaseModel):
    """What the job scores, and how it reads; fixed at the start, reused by ``--resume``."""

    scorers_module: str
    scorer_ids: list[str] = Field(min_length=1)
    since_ns: int | None = None
    until_ns: int | None = None
    sample_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    batch_size: int = Field(default=200, ge=1)
    window_spans: int = Field(default=10_000, ge=1)
    window_files: int = Field(default=1, ge=0)
    max_open_spans: int = Field(default=100_000, ge=1)
    # --max-cost: the job's judge spend limit in USD (None: only the daily TRACESCORE_BUDGETS).
    max_cost_usd: float | None = Field(default=None, ge=0)


class JobCounters(BaseModel):
    """Cumulative over every run (and resume) of the job."""

    traces_read: int = 0
    runs_read: int = 0
    runs_enqueued: int = 0
    traces_enqueued: int = 0
    batches: int = 0
    skipped: dict[str, int] = Field(default_factory=dict)
    unreadable: dict[str, int] = Field(default_factory=dict)
    malformed: int = 0
    malformed_where: list[str] = Field(default_factory=list)
    evicted_traces: int = 0
    # Roots that arrived after their trace was released without one (read without its root).
    late_roots: int = 0
    # Runs not enqueued, by reason (``too_large``: one run over the broker's message cap).
    runs_rejected: dict[str, int] = Field(default_factory=dict)
    # Runs enqueued with U+FFFD for text no JSON can hold (bytes not UTF-8, lone surrogates).
    runs_text_replaced: int = 0

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def unread(self, reason: str) -> None:
        self.unreadable[reason] = self.unreadable.get(reason, 0) + 1

    def reject(self, reason: str) -> None:
        self.runs_rejected[reason] = self.runs_rejected.get(reason, 0) + 1

    def bad_line(self, where: str) -> None:
        self.malformed += 1
        if len(self.malformed_where) < MAX_MALFORMED_KEPT:
            self.malformed_where.append(where)


class BackfillState(BaseModel):
    job_id: str
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    source: dict[str, Any]
    source_label: str = ""
    options: BackfillOptions
    status: Literal["reading", "interrupted", "enqueued", "finished"] = "reading"
    checkpoint: tuple[int, int, int] = (0, 0, 0)
    counters: JobCounters = Field(default_factory=JobCounters)
    elapsed_s: float = 0.0

    @property
    def position(self) -> Position:
        return Position(*self.checkpoint)

    @property
    def expected_scores(self) -> int:
        return self.counters.runs_enqueued * len(self.options.scorer_ids)


class RedisJobStore:
    """Job state and the enqueued-trace set in Redis (sync client: the driver is sync)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def load(self, job_id: str) -> BackfillState | None:
        raw = self.client.get(backfill_state_key(job_id))
        return None if raw is None else BackfillState.model_validate_json(raw)

    def save(self, state: BackfillState, newly_enqueued: Sequence[str] = ()) -> None:
        """Store the state and add ``newly_enqueued`` trace ids, in one transaction."""
        state.updated_at = time.time()
        pipe = self.client.pipeline(transaction=True)
        if newly_enqueued:
            pipe.sadd(backfill_traces_key(state.job_id), *newly_enqueued)
            pipe.expire(backfill_traces_key(state.job_id), JOB_TTL_SECONDS)
        pipe.set(backfill_state_key(state.job_id), state.model_dump_json(), ex=JOB_TTL_SECONDS)
        pipe.execute()

    def already_enqueued(self, job_id: str, trace_ids: Sequence[str]) -> set[str]:
        if not trace_ids:
            return set()
        flags = self.client.smismember(backfill_traces_key(job_id), list(trace_ids))
        return {t for t, f in zip(trace_ids, flags, strict=True) if f}

    def delete(self, job_id: str) -> None:
        self.client.delete(backfill_state_key(job_id), backfill_traces_key(job_id))
