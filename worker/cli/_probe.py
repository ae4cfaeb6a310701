"""``tracescore probe live|ready``: exec probes for a worker's container (Kubernetes, compose).

They read the files the worker writes in ``TRACESCORE_PROBE_DIR`` (``worker._heartbeat``), so a
probe costs no broker round trip through the worker and cannot be fooled by a busy one: a worker
scoring many runs keeps its event loops turning and its files fresh; one whose loop is blocked
(a scorer step that never returns) or whose consumer is stuck lets them go stale.
"""

from __future__ import annotations

from pathlib import Path

import click

from worker import _heartbeat as probe_files
from worker.cli._common import CliError, FiniteRange, broker_option, redis_settings, unreachable

__all__ = ["probe_group"]


def _directory(directory: str | None) -> Path:
    if not directory:
        raise CliError(
            "no probe directory: start the worker with TRACESCORE_PROBE_DIR set (and give the probe the same)"
        )
    path = Path(directory)
    if not path.is_dir():
        raise CliError(
            f"probe directory {path} does not exist: has the worker started with TRACESCORE_PROBE_DIR={path}?"
        )
    return path


# Click reads the variable (the worker reads the same one through its Settings): the probes
# run every 15-30 s in every pod, and loading the settings (pydantic-settings) was most of what
# `probe live` cost.
_dir_option = click.option(
    "--dir",
    "directory",
    default=None,
    envvar="TRACESCORE_PROBE_DIR",
    metavar="PATH",
    help="The worker's TRACESCORE_PROBE_DIR (default: that variable).",
)


@click.group("probe")
def probe_group() -> None:
    """Liveness and readiness checks for the worker in this container (exit 0: yes, 1: no).

    \b
    Examples:
      TRACESCORE_PROBE_DIR=/tmp/tracescore tracescore probe live --max-age 60
      tracescore probe ready --dir /tmp/tracescore
    """


@probe_group.command("live")
@_dir_option
@click.option(
    "--max-age",
    type=FiniteRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds a heartbeat may be old: the consumer's, and each scoring process's event loop.",
)
def live_command(directory: str | None, max_age: float) -> None:
    """Live: the consumer and every scoring event loop turned within --max-age seconds.

    A busy worker is live (its loops turn between awaits); a loop blocked by a step that does
    not return is not, nor is a consumer that stopped turning. A worker reconnecting to a lost
    broker is live (not wedged; restarting it would not bring the broker back) and not ready."""
    path = _directory(directory)
    problems = probe_files.liveness_problems(path, max_age)
    if problems:
        raise CliError("not live: " + "; ".join(problems))
    if probe_files.consumer_reconnecting(path):
        # live: waiting for the broker is not being wedged; `probe ready` fails meanwhile
        click.echo("live (the consumer is reconnecting to the broker: not ready until it is back)")
        return
    click.echo("live")


@probe_group.command("ready")
@_dir_option
@click.option("--timeout", type=FiniteRange(0.1, 60), default=2.0, show_default=True, help="Redis ping timeout.")
@broker_option
def ready_command(directory: str | None, timeout: float, broker: str | None) -> None:
    """Ready: the worker's consumer is connected and consuming, and the broker answers a ping,
    and so does the score store when it is a Redis of its own (TRACESCORE_REDIS_URL).

    Not ready before the consumer starts, after it lost the broker, while its store is away (a
    message it takes then waits for the store, or goes back to the queue), and from SIGTERM on."""
    path = _directory(directory)
    if not (path / probe_files.READY_FILE).exists():
        raise CliError(f"not ready: the worker is not consuming (no {probe_files.READY_FILE} file in {path})")
    # (here: `probe live` runs every few seconds and has no use for a Redis client or the settings)
    import redis

    from worker._settings import redis_py_url

    settings = redis_settings(broker)
    broker_client = redis.Redis.from_url(
        settings.broker_redis_url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        **settings.tls.redis_kwargs(settings.broker_url),
    )
    pings = [("broker", settings.broker_url, broker_client)]
    if settings.redis_url and redis_py_url(settings.redis_url) != settings.broker_redis_url:
        # (its URL carries the TLS settings: the store's own clients take only a URL)
        store = redis.Redis.from_url(settings.store_url, socket_connect_timeout=timeout, socket_timeout=timeout)
        pings.append(("score store", settings.redis_url, store))
    try:
        for what, url, client in pings:
            try:
                client.ping()
            except (redis.RedisError, OSError) as exc:
                raise CliError(f"not ready: {unreachable(what, url, exc).message}") from None
    finally:
        for _, _, client in pings:
            client.close()
    click.echo("ready")
