"""The scoring task (``tracescore.score_batch``): validate, score on the loop thread, retry or
dead-letter. It never lets a bad message crash the worker (the consumer's guard, ``_guard.py``,
refuses what is not a task message before this runs).

A batch whose delivery killed its worker process (segfault, OOM kill: the message comes back
without finishing) is split on redelivery into one message per run (a request of several runs
into one request per target, each with its run's own spans), so the run that kills its process
is dead-lettered alone and its neighbours are scored."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import structlog
from billiard.pool import soft_timeout_sighandler
from celery import Task
from celery.exceptions import Reject, Retry, SoftTimeLimitExceeded
from kombu.exceptions import OperationalError as KombuOperationalError
from pydantic import ValidationError
from redis import exceptions as redis_errors

from tracing.queue import SCORE_TASK_NAME, ScoreBatch, plain_id, request_json, shown_id
from worker import _heartbeat as probe_files
from worker._errors import caused_by, crash_fields
from worker._guard import BODY_BYTES_HEADER, STORE_WAITS_HEADER
from worker._logs import CountedLog
from worker._loop import (
    WATCHDOG_GRACE_S,
    GraceExpired,
    call_from_signal_handler,
    install_drain_handler,
    run_coro,
    run_draining,
    shutting_down,
    within_cleanup,
)
from worker._reconnect import COMMAND_SLACK_S, RECONNECT_S
from worker._runtime import WorkerRuntime, get_runtime
from worker._scoring import STORE_REFUSALS, StoreUnavailableError, score_batch
from worker.metrics import observe_records
from worker.store import END_WAIT_S, DeadLetter, StoreKeyTypeError, dead_letter_id, new_token, validation_place

if TYPE_CHECKING:
    from worker._app import TracescoreApp
    from worker._settings import Settings

__all__ = ["DRAIN_SIGNAL", "register_score_task"]

log = structlog.get_logger("tracescore.worker.task")
T = TypeVar("T")

# A dead letter keeps the payload for `tracescore dlq retry` unless it is larger than this.
MAX_DEAD_PAYLOAD_BYTES = 1024 * 1024
# Crashed deliveries of a one-run message tolerated before it is dead-lettered (a crash may be
# the machine's fault, not the run's).
MAX_CRASHED_DELIVERIES = 2
# Names the per-run messages of a split batch (deterministic: a second split sends the same ids).
_SPLIT_NAMESPACE = uuid.UUID("5b0c1f0e-7a53-4d0b-9f7e-3a2f4c8d9e10")
# Names, on each per-run message of a split batch, the task id of the batch it came from: the
# message is new, but its run was delivered before and may have paid judge calls that failed
# (the call cap reads them). A producer setting it only makes its runs' cap read their count.
_SPLIT_HEADER = "tracescore_split_from"
# The main process tells its prefork children to start their grace period with this (worker._app).
DRAIN_SIGNAL = signal.SIGUSR2
# What encoding a letter raises for a value the store cannot hold (a lone surrogate, nesting past
# the encoder's depth, bytes not UTF-8): raised before anything reaches the store, and again on
# every try with that letter.
_UNENCODABLE = (ValueError, TypeError, RecursionError)
# Failures of the machinery around scoring (the broker, Redis, the loop wait): the message goes
# back to the queue. Celery would otherwise fail the task and acknowledge (drop) its message.
_INFRASTRUCTURE_ERRORS = (TimeoutError, OSError, KombuOperationalError, redis_errors.RedisError)
# How long the score store has to answer once a batch's soft time limit passed (at most half the
# gap to the hard limit): Redis on a reachable host answers a PING in milliseconds.
_STORE_PING_S = 2.0
# Refusals redis-py raises as a ConnectionError although the store answered (an older redis-py
# has no MaxClientsReachedError: its text is read below). Not BusyLoadingError: a store loading
# its data after a restart serves nobody, an outage.
_STORE_REFUSED_NEW: tuple[type[Exception], ...] = tuple(
    getattr(redis_errors, name)
    for name in ("AuthenticationError", "AuthorizationError", "MaxClientsReachedError")
    if hasattr(redis_errors, name)
)
_MAX_CLIENTS = "max number of clients reached"


def _until_the_grace_ends(runtime: WorkerRuntime, call: Coroutine[Any, Any, T], **logged: str) -> T:
    """A store call of the task's own (marking its delivery begun, keeping a dead letter), cut by
    the shutdown grace period's end as the scoring is: with the store hanging as SIGTERM came,
    its wait (the reconnect, 15 s) ran past the cleanup deadline and the worker left by the
    backstop (exit 71). The message goes back to the queue instead; a letter not kept is kept by
    its next delivery (one per message)."""
    try:
        return run_draining(call, _loop_wait(runtime))
    except GraceExpired:
        log.warning("batch_requeued_at_shutdown", **logged, waited_for="store")
        raise Reject("the shutdown grace period ended as the store did not answer; requeued", requeue=True) from None


def _loop_wait(runtime: WorkerRuntime) -> float:
    """How long the task waits for one store call on the loop: a sync step may hold the loop
    for the run timeout (plus the watchdog's turn and grace) before the call even starts, and
    the call itself may reconnect for RECONNECT_S. A shorter wait would give up on a healthy
    delivery while another batch's step blocks the shared loop."""
    return runtime.settings.run_timeout + WATCHDOG_GRACE_S + 1.0 + RECONNECT_S + COMMAND_SLACK_S


# Letters expected for every message until a budget resets or a price is added: a line a minute.
_refusal_logs = {
    reason: CountedLog(
        f"{reason}_messages", logger=structlog.get_logger("tracescore.worker.budget"), count_key="dead_lettered"
    )
    for reason in ("budget_exhausted", "unpriced_model")
}


def _dead_letter(
    runtime: WorkerRuntime,
    payload: Any,
    *,
    reason: str,
    error: str,
    attempts: int,
    retryable: bool,
    message_key: str,
    run_ids: list[str] | None = None,
    size: int | None = None,
    exc: BaseException | None = None,
) -> None:
    """Keep the message whose task argument is ``payload`` as its one dead letter. The letter
    holds ``payload`` when it is JSON of at most ``MAX_DEAD_PAYLOAD_BYTES`` and within the
    workers' message cap (``size``: as measured, else ``_size(payload)``): a letter to retry
    must fit the queue. Its batch id is the payload's when that is text. The log line has the
    reason and ``exc``'s type and place, never ``error``: it may quote the run (an exception's
    text), which the letter, in the user's own store, keeps."""
    if size is None:
        size = _size(payload)
    keep = payload if 0 <= size <= min(MAX_DEAD_PAYLOAD_BYTES, runtime.settings.max_payload_bytes) else None
    batch_id = payload.get("batch_id") if isinstance(payload, dict) else None
    if not isinstance(batch_id, str):  # a hostile message's number or object: no letter would validate
        batch_id = None
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
    try:
        pushed = _until_the_grace_ends(runtime, runtime.dead_letters.push(letter), letter=letter.id, reason=reason)
    except _UNENCODABLE as unencodable:
        # Every try would fail alike, and the message, handed back, would come round for ever a
        # second apart: it is kept without what could not be encoded (not to retry: nothing to).
        letter = _without_payload(letter, unencodable)
        pushed = _until_the_grace_ends(runtime, runtime.dead_letters.push(letter), letter=letter.id, reason=reason)
        log.error("dead_letter_payload_dropped", reason=reason, error_type=type(unencodable).__name__, letter=letter.id)
    if reason in _refusal_logs:  # every message until that changes: a line a minute
        _refusal_logs[reason].note(batch_id=shown_id(batch_id), letter=letter.id, duplicate=not pushed)
        return
    log.error(
        "message_dead_lettered",
        reason=reason,
        **(crash_fields(exc) if exc is not None else {}),
        batch_id=shown_id(batch_id),
        attempts=attempts,
        letter=letter.id,
        duplicate=not pushed,
    )


def _without_payload(letter: DeadLetter, exc: BaseException) -> DeadLetter:
    """``letter`` as the store can encode it: no payload, a batch id only when it is a plain id,
    the error's text with what is no character replaced."""
    error = f"{letter.error}; the payload was not kept: it cannot be encoded ({type(exc).__name__})"
    return letter.model_copy(
        update={
            "payload": None,
            "retryable": False,
            "batch_id": letter.batch_id if plain_id(letter.batch_id) else None,
            "error": error.encode("utf-8", "replace").decode("utf-8")[:2000],
            "run_ids": [r.encode("utf-8", "replace").decode("utf-8") for r in letter.run_ids],
        }
    )


def _split(task: Task[Any, Any], payload: dict[str, Any], batch: ScoreBatch, task_id: str, queue: str) -> None:
    """Requeue each run of ``batch`` as its own message (the original is then acked): a request
    of one run as it came, one of several as one request per target."""
    # One-run requests in the shape every worker reads, the previous release's included: a split
    # during a rolling upgrade may be taken by a worker not yet upgraded.
    runs = [
        raw if len(request.target_span_ids) == 1 else json.loads(request_json(one))
        for raw, request in zip(payload["requests"], batch.requests, strict=True)
        for one in request.per_target()
    ]
    for i, request in enumerate(runs):
        sub_id = str(uuid.uuid5(_SPLIT_NAMESPACE, f"{task_id}/{i}"))
        sub_batch_id = f"{batch.batch_id}/{i}"
        if not plain_id(sub_batch_id):
            # Past the screen's 128 characters: it would refuse every run's message. A digest of
            # the batch's id instead, as deterministic (a second split sends the same ids).
            digest = hashlib.sha256(batch.batch_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            sub_batch_id = f"{digest}/{i}"
        task.apply_async(
            args=({"batch_id": sub_batch_id, "requests": [request]},),
            task_id=sub_id,
            queue=queue,
            headers={_SPLIT_HEADER: task_id},
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


# billiard's soft time limit: the main process's timer sends it to the prefork child running the task.
_SOFT_LIMIT_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)
_task_running = False


def _soft_limit_if_running(signum: int, frame: object) -> None:
    """billiard's soft-time-limit handler, but raising only while this process runs a task.

    The pool's time-limit timers run on the main process's event loop, which Celery's consumer
    holds while it reconnects to a lost broker (kombu's retry sleeps in it). When the broker is
    back, the timers that fell due meanwhile fire before the children's results are read: the
    soft limit of a task that ended during the outage reaches a child that is idle, or still
    blocked writing that task's result to a pipe nobody read (a Retry's or Reject's traceback
    is larger than the pipe's 64 KiB). billiard's handler raised there, outside any task: the
    idle child died (exit 1), and the writing one, cut mid-message, wrote its error report after
    the cut, so the main process read a corrupt message and exited (UnpicklingError). A limit
    arriving outside a task is late: ignored, and logged."""
    if _task_running:
        raise SoftTimeLimitExceeded()
    call_from_signal_handler(lambda: log.warning("late_soft_time_limit_ignored", pid=os.getpid()))


def _guard_soft_limit() -> None:
    """Put ``_soft_limit_if_running`` in place of billiard's handler (a prefork child only: the
    solo pool's process is the main one, whose SIGUSR1 is Celery's own)."""
    if _SOFT_LIMIT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(_SOFT_LIMIT_SIGNAL) is soft_timeout_sighandler:
        signal.signal(_SOFT_LIMIT_SIGNAL, _soft_limit_if_running)


@contextlib.contextmanager
def _running() -> Iterator[None]:
    global _task_running
    _task_running = True
    try:
        yield
    finally:
        _task_running = False


def _score_batch(self: Task[Any, Any], payload: Any) -> dict[str, Any] | None:
    """Score one ``ScoreBatch`` (its ``model_dump(mode="json")``).

    Every way out marks this delivery as ended (see ``worker.store.DeliveryLog``), so only a delivery
    whose process died counts as a crash. A failure of the machinery (a loop wait that ran out,
    the broker or Redis away) hands the message back to the queue; nothing is acked and dropped."""
    _guard_soft_limit()  # (again before each task: billiard installs its handler after our initializer)
    with _running():
        return _score_one_batch(self, payload)


def _score_one_batch(self: Task[Any, Any], payload: Any) -> dict[str, Any] | None:
    app: TracescoreApp = self.app  # type: ignore[assignment]  # create_app registers this task
    batch_id = payload.get("batch_id") if isinstance(payload, dict) else None
    task_id = str(self.request.id or (shown_id(batch_id) if isinstance(batch_id, str) else None) or "-")
    if shutting_down():
        # SIGTERM came: a message handed over since (prefetched, or queued in the pool) goes
        # straight back for another worker, before any delivery is recorded or score claimed.
        log.info("batch_requeued_at_shutdown", task_id=task_id, started=False)
        raise Reject("the worker is shutting down; requeued", requeue=True)
    runtime = get_runtime(app.settings)
    # (the cleanup time too: left out, the handler went back to the 10 s default at a prefork
    # child's first task, and the child's way out outlasted the main process's backstop)
    install_drain_handler(
        DRAIN_SIGNAL, runtime.settings.shutdown_grace_seconds, runtime.settings.shutdown_cleanup_seconds
    )
    token = new_token()
    # Not in a `finally`: a delivery ended by its process going down (SystemExit, a kill) is
    # exactly what must stay unended.
    try:
        report = _score_delivery(self, runtime, payload, task_id, token)
    except (Retry, Reject):
        _end_delivery(runtime, task_id, token)
        raise
    except Exception as exc:
        _end_delivery(runtime, task_id, token)
        _failed_around_scoring(self, runtime, payload, task_id, exc)
        return None
    _end_delivery(runtime, task_id, token)
    return report


def _failed_around_scoring(
    self: Task[Any, Any], runtime: WorkerRuntime, payload: Any, task_id: str, exc: Exception
) -> None:
    """Celery would fail the task and ack (drop) its message: requeue it, or keep it as a letter."""
    if caused_by(exc, STORE_REFUSALS) is not None:
        raise _store_unwritable(self, runtime, payload, task_id, exc) from exc
    if isinstance(exc, _INFRASTRUCTURE_ERRORS):
        # Not the message's fault: try again later (the error's type only: its text may quote a run).
        log.warning("batch_requeued", task_id=task_id, error_type=type(exc).__name__)
        raise Reject(f"requeued after {type(exc).__name__} (infrastructure)", requeue=True) from exc
    # A bug in the task around scoring: requeueing would repeat it forever; keep the message.
    log.error("batch_task_crashed", task_id=task_id, **crash_fields(exc))
    try:
        _dead_letter(
            runtime,
            payload,
            reason="task_crashed",
            error=f"the scoring task failed around scoring: {type(exc).__name__} (see the worker log)",
            attempts=_attempt(self) + 1,
            retryable=True,
            message_key=_message_key(task_id),
        )
    except StoreKeyTypeError as dlq_exc:
        # The dead-letter list itself holds another Redis type: nothing can be kept there until an
        # operator moves it aside. Sent again after a backoff (an immediate requeue would spin).
        # A wait for the operator, as for a store refusing writes: not one of the message's tries.
        countdown = runtime.settings.retry_delay(int(self.request.retries or 0))
        log.error("dead_letter_refused", task_id=task_id, key=dlq_exc.key, found=dlq_exc.found, countdown_s=countdown)
        raise _retry_later(self, task_id, countdown, dlq_exc, headers=_waiting(self)) from dlq_exc
    except Exception as dlq_exc:
        if caused_by(dlq_exc, STORE_REFUSALS) is not None:
            raise _store_unwritable(self, runtime, payload, task_id, dlq_exc) from dlq_exc
        raise Reject("the message could not be dead-lettered; requeued", requeue=True) from dlq_exc
    return


def _store_unwritable(
    self: Task[Any, Any], runtime: WorkerRuntime, payload: Any, task_id: str, exc: Exception
) -> Retry:
    """The message sent again after a growing delay (within the visibility timeout): the store
    refuses every write, so nothing it scored now could be kept, and an immediate requeue spins.
    Not one of the message's tries (``STORE_WAITS_HEADER``), but the delay grows with each."""
    refusal = caused_by(exc, STORE_REFUSALS)
    countdown = runtime.settings.retry_delay(int(self.request.retries or 0))
    log.warning("store_unwritable", task_id=task_id, error_type=type(refusal).__name__, countdown_s=countdown)
    _count_left(runtime, payload, "store_unwritable")
    return _retry_later(self, task_id, countdown, headers=_waiting(self))


def _count_left(runtime: WorkerRuntime, payload: Any, reason: str) -> None:
    """Count the message's runs as left for another delivery (``tracescore_runs{outcome="retry"}``)."""
    try:
        batch = ScoreBatch.model_validate(payload)
    except (ValidationError, RecursionError):
        return
    registry = runtime.deps.registry
    observe_records(
        [],
        [
            (scorer_id if scorer_id in registry else None, reason)
            for request in batch.requests
            for _ in request.target_span_ids
            for scorer_id in dict.fromkeys(request.scorer_ids)
        ],
    )


def _retry_later(
    self: Task[Any, Any],
    task_id: str,
    countdown: float,
    exc: Exception | None = None,
    headers: dict[str, Any] | None = None,
) -> Retry:
    """``self.retry``, but never a lost message: when Celery cannot publish the retry (the broker
    went away), it rejects the message without requeueing it, which acks it. Requeued instead,
    at the same retry count; if even that cannot reach the broker, the message stays in its
    unacked hash and the visibility timeout brings it back."""
    try:
        if headers is None:
            return self.retry(countdown=countdown, exc=exc)
        return self.retry(countdown=countdown, exc=exc, headers=headers)
    except Reject as rejected:
        if getattr(rejected, "requeue", False):  # (celery-types does not list Reject's fields)
            raise
        reason = getattr(rejected, "reason", None)
        log.warning("retry_not_published", task_id=task_id, error_type=type(reason).__name__)
        raise Reject("the retry could not be published; requeued", requeue=True) from None


def _message_key(task_id: str) -> str:
    """The message's dead-letter identity: one letter per message, whichever copy comes back.

    The task id, not the retry count: a retry is published before its original is acked, so a
    broker lost between the two brings back both (the original once the visibility timeout
    restores it), at different counts. Every publish (``dlq retry`` too) takes a new task id."""
    return f"task:{task_id}"


def _end_delivery(runtime: WorkerRuntime, task_id: str, token: str) -> None:
    # After the grace period, within the cleanup deadline (a run's cleanup may have used it all:
    # then no Redis call at all). With Redis refusing connections, its own 2 s after the deadline
    # kept a worker 2 s longer (a prefork one to 6.6 s of its 7 s before the backstop's exit 71).
    wait_s = within_cleanup(END_WAIT_S + 1.0)
    if wait_s <= 0:
        runtime.deliveries.keep(task_id, token)
        return
    try:
        run_coro(runtime.deliveries.end(task_id, token, min(END_WAIT_S, wait_s)), wait_s)
    except Exception:
        # The loop is busy or Redis away: write it before this process's next delivery.
        runtime.deliveries.keep(task_id, token)


def _screened(self: Task[Any, Any]) -> bool:
    """Whether the guard screened this message (its ``BODY_BYTES_HEADER``): the body is within
    TRACESCORE_MAX_PAYLOAD_BYTES and is JSON, so the task need not serialize the batch again to
    check. Not a size to report: a retried message was re-encoded by kombu with ASCII escapes,
    so its body may be up to 6× the batch's own size (``_size``), which dead letters report."""
    measured = getattr(self.request, BODY_BYTES_HEADER, None)
    return isinstance(measured, int) and not isinstance(measured, bool) and measured >= 0


def _waiting(self: Task[Any, Any]) -> dict[str, Any]:
    """The headers of this message's retry that waits for the store (or its operator): one more
    ``STORE_WAITS_HEADER``. (Celery's retry sends the headers it is given instead of the
    message's: the others kept.)"""
    return {**(self.request.headers or {}), STORE_WAITS_HEADER: _store_waits(self) + 1}


def _store_waits(self: Task[Any, Any]) -> int:
    """How many of this message's retries were waits for the store (``STORE_WAITS_HEADER``)."""
    waits = getattr(self.request, STORE_WAITS_HEADER, 0)
    retries = int(self.request.retries or 0)
    return min(max(waits, 0), retries) if isinstance(waits, int) and not isinstance(waits, bool) else 0


def _attempt(self: Task[Any, Any]) -> int:
    """This delivery's try of the message, counted against TRACESCORE_RETRY_BUDGET: its retries
    less those that waited for the store."""
    return int(self.request.retries or 0) - _store_waits(self)


def _split_from_a_batch(self: Task[Any, Any]) -> bool:
    """Whether this message is one run of a batch ``_split`` after a crash: its first delivery
    is not its run's, so the judge-call cap reads what the batch's deliveries paid."""
    return isinstance(getattr(self.request, _SPLIT_HEADER, None), str)


def _size(payload: Any) -> int:
    """The payload's size as the guard measures it (UTF-8 bytes of compact JSON; -1: not JSON).
    ASCII escaping would count a CJK character 6 bytes instead of 3 (an emoji 12, not 4)."""
    try:
        return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError):
        return -1


def _store_unanswered(settings: Settings) -> Exception | None:
    """Why the score store does not answer a PING now (``None``: it answers). A client of its own
    on this thread: the loop may be held by the batch's runs, and the store's clients retry for
    ``RECONNECT_S``. Given a moment within the gap to the hard time limit."""
    wait_s = min(_STORE_PING_S, (settings.task_time_limit - settings.task_soft_time_limit) / 2)
    client = redis.Redis.from_url(settings.store_url, socket_connect_timeout=wait_s, socket_timeout=wait_s)
    try:
        client.ping()
    except _STORE_REFUSED_NEW:
        # It answered, refusing a new connection (at its maxclients; a password rotated under
        # this worker, whose own connections stay signed in): taken for away, a batch merely
        # slow came round without end, its runs judged again each time.
        return None
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
        return None if _MAX_CLIENTS in str(exc) else exc
    except redis_errors.RedisError:
        return None  # it answered, with an error: it is there
    finally:
        client.close()
    return None


def _score_delivery(
    self: Task[Any, Any], runtime: WorkerRuntime, payload: Any, task_id: str, token: str
) -> dict[str, Any] | None:
    settings = runtime.settings
    attempt = _attempt(self)
    message_key = _message_key(task_id)
    if not _screened(self):  # it skipped the guard (applied in process): measured here
        size = _size(payload)
        if size > settings.max_payload_bytes or size < 0:
            _dead_letter(
                runtime,
                payload,
                reason="payload_too_large" if size > 0 else "payload_not_json",
                error=f"message is {size} bytes; TRACESCORE_MAX_PAYLOAD_BYTES is {settings.max_payload_bytes}"
                " — send fewer runs per batch",
                size=size,
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
            # (a part of the place that is no plain name is not shown: an unknown field is named
            # by its name, text of the producer's)
            problems = "; ".join(f"{validation_place(e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        _dead_letter(
            runtime,
            payload,
            reason="invalid_payload",
            error=f"not a ScoreBatch: {problems}",
            attempts=attempt + 1,
            retryable=False,
            message_key=message_key,
        )
        return None

    # A message that kills its worker (OOM, segfault) comes back via reject_on_worker_lost /
    # the visibility timeout without a retry count of its own: its earlier deliveries that
    # began and never ended are the crashes.
    crashes = _until_the_grace_ends(runtime, runtime.deliveries.start(task_id, token), task_id=task_id)
    deliveries = attempt + 1 + crashes
    if crashes > 0 and batch.runs() > 1:
        # One of these runs may kill whatever process scores it: score each on its own, so
        # only that one is lost. Runs already scored are skipped by their score ids.
        assert isinstance(payload, dict)
        _split(self, payload, batch, task_id, settings.queue)
        log.warning("batch_split", batch_id=shown_id(batch.batch_id), runs=batch.runs(), crashed_deliveries=crashes)
        return None
    if crashes > MAX_CRASHED_DELIVERIES:
        request = batch.requests[0]
        (run_id,) = request.run_ids()  # one run: a message of several was split above
        _dead_letter(
            runtime,
            payload,
            reason="too_many_deliveries",
            # (the scorer ids are the producer's text: one the registry lacks is named all the same)
            error=f"run {run_id} (scorers {', '.join(shown_id(s) or '-' for s in request.scorer_ids)[:200]}) "
            f"was being scored each time its worker process died: delivered {deliveries} times, "
            f"{crashes} of them never finished",
            attempts=deliveries,
            retryable=True,
            message_key=message_key,
            run_ids=[run_id],
        )
        return None
    final = attempt >= settings.retry_budget
    again = deliveries > 1 or _split_from_a_batch(self)  # not the first delivery of its runs
    try:
        report = run_draining(
            score_batch(
                batch,
                runtime.deps,
                final_attempt=final,
                redelivery=again,
                retried=again,
            ),
            timeout=settings.task_soft_time_limit,
            on_wait=probe_files.beat_from_task,
        )
    except GraceExpired:
        # SIGTERM's grace period ended mid-batch: what finished is stored, the rest was cancelled
        # and its claims released. Requeued as it is (same retry count; the delivery is marked
        # ended, so not a crash): the next delivery scores only what is missing.
        log.warning("batch_requeued_at_shutdown", task_id=task_id, batch_id=shown_id(batch.batch_id), started=True)
        raise Reject("shutdown grace period ended; requeued", requeue=True) from None
    except (Retry, StoreUnavailableError):  # Redis unreachable: a Reject that requeues, not a retry
        raise
    except (Exception, SoftTimeLimitExceeded) as exc:
        if caused_by(exc, STORE_REFUSALS) is not None:
            raise  # not the batch's failure: backed off around scoring
        if isinstance(exc, TimeoutError | SoftTimeLimitExceeded) and (away := _store_unanswered(settings)) is not None:
            # The limit passed while the store was away: what the batch waited for was most likely
            # the store (its scores, a checkpoint, a delivery mark), not its runs. An outage is
            # not one of the message's tries: requeued as one, and once the store answers, a limit
            # passing is counted again (a batch that is merely slow does not come round forever).
            log.warning(
                "batch_requeued",
                task_id=task_id,
                batch_id=shown_id(batch.batch_id),
                reason="store_away_at_time_limit",
                error_type=type(exc).__name__,
                store_error=type(away).__name__,
            )
            # (the error's type only: a refused connection's text names the host and port)
            raise StoreUnavailableError(
                f"Redis is unreachable: the score store did not answer as the batch's soft time limit passed "
                f"({type(away).__name__}); requeued"
            ) from exc
        error = f"{type(exc).__name__}: {exc}"
        if final:
            _dead_letter(
                runtime,
                payload,
                reason="retry_budget_exhausted",
                error=error,
                attempts=attempt + 1,
                retryable=True,
                message_key=message_key,
                exc=exc,
            )
            return None
        log.warning("batch_retry", batch_id=shown_id(batch.batch_id), attempt=attempt + 1, **crash_fields(exc))
        countdown = settings.retry_delay(attempt)
        # Not the exception itself: Celery logs a retry with its repr (its text).
        raise _retry_later(self, task_id, countdown) from exc
    # Shown, returned and logged by Celery as the task's result ("Task ... succeeded ...: {...}"):
    # the batch id as the log lines have it.
    summary = {**report.as_dict(), "batch_id": shown_id(batch.batch_id)}
    # Retries of deferred scores wait at most max_eta_seconds each (inside the visibility
    # timeout): enough of them to outlast the other delivery's claim before giving up on it.
    claim_attempts = max(settings.retry_budget, settings.claim_tries)
    # This delivery's failures and those an earlier one recorded, which it left as they are.
    failed = report.failed + report.kept
    if report.exhausted and not final and not report.needs_retry:
        # Before the last attempt only runs refused by a spent judge budget (or one their
        # model's missing price cannot be held against), their judge-call cap or a spend key of
        # another Redis type are recorded as retryable: keep the message (a retryable dead
        # letter) so `tracescore dlq retry` scores them once that is past.
        refused = next(
            (r for r in ("store_key_refused", "unpriced_model", "budget_exhausted") if failed.get(r)),
            "judge_attempts_exhausted",
        )
        _dead_letter(
            runtime,
            payload,
            reason=refused,
            error=f"{len(report.exhausted)} score(s) not paid for: " + ", ".join(f"{k}×{v}" for k, v in failed.items()),
            attempts=attempt + 1,
            retryable=True,
            message_key=message_key,
        )
    if final and (report.exhausted or (report.deferred and attempt >= claim_attempts)):
        # Error records for the exhausted runs are written (visible); the message is kept so
        # `tracescore dlq retry` can score what is missing once the cause is gone.
        reasons: list[str] = []
        if report.exhausted:
            reasons.append(
                f"{len(report.exhausted)} score(s) still failing after {attempt + 1} attempts ("
                + ", ".join(f"{k}×{v}" for k, v in failed.items())
                + ")"
            )
        if report.deferred:
            reasons.append(f"{len(report.deferred)} score(s) stayed claimed by another delivery")
        _dead_letter(
            runtime,
            payload,
            reason="retry_budget_exhausted" if report.exhausted else "still_claimed",
            error="; ".join(reasons),
            attempts=attempt + 1,
            retryable=True,
            message_key=message_key,
        )
        log.info("batch_done", **summary)
        return summary
    if report.needs_retry:
        countdown = settings.retry_delay(attempt)
        if report.deferred:
            # Spread the retries over one claim lifetime: by then the holder finished or lapsed.
            spread = settings.claim_ttl / max(1, settings.retry_budget)
            countdown = max(countdown, min(spread, settings.max_eta_seconds))
        log.warning(
            "batch_retry",
            batch_id=shown_id(batch.batch_id),
            attempt=attempt + 1,
            transient=dict(report.transient),
            deferred=len(report.deferred),
            countdown_s=countdown,
        )
        raise _retry_later(self, task_id, countdown)
    log.info("batch_done", **summary)
    return summary
