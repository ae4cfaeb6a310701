"""The scoring task (``tracescore.score_batch``): validate, score on the loop thread, retry or
dead-letter. It never lets a bad message crash the worker (the consumer's guard, ``_guard.py``,
refuses what is not a task message before this runs).

A batch whose delivery killed its worker process (segfault, OOM kill: the message comes back
without finishing) is split on redelivery into one message per run, so the run that kills its
process is dead-lettered alone and its neighbours are scored."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import structlog
from celery import Task
from celery.exceptions import Retry, SoftTimeLimitExceeded
from pydantic import ValidationError

from tracing.queue import SCORE_TASK_NAME, ScoreBatch
from worker._loop import run_coro
from worker._runtime import WorkerRuntime, get_runtime
from worker._scoring import StoreUnavailableError, score_batch
from worker.store import DeadLetter, dead_letter_id

if TYPE_CHECKING:
    from worker._app import TracescoreApp

__all__ = ["register_score_task"]

log = structlog.get_logger("tracescore.worker.task")

# A dead letter keeps the payload for `tracescore dlq retry` unless it is larger than this.
MAX_DEAD_PAYLOAD_BYTES = 1024 * 1024
# Crashed deliveries of a one-run message tolerated before it is dead-lettered (a crash may be
# the machine's fault, not the run's).
MAX_CRASHED_DELIVERIES = 2
# Names the per-run messages of a split batch (deterministic: a second split sends the same ids).
_SPLIT_NAMESPACE = uuid.UUID("5b0c1f0e-7a53-4d0b-9f7e-3a2f4c8d9e10")


def _dead_letter(
    runtime: WorkerRuntime,
    *,
    reason: str,
    error: str,
    payload: Any,
    size: int,
    batch_id: str | None,
    attempts: int,
    retryable: bool,
    message_key: str,
    run_ids: list[str] | None = None,
) -> None:
    keep = payload if 0 <= size <= MAX_DEAD_PAYLOAD_BYTES else None
    letter = DeadLetter(
        id=dead_letter_id(message_key),
        message_key=message_key,
        run_ids=run_ids or [],
        reason=reason,
        error=error[:2000],
        batch_id=batch_id,
        task_name=SCORE_TASK_NAME,
        attempts=attempts,
        payload=keep,
        retryable=retryable and keep is not None,
    )
    pushed = run_coro(runtime.dead_letters.push(letter), 30.0)
    log.error(
        "message_dead_lettered",
        reason=reason,
        error=error[:300],
        batch_id=batch_id,
        attempts=attempts,
        letter=letter.id,
        duplicate=not pushed,
    )


def _split(task: Task[Any, Any], payload: dict[str, Any], batch: ScoreBatch, task_id: str, queue: str) -> None:
    """Requeue each run of ``batch`` as its own message (the original is then acked)."""
    for i, request in enumerate(payload["requests"]):
        sub_id = str(uuid.uuid5(_SPLIT_NAMESPACE, f"{task_id}/{i}"))
        task.apply_async(
            args=({"batch_id": f"{batch.batch_id}/{i}", "requests": [request]},), task_id=sub_id, queue=queue
        )


def register_score_task(app: TracescoreApp) -> Task[Any, Any]:
    """Register the scoring task on ``app`` (``create_app`` does, for every app it builds)."""
    task: Task[Any, Any] = app.task(
        name=SCORE_TASK_NAME,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        max_retries=None,  # our own budget (TRACESCORE_RETRY_BUDGET) decides
    )(_score_batch)
    return task


def _score_batch(self: Task[Any, Any], payload: Any) -> dict[str, Any] | None:
    """Score one ``ScoreBatch`` (its ``model_dump(mode="json")``)."""
    app: TracescoreApp = self.app  # type: ignore[assignment]  # create_app registers this task
    runtime = get_runtime(app.settings)
    settings = runtime.settings
    attempt = int(self.request.retries or 0)
    task_id = str(self.request.id or (payload.get("batch_id") if isinstance(payload, dict) else None) or "-")
    # One dead letter per message: a redelivery of this very message (same id, same retry)
    # finds the letter already there.
    message_key = f"task:{task_id}:{attempt}"
    try:
        size = len(json.dumps(payload, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        size = -1
    if size > settings.max_payload_bytes or size < 0:
        _dead_letter(
            runtime,
            reason="payload_too_large" if size > 0 else "payload_not_json",
            error=f"message is {size} bytes; TRACESCORE_MAX_PAYLOAD_BYTES is {settings.max_payload_bytes}"
            " — send fewer runs per batch",
            payload=None,
            size=size,
            batch_id=payload.get("batch_id") if isinstance(payload, dict) else None,
            attempts=attempt + 1,
            retryable=False,
            message_key=message_key,
        )
        return None
    try:
        batch = ScoreBatch.model_validate(payload)
    except (ValidationError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            problems = "nested too deeply"
        else:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:5]
            )
        _dead_letter(
            runtime,
            reason="invalid_payload",
            error=f"not a ScoreBatch: {problems}",
            payload=payload,
            size=size,
            batch_id=payload.get("batch_id") if isinstance(payload, dict) else None,
            attempts=attempt + 1,
            retryable=False,
            message_key=message_key,
        )
        return None

    # Deliveries are counted in Redis: a message that kills its worker (OOM, segfault) comes
    # back via reject_on_worker_lost / the visibility timeout without a retry count of its own,
    # so deliveries beyond its retries are deliveries that never finished.
    deliveries = run_coro(runtime.store.count_delivery(task_id, int(settings.visibility_timeout) * 10), 30.0)
    crashes = deliveries - (attempt + 1)
    if crashes > 0 and len(batch.requests) > 1:
        # One of these runs may kill whatever process scores it: score each on its own, so
        # only that one is lost. Runs already scored are skipped by their score ids.
        assert isinstance(payload, dict)
        _split(self, payload, batch, task_id, settings.queue)
        log.warning("batch_split", batch_id=batch.batch_id, runs=len(batch.requests), crashed_deliveries=crashes)
        return None
    if crashes > MAX_CRASHED_DELIVERIES:
        request = batch.requests[0]
        run_id = f"{request.trace_id}:{request.span_id}"
        _dead_letter(
            runtime,
            reason="too_many_deliveries",
            error=f"run {run_id} (scorers {', '.join(request.scorer_ids)[:200]}) was being scored each time "
            f"its worker process died: delivered {deliveries} times, {crashes} of them never finished",
            payload=payload,
            size=size,
            batch_id=batch.batch_id,
            attempts=deliveries,
            retryable=True,
            message_key=message_key,
            run_ids=[run_id],
        )
        return None
    final = attempt >= settings.retry_budget
    try:
        report = run_coro(score_batch(batch, runtime.deps, final_attempt=final), timeout=settings.task_soft_time_limit)
    except (Retry, StoreUnavailableError):  # Redis unreachable: a Reject that requeues, not a retry
        raise
    except (Exception, SoftTimeLimitExceeded) as exc:
        error = f"{type(exc).__name__}: {exc}"
        if final:
            _dead_letter(
                runtime,
                reason="retry_budget_exhausted",
                error=error,
                payload=payload,
                size=size,
                batch_id=batch.batch_id,
                attempts=attempt + 1,
                retryable=True,
                message_key=message_key,
            )
            return None
        log.warning("batch_retry", batch_id=batch.batch_id, attempt=attempt + 1, error=error[:300])
        countdown = min(settings.retry_backoff_seconds * 2**attempt, settings.max_eta_seconds)
        raise self.retry(countdown=countdown, exc=exc) from exc
    summary = report.as_dict()
    if final and (report.exhausted or report.deferred):
        # Error records for the exhausted runs are written (visible); the message is kept so
        # `tracescore dlq retry` can score what is missing once the cause is gone.
        reasons: list[str] = []
        if report.exhausted:
            reasons.append(
                f"{len(report.exhausted)} score(s) still failing after {attempt + 1} attempts ("
                + ", ".join(f"{k}×{v}" for k, v in report.failed.items())
                + ")"
            )
        if report.deferred:
            reasons.append(f"{len(report.deferred)} score(s) stayed claimed by another delivery")
        _dead_letter(
            runtime,
            reason="retry_budget_exhausted" if report.exhausted else "still_claimed",
            error="; ".join(reasons),
            payload=payload,
            size=size,
            batch_id=batch.batch_id,
            attempts=attempt + 1,
            retryable=True,
            message_key=message_key,
        )
        log.info("batch_done", **summary)
        return summary
    if report.needs_retry:
        countdown = settings.retry_backoff_seconds * 2**attempt
        if report.deferred:
            # Spread the retries over one claim lifetime: by then the holder finished or lapsed.
            countdown = max(countdown, settings.claim_ttl / max(1, settings.retry_budget))
        # The guard refuses ETAs further ahead than this; our own retries must not be refused.
        countdown = min(countdown, settings.max_eta_seconds)
        log.warning(
            "batch_retry",
            batch_id=batch.batch_id,
            attempt=attempt + 1,
            transient=dict(report.transient),
            deferred=len(report.deferred),
            countdown_s=countdown,
        )
        raise self.retry(countdown=countdown)
    log.info("batch_done", **summary)
    return summary
