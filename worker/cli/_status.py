"""``tracescore status``: queue depth, live workers, rate-limit state, recent failures, each
score sink's delivered / pending / failed, and the backfill jobs Redis still keeps.

Exit code 1 when the broker cannot be reached, so it doubles as a health check. A key holding
another Redis type (the queue's list, the dead-letter list, a sink's queue) leaves its figure
unknown (``null``) and is named under ``refused_keys``; a counter that is no number is unknown too
(a line names it, never its value: read as 0 it showed a smaller figure); the rest is shown.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
from redis.exceptions import RedisError

from tracing import redact
from worker._admin import backfill_jobs, broker_status, store_evicts, store_status
from worker._reconnect import CLI_PATIENCE
from worker._settings import Settings
from worker._terminal import printable
from worker.cli._common import FiniteRange, broker_option, json_option, known, redis_settings, unreachable
from worker.cli._sinks import dropped_past_bound
from worker.store import RedisOutbox, StoreKeyTypeError

__all__ = ["collect_status", "status_command"]


def collect_status(ping_timeout: float = 1.0, settings: Settings | None = None) -> dict[str, Any]:
    """Everything ``tracescore status`` shows, for ``settings`` (default: ``TRACESCORE_*``);
    raises ``CliError`` naming the server that cannot be reached."""
    if settings is None:
        settings = redis_settings()
    try:
        status = broker_status(settings, ping_timeout)
    except (RedisError, OSError) as exc:
        raise unreachable("broker", settings.broker_url, exc) from exc
    try:
        store = asyncio.run(store_status(settings))
    except (RedisError, OSError) as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    status.update(store, refused_keys=status["refused_keys"] + store["refused_keys"])
    # (the broker's Redis unless TRACESCORE_REDIS_URL names another)
    status["store"], status["store_evicts"] = status["broker"], status["broker_evicts"]
    if settings.store_url != settings.tls.url(settings.broker_redis_url):
        status["store"] = redact(settings.store_url)
        try:
            status["store_evicts"] = store_evicts(settings)
        except (RedisError, OSError) as exc:
            raise unreachable("score store", settings.store_url, exc) from exc
    try:
        status["backfill_jobs"], refused = backfill_jobs(settings)
    except (RedisError, OSError) as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    status["refused_keys"] += refused
    try:
        status["sinks"] = _sink_counts(settings)
    except StoreKeyTypeError as exc:  # a sink's queue of another type: say so, show the rest
        status["sinks"] = None
        status["refused_keys"].append(str(exc))
    return status


def _sink_counts(settings: Settings) -> dict[str, dict[str, int | None]]:
    """Per sink the workers drain: delivered, pending, failed (dead letters), dropped, retried,
    dead_letters_dropped (past the bound) (None: its counter in Redis is no number)."""
    outbox = RedisOutbox(settings.store_url, **CLI_PATIENCE)
    try:
        return {name: counts.as_dict() for name, counts in outbox.counts().items()}
    except (RedisError, OSError) as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    finally:
        outbox.close()


@click.command("status")
@click.option(
    "--timeout", type=FiniteRange(0.1, 60), default=1.0, show_default=True, help="Seconds to wait for worker pings."
)
@json_option("Print one JSON object.")
@broker_option
def status_command(broker: str | None, timeout: float, as_json: bool) -> None:
    """Show queue depth, workers, rate-limit state, failures of the last hour, judge spend today,
    dead letters, sinks and backfill jobs.

    Backfill jobs: those whose state is still in Redis (kept 7 days after their last save),
    newest first, at most 10 here (--json lists them all): status, source, scorers, runs
    enqueued, scores expected and scored / failed / skipped so far, and whether a process runs
    it now. Jobs started by a release before this one are not listed until resumed.

    Exits 1 when the broker is unreachable (use it as a health check); a key of another type or a
    count that is no number is shown unknown and named, exit 0.

    \b
    Examples:
      tracescore status
      tracescore status --json --timeout 3
      tracescore status --broker redis://:PASSWORD@redis:6379/0
      tracescore status >/dev/null || echo "broker or score store down"
    """
    status = collect_status(timeout, redis_settings(broker))
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    _echo(f"broker      {status['broker']}  (queue {status['queue']})")
    if status["broker_full"]:
        memory = status["broker_memory"]
        _echo(
            f"broker FULL  used memory {memory['used_bytes'] / 2**20:.0f} MiB at maxmemory "
            f"{(memory['max_bytes'] or 0) / 2**20:.0f} MiB: Redis refuses writes and the workers wait for room "
            "(deliver or drop the sinks' backlog: tracescore sinks list; or raise maxmemory)"
        )
    if status["broker_evicts"]:
        _echo(
            f"broker EVICTS  maxmemory-policy {status['broker_evicts']}: a full Redis drops score records, claims"
            " and queued runs (scores lost or made twice); workers refuse to start on it: set noeviction"
        )
    if status["store_evicts"] and status["store"] != status["broker"]:
        _echo(
            f"score store {status['store']} EVICTS  maxmemory-policy {status['store_evicts']}: a full Redis drops"
            " score records and claims (scores lost or made twice); workers refuse to start on it: set noeviction"
        )
    if status["broker_read_only"]:
        _echo(
            "broker READ-ONLY  the endpoint is a replica (a failover under way?): Redis refuses writes "
            "and the workers wait for a primary"
        )
    depth, unacked = (known(status[k]) for k in ("queue_depth", "unacked"))
    _echo(f"queue depth {depth} waiting, {unacked} in progress (unacked)")
    workers = status["workers"]
    if workers is None:
        _echo("workers     unknown (a broker that refuses writes takes no ping)")
    else:
        answered = f": {', '.join(workers)}" if workers else " (none answered the ping)"
        _echo(f"workers     {len(workers):,}{answered}")
    limits = status["rate_limits"]
    if limits:
        for model, state in sorted(limits.items()):
            parts = [f"{k}={known(v)}" for k, v in sorted(state.items())]
            _echo(f"rate limit  {model}: {', '.join(parts)}")
    else:
        _echo("rate limit  no judge calls limited yet")
    _echo(f"failures    last hour: {_by_reason(status['recent_failures']) or 'none'}")
    _echo_spend(status["spend"])
    by_reason = _by_reason(status["dead_letters_by_reason"])
    _echo(f"dead letters {known(status['dead_letters'])}" + (f" ({by_reason})" if by_reason else ""))
    if status["dead_letters"] is not None:
        # (a count lost or damaged in Redis: summed again from the list at the next push)
        held = status["dead_letters_bytes"]
        held_said = "bytes unknown until the next dead letter," if held is None else f"{held:,} bytes"
        _echo(
            f"             {held_said} of the bound's {status['dead_letters_max_bytes']:,} (TRACESCORE_DLQ_MAX_BYTES)"
        )
    if dropped := _by_reason(status["dead_letters_dropped"]):
        bounds = "(TRACESCORE_DLQ_MAX_LETTERS, TRACESCORE_DLQ_MAX_BYTES)"
        _echo(f"             dropped past the list's bounds {bounds}, the oldest first: {dropped}")
    for name, counts in sorted((status["sinks"] or {}).items()):
        _echo(
            f"sink        {name}: {known(counts['delivered'])} delivered, {known(counts['pending'])} pending, "
            f"{known(counts['failed'])} failed"
            + (f", {known(counts['dropped'])} dropped (record expired)" if counts["dropped"] != 0 else "")
            + dropped_past_bound(counts)
        )
    if status["sinks"] == {}:
        _echo("sinks       none drained yet")
    _echo_jobs(status["backfill_jobs"])
    unknown = [
        *(
            f"sink {name} {field}"
            for name, c in sorted((status["sinks"] or {}).items())
            for field in c
            if c[field] is None
        ),
        *(f"dead letters {reason}" for reason, n in status["dead_letters_by_reason"].items() if n is None),
        *(f"dead letters dropped {reason}" for reason, n in status["dead_letters_dropped"].items() if n is None),
        *(f"failures {reason}" for reason, n in status["recent_failures"].items() if n is None),
        *(f"rate limit {model} {k}" for model, state in sorted(limits.items()) for k, v in state.items() if v is None),
        *(
            f"backfill {job['job_id']} {field}"
            for job in status["backfill_jobs"] or []
            if job["counts_unreadable"] is None
            for field in ("scored", "failed", "skipped")
            if job[field] is None and job["status"] is not None
        ),
    ]
    if unknown:
        # (read as 0, a sink that had delivered thousands showed none)
        # (a job's count is no counter a write starts over: the store's scripts keep it aside)
        aside = "; a backfill job's is kept aside first" if any(u.startswith("backfill ") for u in unknown) else ""
        _echo(
            f"unknown     a counter in Redis is no number: {', '.join(unknown)} (shown unknown, not 0; the log"
            f" names its key; a write that adds to it starts it over{aside})"
        )
    for problem in status["refused_keys"]:
        _echo(f"refused key {problem}")


# Jobs shown in the text, newest first (``--json`` lists them all).
JOBS_SHOWN = 10


def _echo_jobs(jobs: list[dict[str, Any]] | None) -> None:
    """The backfill jobs: one line each, a second for its counts, a third when they are unknown."""
    if jobs is None:
        return  # (the index of another type: a refused key line names it)
    if not jobs:
        _echo("backfill    no job in Redis")
        return
    for job in jobs[:JOBS_SHOWN]:
        held = ", running now (a process holds it)" if job["held"] else ""
        started = job["started"].replace("T", " ").replace("Z", " UTC") if job["started"] else "(unknown)"
        if job["status"] is None:
            why = job["state_unreadable"] or "its key holds another type"
            _echo(f"backfill    {job['job_id']}: started {started}{held}; its state is unreadable: {why}")
            continue
        _echo(f"backfill    {job['job_id']}: {job['status']}, started {started}{held}")
        _echo(f"              source {job['source']}; scorers {', '.join(job['scorers'])}")
        done = ", ".join(f"{known(job[k])} {k}" for k in ("scored", "failed", "skipped"))
        if job["counts_unreadable"] is not None:
            done = "scored, failed and skipped unknown"
        _echo(
            f"              {job['runs_enqueued']:,} runs enqueued, {job['expected_scores']:,} scores expected: {done}"
        )
        counted = [job[k] for k in ("scored", "failed", "skipped")]
        if (
            job["status"] == "enqueued"
            and not job["held"]
            and None not in counted
            and sum(counted) >= job["expected_scores"]
        ):
            # (a --no-wait job stays "enqueued" until a process follows it: nothing else marks it done)
            _echo(f"              all counted: tracescore backfill --resume {job['job_id']} sums it up and ends it")
        if job["counts_unreadable"] is not None:
            _echo(f"              counts unknown: {job['counts_unreadable']['message']}")
    if len(jobs) > JOBS_SHOWN:
        _echo(f"backfill    and {len(jobs) - JOBS_SHOWN:,} more (older; tracescore status --json lists them all)")


def _echo(line: str) -> None:
    # Worker names, scorer and model names, reasons: text from Redis, which anyone who can
    # write there chooses (an escape sequence retitled the terminal).
    click.echo(printable(line))


def _by_reason(counts: dict[str, int | None]) -> str:
    """``reason=count, ...``, the largest first; a count that is no number in Redis unknown."""
    return ", ".join(f"{k}={known(v)}" for k, v in sorted(counts.items(), key=lambda kv: -(kv[1] or 0)))


def _echo_spend(spend: dict[str, Any]) -> None:
    """Judge spend today (UTC) per scorer and model, and what each budget has left; a figure a
    field that is no number leaves unknown says so (read as 0, it showed a smaller spend)."""

    def usd(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.4f}"

    unreadable = spend.get("unreadable") or []
    why = (
        f" (a spend field in Redis is no number: {', '.join(unreadable)}; a judge call that reads or adds to it"
        " repairs it: a total is summed again from the scorers' spend, another field starts over)"
        if unreadable
        else ""
    )
    _echo(
        f"spend       {spend['day']} (UTC): {usd(spend['total_usd'])}{' USD' * (spend['total_usd'] is not None)}{why}"
    )
    for kind in ("by_scorer", "by_model"):
        for name, value in sorted(spend[kind].items(), key=lambda kv: -(kv[1] or 0)):
            _echo(f"  {kind[3:]:<7} {name}: {usd(value)}{' USD' * (value is not None)}")
    for name, calls in spend.get("unpriced_calls", {}).items():
        counted = "unknown" if calls is None else f"{calls:,}"
        _echo(f"  model   {name}: unpriced ({counted} calls not in the spend; add it to TRACESCORE_PRICES)")
    for field, budget in spend["budgets"].items():
        left = budget["remaining_usd"]
        _echo(
            f"budget      {field}: {usd(left)} of {budget['limit_usd']:.4f} USD left today"
            + (" (spent: runs are budget_exhausted)" if left is not None and left <= 0 else "")
        )
