"""``tracescore worker``: start a Celery worker that scores what the exporter and backfills send."""

from __future__ import annotations

import os
import ssl
from typing import Any

import click
import redis
from redis.exceptions import AuthenticationError, ResponseError

from tracing._broker import redact
from worker._cli_common import CliError
from worker._registry import RegistryError, load_registry
from worker._settings import Settings, SettingsError, get_settings

__all__ = ["check_connections", "worker_command"]

_AUTH_REPLIES = ("WRONGPASS", "NOAUTH", "AUTH")


def check_connections(settings: Settings, timeout_s: float = 5.0) -> None:
    """Fail fast on what no retry can fix: a refused password or a TLS certificate that does
    not verify, on the broker or the score store. A broker that is merely down is left to
    Celery, which waits for it to come up."""
    targets: list[tuple[str, str, dict[str, Any]]] = [
        ("broker", settings.broker_url, settings.tls.redis_kwargs(settings.broker_url)),
    ]
    if settings.store_url != settings.tls.url(settings.broker_url):
        targets.append(("score store", settings.store_url, {}))  # its URL carries the TLS options
    for what, url, tls_kwargs in targets:
        if not url.startswith(("redis://", "rediss://")):
            continue
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, **tls_kwargs)
        try:
            client.ping()
        except (AuthenticationError, ResponseError) as exc:
            if isinstance(exc, AuthenticationError) or any(r in str(exc) for r in _AUTH_REPLIES):
                raise CliError(
                    f"the {what} at {redact(url)} refused the credentials (authentication failed: "
                    f"{redact(str(exc))}); fix the password in TRACESCORE_"
                    f"{'BROKER' if what == 'broker' else 'REDIS'}_URL"
                ) from None
            # any other reply means the server is there and talking: Celery takes it from here
        except redis.ConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise CliError(
                    f"the {what}'s TLS certificate at {redact(url)} did not verify ({redact(str(cause or exc))}): "
                    "set TRACESCORE_BROKER_CA_FILE to the PEM of the CA that signed it "
                    "(or TRACESCORE_BROKER_TLS_INSECURE=true to skip the check, for tests only)"
                ) from None
            if isinstance(cause, ssl.SSLError):
                raise CliError(
                    f"TLS with the {what} at {redact(url)} failed ({redact(str(cause))}): "
                    "is the server listening for TLS (rediss://) on that port?"
                ) from None
            # down or unreachable: Celery retries the broker until it is up
        finally:
            client.close()


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
