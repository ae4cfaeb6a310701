"""``tracescore backfill``: the click command over the backfill job (``worker.backfill``): it parses
the options, opens the source and builds the job's state; the job does the rest."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click
import structlog

from tracing.sources import DEFAULT_MAX_OPEN_BYTES, SourceError, open_source
from worker._gc import tuned_gc
from worker._progress import ProgressReporter
from worker._terminal import printable
from worker.backfill import (
    EXIT_WAIT_TIMEOUT,
    BackfillJob,
    BackfillOptions,
    BackfillState,
    load_scorers,
    new_job_id,
)
from worker.cli._common import CliError, FiniteRange, json_option, out_option
from worker.cli._sinks import sink_options, sink_overrides

__all__ = ["EXIT_WAIT_TIMEOUT", "backfill_command", "parse_time"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str, *, now: float | None = None) -> int:
    """Epoch nanoseconds from ISO 8601 (``2026-11-30T10:00Z``, ``2026-11-30``), a duration ago
    (``2h``, ``30m``, ``7d``) or epoch seconds."""
    text = value.strip()
    relative = _RELATIVE.match(text)
    if relative:
        ago = float(relative.group(1)) * _UNITS[relative.group(2)]
        try:
            return int(((time.time() if now is None else now) - ago) * 1e9)
        except OverflowError:  # "1e999d" reads as infinitely long ago
            raise click.BadParameter(f"{value!r} is out of range") from None
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    except OverflowError:  # "1e400", "inf": a number, but no time
        raise click.BadParameter(f"{value!r} is out of range; use epoch seconds, e.g. 1764496800") from None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a time; use ISO 8601 (2026-11-30T10:00:00Z), a duration ago (2h, 7d) or epoch seconds"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1e9)


def _quiet_logs(verbose: bool) -> None:
    """The table and the progress bar are the output; logs only from warnings up (all with -v)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line (not its default)."""
    return ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE


# Options a job keeps from its start: --resume refuses them rather than ignore them.
_FIXED_AT_START = frozenset(
    [
        "sources",
        "only",
        "since",
        "until",
        "sample",
        "dry_run",
        "batch_size",
        "window_spans",
        "window_files",
        "max_open_spans",
        "max_open_mb",
        "tempo_query",
    ]
)


@click.command("backfill")
@click.argument("sources", nargs=-1)
@click.option("--scorers", "module", help="Module that defines the scorers, e.g. examples.scorers.")
@click.option("--scorer", "only", multiple=True, help="Only this scorer id (repeatable; default: all in --scorers).")
@click.option("--since", help="Only traces that started at or after this time (ISO 8601, '2h', '7d', epoch s).")
@click.option("--until", help="Only traces that started before this time.")
@click.option(
    "--sample",
    type=FiniteRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Score this share of traces (deterministic on the trace id, like the exporter).",
)
@click.option("--broker", help="Broker URL (default: TRACESCORE_BROKER_URL; with neither, score in this process).")
@click.option("--resume", "resume_id", metavar="JOB_ID", help="Continue an interrupted job (Redis mode).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only count the traces and runs that would be scored, and estimate the judge tokens and cost.",
)
@click.option(
    "--max-cost",
    type=FiniteRange(min=0),
    metavar="USD",
    help="Stop paying for judge calls once this job spent this much (runs past it: budget_exhausted records).",
)
@click.option("--no-wait", is_flag=True, help="Redis mode: return once everything is enqueued.")
@click.option(
    "--wait-timeout",
    type=FiniteRange(min=0),
    default=None,
    help="Redis mode: stop waiting for the workers after this many seconds.",
)
@out_option(
    "Also write every score record as JSON Lines here (for tracescore compare; with a broker, once the "
    "workers are done)."
)
@click.option("--table", "show_table", is_flag=True, help="Embedded mode: also print one row per score as it is made.")
@click.option(
    "--worst",
    type=click.IntRange(0, 100),
    default=3,
    show_default=True,
    help="Worst runs listed per scorer in the summary.",
)
@click.option("--otlp", is_flag=True, help="Embedded mode: same as --sink otlp (OTEL_EXPORTER_OTLP_* settings).")
@sink_options
@click.option(
    "--batch-size",
    type=click.IntRange(1, 5000),
    default=200,
    show_default=True,
    help="Runs per queue message (and at most 100,000 run x scorer pairs a message).",
)
@click.option(
    "--high-water",
    type=click.IntRange(1),
    default=40,
    show_default=True,
    help="Redis mode: wait while more batches than this are queued.",
)
@click.option(
    "--window-spans",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="Assembly window: a trace is complete this many spans after its last one (once its root is seen).",
)
@click.option(
    "--window-files",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Assembly window: keep a rootless trace open across this many file boundaries.",
)
@click.option(
    "--max-open-spans",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Memory bound: spans held while assembling.",
)
@click.option(
    "--max-open-mb",
    type=click.IntRange(1),
    default=DEFAULT_MAX_OPEN_BYTES // 2**20,
    show_default=True,
    help="Memory bound: MiB of span text held while assembling.",
)
@click.option("--query", "tempo_query", help="Tempo sources: the TraceQL query (default '{}': every trace).")
@json_option("Print the final summary as one JSON object on stdout.")
@click.pass_context
def backfill_command(
    ctx: click.Context,
    sources: tuple[str, ...],
    module: str | None,
    only: tuple[str, ...],
    since: str | None,
    until: str | None,
    sample: float,
    broker: str | None,
    resume_id: str | None,
    dry_run: bool,
    max_cost: float | None,
    no_wait: bool,
    wait_timeout: float | None,
    out: Path | None,
    show_table: bool,
    worst: int,
    otlp: bool,
    sinks: tuple[str, ...],
    phoenix_url: str | None,
    mlflow_url: str | None,
    langfuse_host: str | None,
    batch_size: int,
    high_water: int,
    window_spans: int,
    window_files: int,
    max_open_spans: int,
    max_open_mb: int,
    tempo_query: str | None,
    as_json: bool,
) -> None:
    """Score stored traces: OTLP JSON/protobuf files (JSON Lines, .gz, directories) or Tempo.

    With no broker configured (no --broker, no TRACESCORE_BROKER_URL) the scoring runs in
    this process and prints a summary per scorer (runs, mean, distribution, failures, worst
    runs; --table adds one row per score, --out writes every record); with a broker the runs
    go to the Redis queue in batches and the command waits for the workers (unless --no-wait).
    Interrupted Redis jobs resume with --resume JOB_ID. Tempo auth or tenant headers come from TRACESCORE_TEMPO_HEADERS
    (key=value,key2=value2, like OTEL_EXPORTER_OTLP_HEADERS).

    \b
    Examples:
      tracescore backfill examples/traces --scorers examples.scorers
      tracescore backfill traces/ --scorers my.scorers --scorer relevancy --since 2026-11-01 --sample 0.1
      tracescore backfill traces/*.jsonl.gz --scorers my.scorers --broker redis://127.0.0.1:6379/0
      tracescore backfill tempo+http://tempo:3200 --since 24h --query '{}' --scorers my.scorers
      tracescore backfill --resume bf-20261130-152233-1a2b3c --broker redis://127.0.0.1:6379/0
      tracescore backfill examples/traces --scorers examples.scorers --dry-run
      tracescore backfill traces/ --scorers my.scorers --max-cost 5
      tracescore backfill traces/ --scorers my.scorers --sink phoenix --phoenix-url http://127.0.0.1:6006

    --sink (in this process; with a broker the workers' TRACESCORE_SINKS apply) delivers every
    score to that backend; the summary shows each sink's delivered/failed/pending, and the exit
    code is 4 when a sink refused scores or had not taken them all.
    """
    _quiet_logs(bool((ctx.obj or {}).get("verbose")))
    # --broker "" is no broker (this process), as an empty TRACESCORE_BROKER_URL is.
    broker = (broker if broker is not None else os.environ.get("TRACESCORE_BROKER_URL")) or None
    job = BackfillJob(
        ProgressReporter(),
        broker,
        no_wait=no_wait,
        wait_timeout=wait_timeout,
        high_water=high_water,
        as_json=as_json,
        out=out,
        otlp=otlp,
        sinks=tuple(sinks),
        sink_options={
            k: v for k, v in sink_overrides((), phoenix_url, mlflow_url, langfuse_host).items() if v is not None
        },
        show_table=show_table,
        worst=worst,
    )
    if show_table and broker:  # it was ignored without a word
        click.echo(
            "note: --table prints scores made in this process; with a broker the workers make them"
            " (the summary shows the worst runs, --out writes every record)",
            err=True,
        )
    if "none" in sinks and (otlp or len(set(sinks)) > 1):  # (--otlp won, and retried for 34 s)
        raise click.UsageError("--sink none delivers nowhere: drop it, or drop --otlp and the other --sink")
    if not broker and (_given(ctx, "no_wait") or _given(ctx, "wait_timeout")):  # (ignored without a word)
        click.echo(
            "note: --no-wait and --wait-timeout follow Redis workers; with no broker this process scores", err=True
        )
    if dry_run and out is not None:
        click.echo(f"note: --dry-run scores nothing, so --out {out} is not written", err=True)
    if out is not None and broker and no_wait:
        raise CliError("--out with a broker writes the workers' records once they are done: drop --no-wait")
    if resume_id:
        # What the job reads and scores was fixed at its start (the job's state keeps it): given
        # again, it was ignored without a word.
        fixed = [
            param.opts[0] if param.opts[0].startswith("-") else param.human_readable_name
            for param in ctx.command.params
            if param.name in _FIXED_AT_START and _given(ctx, param.name)
        ]
        if fixed:
            raise click.UsageError(
                f"--resume continues the job as it started (its sources, scorers and reading options): drop"
                f" {', '.join(fixed)}, or start a new job without --resume"
            )
        job.resume(resume_id, max_cost_usd=max_cost)
        return
    # Usage errors (exit 2), as `score` without --scorers is: each is required but for --resume.
    if not sources:
        raise click.UsageError(
            "give a source (trace files, a directory, or tempo+http://HOST:3200), or --resume JOB_ID"
        )
    if not module:
        raise click.UsageError("give the scorers with --scorers my.module (the module that defines them)")
    registry = load_scorers(module)
    unknown = [s for s in only if s not in registry]
    if unknown:
        raise CliError(f"unknown scorer id(s) {', '.join(unknown)}; {module} has: {', '.join(registry)}")
    since_ns = parse_time(since) if since else None
    until_ns = parse_time(until) if until else None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise click.BadParameter("--since must be before --until", param_hint="--since/--until")
    missing = [s for s in sources if "://" not in s and not os.path.exists(s)]
    if missing:  # README: a missing input file is a usage error (exit 2), as for score and compare
        what = "a symbolic link that leads nowhere" if os.path.islink(missing[0]) else "no such file or directory"
        # (printable: click strips no escape on a terminal, and a name is the user's or a glob's)
        raise click.BadParameter(printable(f"{missing[0]}: {what}"), param_hint="SOURCES")
    try:
        source = open_source(list(sources), since_ns=since_ns, until_ns=until_ns, query=tempo_query)
    except SourceError as exc:
        raise CliError(str(exc)) from exc
    options = BackfillOptions(
        scorers_module=module,
        scorer_ids=list(only or registry),
        since_ns=since_ns,
        until_ns=until_ns,
        sample_rate=sample,
        batch_size=batch_size,
        window_spans=window_spans,
        window_files=window_files,
        max_open_spans=max_open_spans,
        max_open_mb=max_open_mb,
        max_cost_usd=max_cost,
    )
    state = BackfillState(job_id=new_job_id(), source=source.describe(), source_label=source.label(), options=options)

    with tuned_gc():
        if dry_run:
            job.dry_run(source, state, registry)
        else:
            job.start(source, state, registry)
