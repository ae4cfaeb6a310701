"""``tracescore status``: queue depth, live workers, rate-limit state, recent failures.

Exit code 1 when the broker cannot be reached, so it doubles as a health check.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
import redis
from redis.exceptions import RedisError

from tracing._broker import redact
from worker._limiter import RedisRateLimiter
from worker._settings import Settings
from worker.cli._common import CliError, broker_option, cli_settings, json_option
from worker.store import RedisDeadLetters, RedisJobStats

__all__ = ["collect_status", "status_command"]


async def _store_status(url: str, limits: Any) -> dict[str, Any]:
    letters, jobs = RedisDeadLetters(url), RedisJobStats(url)
    limiter = RedisRateLimiter(url, limits)
    try:
        return {
            "dead_letters": await letters.size(),
            "dead_letters_by_reason": await letters.counts(),
            "recent_failures": await jobs.recent_failures(),
            "rate_limits": await limiter.state(),
        }
    finally:
        await letters.close()
        await jobs.close()
        await limiter.close()


def collect_status(ping_timeout: float = 1.0, settings: Settings | None = None) -> dict[str, Any]:
    """Everything ``tracescore status`` shows, for ``settings`` (default: ``TRACESCORE_*``);
    raises ``CliError`` if the broker is unreachable."""
    if settings is None:
        settings = cli_settings()
    tls = settings.tls.redis_kwargs(settings.broker_url)  # rediss:// verifies, as the workers do
    broker = redis.Redis.from_url(settings.broker_url, socket_connect_timeout=2, socket_timeout=2, **tls)
    try:
        broker.ping()
        depth = int(broker.llen(settings.queue))
        unacked = int(broker.hlen("unacked"))
    except (RedisError, OSError) as exc:
        raise CliError(f"broker unreachable at {redact(settings.broker_url)}: {redact(str(exc))}") from exc
    finally:
        broker.close()
    from celery import Celery

    # A throwaway app on exactly this broker, for the control channel (worker pings).
    control = Celery("tracescore-status", broker=settings.broker_url, set_as_current=False)
    control.conf.update(
        accept_content=["json"],
        broker_connection_retry_on_startup=False,
        broker_use_ssl=settings.tls.kombu_ssl(settings.broker_url),
    )
    try:
        replies = control.control.inspect(timeout=ping_timeout).ping() or {}
    except Exception as exc:
        raise CliError(f"broker unreachable at {redact(settings.broker_url)}: {redact(str(exc))}") from exc
    finally:
        control.close()
    status: dict[str, Any] = {
        "broker": redact(settings.broker_url),
        "queue": settings.queue,
        "queue_depth": depth,
        "unacked": unacked,
        "workers": sorted(replies),
    }
    try:
        status.update(asyncio.run(_store_status(settings.store_url, settings.rate_limit)))
    except (RedisError, OSError) as exc:
        raise CliError(f"score store unreachable at {redact(settings.store_url)}: {redact(str(exc))}") from exc
    return status


@click.command("status")
@click.option("--timeout", type=float, default=1.0, show_default=True, help="Seconds to wait for worker pings.")
@json_option("Print one JSON object.")
@broker_option
def status_command(broker: str | None, timeout: float, as_json: bool) -> None:
    """Show queue depth, workers, rate-limit state and failures of the last hour.

    Exits 1 when the broker is unreachable (use it as a health check).

    \b
    Examples:
      tracescore status
      tracescore status --json --timeout 3
      tracescore status --broker redis://:PASSWORD@redis:6379/0
      tracescore status >/dev/null || echo "broker down"
    """
    status = collect_status(timeout, cli_settings(broker))
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    click.echo(f"broker      {status['broker']}  (queue {status['queue']})")
    click.echo(f"queue depth {status['queue_depth']} waiting, {status['unacked']} in progress (unacked)")
    workers = status["workers"]
    click.echo(f"workers     {len(workers)}" + (f": {', '.join(workers)}" if workers else " (none answered the ping)"))
    limits = status["rate_limits"]
    if limits:
        for model, state in sorted(limits.items()):
            parts = [f"{k}={v}" for k, v in sorted(state.items())]
            click.echo(f"rate limit  {model}: {', '.join(parts)}")
    else:
        click.echo("rate limit  no judge calls limited yet")
    failures = status["recent_failures"]
    summary = ", ".join(f"{k}={v}" for k, v in sorted(failures.items(), key=lambda kv: -kv[1])) or "none"
    click.echo(f"failures    last hour: {summary}")
    letters = sorted(status["dead_letters_by_reason"].items(), key=lambda kv: -kv[1])
    by_reason = ", ".join(f"{k}={v}" for k, v in letters)
    click.echo(f"dead letters {status['dead_letters']}" + (f" ({by_reason})" if by_reason else ""))
