"""Everything one worker process needs to score, built once per process (again after a fork).

Settings, the scorer registry, the Redis store, the score writer, and the Redis rate limiter
installed as the judge's limiter (``set_judge_hooks``) so every judge call in this process
takes a slot from the shared budget.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from opentelemetry import trace

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE
from tracing._score_writer import ConsoleScoreWriter, JsonlScoreWriter, OtlpScoreWriter, ScoreWriter
from worker._gc import freeze_startup_objects
from worker._limiter import RedisRateLimiter
from worker._registry import Registry, RegistryError, load_registry
from worker._scoring import ScoringDeps
from worker._settings import Settings, get_settings
from worker._store import RedisScoreStore

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
        store = RedisScoreStore(settings.store_url)
        writer = build_writer(settings)
        limiter = RedisRateLimiter(
            settings.store_url, settings.rate_limit, model_concurrency=settings.model_concurrency
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
        )
        freeze_startup_objects()
        log.info(
            "worker_runtime_ready",
            pid=os.getpid(),
            scorers=",".join(registry),
            module=settings.scorers,
            writer=settings.writer,
        )
        return cls(settings, registry, store, writer, limiter, deps, os.getpid())


_lock = threading.Lock()
_runtime: WorkerRuntime | None = None


def get_runtime() -> WorkerRuntime:
    """This process's runtime, built on first use (a forked child builds its own)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = WorkerRuntime.build(get_settings())
        return _runtime


def reset_runtime() -> WorkerRuntime | None:
    """Forget this process's runtime (returns it, so the caller can flush its writer)."""
    global _runtime
    with _lock:
        current, _runtime = _runtime, None
    return current if current is not None and current.pid == os.getpid() else None
