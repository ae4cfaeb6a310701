"""The Celery app: JSON only, late acks, prefetch 1, time limits inside the visibility timeout.

``celery -A worker worker --scorers my.module`` and ``tracescore worker`` both start it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import structlog
from celery import Celery, bootsteps, signals

from tracing._broker import redact
from worker._settings import Settings, SettingsError, get_settings

__all__ = ["app", "configure_app", "redact", "settings_error"]

log = structlog.get_logger("tracescore.worker")

settings_error: SettingsError | None = None


def _settings() -> Settings:
    global settings_error
    try:
        return get_settings()
    except SettingsError as exc:
        # Reported when a worker starts (see _check_settings); importing must not fail, or
        # even `tracescore --help` would.
        settings_error = exc
        return Settings.model_construct()


def configure_app(app: Celery, settings: Settings) -> None:
    """Apply ``settings`` to ``app`` (also used after ``--scorers`` and env changes)."""
    app.conf.update(
        broker_url=settings.broker_url,
        # rediss:// verifies the certificate (kombu alone would not); None for redis://
        broker_use_ssl=settings.tls.kombu_ssl(settings.broker_url),
        broker_connection_retry_on_startup=True,
        accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        result_accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A retry republishes the message before the delivery is acked. Celery's default publish
        # retry gives up after ~0.6 s and then discards the delivery (Reject(requeue=False)): a
        # broker restart mid-retry would lose the batch. Ride out a restart instead.
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 30, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2},
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.task_soft_time_limit,
        task_time_limit=settings.task_time_limit,
        task_default_queue=settings.queue,
        task_create_missing_queues=True,
        worker_hijack_root_logger=False,
        # structlog writes its own lines; Celery would re-log them as WARNING otherwise.
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        broker_transport_options={
            # Longer than the longest task, so Redis never hands a running task to a second worker.
            "visibility_timeout": settings.visibility_timeout,
            "unacked_restore_interval": settings.unacked_restore_interval,
            "unacked_restore_throttle": settings.unacked_restore_throttle,
        },
    )
    # Every message is screened before Celery decodes it; refusals are dead letters (_guard.py).
    app.conf.worker_consumer = "worker._guard:GuardedConsumer"
    if settings.broker_url.partition("://")[0] in ("redis", "rediss"):
        app.conf.broker_transport = "worker._guard:GuardedRedisTransport"


app = Celery("tracescore", set_as_current=False)
configure_app(app, _settings())

app.user_options["worker"].add(
    click.Option(
        ["--scorers"],
        default=None,
        help="Module that defines the scorers (sets TRACESCORE_SCORERS), e.g. my_app.scorers.",
    )
)


class ScorersOption(bootsteps.Step):
    """Takes ``--scorers`` from the worker's command line and loads the registry once, up front,
    so a wrong module fails the start instead of every task."""

    def __init__(self, parent: Any, scorers: str | None = None, **options: Any) -> None:
        if scorers:
            os.environ["TRACESCORE_SCORERS"] = scorers
            get_settings.cache_clear()
        try:
            _check_settings()
        except Exception as exc:  # Celery would swallow it and stop silently: say why, exit 1
            sys.stderr.write(f"tracescore worker cannot start: {exc}\n")
            raise SystemExit(1) from exc
        super().__init__(parent, **options)


app.steps["worker"].add(ScorersOption)


def _check_settings() -> None:
    from worker._registry import load_registry

    if settings_error is not None:
        raise settings_error
    from worker._cli_worker import check_connections

    settings = get_settings()
    configure_app(app, settings)
    # A wrong password or an unverifiable certificate fails the start; Celery would retry for minutes.
    check_connections(settings)
    if not settings.scorers:
        raise SettingsError("no scorer module: start the worker with --scorers my.module (or TRACESCORE_SCORERS)")
    registry = load_registry(settings.scorers)
    log.info(
        "worker_starting",
        broker=redact(settings.broker_url),
        store=redact(settings.store_url),
        scorers=",".join(registry),
        queue=settings.queue,
        writer=settings.writer,
    )


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _flush_writer(**_: Any) -> None:
    from worker._loop import run_coro, stop_loop
    from worker._runtime import reset_runtime

    runtime = reset_runtime()
    if runtime is None:
        return
    if runtime.writer is not None:
        runtime.writer.flush(5.0)
        runtime.writer.close()
    try:
        run_coro(runtime.store.close(), 5.0)
        run_coro(runtime.limiter.close(), 5.0)
    except Exception:
        log.warning("worker_close_failed", exc_info=True)
    stop_loop()
