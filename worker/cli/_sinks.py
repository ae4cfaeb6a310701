"""``tracescore sinks list|retry``: each score sink's dead letters, and queueing them again;
and the ``--sink`` options the scoring commands share."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from redis.exceptions import RedisError

from tracing import redact
from worker._settings import SINK_NAMES
from worker._terminal import cell, printable
from worker.cli._common import CliError, broker_option, json_option, known, redis_settings, unreachable
from worker.store import RedisOutbox

__all__ = ["sink_options", "sink_overrides", "sinks_group"]

F = TypeVar("F", bound=Callable[..., Any])


def _http_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A backend's address as given: one that cannot be is a usage error (exit 2)."""
    from tracing.sinks import http_url_problem

    problem = http_url_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(f"{problem}, got {redact(value or '')!r}")
    return value


def sink_options(command: F) -> F:
    """``--sink NAME`` (repeatable) and the backends' addresses: ``--phoenix-url``,
    ``--mlflow-url``, ``--langfuse-host`` (their keys stay in ``TRACESCORE_*`` variables)."""
    for option in reversed(
        [
            click.option(
                "--sink",
                "sinks",
                multiple=True,
                type=click.Choice([*SINK_NAMES, "none"]),
                help="Where scores go, at least once each (repeat for several; default TRACESCORE_SINKS).",
            ),
            click.option(
                "--phoenix-url",
                default=None,
                metavar="URL",
                callback=_http_url,
                help="Phoenix base URL (TRACESCORE_PHOENIX_URL).",
            ),
            click.option(
                "--mlflow-url",
                default=None,
                metavar="URL",
                callback=_http_url,
                help="MLflow tracking URI (TRACESCORE_MLFLOW_URL).",
            ),
            click.option(
                "--langfuse-host",
                default=None,
                metavar="URL",
                callback=_http_url,
                help="Langfuse host (TRACESCORE_LANGFUSE_HOST).",
            ),
        ]
    ):
        command = option(command)
    return command


def sink_overrides(
    sinks: tuple[str, ...], phoenix_url: str | None, mlflow_url: str | None, langfuse_host: str | None
) -> dict[str, Any]:
    """The settings the ``--sink`` options stand for (None: leave the variable's value)."""
    return {
        "sinks": ",".join(sinks) if sinks else None,
        "phoenix_url": phoenix_url,
        "mlflow_url": mlflow_url,
        "langfuse_host": langfuse_host,
    }


@click.group("sinks")
def sinks_group() -> None:
    """Each score sink's delivery: counts, dead letters (scores a sink refused or never took),
    and queueing them again.

    \b
    Examples:
      tracescore sinks list
      tracescore sinks list phoenix --json
      tracescore sinks retry phoenix --all
    """


def _outbox(broker: str | None) -> tuple[RedisOutbox, str]:
    settings = redis_settings(broker)
    # As `tracescore status` asks Redis: 2 s a call, one retry.
    return RedisOutbox(settings.store_url, reconnect_s=1.0, socket_timeout_s=2.0), settings.store_url


# A name no sink has (a typo) is a usage error, not "unknown sink" and exit 0.
_sink_name = click.Choice(SINK_NAMES)


@sinks_group.command("list")
@click.argument("sink", required=False, type=_sink_name)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Dead letters per sink.")
@json_option("One JSON object: per sink its counts and dead letters.")
@broker_option
def sinks_list(broker: str | None, sink: str | None, limit: int, as_json: bool) -> None:
    """Per sink: delivered, pending, failed; then its dead letters, newest first (score id,
    when, reason, the backend's answer).

    \b
    Example:
      tracescore sinks list otlp --limit 5
    """
    outbox, url = _outbox(broker)
    try:
        counts = outbox.counts()
        names = [sink] if sink else sorted(counts)
        letters = {n: outbox.dead_letters(n, limit) for n in names}
    except (RedisError, OSError) as exc:
        raise unreachable("score store", url, exc) from exc
    finally:
        outbox.close()
    if as_json:
        out = {
            n: {**(counts[n].as_dict() if n in counts else {}), "dead_letters": [x.model_dump() for x in letters[n]]}
            for n in names
        }
        click.echo(json.dumps(out, sort_keys=True))
        return
    if not names:
        click.echo("no sink has drained the outbox yet (TRACESCORE_SINKS on the workers)")
    for name in names:
        c = counts.get(name)
        # (delivered: unknown while its counter in Redis is no number; 0 it showed none delivered)
        line = (
            f"{known(c.delivered)} delivered, {c.pending} pending, {c.failed} failed" if c else "nothing delivered yet"
        )
        click.echo(printable(f"{name}: {line}"))  # a sink name from Redis
        for x in letters[name]:
            when = dt.datetime.fromtimestamp(x.failed_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            click.echo(printable(f"  {x.score_id}  {when}  {x.reason}  attempts={x.attempts}  trace={x.trace_id}"))
            if x.detail:  # the backend's answer
                click.echo(f"    {cell(x.detail, 200)}")


@sinks_group.command("retry")
@click.argument("sink", type=_sink_name)
@click.argument("score_ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="Queue every dead letter of SINK again.")
@json_option(
    "One JSON object: the sink, how many scores were queued again, how many given ids were not its dead letters."
)
@broker_option
def sinks_retry(broker: str | None, sink: str, score_ids: tuple[str, ...], retry_all: bool, as_json: bool) -> None:
    """Queue a sink's dead letters (by score id, or --all) for delivery again; the workers'
    drainers take them (a re-send is an upsert in the backend).

    \b
    Examples:
      tracescore sinks retry phoenix --all
      tracescore sinks retry otlp 6f1c...e2 --json
    """
    if bool(score_ids) == retry_all:
        raise click.UsageError("give score id(s) or --all (not both)")
    outbox, url = _outbox(broker)
    try:
        ids = list(dict.fromkeys(score_ids))  # an id given twice is queued (and counted) once
        done = outbox.redrive(sink, None if retry_all else ids)
    except (RedisError, OSError) as exc:
        raise unreachable("score store", url, exc) from exc
    finally:
        outbox.close()
    missing = len(ids) - done if ids else 0
    if as_json:
        click.echo(json.dumps({"sink": sink, "queued": done, "not_dead_letters": missing}))
    else:
        click.echo(f"{done} score(s) queued again for {sink}")
    if missing:
        raise CliError(f"{missing} of the given id(s) are not {sink} dead letters")
