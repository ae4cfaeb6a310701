"""Everything one worker process needs to score, built once per process (again after a fork).

Settings, the scorer registry, the Redis store (queueing every score for the configured sinks),
this process's sink drainers (``worker._delivery``; the main process starts them when the
worker is ready, a prefork child with its runtime), and the Redis rate limiter
installed as the judge's limiter (``set_judge_hooks``) so every judge call in this process
takes a slot from the shared budget.

Limits of the process: a watchdog on its event loop interrupts a run that blocks the loop past
the run timeout; if the blocking code cannot be interrupted, the run's ``timeout`` record is
stored and the process exits (likewise, with a ``memory`` record, when its resident memory
passes ``TRACESCORE_MEMORY_LIMIT_MB``), so the pool starts a fresh one and the broker
redelivers what it held (the redelivery skips the recorded run and scores the others).
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from celery import signals
from opentelemetry import trace

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks
from tracing import JUDGE_ROLE, ROLE_ATTRIBUTE, ScoreRecord, ScoreWriter
from worker._budget import BudgetGuard, RedisLedger, parse_budgets, parse_prices
from worker._delivery import DrainerWaker, process_deliveries, start_process_deliveries, stop_process_deliveries
from worker._gc import freeze_startup_objects
from worker._limiter import RedisRateLimiter
from worker._loop import halt_loop, run_coro, start_watchdog
from worker._reconnect import RECONNECT_S
from worker._registry import Registry, RegistryError, load_registry
from worker._scoring import ScoringDeps, scoring_run_of, wedged_record
from worker._settings import Settings
from worker.metrics import judge_request_context, observe_judge_usage, observe_records
from worker.store import DeliveryLog, RedisDeadLetters, RedisScoreStore

# Exit status of a worker process whose event loop was wedged (EX_SOFTWARE).
EXIT_WEDGED = 70
# How long a process over its memory limit waits for its loop thread to stop before it
# records the run anyway (a step inside one long C call takes the stop when the call returns).
HALT_S = 2.0

__all__ = [
    "WorkerRuntime",
    "build_writer",
    "close_runtime",
    "get_runtime",
    "judge_call_span",
    "reset_runtime",
    "start_deliveries",
]

log = structlog.get_logger("tracescore.worker")


@contextmanager
def judge_call_span(model_id: str) -> Iterator[None]:
    """Marks each judge request (and the HTTP spans an instrumented SDK makes under it) as the
    judge's, so a ScoringSpanExporter in this process never scores judge traffic (loop guard)."""
    tracer = trace.get_tracer("tracescore.judge")
    with tracer.start_as_current_span(
        "tracescore.judge", attributes={ROLE_ATTRIBUTE: JUDGE_ROLE, "gen_ai.request.model": model_id}
    ):
        yield


def build_writer(settings: Settings) -> ScoreWriter | None:
    """What the scoring code calls after storing new records: this process's drainers' wake-up
    (their sinks take the records from the outbox). None when no sink is configured."""
    deliveries = start_process_deliveries(settings)
    return DrainerWaker(deliveries) if deliveries is not None else None


def start_deliveries(sender: Any = None, **_: Any) -> None:
    """Celery's ``worker_ready``: start the main process's drainers at once, so that what a
    previous worker stored and did not deliver goes out even before a task arrives."""
    settings = getattr(getattr(sender, "app", None), "settings", None)
    if isinstance(settings, Settings):
        try:
            start_process_deliveries(settings)
        except Exception as exc:
            log.error("drainers_not_started", error_type=type(exc).__name__, error=str(exc))


signals.worker_ready.connect(start_deliveries, weak=False)


@dataclass
class WorkerRuntime:
    settings: Settings
    registry: Registry
    store: RedisScoreStore
    dead_letters: RedisDeadLetters
    writer: ScoreWriter | None
    limiter: RedisRateLimiter
    deps: ScoringDeps
    pid: int
    deliveries: DeliveryLog

    @classmethod
    def build(cls, settings: Settings) -> WorkerRuntime:
        if not settings.scorers:
            raise RegistryError(
                "no scorer module: start the worker with --scorers my.module (or set TRACESCORE_SCORERS=my.module)"
            )
        registry = load_registry(settings.scorers)
        # Every recorded score is queued for each sink (the outbox); the drainers deliver it.
        store = RedisScoreStore(settings.store_url, reconnect_s=RECONNECT_S, sinks=settings.sink_names)
        writer = build_writer(settings)
        limiter = RedisRateLimiter(
            settings.store_url,
            settings.rate_limit,
            model_concurrency=settings.model_concurrency,
            reconnect_s=RECONNECT_S,
        )
        call_context = judge_request_context(get_judge_hooks().call_context or judge_call_span)
        # Budgets, spend and the per-run judge-call cap, shared by every worker (worker/_budget.py).
        prices = parse_prices(settings.prices)
        guard = BudgetGuard(
            RedisLedger(settings.store_url, reconnect_s=RECONNECT_S),
            parse_budgets(settings.budgets),
            on_usage=observe_judge_usage,
            prices=prices,
        )
        set_judge_hooks(JudgeHooks(limiter=limiter, call_context=call_context, guard=guard))
        deps = ScoringDeps(
            registry=registry,
            store=store,
            writer=writer,
            model_concurrency=settings.model_concurrency,
            run_concurrency=settings.run_concurrency,
            score_ttl_s=settings.score_ttl_seconds,
            claim_ttl_s=settings.claim_ttl,
            checkpoint_ttl_s=settings.checkpoint_ttl_seconds,
            run_timeout_s=settings.run_timeout,
            judge_call_cap=settings.max_judge_attempts_per_run,
            retry_budget=settings.retry_budget,
            prices=prices,
        )
        start_watchdog(
            settings.run_timeout,
            _recycle_wedged_process,
            can_interrupt=scoring_run_of,
            rss_limit_bytes=settings.memory_limit_mb * 2**20,
            on_memory=_recycle_process_over_memory,
        )
        freeze_startup_objects()
        log.info(
            "worker_runtime_ready",
            pid=os.getpid(),
            scorers=",".join(registry),
            module=settings.scorers,
            sinks=",".join(settings.sink_names) or "none",
        )
        # Kept well past any redelivery of the message (its retries keep the task id).
        deliveries = DeliveryLog(
            settings.store_url, ttl_s=int(settings.visibility_timeout) * 10, reconnect_s=RECONNECT_S
        )
        dead_letters = RedisDeadLetters(
            settings.store_url,
            reconnect_s=RECONNECT_S,
            max_letters=settings.dlq_max_letters,
            max_bytes=settings.dlq_max_bytes,
        )
        return cls(settings, registry, store, dead_letters, writer, limiter, deps, os.getpid(), deliveries)


def _cap_memory(limit_mb: int) -> None:
    """RLIMIT_AS for a process scoring in place (``tracescore score``/``backfill`` without a
    broker): an allocation past it raises MemoryError in the allocating run (recorded as
    error_type "memory"). Not for workers: with the threads pool glibc reserves a 64 MiB arena
    per thread, so an address-space cap fails far below its size in real memory, and the
    MemoryError lands anywhere (kombu, the Redis client). Workers watch their RSS instead."""
    if not limit_mb:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


async def _store_alone(record: ScoreRecord, deps: ScoringDeps) -> bool:
    # The process's store is bound to the wedged loop: a client of our own, on this thread.
    store = deps.store
    if isinstance(store, RedisScoreStore):
        store = RedisScoreStore(store.url, reconnect_s=5.0, sinks=store.sinks)
    try:
        (fresh,) = await store.put_records([record], deps.owner, deps.score_ttl_s)
        return fresh
    finally:
        if store is not deps.store:
            await store.close()


def _recycle_wedged_process(task: asyncio.Task[Any] | None, blocked_s: float) -> None:
    """The watchdog could not free the loop: record the run that blocks it, flush the writer,
    and exit. Unacknowledged messages are redelivered (prefork: at once, as the pool replaces
    the child; solo/threads: by the visibility-timeout sweep once the worker is restarted)."""
    _record_and_exit(wedged_record(task, blocked_s), event="worker_loop_wedged_exiting", blocked_s=round(blocked_s, 1))


def _recycle_process_over_memory(task: asyncio.Task[Any] | None, rss_mb: float) -> None:
    """Resident memory passed TRACESCORE_MEMORY_LIMIT_MB: record the run the loop is in (the
    allocating one, when a sync step allocates) as ``memory`` and exit, as for a wedged loop.
    A run allocating from async code is not known here: its redeliveries die the same way and
    count as crashes, so it ends up alone in its message and dead-lettered.

    The loop is stopped first: a step allocating in a loop takes the GIL back from this thread
    at every turn, and while the record was stored it grew a 512 MB process to 7 GB, until
    Celery's hard time limit SIGKILLed it before it could exit."""
    found = wedged_record(
        task,
        0.0,
        error=MemoryError(
            f"the worker process's resident memory reached {rss_mb:.0f} MB, over "
            "TRACESCORE_MEMORY_LIMIT_MB, while this run's step was running; the process was replaced"
        ),
        error_type="memory",
    )
    loop_stopped = halt_loop(HALT_S)
    _record_and_exit(
        found,
        event="worker_memory_limit_exiting",
        rss_mb=round(rss_mb),
        loop_stopped=loop_stopped,
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    )


def _record_and_exit(found: tuple[ScoreRecord, ScoringDeps] | None, *, event: str, **fields: Any) -> None:
    runtime = _runtime if _runtime is not None and _runtime.pid == os.getpid() else None
    try:
        if found is not None:
            record, deps = found
            if asyncio.run(_store_alone(record, deps)):
                observe_records([record])  # its timeout/memory record, counted before the process goes
                if deps.writer is not None:
                    deps.writer.write([record])
        if runtime is not None and runtime.writer is not None:
            runtime.writer.flush(5.0)
    except Exception:
        log.exception("wedged_run_not_recorded")
    log.error(
        event,
        pid=os.getpid(),
        **fields,
        scorer=found[0].scorer_id if found else None,
        score_id=found[0].score_id if found else None,
        exit_status=EXIT_WEDGED,
    )
    os._exit(EXIT_WEDGED)


_lock = threading.Lock()
_runtime: WorkerRuntime | None = None


def get_runtime(settings: Settings) -> WorkerRuntime:
    """This process's runtime, built from ``settings`` (the app's) on first use (a forked
    child builds its own)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = WorkerRuntime.build(settings)
        return _runtime


def close_runtime(deadline: float) -> None:
    """This process's way out, every step by ``deadline`` (``time.monotonic()``; the shutdown's
    one cleanup deadline): the drainers deliver what is due, then stop; the delivery log, score
    store, dead letters and rate limiter close together. A step cut short loses nothing: what
    was not delivered stays in the outbox and its lease hands it to another worker; a connection
    not closed goes with the process."""
    global _runtime

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    cut_short: list[str] = []
    deliveries = process_deliveries()
    if deliveries is not None and not deliveries.flush(left()):
        cut_short.append("sink_deliveries")
    stop_process_deliveries(left())  # a drainer still delivering keeps its sink (Deliveries.stop)
    with _lock:
        current, _runtime = _runtime, None
    if current is not None and current.pid == os.getpid():
        if current.writer is not None:
            current.writer.close()
        closing = {
            "delivery_log": current.deliveries.close(left()),
            "store": current.store.close(),
            "dead_letters": current.dead_letters.close(),
            "limiter": current.limiter.close(),
        }

        async def close_all() -> list[BaseException | None]:
            tasks = [asyncio.ensure_future(c) for c in closing.values()]
            _, pending = await asyncio.wait(tasks, timeout=left())
            for task in pending:
                task.cancel()
            return [TimeoutError() if t in pending else t.exception() for t in tasks]

        try:
            outcomes = run_coro(close_all(), left() + 1.0)
        except Exception as exc:  # the loop itself is stuck (a blocked step): nothing more to wait for
            outcomes = [exc] * len(closing)
        for name, outcome in zip(closing, outcomes, strict=True):
            if outcome is not None:
                cut_short.append(name)
    if cut_short:
        log.warning(
            "shutdown_cleanup_cut_short",
            steps=",".join(cut_short),
            note="scores not delivered stay in the outbox; their lease hands them to another worker",
        )


def reset_runtime() -> WorkerRuntime | None:
    """Forget this process's runtime (returns it, so the caller can flush its writer and close
    its store; the delivery log, which callers do not know about, is closed here)."""
    global _runtime
    with _lock:
        current, _runtime = _runtime, None
    stop_process_deliveries(5.0)
    if current is None or current.pid != os.getpid():
        return None
    try:
        run_coro(current.deliveries.close(), 5.0)
    except Exception:
        log.warning("delivery_log_close_failed", exc_info=True)
    return current
