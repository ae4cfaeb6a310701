"""``tracescore scores --trace ID``: the stored scores of one trace."""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import click
from redis.exceptions import RedisError

from tracing import ScoreRecord
from worker._reconnect import CLI_PATIENCE
from worker._terminal import cell, printable
from worker.cli._common import CliError, broker_option, json_line, json_option, redis_settings, unreachable
from worker.store import RedisScoreStore

__all__ = ["scores_command"]


async def _fetch(url: str, trace_id: str) -> list[ScoreRecord]:
    store = RedisScoreStore(url, **CLI_PATIENCE)
    try:
        return await store.records_for_trace(trace_id)
    finally:
        await store.close()


@click.command("scores")
@click.option("--trace", "trace_id", required=True, help="Trace id (32 hex characters).")
@json_option("One ScoreRecord JSON object per line.")
@broker_option
def scores_command(broker: str | None, trace_id: str, as_json: bool) -> None:
    """Show the scores stored for one trace (kept in Redis for TRACESCORE_SCORE_TTL_SECONDS).

    \b
    Examples:
      tracescore scores --trace 0af7651916cd43dd8448eb211c80319c
      tracescore scores --trace 0af7651916cd43dd8448eb211c80319c --json | jq .score
    """
    trace_id = trace_id.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{32}", trace_id):
        raise click.BadParameter(
            f"must be 32 hex characters (an OTel trace id), got {trace_id!r}", param_hint="--trace"
        )
    url = redis_settings(broker).store_url
    try:
        records = asyncio.run(_fetch(url, trace_id))
    except (RedisError, OSError) as exc:
        raise unreachable("score store", url, exc) from exc
    if not records:  # exit 1 with --json too (stdout empty): a script tells "none" from "some"
        raise CliError(f"no scores stored for trace {trace_id} (expired, not scored yet, or another store)")
    if as_json:
        for record in records:
            click.echo(json_line(record))
        return
    for r in sorted(records, key=lambda r: (r.span_id, r.scorer_id)):
        when = dt.datetime.fromtimestamp(r.scored_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        if r.error_type:
            value = f"error {r.error_type}: {r.error_message or ''}"
        elif r.score is None:
            value = f"not scorable ({r.not_scorable})"
        else:
            value = f"{r.score:.3f}" + (f" [{r.label}]" if r.label else "")
            if r.reason:
                value += f"  {cell(r.reason, 80)}"
        # (names, reasons and errors come from traces and judges: printable)
        line = f"{r.span_id}  {r.span_name or '-':<20.20}  {r.scorer_id:<20.20} v{r.scorer_version:<3} {when}  {value}"
        click.echo(printable(line))
