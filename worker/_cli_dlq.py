"""``tracescore dlq list|retry``: messages that could not be scored, and requeuing them."""

from __future__ import annotations

import asyncio
import datetime as dt

import click
from pydantic import ValidationError
from redis.exceptions import RedisError

from tracing._run import ScoreBatch
from tracing._sinks import CelerySink
from worker._app import redact
from worker._cli_common import CliError
from worker._settings import SettingsError, get_settings
from worker._store import DeadLetter, RedisScoreStore

__all__ = ["dlq_group"]


def _store() -> RedisScoreStore:
    try:
        return RedisScoreStore(get_settings().store_url)
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


async def _list(store: RedisScoreStore, limit: int) -> tuple[int, list[DeadLetter]]:
    try:
        return await store.dlq_len(), await store.dlq_list(limit)
    finally:
        await store.close()


@click.group("dlq")
def dlq_group() -> None:
    """Inspect and requeue dead letters: messages that failed validation or their retry budget.

    \b
    Examples:
      tracescore dlq list
      tracescore dlq retry 3f2a9c...   # one letter, by id
      tracescore dlq retry --all
    """


@dlq_group.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One dead letter JSON object per line.")
def dlq_list(limit: int, as_json: bool) -> None:
    """List dead letters, newest first: id, when, reason, batch, attempts, error.

    \b
    Example:
      tracescore dlq list --limit 10
    """
    store = _store()
    try:
        total, letters = asyncio.run(_list(store, limit))
    except (RedisError, OSError) as exc:
        raise CliError(f"cannot reach the score store at {redact(store.url)}: {exc}") from exc
    if as_json:
        for letter in letters:
            click.echo(letter.model_dump_json())
        return
    click.echo(f"{total} dead letter(s)" + (f", showing {len(letters)}" if total > len(letters) else ""))
    for d in letters:
        when = dt.datetime.fromtimestamp(d.failed_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        retry = "" if d.retryable else " (not retryable)"
        runs = f"  runs={','.join(d.run_ids)}" if d.run_ids else ""
        click.echo(f"{d.id}  {when}  {d.reason}{retry}  batch={d.batch_id or '-'}  attempts={d.attempts}{runs}")
        if d.error:
            click.echo(f"    {' '.join(d.error.split())[:160]}")


async def _retry(store: RedisScoreStore, ids: list[str] | None) -> tuple[list[DeadLetter], list[str]]:
    settings = get_settings()
    sink = CelerySink(settings.broker_url, queue=settings.queue)
    requeued: list[DeadLetter] = []
    problems: list[str] = []
    try:
        listed = {d.id: d for d in await store.dlq_list(limit=1_000_000)}
        if ids is None:
            ids = list(listed)
        for letter_id in ids:
            letter = listed.get(letter_id)
            if letter is None:
                problems.append(f"{letter_id}: no such dead letter (see `tracescore dlq list`)")
                continue
            if not letter.retryable or letter.payload is None:
                problems.append(f"{letter_id}: not retryable ({letter.reason}); fix the producer instead")
                continue
            try:
                batch = ScoreBatch.model_validate(letter.payload)
            except ValidationError as exc:
                problems.append(f"{letter_id}: the stored message is not a valid ScoreBatch: {exc.errors()[0]['msg']}")
                continue
            try:
                sink.send(batch)
            except Exception as exc:
                problems.append(f"{letter_id}: could not requeue: {type(exc).__name__}: {exc}")
                continue
            # Removed only once sent: interrupted before this, the letter stays listed (a later
            # retry sends it again, which the idempotent score ids make harmless), never lost.
            await store.dlq_take(letter_id)
            requeued.append(letter)
    finally:
        sink.close()
        await store.close()
    return requeued, problems


@dlq_group.command("retry")
@click.argument("ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="Requeue every retryable dead letter.")
def dlq_retry(ids: tuple[str, ...], retry_all: bool) -> None:
    """Requeue dead letters (by ID, or --all) to the scoring queue; they leave the list.

    Scores already recorded are skipped by the worker, so a retry never writes duplicates.

    \b
    Examples:
      tracescore dlq retry 3f2a9c0b1d2e4f5a6b7c8d9e0f1a2b3c
      tracescore dlq retry --all
    """
    if bool(ids) == retry_all:
        raise CliError("give dead letter ID(s) or --all (not both)")
    store = _store()
    try:
        requeued, problems = asyncio.run(_retry(store, None if retry_all else list(ids)))
    except (RedisError, OSError) as exc:
        raise CliError(f"cannot reach the broker/store at {redact(store.url)}: {exc}") from exc
    for letter in requeued:
        click.echo(f"requeued {letter.id} (batch {letter.batch_id or '-'})")
    for problem in problems:
        click.echo(problem, err=True)
    click.echo(f"{len(requeued)} requeued, {len(problems)} not", err=True)
    if problems and not requeued:
        raise CliError("nothing requeued")
