"""``tracescore dlq list|retry|drop``: messages that could not be scored, requeuing them, and
removing the ones that will never be."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import click
from redis.exceptions import RedisError

from worker._admin import dead_letters, drop_dead_letters, requeue_dead_letters
from worker._terminal import cell, printable
from worker.cli._common import (
    CliError,
    broker_option,
    confirm_drop,
    json_line,
    json_option,
    redis_settings,
    unreachable,
)
from worker.store import StoreUnavailableError

__all__ = ["dlq_group"]


@click.group("dlq")
def dlq_group() -> None:
    """Inspect, requeue or drop dead letters: messages that failed validation or their retry budget.

    \b
    Examples:
      tracescore dlq list
      tracescore dlq retry 3f2a9c...   # one letter, by id
      tracescore dlq retry --all
      tracescore dlq drop --reason unreadable_dead_letter --yes
    """


@dlq_group.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@json_option("One dead letter JSON object per line.")
@broker_option
def dlq_list(broker: str | None, limit: int, as_json: bool) -> None:
    """List dead letters, newest first: id, when, reason, batch, attempts, error.

    \b
    Example:
      tracescore dlq list --limit 10
      tracescore dlq list --json --broker redis://:PASSWORD@redis:6379/0
    """
    settings = redis_settings(broker)
    try:
        total, letters = asyncio.run(dead_letters(settings, limit))
    except (RedisError, OSError) as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    if as_json:
        for letter in letters:
            click.echo(json_line(letter))
        return
    click.echo(f"{total:,} dead letter(s)" + (f", showing {len(letters):,}" if total > len(letters) else ""))
    for d in letters:
        when = dt.datetime.fromtimestamp(d.failed_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        retry = "" if d.retryable else " (not retryable)"
        runs = f"  runs={','.join(d.run_ids)}" if d.run_ids else ""
        # (run ids come from the message, the error from a scorer or a provider: printable)
        click.echo(
            printable(f"{d.id}  {when}  {d.reason}{retry}  batch={d.batch_id or '-'}  attempts={d.attempts}{runs}")
        )
        if d.error:
            click.echo(f"    {cell(d.error, 160)}")


@dlq_group.command("retry")
@click.argument("ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="Requeue every retryable dead letter.")
@json_option("One JSON object: the requeued letters' ids and the problems, one line each.")
@broker_option
def dlq_retry(broker: str | None, ids: tuple[str, ...], retry_all: bool, as_json: bool) -> None:
    """Requeue dead letters (by ID, or --all) to the scoring queue; they leave the list.

    Scores already recorded are skipped by the worker, so a retry never writes duplicates.

    \b
    Examples:
      tracescore dlq retry 3f2a9c0b1d2e4f5a6b7c8d9e0f1a2b3c
      tracescore dlq retry --all --json --broker redis://:PASSWORD@redis:6379/0
    """
    if bool(ids) == retry_all:
        raise click.UsageError("give dead letter ID(s) or --all (not both)")
    settings = redis_settings(broker)
    try:
        requeued, problems, not_retryable = asyncio.run(
            requeue_dead_letters(settings, None if retry_all else list(ids))
        )
    except (RedisError, OSError) as exc:
        if isinstance(exc, StoreUnavailableError):  # the dead letters' store; else the broker
            raise unreachable("score store", settings.store_url, exc) from exc
        raise unreachable("broker", settings.broker_url, exc) from exc
    if as_json:
        said = {"requeued": [letter.id for letter in requeued], "problems": problems, "not_retryable": not_retryable}
        click.echo(json.dumps(said))
    for letter in [] if as_json else requeued:
        click.echo(printable(f"requeued {letter.id} (batch {letter.batch_id or '-'})"))  # ids from Redis
    for problem in [] if as_json else problems:
        click.echo(printable(problem), err=True)
    if not as_json:
        click.echo(f"{len(requeued):,} requeued, {len(problems):,} not", err=True)
    # --all asks for the retryable ones: a list holding only others is no failure (a cron job's
    # `dlq retry --all` failed for as long as one not_json letter stayed listed).
    failed = len(problems) - (len(not_retryable) if retry_all else 0)
    if failed and not requeued:
        raise CliError("nothing requeued")


@dlq_group.command("drop")
@click.argument("ids", nargs=-1)
@click.option("--reason", help="Drop every dead letter of this reason (as `dlq list` shows it).")
@click.option("--all", "drop_all", is_flag=True, help="Drop every dead letter.")
@click.option("--yes", is_flag=True, help="Drop by --reason or --all without asking.")
@json_option("One JSON object: the dropped letters' ids and the problems, one line each.")
@broker_option
def dlq_drop(
    broker: str | None, ids: tuple[str, ...], reason: str | None, drop_all: bool, yes: bool, as_json: bool
) -> None:
    """Remove dead letters for good (by ID, --reason or --all): the ones that will never be
    retried, such as damaged entries (unreadable_dead_letter) or a fixed producer's bad messages.

    A letter a `dlq retry` is sending is left to it. Without --yes, --reason and --all ask first
    (on a terminal; elsewhere they need --yes).

    \b
    Examples:
      tracescore dlq drop 3f2a9c0b1d2e4f5a6b7c8d9e0f1a2b3c
      tracescore dlq drop --reason unreadable_dead_letter --yes --json
    """
    if sum((bool(ids), reason is not None, drop_all)) != 1:
        raise click.UsageError("give dead letter ID(s), --reason or --all (one of them)")
    if not ids:
        confirm_drop("every dead letter" if drop_all else f"every dead letter of reason {reason!r}", yes)
    settings = redis_settings(broker)
    try:
        dropped, problems = asyncio.run(drop_dead_letters(settings, list(ids) or None, reason))
    except (RedisError, OSError) as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    if as_json:
        click.echo(json.dumps({"dropped": [letter.id for letter in dropped], "problems": problems}))
    for letter in [] if as_json else dropped:
        click.echo(printable(f"dropped {letter.id} ({letter.reason}, batch {letter.batch_id or '-'})"))  # from Redis
    for problem in [] if as_json else problems:
        click.echo(printable(problem), err=True)
    if not as_json:
        if reason is not None and not dropped and not problems:  # (a reason mistyped drops nothing)
            click.echo(
                printable(f"no dead letter of reason {reason!r} is listed (`tracescore status` counts them by reason)"),
                err=True,
            )
        click.echo(f"{len(dropped):,} dropped, {len(problems):,} not", err=True)
    if problems:
        raise CliError("some dead letters were not dropped" if dropped else "nothing dropped")
