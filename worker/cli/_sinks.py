"""``tracescore sinks list|retry|drop``: each score sink's dead letters, queueing them again, and
removing the ones that will never be; and the ``--sink`` options the scoring commands share."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from redis.exceptions import RedisError

from tracing import redact
from worker._reconnect import CLI_PATIENCE
from worker._settings import SINK_NAMES
from worker._terminal import cell, printable
from worker.cli._common import (
    CliError,
    broker_option,
    confirm_drop,
    json_option,
    known,
    redis_settings,
    unreachable,
)
from worker.store import RedisOutbox

__all__ = ["dropped_past_bound", "sink_options", "sink_overrides", "sinks_group"]

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
    queueing them again, and dropping the ones that never will be.

    \b
    Examples:
      tracescore sinks list
      tracescore sinks list phoenix --json
      tracescore sinks retry phoenix --all
      tracescore sinks drop otlp --reason otlp_http_400 --yes
    """


def _outbox(broker: str | None) -> tuple[RedisOutbox, str]:
    settings = redis_settings(broker)
    return RedisOutbox(settings.store_url, **CLI_PATIENCE), settings.store_url


def dropped_past_bound(counts: dict[str, int | None]) -> str:
    """``, N dead letters dropped past the bound (...)`` for a sink that dropped any (``sinks
    list`` and ``status``)."""
    n = counts.get("dead_letters_dropped", 0)
    if n == 0:
        return ""
    return f", {known(n)} dead letters dropped past the bound (TRACESCORE_SINK_MAX_DEAD_LETTERS), the oldest first"


# A name no sink has (a typo) is a usage error, not "unknown sink" and exit 0.
_sink_name = click.Choice(SINK_NAMES)


@sinks_group.command("list")
@click.argument("sink", required=False, type=_sink_name)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Dead letters per sink.")
@json_option("One JSON object: per sink its counts and dead letters.")
@broker_option
def sinks_list(broker: str | None, sink: str | None, limit: int, as_json: bool) -> None:
    """Per sink: delivered, pending, failed (and the dead letters dropped past the bound,
    TRACESCORE_SINK_MAX_DEAD_LETTERS); then its dead letters, newest first (score id, when,
    reason, the backend's answer).

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
            f"{known(c.delivered)} delivered, {c.pending:,} pending, {c.failed:,} failed"
            + dropped_past_bound(c.as_dict())
            if c
            else "nothing delivered yet"
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
        click.echo(f"{done:,} score(s) queued again for {sink}")
    if missing:
        raise CliError(f"{missing:,} of the given id(s) are not {sink} dead letters")


@sinks_group.command("drop")
@click.argument("sink", type=_sink_name)
@click.argument("score_ids", nargs=-1)
@click.option("--reason", help="Drop every dead letter of SINK of this reason (as `sinks list` shows it).")
@click.option("--all", "drop_all", is_flag=True, help="Drop every dead letter of SINK.")
@click.option("--yes", is_flag=True, help="Drop by --reason or --all without asking.")
@json_option(
    "One JSON object: the sink, how many dead letters were dropped, how many given ids were not its dead letters."
)
@broker_option
def sinks_drop(
    broker: str | None,
    sink: str,
    score_ids: tuple[str, ...],
    reason: str | None,
    drop_all: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Remove a sink's dead letters for good (by score id, --reason or --all): the ones that will
    never be sent again, such as a deleted project's or a revoked key's refusals.

    Without --yes, --reason and --all ask first (on a terminal; elsewhere they need --yes). The
    letters are read and removed a page at a time, however many there are.

    \b
    Examples:
      tracescore sinks drop phoenix 6f1c...e2
      tracescore sinks drop phoenix --all --yes --json
    """
    if sum((bool(score_ids), reason is not None, drop_all)) != 1:
        raise click.UsageError("give score id(s), --reason or --all (one of them)")
    if not score_ids:
        confirm_drop(f"every {sink} dead letter" + (f" of reason {reason!r}" if reason is not None else ""), yes)
    ids = list(dict.fromkeys(score_ids))  # an id given twice is dropped (and counted) once
    found: set[str] = set()
    dropped = 0
    outbox, url = _outbox(broker)
    try:
        for letter in outbox.drop_dead_letters(sink, ids or None, reason=reason):
            dropped += 1
            if ids:
                found.add(letter.score_id)
            if not as_json:
                click.echo(printable(f"dropped {letter.score_id} ({letter.reason})"))  # from Redis
    except (RedisError, OSError) as exc:
        raise unreachable("score store", url, exc) from exc
    finally:
        outbox.close()
    missing = [s for s in ids if s not in found]
    if as_json:
        click.echo(json.dumps({"sink": sink, "dropped": dropped, "not_dead_letters": len(missing)}))
    else:
        for score_id in missing:
            click.echo(printable(f"{score_id}: no such {sink} dead letter"), err=True)
        if reason is not None and not dropped:  # (a reason mistyped drops nothing)
            click.echo(
                printable(f"no {sink} dead letter of reason {reason!r} is listed (tracescore sinks list {sink})"),
                err=True,
            )
        click.echo(f"{dropped:,} dropped, {len(missing):,} not", err=True)
    if missing:
        raise CliError(f"{len(missing):,} of the given id(s) are not {sink} dead letters")
