"""``tracescore worker``: start a Celery worker that scores what the exporter and backfills send.

Its options become the ``Settings`` of a fresh app (``create_app``); the worker's start-up
checks (credentials, certificate, scorer module) run as it starts.
"""

from __future__ import annotations

import click

from tracing import redact
from worker._app import create_app
from worker._registry import RegistryError, load_registry
from worker.cli._common import CliError, broker_option, redis_settings
from worker.cli._sinks import sink_options, sink_overrides

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
    help="Messages handled at once: threads (threads pool) or child processes (prefork); solo: always 1.",
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
@click.option(
    "--hostname",
    "-n",
    default=None,
    help="Node name, as for `celery worker -n` (%h is the host): name each worker on one host, "
    "e.g. -n scorer1@%h, or `tracescore status` lists them as one (default celery@<host>).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve Prometheus metrics on this port, /metrics (TRACESCORE_METRICS_PORT; 0: off).",
)
@sink_options
@broker_option
def worker_command(
    broker: str | None,
    module: str,
    concurrency: int,
    pool: str,
    model_concurrency: int | None,
    queue: str | None,
    loglevel: str,
    hostname: str | None,
    metrics_port: int | None,
    sinks: tuple[str, ...],
    phoenix_url: str | None,
    mlflow_url: str | None,
    langfuse_host: str | None,
) -> None:
    """Start a scoring worker on the Redis broker (--broker or TRACESCORE_BROKER_URL).

    Equivalent to `celery -A worker worker --scorers MODULE`. Scores are stored in Redis
    (TRACESCORE_REDIS_URL, default: the broker) and delivered at least once to each sink of
    --sink / TRACESCORE_SINKS (otlp, jsonl, console, phoenix, mlflow, langfuse; none).
    Rate limits: TRACESCORE_RATE_LIMITS as JSON.

    \b
    Examples:
      tracescore worker --scorers examples.scorers
      tracescore worker --scorers my_app.scorers --pool prefork --concurrency 2
      tracescore worker --scorers my_app.scorers -n scorer1@%h --metrics-port 9464
      tracescore worker --scorers my_app.scorers --broker redis://:PASSWORD@redis:6379/0
      tracescore worker --scorers my_app.scorers --sink otlp --sink phoenix --phoenix-url http://phoenix:6006
      TRACESCORE_BROKER_URL=redis://redis:6379/0 TRACESCORE_SINKS=console \\
        tracescore worker --scorers my_app.scorers --pool solo
      TRACESCORE_RATE_LIMITS='{"openai/gpt-4o-mini": {"requests_per_minute": 500}}' \\
        tracescore worker --scorers my_app.scorers
    """
    settings = redis_settings(
        broker,
        scorers=module,
        model_concurrency=model_concurrency,
        queue=queue,
        metrics_port=metrics_port,
        **sink_overrides(sinks, phoenix_url, mlflow_url, langfuse_host),
    )
    try:
        registry = load_registry(module)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc
    if pool == "solo":  # one message at a time, whatever was asked (Celery's banner says 1 too: worker._app)
        concurrency = 1
    app = create_app(settings)
    click.echo(
        f"tracescore worker: broker {redact(settings.broker_url)} (Redis mode), "
        f"store {redact(settings.store_url)}, queue {settings.queue}, pool {pool}"
        f" x{concurrency}, sinks {','.join(settings.sink_names) or 'none'}; "
        f"scorers from {module}: {', '.join(registry)}",
        err=True,
    )
    argv = ["worker", "--pool", pool, "--loglevel", loglevel, "-Q", settings.queue]
    argv += ["--concurrency", str(concurrency)]
    if hostname:
        argv += ["--hostname", hostname]
    app.worker_main(argv=argv)
