"""Everything one worker process needs to score, built once per process (again after a fork).

Settings, the scorer registry, the Redis store, the score writer, and the Redis rate limiter
installed as the judge's limiter (``set_judge_hooks``) so every judge call in this process
takes a slot from the shared budget.

Limits of the process: ``TRACESCORE_MEMORY_LIMIT_MB`` becomes its address-space cap, and a
watchdog on its event loop interrupts a run that blocks the loop past the run timeout; if the
blocking code cannot be interrupted, the run's ``timeout`` record is stored and the process
exits, so the pool starts a fresh one and the broker redelivers what it held (the redelivery
skips the recorded run and scores the others).
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from opentelemetry import trace

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE
from tracing._score_record import ScoreRecord
from tracing._score_writer import ConsoleScoreWriter, JsonlScoreWriter, OtlpScoreWriter, ScoreWriter
from worker._gc import freeze_startup_objects
from worker._limiter import RedisRateLimiter
from worker._loop import start_watchdog
from worker._reconnect import RECONNECT_S
from worker._registry import Registry, RegistryError, load_registry
from worker._scoring import ScoringDeps, scoring_run_of, wedged_record
from worker._settings import Settings
from worker.store import RedisDeadLetters, RedisScoreStore

# Exit status of a worker process whose event loop was wedged (EX_SOFTWARE).
EXIT_WEDGED = 70

__all__ = ["WorkerRuntime", "build_writer", "get_runtime", "judge_call_span", "reset_runtime"]

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
    """The writer ``TRACESCORE_WRITER`` names (``none`` → scores are only stored)."""
    if settings.writer == "otlp":
        return OtlpScoreWriter()
    if settings.writer == "jsonl":
        assert settings.writer_path is not None  # checked by Settings
        return JsonlScoreWriter(settings.writer_path)
    if settings.writer == "console":
        return ConsoleScoreWriter()
    return None


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

    @classmethod
    def build(cls, settings: Settings) -> WorkerRuntime:
        if not settings.scorers:
            raise RegistryError(
                "no scorer module: start the worker with --scorers my.module (or set TRACESCORE_SCORERS=my.module)"
            )
        registry = load_registry(settings.scorers)
        store = RedisScoreStore(settings.store_url, reconnect_s=RECONNECT_S)
        writer = build_writer(settings)
        limiter = RedisRateLimiter(
            settings.store_url,
            settings.rate_limit,
            model_concurrency=settings.model_concurrency,
            reconnect_s=RECONNECT_S,
        )
        set_judge_hooks(JudgeHooks(limiter=limiter, call_context=get_judge_hooks().call_context or judge_call_span))
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
        )
        _cap_memory(settings.memory_limit_mb)
        start_watchdog(settings.run_timeout, _recycle_wedged_process, can_interrupt=scoring_run_of)
        freeze_startup_objects()
        log.info(
            "worker_runtime_ready",
            pid=os.getpid(),
            scorers=",".join(registry),
            module=settings.scorers,
            writer=settings.writer,
        )
        dead_letters = RedisDeadLetters(settings.store_url, reconnect_s=RECONNECT_S)
        return cls(settings, registry, store, dead_letters, writer, limiter, deps, os.getpid())


def _cap_memory(limit_mb: int) -> None:
    """RLIMIT_AS for this process: an allocation past it raises MemoryError in the allocating
    run (recorded as error_type "memory") instead of the OOM killer taking the process."""
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
        store = RedisScoreStore(store.url, reconnect_s=5.0)
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
    found = wedged_record(task, blocked_s)
    runtime = _runtime if _runtime is not None and _runtime.pid == os.getpid() else None
    try:
        if found is not None:
            record, deps = found
            if asyncio.run(_store_alone(record, deps)) and deps.writer is not None:
                deps.writer.write([record])
        if runtime is not None and runtime.writer is not None:
            runtime.writer.flush(5.0)
    except Exception:
        log.exception("wedged_run_not_recorded")
    log.error(
        "worker_loop_wedged_exiting",
        pid=os.getpid(),
        blocked_s=round(blocked_s, 1),
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


def reset_runtime() -> WorkerRuntime | None:
    """Forget this process's runtime (returns it, so the caller can flush its writer)."""
    global _runtime
    with _lock:
        current, _runtime = _runtime, None
    return current if current is not None and current.pid == os.getpid() else None
