"""``tracescore worker``: start a Celery worker that scores what the exporter and backfills send."""

from __future__ import annotations

import os

import click

from worker._cli_common import CliError
from worker._registry import RegistryError, load_registry
from worker._settings import SettingsError, get_settings

__all__ = ["worker_command"]


@click.command("worker")
@click.option(
    "--scorers",
    "module",
    envvar="TRACESCORE_SCORERS",
    required=True,
    help="Module that defines the scorers, e.g. my_app.scorers (or TRACESCORE_SCORERS).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Messages handled at once: threads (threads pool) or child processes (prefork).",
)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "solo", "threads"]),
    default="threads",
    show_default=True,
    help="threads: all messages share this process's one event loop (judge calls are I/O bound); "
    "prefork: one event loop per child process (CPU-heavy function scorers); solo: one at a time.",
)
@click.option(
    "--model-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Judge calls in flight per model in each process (TRACESCORE_MODEL_CONCURRENCY).",
)
@click.option("--queue", "-Q", default=None, help="Queue to consume (TRACESCORE_QUEUE, default tracescore).")
@click.option("--loglevel", "-l", default="INFO", show_default=True, help="Celery log level.")
def worker_command(
    module: str,
    concurrency: int,
    pool: str,
    model_concurrency: int | None,
    queue: str | None,
    loglevel: str,
) -> None:
    """Start a scoring worker on the Redis broker (TRACESCORE_BROKER_URL).

    Equivalent to `celery -A worker worker --scorers MODULE`. Scores are stored in Redis
    (TRACESCORE_REDIS_URL, default: the broker) and written back by TRACESCORE_WRITER
    (otlp, jsonl, console or none). Rate limits: TRACESCORE_RATE_LIMITS as JSON.

    \b
    Examples:
      tracescore worker --scorers examples.scorers
      tracescore worker --scorers my_app.scorers --pool prefork --concurrency 2
      TRACESCORE_BROKER_URL=redis://redis:6379/0 TRACESCORE_WRITER=console \\
        tracescore worker --scorers my_app.scorers --pool solo
      TRACESCORE_RATE_LIMITS='{"openai/gpt-4o-mini": {"requests_per_minute": 500}}' \\
        tracescore worker --scorers my_app.scorers
    """
    os.environ["TRACESCORE_SCORERS"] = module
    if model_concurrency is not None:
        os.environ["TRACESCORE_MODEL_CONCURRENCY"] = str(model_concurrency)
    if queue is not None:
        os.environ["TRACESCORE_QUEUE"] = queue
    get_settings.cache_clear()
    try:
        settings = get_settings()
        registry = load_registry(module)
    except (SettingsError, RegistryError) as exc:
        raise CliError(str(exc)) from exc

    from worker._app import app, configure_app, settings_error

    if settings_error is not None:
        raise CliError(str(settings_error))
    configure_app(app, settings)
    from worker._app import redact

    click.echo(
        f"tracescore worker: broker {redact(settings.broker_url)} (Redis mode), "
        f"store {redact(settings.store_url)}, queue {settings.queue}, pool {pool}"
        f"{f' x{concurrency}' if concurrency else ''}, writer {settings.writer}; "
        f"scorers from {module}: {', '.join(registry)}",
        err=True,
    )
    argv = ["worker", "--pool", pool, "--loglevel", loglevel, "-Q", settings.queue]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    app.worker_main(argv=argv)
