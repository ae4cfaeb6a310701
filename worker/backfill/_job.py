"""The backfill job: read → assemble → plan → submit → follow, embedded or through Redis.

``BackfillJob`` holds how a job runs and reports (broker or none, waiting, outputs);
``start`` runs a new job (its source, state, registry) in this process (``_run_embedded``) or
through the workers (``_run_redis``: enqueue with backpressure, then follow the job's counters
until the workers are done), ``dry_run`` only counts, ``resume`` continues an interrupted Redis
job. Each ends with the per-scorer summary (``print_summary`` / ``--json``). The click command
in ``worker/cli/_backfill.py`` only parses options and calls these.
"""

from __future__ import annotations

import functools
import io
import json
import os
import resource
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click
import structlog
from pydantic import ValidationError, create_model

from tracing import JsonlScoreWriter, ScoreRecord, ScoreWriter, SpanRecord, TraceReadError, redact, score_id_for
from tracing.queue import MAX_SCORER_IDS, QueueKeyError, ScoreBatch
from tracing.sources import MAX_SPANS_PER_TRACE, SourceError, TraceSource, source_from_description
from worker._budget import CostEstimate, install_local_guard, job_spend, parse_budgets, parse_prices, set_job_limit
from worker._errors import UnreadableCounterError, UnreadableStateError, caused_by
from worker._gc import tuned_gc
from worker._interrupt import stop_on_signals
from worker._keys import (
    backfill_rootless_key,
    backfill_runs_key,
    backfill_state_key,
    backfill_traces_key,
    job_key,
    job_skips_key,
    job_uncounted_key,
    record_key,
)
from worker._progress import ProgressReporter, format_duration
from worker._registry import Registry, RegistryError, load_registry
from worker._settings import Settings, SettingsError, load_settings
from worker._summary import Outcome, ScoreTable, Summary, SummaryScoreWriter, spend_lines
from worker._terminal import EXIT_OUTPUT_CLOSED, READER_LEFT, output_closed, printable
from worker.backfill._driver import MAX_REPORTED, Backfill, Submitter
from worker.backfill._state import (
    BackfillState,
    JobCounters,
    JobHold,
    RedisJobStore,
    late_by_option,
    late_said,
    store_client,
)
from worker.cli import CliError, cli_settings, names_an_input, unreachable
from worker.store import StoreKeyTypeError, failed_fields

if TYPE_CHECKING:
    from worker.backfill._submit import RedisSubmitter

__all__ = ["EXIT_SINK_FAILED", "EXIT_WAIT_TIMEOUT", "BackfillJob", "WaitTimeoutError", "load_scorers", "print_summary"]

# Exit codes beyond the shared ones (README, "Exit codes"): 1 also means "nothing came out"
# (every score failed, every line malformed); 3 means the workers were not done in time.
EXIT_WAIT_TIMEOUT = 3
# A sink refused scores (its dead letters) or had not taken them all when the command ended.
EXIT_SINK_FAILED = 4
# A job's scores and its queue standing still this long is said once, as a question (a worker
# may be busy with one long batch), with the command that starts a worker: waiting on a queue
# no worker reads looked like a slow job, or like a backfill held back by backpressure.
STALL_HINT_S = 30.0

log = structlog.get_logger("tracescore.backfill")


def _broker_refusal(exc: BaseException) -> tuple[str, str] | None:
    """What to tell the user when ``exc`` is the broker refusing the backfill's messages for now,
    and when to resume: Redis refusing writes (kombu wraps it in its own OperationalError when
    publishing), the queue's key holding another Redis type, or the connection lost (Redis
    restarting, a failover); else None. Never Redis' text:
    it quotes the refused command, a batch of spans with it."""
    import redis

    errors = redis.exceptions
    found = caused_by(
        exc,
        (
            StoreKeyTypeError,
            QueueKeyError,
            errors.OutOfMemoryError,
            errors.ReadOnlyError,
            errors.ConnectionError,
            errors.TimeoutError,
            ConnectionError,
        ),
    )
    # (a job's own keys are named by _refused_key before this: the key here is the queue's)
    if isinstance(found, StoreKeyTypeError | QueueKeyError):
        return f"the broker's queue: {found}", "once it is moved aside"
    if isinstance(found, errors.OutOfMemoryError):
        return (
            "the broker's Redis is full (used memory at maxmemory, noeviction) and refuses writes: make "
            "room (tracescore sinks list shows the sinks' backlog) or raise maxmemory",
            "once it takes writes again",
        )
    if isinstance(found, errors.ReadOnlyError):
        return (
            "the broker's Redis endpoint is a read-only replica (a failover under way?) and refuses writes",
            "once it takes writes again",
        )
    if found is not None:
        # Not its text: it may name the broker's address with its password.
        return f"the connection to the broker's Redis was lost ({type(found).__name__})", "once it is back"
    return None


class WaitTimeoutError(CliError):
    exit_code = EXIT_WAIT_TIMEOUT


class SinkFailedError(CliError):
    exit_code = EXIT_SINK_FAILED


def _refused_key(exc: StoreKeyTypeError | UnreadableStateError, job_id: str, resume: str | None) -> CliError:
    """The one line for a key of job ``job_id`` that cannot be used: its role, name and type
    (never its value), that it is left as it is, and what the operator does (``resume``: the
    resume line, None when the job has no state saved yet)."""
    state_key = backfill_state_key(job_id)
    if isinstance(exc, UnreadableStateError):
        what = f"its state {exc}"
    else:
        roles = {
            state_key: "state",
            backfill_runs_key(job_id): "set of the runs it enqueued",
            backfill_traces_key(job_id): "set of the traces an earlier release enqueued",
            backfill_rootless_key(job_id): "list of the traces it read",
            # (the workers' keys of the job, read by its progress and finish: named when the store refuses one)
            job_key(job_id): "hash of counters",
            job_skips_key(job_id): "set of the scores it counted as skipped",
            job_uncounted_key(job_id): "set of the records stored after it finished",
        }
        if exc.key not in roles:  # the broker's queue (its backpressure reads its length)
            what, when = _broker_refusal(exc) or (str(exc), "once it is moved aside")
            then = f"resume with: {resume}" if resume else "run the backfill again"
            return CliError(f"{what}; nothing enqueued is lost. {when.capitalize()}, {then}")
        role, found, expected = roles[exc.key], exc.found, exc.expected
        what = f"its {role} (Redis key {exc.key}) holds a {found}, where tracescore keeps a {expected}"
        if isinstance(exc, UnreadableCounterError):
            # (the workers went on: every score is stored and counted since; only the count
            # that field held is unknown, so the job's total may never be reached)
            then = f"follow the job with: {resume}" if resume else "run the backfill again"
            return CliError(
                f"backfill {job_id}: its {role} (Redis key {exc.key}) had a field {exc.field} that held no"
                f" integer {exc.found_times()}: the workers go on storing and counting the job's scores (nothing"
                f" is lost), but that count started over{' each time' * (exc.times > 1)} (what it held is kept in"
                f" {exc.kept_where()}), so the job's counts are unknown: {exc.repair()}; then {then}"
            )
    if exc.key in (job_key(job_id), job_skips_key(job_id), job_uncounted_key(job_id)) and resume is not None:
        # (the workers' keys: the job's state stands as saved; only its counts are unknown)
        return CliError(
            f"backfill {job_id}: {what}; it is left as it is, and the job's counts are unknown while it is:"
            f" rename it aside (what it counted is then counted again), then follow the job with: {resume}"
        )
    if exc.key == state_key:
        todo = (
            f"rename it aside (RENAME {exc.key} {exc.key}:aside) to look at it; the job cannot go on without"
            " its state: run the backfill again (scores already stored are not made twice)"
        )
    elif resume is None:
        todo = "the job had saved nothing yet: rename it aside (or delete it) and run the backfill again"
    else:
        # (without the set, runs read again past the checkpoint are enqueued again: their scores
        # are not made twice; without the list, a late root past it is taken for a new trace)
        todo = f"rename it aside (or delete it), then resume with: {resume}"
    # (nothing saved: each save checks every key before it writes; a batch sent just before the
    # save that met the key is past the checkpoint that stands, so the resume sends it again)
    return CliError(f"backfill {job_id}: {what}; it is left as it is and nothing was saved: {todo}")


def _sink_names(chosen: tuple[str, ...], otlp: bool) -> tuple[str, ...]:
    """The sinks a command scoring in place delivers to: ``--sink`` (and ``--otlp``), else an
    explicit ``TRACESCORE_SINKS``; never the workers' ``WRITER`` default (a local run writes
    nowhere unless asked). ``--sink none`` is a choice too: no ``TRACESCORE_SINKS`` then."""
    names = [*(n for n in chosen if n != "none"), *(["otlp"] if otlp else [])]
    if not names and "none" not in chosen:
        explicit = os.environ.get("TRACESCORE_SINKS")
        names = [n.strip() for n in explicit.split(",") if n.strip() and n.strip() != "none"] if explicit else []
    return tuple(dict.fromkeys(names))


def _report_sinks(summary: dict[str, Any]) -> None:
    """Print each sink's delivery line (and the backend's answer for its refusals)."""
    for name, state in (summary.get("sinks") or {}).items():
        line = (
            f"  sink {name:<12} delivered {state['delivered']:,}, failed {state['failed']:,}, "
            f"pending {state['pending']:,}"
        )
        if state.get("endpoint"):  # (two sinks of one backend told apart, as in its retries' log line)
            line += f" ({state['endpoint']})"
        if state.get("dropped"):
            line += f", dropped {state['dropped']:,}"
        if state.get("dead_letters_dropped"):
            line += f", dead letters dropped past the bound {state['dead_letters_dropped']:,}"
        if state.get("not_queued"):
            line += f", not queued {state['not_queued']:,}"
        click.echo(line, err=True)
        for letter in state.get("dead_letters", [])[:3]:
            click.echo(printable(f"    {letter['reason']}: {letter['detail'][:300]}"), err=True)


def _check_sinks(summary: dict[str, Any]) -> None:
    # (failed: the dead letters kept; those dropped past the bound failed too)
    failed = {n: s["failed"] + (s.get("dead_letters_dropped") or 0) for n, s in (summary.get("sinks") or {}).items()}
    bad = {n: s for n, s in (summary.get("sinks") or {}).items() if failed[n] or s["pending"]}
    if bad:
        parts = [f"{n}: {failed[n]:,} failed, {s['pending']:,} pending" for n, s in sorted(bad.items())]
        if summary.get("mode") == "redis":
            # (pending alone was sent to `sinks retry`, which retries the failed: it had none)
            todo = ""
            if any(s["failed"] for s in bad.values()):  # (the letters kept: those dropped are gone)
                todo += "; retry a sink's failed scores with tracescore sinks retry SINK --all"
            if any(s["pending"] for s in bad.values()):
                todo += (
                    "; pending scores stay in Redis for the workers to deliver once the sink takes them"
                    " (the workers' log says why it has not: sink_retry lines; tracescore sinks list follows them)"
                )
        else:  # (its store and dead letters live in this process)
            todo = (
                "; this process keeps none of them past its end: run the backfill again once the sink is"
                " fixed, with a longer TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS for a slow one, or with a broker,"
                " whose outbox keeps them"
            )
        raise SinkFailedError(
            "scores did not all reach their sinks (" + "; ".join(parts) + "): see the sink lines above" + todo
        )


class _Fanout:
    """Every writer gets the records, whichever fails (the table's failure had kept them from
    ``--out``); the first failure is raised after."""

    def __init__(self, writers: list[ScoreWriter]) -> None:
        self.writers = writers

    def write(self, records: Any) -> None:
        failed: Exception | None = None
        for writer in self.writers:
            try:
                writer.write(records)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def flush(self, timeout_s: float = 10.0) -> bool:
        return all([w.flush(timeout_s) for w in self.writers])  # noqa: C419  (flush every writer)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class _OutFile:
    """``--out`` in this process: the records as JSON Lines. Its first write error (a full disk)
    is kept and the rest of the job's records are not tried: the job ends with that error
    (exit 1) after its summary, instead of a traceback a batch and exit 0."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None
        self._writer = JsonlScoreWriter(path)

    def write(self, records: Any) -> None:
        if self.error is None:
            try:
                self._writer.write(records)
            except OSError as exc:
                self.error = exc.strerror or str(exc)

    def flush(self, timeout_s: float = 10.0) -> bool:
        try:
            return self._writer.flush(timeout_s)
        except OSError as exc:
            self.error = self.error or exc.strerror or str(exc)
            return False

    def close(self) -> None:
        try:
            self._writer.close()
        except OSError as exc:  # what a failed write left buffered
            self.error = self.error or exc.strerror or str(exc)


def _check_out(out: Path | None, source: TraceSource, *, replace_now: bool) -> None:
    """Refuse an ``--out`` that is one of the input files, and one that cannot be written: a job
    finds out before its work, not after it. ``replace_now``: emptied now (this process writes
    it as it scores); else left as it is until the workers' records are read back into it (a job
    interrupted before then emptied an earlier file for nothing)."""
    if out is None:
        return
    if names_an_input(out, getattr(source, "files", ())):
        raise CliError(f"--out {out} is one of the input files: the scores would be written into it")
    try:
        out.open("w" if replace_now else "a", encoding="utf-8").close()
    except OSError as exc:
        raise CliError(f"cannot write --out {out}: {exc.strerror or exc}") from exc


def _out_failed(out: Path | None, error: str | None) -> None:
    """End the job with exit 1 when ``--out`` could not be written (after its summary)."""
    if out is not None and error is not None:
        raise CliError(f"cannot write --out {out}: {error}; the summary above has the scores, the file does not")


def _settings(broker: str | None) -> Settings:
    """The settings of a job on ``broker`` (None: the environment's): a bad URL is named by
    where it came from, the variable when it is the variable's, else ``--broker``."""
    return cli_settings(None if broker in (None, os.environ.get("TRACESCORE_BROKER_URL")) else broker)


def load_scorers(module: str) -> Registry:
    try:
        return load_registry(module)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _summary(state: BackfillState, mode: str, progress: dict[str, int] | None, elapsed: float) -> dict[str, Any]:
    counters = state.counters
    failed = {k.split(":", 1)[1]: v for k, v in (progress or {}).items() if k.startswith("failed:")}
    skipped_scores = {k.split(":", 1)[1]: v for k, v in (progress or {}).items() if k.startswith("skipped:")}
    return {
        "job_id": state.job_id,
        "mode": mode,
        "status": state.status,
        "source": state.source_label,
        "scorers": state.options.scorer_ids,
        "traces_read": counters.traces_read,
        "runs_read": counters.runs_read,
        "runs_enqueued": counters.runs_enqueued,
        # The traces those runs are of, each once over the job (its first runs' batch counts it).
        "traces_enqueued": counters.traces_enqueued,
        "scores_expected": state.expected_scores,
        "scored": (progress or {}).get("scored", 0),
        "failed": (progress or {}).get("failed", 0),
        "failed_by_reason": failed,
        "scores_skipped": skipped_scores,
        "traces_skipped": counters.skipped,
        "traces_unreadable": counters.unreadable,
        "malformed_lines": counters.malformed,
        "malformed_where": counters.malformed_where[:10],
        "evicted_traces": counters.evicted_traces,
        # Counted by the assembler when a trace's root span came after its window had closed.
        "late_roots": counters.late_roots,
        # Other spans that came after their trace was read: not read, nor a trace of their own.
        "late_spans": counters.late_spans,
        # Runs of such spans scored: whole runs of their own that no part of the trace read held.
        "late_runs": counters.late_runs,
        # Both by the option that would have kept their trace open (why it was released).
        "late_roots_by_option": late_by_option(
            counters.late_roots, counters.late_roots_window, counters.late_roots_evicted
        ),
        "late_spans_by_option": late_by_option(
            counters.late_spans, counters.late_spans_window, counters.late_spans_evicted
        ),
        # Runs refused before enqueueing, by reason (too_large: one run over the message cap).
        "runs_rejected": dict(counters.runs_rejected),
        # Runs sent with U+FFFD for text no JSON can hold (bytes not UTF-8, lone surrogates).
        "runs_text_replaced": counters.runs_text_replaced,
        # Runs the job had enqueued already (input read twice, or again after a resume): sent once.
        "runs_read_again": counters.runs_read_again,
        # Spans past the cap on one trace's spans: each such trace was read without them.
        "spans_dropped": counters.spans_dropped,
        "elapsed_s": round(elapsed, 3),
        "reading_s": round(state.elapsed_s, 3),
        # ru_maxrss is in KiB on Linux: the backfill process's own peak, whatever the source size.
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu_s": round(_cpu_seconds(), 2),
    }


def _this_run(summary: dict[str, Any], at_start: JobCounters, current: JobCounters, *, resumed: bool) -> None:
    """Say in ``summary`` (Redis mode) which figures are this process's: its counts are the job's,
    over every run and resume, while its elapsed time and per-scorer summary are of the runs this
    process enqueued (``this_run``; its judge spend and sink lines are the job's when read back
    by its run ids: ``spend_of``, ``sinks_of``); a resume's summary put the two side by side
    unsaid (noticed)."""
    summary["resumed"] = resumed
    summary["this_run"] = {
        "traces_read": current.traces_read - at_start.traces_read,
        "runs_enqueued": current.runs_enqueued - at_start.runs_enqueued,
        "malformed_lines": current.malformed - at_start.malformed,
        "elapsed_s": summary["elapsed_s"],
    }


def _count(value: int | None) -> str:
    return "unknown (Redis did not answer)" if value is None else f"{value:,}"


def print_summary(summary: dict[str, Any]) -> None:
    def by_reason(counts: dict[str, int]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) if counts else ""

    elapsed = summary["elapsed_s"]
    reading = summary["reading_s"] or elapsed
    rate = summary["traces_read"] / reading if reading else 0.0
    lines = [f"backfill {summary['job_id']} ({summary['mode']}): {summary['status']}"]
    this_run = summary.get("this_run") if summary.get("resumed") else None
    if this_run is not None:
        # (the sink lines and the judge spend are the job's too, unless it was started by a
        # release that kept no run ids)
        ours = ["elapsed time"]
        ours += [] if summary.get("spend_of") == "job" else ["judge spend"]
        ours += [] if summary.get("by_scorer_of") == "job" else ["per-scorer summary"]
        ours += [] if summary.get("sinks_of") == "job" else ["sink lines"]
        named = f"{', '.join(ours[:-1])} and {ours[-1]} are" if len(ours) > 1 else f"{ours[0]} is"
        lines.append(
            f"  (resumed: the counts are the whole job's; this run read {this_run['traces_read']:,} traces and"
            f" enqueued {this_run['runs_enqueued']:,} runs, and the {named} of those alone)"
        )
    lines += [
        f"  traces read       {summary['traces_read']:,}" + (f"   ({rate:,.0f}/s)" if summary["traces_read"] else ""),
        f"  runs {'scored  ' if summary['mode'] == 'embedded' else 'enqueued'}     {summary['runs_enqueued']:,}"
        f"  × {len(summary['scorers'])} scorers "
        f"= {summary['scores_expected']:,} scores",
        f"  scored            {_count(summary['scored'])}",
        f"  failed            {_count(summary['failed'])}"
        + (f"   ({by_reason(summary['failed_by_reason'])})" if summary["failed_by_reason"] else ""),
    ]
    skipped = summary["traces_skipped"]
    if skipped:
        lines.append(f"  traces skipped    {sum(skipped.values()):,}   ({by_reason(skipped)})")
    if summary["scores_skipped"]:
        lines.append(
            f"  scores skipped    {sum(summary['scores_skipped'].values()):,}   "
            f"({by_reason(summary['scores_skipped'])})"
        )
    unreadable = summary["traces_unreadable"]
    if unreadable:
        lines.append(f"  unreadable traces {sum(unreadable.values()):,}   ({by_reason(unreadable)})")
    if summary["malformed_lines"]:
        where = ", ".join(summary["malformed_where"][:5])
        more = "…" if summary["malformed_lines"] > 5 else ""
        lines.append(f"  malformed lines   {summary['malformed_lines']:,}   ({where}{more})")
    if summary["evicted_traces"]:
        lines.append(f"  traces released early (memory bound) {summary['evicted_traces']:,}")
    if summary.get("late_roots"):
        lines.append(
            f"  late roots        {summary['late_roots']:,}   (root span arrived after its trace was read without it: "
            f"{late_said(summary['late_roots_by_option'])})"
        )
    if summary.get("late_spans"):
        lines.append(
            f"  late spans        {summary['late_spans']:,}   (of traces already read, not read: "
            f"{late_said(summary['late_spans_by_option'])})"
        )
    if summary.get("late_runs"):
        lines.append(
            f"  late runs         {summary['late_runs']:,}   (spans that arrived after their trace was read,"
            " a run of their own no part read held: scored, the trace counted once)"
        )
    if summary.get("runs_rejected"):
        rejected = summary["runs_rejected"]
        lines.append(
            f"  runs rejected     {sum(rejected.values()):,}   ({by_reason(rejected)}; a run larger than "
            "TRACESCORE_MAX_PAYLOAD_BYTES cannot be sent to the workers)"
        )
    if summary.get("runs_text_replaced"):
        lines.append(
            f"  text replaced     {summary['runs_text_replaced']:,} runs   (bytes not UTF-8 or lone surrogates,"
            " sent with U+FFFD in their place; objects of exactly __type__ and __value__, as JSON text)"
        )
    if summary.get("runs_read_again"):
        lines.append(
            f"  runs read again   {summary['runs_read_again']:,}   (the job had them already and sends each run once:"
            " an input read twice, or read again after --resume)"
        )
    if summary.get("spans_dropped"):
        lines.append(
            f"  spans dropped     {summary['spans_dropped']:,}   (past {MAX_SPANS_PER_TRACE:,} spans in one trace;"
            " the trace was read without them)"
        )
    if summary.get("records_unreadable"):
        unreadable_records = summary["records_unreadable"]
        lines.append(
            f"  unreadable records {sum(unreadable_records.values()):,}   ({by_reason(unreadable_records)}; score"
            " records in Redis that do not read as one: left out of the per-scorer summary and --out, logged as"
            " score_record_unreadable)"
        )
    lines += spend_lines(summary.get("spend"))
    if summary.get("spend_unknown"):
        lines.append(f"  judge spend       unknown ({summary['spend_unknown']})")
    lines.append(
        f"  elapsed           {format_duration(elapsed)} ({elapsed:.2f}s{', this run' if this_run is not None else ''})"
    )
    click.echo("\n".join(printable(line) for line in lines), err=True)  # file names among them


class SpoolError(Exception):
    """The temporary file of a job's enqueued runs could not be written or read (a full or
    read-only ``TMPDIR``): only the end-of-job summary needs it, never the job itself."""


class _Spool:
    """Lines in an anonymous temporary file (gone when closed or when the process ends):
    appended as they come and read back in order, as often as needed, in constant memory."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self.count = 0

    def add(self, line: str) -> None:
        try:
            if self._file is None:  # created with the first line: a job that enqueues nothing has no file
                self._file = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115  (closed by close)
            self._file.write(line)
            self._file.write("\n")
        except OSError as exc:
            raise SpoolError(f"cannot spool to {tempfile.gettempdir()}: {exc.strerror or exc}") from exc
        self.count += 1

    def __iter__(self) -> Iterator[str]:
        file = self._file
        if file is None:
            return
        try:
            file.flush()
            file.seek(0)
            try:
                for line in file:
                    yield line[:-1]
            finally:
                if not file.closed:  # an iteration left unfinished when the job ended
                    file.seek(0, io.SEEK_END)  # later lines are appended
        except OSError as exc:
            raise SpoolError(f"cannot read the spool back: {exc.strerror or exc}") from exc

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


_STATES_CHUNK = 5000  # score ids per question to the outbox


def _job_delivery(
    settings: Settings, score_ids: Callable[[], Iterable[str]], reporter: ProgressReporter
) -> dict[str, Any]:
    """Where the job's scores stand with each sink the workers drain, waiting up to
    ``TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS`` for the pending ones. ``score_ids`` streams the
    job's ids (again for a sink with dead letters): they are asked about in chunks, only counts
    are kept, and the pending ones are spooled to disk, so memory does not grow with the job."""
    from worker.store import RedisOutbox

    outbox = RedisOutbox(settings.store_url, reconnect_s=2.0)
    names = sorted(outbox.counts())
    settled: dict[str, Counter[str]] = {name: Counter() for name in names}
    pending = {name: _Spool() for name in names}

    def ask(name: str, ids: list[str], still_pending: _Spool) -> None:
        unowned: list[str] = []
        for score_id, state in outbox.states(name, ids).items():
            if state == "pending":
                still_pending.add(score_id)
            elif state == "none":
                unowned.append(score_id)
            else:
                settled[name][state] += 1
        if unowned:
            # "none" is also a dead letter dropped past the sink's bound (the outbox keeps no
            # trace of it): a score whose record is stored was queued for the sink and left its
            # queue undelivered; one without a record was never queued.
            found, unreadable = outbox.read(unowned)
            left = len(found) + len(unreadable)
            settled[name]["left"] += left
            settled[name]["none"] += len(unowned) - left

    try:
        deadline = time.monotonic() + settings.sink_drain_timeout_seconds
        for chunk in _chunks(score_ids(), _STATES_CHUNK):
            for name in names:
                ask(name, chunk, pending[name])
        # The wait as a phase of the progress (a bar on a terminal, a line every interval else):
        # a line each poll was two a second for the whole timeout.
        owed = sum(p.count for p in pending.values())
        reporter.start("delivering")
        while (waiting := sum(p.count for p in pending.values())) and time.monotonic() < deadline:
            reporter.update(
                "delivering", owed - waiting, "deliveries", 1 - waiting / owed, extra=f"{waiting:,} pending"
            )
            time.sleep(0.5)
            for name in names:  # only what was pending can have moved
                was, pending[name] = pending[name], _Spool()
                for chunk in _chunks(was, _STATES_CHUNK):
                    ask(name, chunk, pending[name])
                was.close()
        reporter.clear()  # (the summary says where each sink stands)
        if waiting:
            reporter.message(
                f"stopped waiting for the sinks after {settings.sink_drain_timeout_seconds:g}s"
                f" (TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS): {waiting:,} deliveries pending"
            )
        out: dict[str, Any] = {}
        totals = outbox.counts()
        for name in names:
            # Left the queue undelivered: dead letters dropped past the bound, as many as the sink
            # ever dropped at most (a sink configured after a score was stored was never owed it).
            left, ever = settled[name]["left"], totals[name].dead_letters_dropped if name in totals else 0
            dropped = left if ever is None else min(left, ever)
            counts = {
                "delivered": settled[name]["delivered"],
                "failed": settled[name]["failed"],
                "pending": pending[name].count,
                "dead_letters_dropped": dropped,
            }
            if not any(counts.values()):
                continue  # none of this job's scores was owed to it: not one of its sinks
            # Never queued for this sink (a run left without a record): not delivered.
            counts["not_queued"] = settled[name]["none"] + left - dropped
            letters = _job_letters(outbox, name, score_ids) if counts["failed"] else []
            out[name] = {**counts, "dead_letters": letters}
        return out
    finally:
        for spool in pending.values():
            spool.close()
        outbox.close()


def _job_scores(
    runs: RedisJobStore, job_id: str, registry: Registry, scorer_ids: list[str]
) -> Iterator[tuple[str, str, str]]:
    """Every score of the job (score id, scorer id, no agent), over all its runs (streamed): each
    run it enqueued (trace:span) with each of its scorers, for every run asks for all of them."""
    versions = {s: registry[s].version for s in scorer_ids if s in registry}
    for run in runs.run_ids(job_id) or ():
        trace_id, _, span_id = run.partition(":")
        for scorer_id, version in versions.items():
            yield score_id_for(trace_id, span_id, scorer_id, version), scorer_id, ""


def _job_score_ids(runs: RedisJobStore, job_id: str, registry: Registry, scorer_ids: list[str]) -> Iterator[str]:
    """Every score id of the job (streamed)."""
    return (score_id for score_id, _, _ in _job_scores(runs, job_id, registry, scorer_ids))


def _job_letters(outbox: Any, sink: str, score_ids: Callable[[], Iterable[str]]) -> list[dict[str, Any]]:
    """Up to five of the sink's newest dead letters that are this job's failed scores."""
    letters = outbox.dead_letters(sink, 1000)
    listed = {x.score_id for x in letters}
    mine = list({s for s in score_ids() if s in listed})
    failed = {s for s, state in outbox.states(sink, mine).items() if state == "failed"}
    return [x.model_dump() for x in letters if x.score_id in failed][:5]


_compact = json.JSONEncoder(separators=(",", ":")).encode  # ASCII: any agent name fits a line


class _Enqueued:
    """The runs this process enqueued (trace, span, agent, scorer ids), so the workers' score
    records can be read back by their deterministic ids for the per-scorer summary, ``--out``
    and the sinks' delivery states. Spooled to a temporary file as batches go out (one short
    JSON line a run, on disk): memory does not grow with the number of runs."""

    def __init__(self) -> None:
        self._spool = _Spool()
        # Each distinct tuple of scorer ids (a handful per job) once; a line holds its index.
        self._ids: dict[tuple[str, ...], int] = {}
        # Why the spool stopped (then no summary is read back: it would miss runs).
        self.lost: str | None = None
        # Per scorer, the scores the last ``summary`` found no record of, and those whose record
        # it could not read.
        self.missing: Counter[str] = Counter()
        self.unreadable: Counter[str] = Counter()

    @property
    def count(self) -> int:
        """Runs spooled, 0 once the spool failed (nothing to read back)."""
        return 0 if self.lost else self._spool.count

    def __call__(self, batch: ScoreBatch) -> None:
        if self.lost:
            return
        try:
            for request in batch.requests:
                index = self._ids.setdefault(tuple(request.scorer_ids), len(self._ids))
                labels = request.agent_labels()
                for span_id in request.target_span_ids:
                    self._spool.add(_compact([request.trace_id, span_id, labels.get(span_id, ""), index]))
        except SpoolError as exc:
            # The batch is enqueued already: the job goes on, without its end-of-job summary.
            self.lost = str(exc)
            self._spool.close()

    def _scores(self, registry: Registry, scorer_ids: list[str]) -> Iterator[tuple[str, str, str]]:
        """(score id, scorer id, agent) of every score the enqueued runs ask for, in the order
        enqueued."""
        versions = {s: registry[s].version for s in scorer_ids if s in registry}
        ids = list(self._ids)
        for line in self._spool:
            trace_id, span_id, agent, index = json.loads(line)
            for scorer_id in ids[index]:
                if scorer_id in versions:
                    yield score_id_for(trace_id, span_id, scorer_id, versions[scorer_id]), scorer_id, agent

    def score_ids(self, registry: Registry, scorer_ids: list[str]) -> Iterator[str]:
        """Every score id the enqueued runs ask for (streamed)."""
        return (score_id for score_id, _, _ in self._scores(registry, scorer_ids))

    def summary(
        self, store: Any, registry: Registry, scorer_ids: list[str], worst: int, out: IO[str] | None = None
    ) -> Summary:
        """Read the records (MGET in chunks; only the fields the summary shows are parsed);
        ``out`` gets each record's JSON as one line."""
        self.missing.clear()
        self.unreadable.clear()
        wanted = self._scores(registry, scorer_ids)
        return _read_back(store, registry, scorer_ids, wanted, self.missing, self.unreadable, worst, out)

    def close(self) -> None:
        self._spool.close()


# The fields of a stored score record that the summary shows (``Outcome.of_record``; not its
# judge spend: the job's spend hash has it, call by call), typed and defaulted as ``ScoreRecord``
# has them: only these are parsed and checked (twice as fast as the whole record).
_READ_BACK = frozenset(
    {"trace_id", "scorer_id", "span_name", "scorer_version", "score", "reason", "not_scorable"}
    | {"error_type", "error_message", "failed_step"}
)
_READ_BACK_FIELDS: dict[str, Any] = {
    name: (field.annotation, field) for name, field in ScoreRecord.model_fields.items() if name in _READ_BACK
}
_ReadBack = create_model("_ReadBack", **_READ_BACK_FIELDS)


def _read_back(
    store: Any,
    registry: Registry,
    scorer_ids: list[str],
    wanted: Iterator[tuple[str, str, str]],
    missing: Counter[str],
    unreadable: Counter[str],
    worst: int = 3,
    out: IO[str] | None = None,
) -> Summary:
    """The summary of the records of ``wanted`` (score id, scorer id, agent), read in chunks
    (MGET; only the fields the summary shows are parsed); ``missing`` counts, per scorer, the
    scores with no record, ``unreadable`` those whose record cannot be read (it does not
    validate, or its key holds no string), and ``out`` gets each record's JSON as one line.
    An unreadable record is logged and counted in the metrics."""
    summary = Summary({s: registry[s] for s in scorer_ids if s in registry}, worst_n=worst)
    while chunk := list(islice(wanted, 1000)):
        keys = [record_key(s) for s, _, _ in chunk]
        raws = store.mget(keys)
        # MGET reads a key of another type as absent: asked, so it is not taken for a record
        # never made (only for the absent ones, a round trip for a chunk with any).
        absent = [key for key, raw in zip(keys, raws, strict=True) if not raw]
        kinds = dict(zip(absent, _key_types(store, absent), strict=True)) if absent else {}
        for (score_id, scorer_id, agent), key, raw in zip(chunk, keys, raws, strict=True):
            problem = ""
            if not raw:
                if kinds[key] == "none":
                    missing[scorer_id] += 1  # not scored yet, or under another id
                    continue
                problem = f"the key holds a {kinds[key]}, not a record"
            else:
                try:
                    # Only the fields the summary shows, parsed and checked in pydantic-core:
                    # the read-back is mostly parsing.
                    fields = _ReadBack.model_validate_json(raw).__dict__
                except ValidationError as exc:
                    problem = failed_fields(exc)
            if problem:
                # Damaged, or not a record: left out, as the store reads it, and counted (never its values).
                _unreadable_record(score_id, problem)
                unreadable[scorer_id] += 1
                continue
            if out is not None:
                out.write(raw + "\n")
            summary.add(Outcome.of_record(fields, agent))
    return summary


def _key_types(store: Any, keys: list[str]) -> list[str]:
    pipe = store.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    return [str(kind) for kind in pipe.execute()]


def _unreadable_record(score_id: str, problem: str) -> None:
    """A score record read back that could not be read: logged as the store logs one (its id and
    what fails, never its values) and counted in ``tracescore_store_unreadable_values``."""
    from worker.metrics import observe_unreadable  # (as the store: loaded only for this)

    log.warning("score_record_unreadable", score_id=score_id, failed=problem)
    observe_unreadable("score_record")


# The job's records read back: their summary, which are missing and which did not read (by scorer).
_JobRead = tuple[Summary, Counter[str], Counter[str]]


def _read_job(
    runs: RedisJobStore, state: BackfillState, registry: Registry, worst: int, out: IO[str] | None = None
) -> _JobRead | str:
    """The job's records read back by its run ids (each one's JSON a line of ``out``): their
    summary, which are missing and which could not be read; or why they cannot be had (no run
    ids, Redis not answering)."""
    import redis

    job_id, scorer_ids = state.job_id, state.options.scorer_ids
    try:
        if runs.run_ids(job_id) is None:
            return "the job was started by an earlier release, which kept no run ids to read its scores by"
    except StoreKeyTypeError as exc:
        return str(exc)
    except redis.exceptions.RedisError as exc:
        return f"cannot read the scores back ({exc})"
    missing: Counter[str] = Counter()
    unreadable: Counter[str] = Counter()
    wanted = _job_scores(runs, job_id, registry, scorer_ids)
    try:
        by_scorer = _read_back(runs.client, registry, scorer_ids, wanted, missing, unreadable, worst, out)
    except redis.exceptions.RedisError as exc:
        return f"cannot read the scores back ({exc})"
    return by_scorer, missing, unreadable


def _set_job_spend(summary: dict[str, Any], settings: Settings, job_id: str) -> None:
    """Set ``summary``'s judge spend to the job's (``spend_of``: ``job``), as its workers'
    ledgers counted it call by call over every delivery and resume (``job_spend``: the summary
    means what an in-process job's does), or ``null`` beside why it cannot be had."""
    import redis

    summary["spend_of"] = "job"
    client = store_client(settings)
    try:
        summary["spend"] = job_spend(client, job_id).as_json()
    except (StoreKeyTypeError, redis.exceptions.RedisError) as exc:
        summary["spend"], summary["spend_unknown"] = None, f"cannot read the job's spend ({exc})"
    finally:
        client.close()


def _job_by_scorer(
    summary: dict[str, Any],
    runs: RedisJobStore,
    state: BackfillState,
    registry: Registry,
    worst: int,
    out: IO[str] | None = None,
) -> _JobRead | None:
    """A resume that enqueued nothing (the job was enqueued or finished already), or given
    ``--out``: set ``summary``'s per-scorer summary to the job's, read back from its records by
    its run ids (which keep no agent name: a worst run is labelled by its span's; each record's
    JSON a line of ``out``), and return what was read; or set it ``null`` beside why it cannot
    be had, and return None."""
    read = _read_job(runs, state, registry, worst, out)
    summary["by_scorer_of"] = "job"
    if isinstance(read, str):
        summary["by_scorer"], summary["by_scorer_unknown"] = None, read
        click.echo(f"  per-scorer summary unavailable: {read}", err=True)
        return None
    summary["by_scorer"] = read[0].as_json()
    summary["records_unreadable"] = dict(read[2])
    return read


def _job_sinks(
    summary: dict[str, Any],
    settings: Settings,
    runs: RedisJobStore,
    state: BackfillState,
    registry: Registry,
    enqueued: _Enqueued,
    reporter: ProgressReporter,
    *,
    resumed: bool,
) -> None:
    """Set ``summary``'s ``sinks``: where the job's scores stand with each sink. A resumed job's
    are the whole job's: its runs are kept in Redis (ids derived from them, asked about 5,000 a
    pipeline, as this run's are); the runs this process enqueued alone for a job an earlier
    release started. ``null`` with ``sinks_unknown`` when they cannot be had."""
    import redis

    unknown: str | None = None
    try:
        whole_job = resumed and runs.run_ids(state.job_id) is not None
        scorer_ids = state.options.scorer_ids
        score_ids: Callable[[], Iterable[str]] = (
            functools.partial(_job_score_ids, runs, state.job_id, registry, scorer_ids)
            if whole_job
            else functools.partial(enqueued.score_ids, registry, scorer_ids)
        )
        sinks = _job_delivery(settings, score_ids, reporter)
    except redis.exceptions.RedisError as exc:
        unknown = f"cannot read the outbox ({exc})"
    except (SpoolError, StoreKeyTypeError) as exc:
        unknown = str(exc)
    else:
        if sinks:
            summary["sinks"] = sinks
            if resumed:
                summary["sinks_of"] = "job" if whole_job else "this_run"
        elif resumed and not whole_job and not enqueued.count:
            # (none of this run's runs to ask about: an empty answer would read as a job with no sink)
            unknown = "the job was started by an earlier release, which kept no run ids to ask by"
    if unknown is not None:
        click.echo(f"  sink delivery unknown: {unknown}", err=True)
        summary["sinks"], summary["sinks_unknown"] = None, unknown


def _missing_records(missing: dict[str, int], registry: Registry) -> None:
    """Refuse a finished job whose workers counted runs done without making this job's records."""
    counts = ", ".join(f"{s}: {n:,}" for s, n in sorted(missing.items()))
    versions = ", ".join(f"{s}@{registry[s].version}" for s in sorted(missing) if s in registry)
    raise CliError(
        f"{sum(missing.values()):,} score(s) this job asked for have no record ({counts}), although the workers"
        " counted every run done: a worker running another version of a scorer than this module's"
        f" ({versions}), or none of it, takes its runs as done under other ids; or the records expired"
        " (TRACESCORE_SCORE_TTL_SECONDS). Restart the workers with this module and run the backfill again"
        " (scores still stored are not made twice)"
    )


def _check_outcome(summary: dict[str, Any]) -> None:
    """Exit non-zero when nothing useful came out, after the summary was printed."""
    if summary["malformed_lines"] and not summary["traces_read"]:
        raise CliError(
            f"every input line was malformed ({summary['malformed_lines']:,}; first at "
            f"{(summary['malformed_where'] or ['?'])[0]}): is this OTLP JSON / protobuf?"
        )
    if summary.get("failed") and not summary.get("scored"):
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary["failed_by_reason"].items()))
        raise CliError(f"every score failed ({summary['failed']:,}{'; ' + reasons if reasons else ''})")


class _StallHint:
    """Says once per stall, as a question, that no worker may read the job's queue: what a look
    sees (``moved``) unchanged for ``STALL_HINT_S`` while messages wait, whether the backfill waits
    to enqueue (backpressure) or for the scores."""

    def __init__(self, reporter: ProgressReporter, state: BackfillState, *, waits_for: str) -> None:
        self._reporter, self._state, self._waits_for = reporter, state, waits_for
        self._seen: object = None
        self._since, self._said = time.monotonic(), False

    def look(self, moved: object, pending: int) -> None:
        if moved != self._seen:
            self._seen, self._since, self._said = moved, time.monotonic(), False
        elif pending and not self._said and time.monotonic() - self._since >= STALL_HINT_S:
            self._said = True
            self._reporter.message(
                f"{self._waits_for} no message taken from queue {self._state.queue!r} for {STALL_HINT_S:.0f}s: if"
                f" no worker is running, start one on this broker: {_worker_command(self._state)}"
            )


def _worker_command(state: BackfillState) -> str:
    """The command that starts a worker for the job: its scorers, and its queue when that is not
    the default one (a worker started without -Q read 'tracescore', and the job waited on)."""
    queue = "" if state.queue in (None, Settings.model_fields["queue"].default) else f" -Q {shlex.quote(state.queue)}"
    return f"tracescore worker --scorers {state.options.scorers_module}{queue}"


def _wait_for_workers(
    submitter: Submitter,
    state: BackfillState,
    reporter: ProgressReporter,
    timeout_s: float | None,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, int]:
    expected = state.expected_scores
    started = time.monotonic()
    reporter.start("scoring")
    progress = submitter.progress(state.job_id)
    stall = _StallHint(reporter, state, waits_for="no score done and")
    while True:
        done = progress.get("scored", 0) + progress.get("failed", 0) + progress.get("skipped", 0)
        pending = submitter.pending()
        reporter.update(
            "scoring", done, "scores", (done / expected) if expected else 1.0, extra=f"of {expected:,}; queue {pending}"
        )
        # Every score counted: done, whatever else the queue holds (live traffic, another job,
        # which it once waited for too). A job counts each of its scores once (the store's put
        # script); past its total (a record that expired and was made again), it waits for the
        # queue to empty as well.
        if done == expected or (done > expected and pending == 0):
            return progress
        stall.look((done, pending), pending)
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            reporter.message(f"stopped waiting after {timeout_s:.0f}s: {done:,} of {expected:,} scores done")
            return progress
        time.sleep(0.25)
        if should_stop():
            raise KeyboardInterrupt
        progress = submitter.progress(state.job_id)


def _start(
    source: TraceSource,
    state: BackfillState,
    registry: Registry,
    reporter: ProgressReporter,
    broker: str | None,
    *,
    no_wait: bool,
    wait_timeout: float | None,
    high_water: int,
    as_json: bool,
    out: Path | None,
    otlp: bool,
    show_table: bool,
    worst: int,
    sinks: tuple[str, ...] = (),
    sink_options: dict[str, Any] | None = None,
) -> None:
    if broker:
        _run_redis(
            source,
            state,
            _settings(broker),
            reporter,
            no_wait=no_wait,
            wait_timeout=wait_timeout,
            high_water=high_water,
            as_json=as_json,
            registry=registry,
            worst=worst,
            out=out,
        )
    else:
        _run_embedded(
            source,
            state,
            registry,
            reporter,
            out=out,
            otlp=otlp,
            as_json=as_json,
            show_table=show_table,
            worst=worst,
            sinks=sinks,
            sink_options=sink_options,
        )


def _dry_run(
    source: TraceSource,
    state: BackfillState,
    reporter: ProgressReporter,
    as_json: bool,
    registry: Registry | None = None,
) -> None:
    reporter.message(f"dry run: reading {state.source_label}; nothing is scored")
    started = time.monotonic()
    estimate = (
        CostEstimate({s: registry[s] for s in state.options.scorer_ids}, parse_prices(_settings(None).prices))
        if registry is not None
        else None
    )

    def on_run(spans: list[SpanRecord], target_span_id: str) -> None:
        # An unreadable run is not a cost (scoring it records the read error). Read as the
        # scoring reads it: a reader's crash is that run's read_failed, never the dry run's end.
        if estimate is not None:
            from worker._scoring import read_run  # (here: a backfill sent to Redis loads no scoring code)

            run = read_run(spans[0].trace_id, target_span_id, spans)
            if not isinstance(run, TraceReadError):
                estimate.add(run)

    source_failed: SourceError | None = None
    with stop_on_signals("input record") as stop:
        backfill = Backfill(source, state, None, reporter=reporter, should_stop=stop, on_dry_run=on_run)
        try:
            interrupted = stop.run(backfill.run)
            if interrupted:  # (the traces still assembling were read: counted and estimated)
                backfill.not_handed_over()
        except SourceError as exc:  # Tempo failing mid-read: what was counted is said first
            interrupted, source_failed = False, exc
        reporter.close()
        # (still under the handler: a second Ctrl-C while it sums up only asks again)
        read = backfill.input_read if interrupted or source_failed is not None else 1.0
        _dry_run_summary(state, estimate, as_json, started, read, interrupted, source_failed)


def _dry_run_summary(
    state: BackfillState,
    estimate: CostEstimate | None,
    as_json: bool,
    started: float,
    read: float | None,
    interrupted: bool,
    source_failed: SourceError | None,
) -> None:
    """Print what the dry run counted and estimated (``read``: the share of the input read);
    stopped (``interrupted``), marked as the part read, exit 130."""
    if interrupted:
        state.status = "interrupted"
    summary = _summary(state, "dry-run", None, time.monotonic() - started)
    summary["input_read"] = None if read is None else round(read, 4)
    if estimate is not None:
        summary["estimate"] = estimate.as_json()
    runs = state.counters.runs_read - state.counters.runs_read_again  # a run the input holds twice is scored once
    summary["runs_to_score"] = runs
    summary["scores_to_compute"] = runs * len(state.options.scorer_ids)
    if as_json:
        click.echo(json.dumps(summary))
        _partial(state, read, interrupted)
        _source_failed(source_failed, "counts")
        _check_outcome(summary)
        return
    counters = state.counters
    for line in estimate.lines() if estimate is not None else []:
        click.echo(line)
    click.echo(
        f"would score {runs:,} runs from {counters.traces_read:,} traces "
        f"with {len(state.options.scorer_ids)} scorers ({', '.join(state.options.scorer_ids)}): "
        f"{summary['scores_to_compute']:,} scores"
    )
    if counters.skipped:
        click.echo("skipped traces: " + ", ".join(f"{k}: {v}" for k, v in sorted(counters.skipped.items())))
    if counters.unreadable:
        click.echo("unreadable traces: " + ", ".join(f"{k}: {v}" for k, v in sorted(counters.unreadable.items())))
    if counters.malformed:
        click.echo(printable(f"malformed lines: {counters.malformed} ({', '.join(counters.malformed_where[:5])})"))
    if summary["late_roots"]:
        click.echo(
            f"late roots: {summary['late_roots']} (root span arrived after its trace was read without it: "
            f"{late_said(summary['late_roots_by_option'])})"
        )
    if summary["late_spans"]:
        click.echo(
            f"late spans: {summary['late_spans']} (of traces already read, not read: "
            f"{late_said(summary['late_spans_by_option'])})"
        )
    if summary["late_runs"]:
        click.echo(
            f"late runs: {summary['late_runs']} (spans that arrived after their trace was read, a run of their"
            " own no part read held: would be scored, the trace counted once)"
        )
    if summary["runs_read_again"]:
        click.echo(f"runs read again: {summary['runs_read_again']} (the input holds them twice: scored once)")
    if summary["spans_dropped"]:
        click.echo(
            f"spans dropped: {summary['spans_dropped']} (past {MAX_SPANS_PER_TRACE:,} spans in one trace; "
            "the trace is read without them)"
        )
    _partial(state, read, interrupted)
    _source_failed(source_failed, "counts")
    _check_outcome(summary)


def _partial(state: BackfillState, read: float | None, interrupted: bool) -> None:
    """A stopped dry run: say that its figures are of the part read, and exit 130."""
    if not interrupted:
        return
    share = "an unknown share" if read is None else f"{read:.1%}"
    click.echo(
        f"partial: stopped after reading {state.counters.traces_read:,} traces ({share} of the input);"
        " the counts and the estimate above are for that part, the rest of the input was not read",
        err=True,
    )
    raise SystemExit(130)


def _source_failed(exc: SourceError | None, what: str) -> None:
    """End the command (exit 1) when its source stopped mid-read, once its summary is out."""
    if exc is not None:
        raise CliError(f"{exc}; the {what} above are the part read before it")


def _name_interrupted(left: list[tuple[str, str, str]]) -> None:
    """Name the pairs a stop left unscored (counted in the summary as skipped: interrupted)."""
    for trace_id, span_id, scorer_id in left[:MAX_REPORTED]:
        click.echo(
            f"trace {trace_id} span {span_id}: scorer {scorer_id} not scored (interrupted: stopped before its"
            " retry, or cut short; not recorded, nor counted as failed)",
            err=True,
        )
    if len(left) > MAX_REPORTED:
        click.echo(f"… and {len(left) - MAX_REPORTED:,} more scores not scored (interrupted)", err=True)


def _run_embedded(
    source: TraceSource,
    state: BackfillState,
    registry: Registry,
    reporter: ProgressReporter,
    *,
    out: Path | None,
    otlp: bool,
    as_json: bool,
    show_table: bool = False,
    worst: int = 3,
    sinks: tuple[str, ...] = (),
    sink_options: dict[str, Any] | None = None,
) -> None:
    from worker._delivery import DrainPolicy, build_sinks
    from worker._embedded import EmbeddedScorer, cli_limits

    agents: dict[str, str] = {}
    by_scorer = Summary({s: registry[s] for s in state.options.scorer_ids}, worst_n=worst)
    # With --json, stdout is the one JSON object: the table goes to stderr.
    table = (
        ScoreTable(sys.stderr if as_json else sys.stdout, traces=True, before_write=reporter.clear)
        if show_table
        else None
    )
    writers: list[ScoreWriter] = [SummaryScoreWriter(by_scorer, table, agents)]
    try:
        out_file = _OutFile(out) if out is not None else None
    except OSError as exc:  # (a file the check above could open but not append to: /proc/version)
        raise CliError(f"cannot write --out {out}: {exc.strerror or exc}") from exc
    if out_file is not None:
        writers.append(out_file)
    names = _sink_names(sinks, otlp)
    try:
        settings = load_settings(**(sink_options or {}), **({"sinks": ",".join(names)} if names else {}))
        built = build_sinks(settings) if names else []
    except SettingsError as exc:
        raise CliError(str(exc)) from exc
    prices = parse_prices(settings.prices)
    scorer = EmbeddedScorer(
        {s: registry[s] for s in state.options.scorer_ids},
        _Fanout(writers) if writers else None,
        settings=settings,  # (its retry budget, backoff and judge-call cap: a worker's)
        agents=agents,
        run_timeout_s=cli_limits(settings),  # the worker's run timeout and memory cap
        # (the workers' limits too: the overshoot past a budget is bounded by them)
        model_concurrency=settings.model_concurrency,
        run_concurrency=settings.run_concurrency,
        sinks=built,
        drain_policy=DrainPolicy.of(settings),
        drain_timeout_s=settings.sink_drain_timeout_seconds,
        prices=prices,
    )
    try:
        # TRACESCORE_BUDGETS and --max-cost, held in this process (the workers' ledger's twin).
        ledger, restore_hooks = install_local_guard(
            parse_budgets(settings.budgets), state.job_id, state.options.max_cost_usd, prices
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    reporter.message(
        f"backfill {state.job_id}: embedded mode (no broker configured: scoring in this process; "
        f"set --broker or TRACESCORE_BROKER_URL to use Redis workers)"
    )
    reporter.message(f"reading {state.source_label}; scorers: {', '.join(state.options.scorer_ids)}")
    started = time.monotonic()
    interrupted = False
    source_failed: SourceError | None = None
    left: list[tuple[str, str, str]] = []
    with stop_on_signals("batch") as stop:
        if table is not None:
            table.on_closed = functools.partial(stop.ask, READER_LEFT)
        scorer.should_stop = stop  # (a first Ctrl-C ends a retry's backoff: no retry starts)
        try:  # (after the work, a signal while the sinks drain only asks again)
            backfill = Backfill(source, state, scorer, reporter=reporter, should_stop=stop, hand_over=stop.deferred)
            interrupted = stop.run(backfill.run)
            if interrupted:
                backfill.not_handed_over()
            state.status = "interrupted" if interrupted else "finished"
        except SourceError as exc:  # Tempo failing mid-job: what was scored is summed up first
            source_failed = exc
            state.status = "interrupted"
        finally:
            scorer.settle()  # (a cancelled batch's runs still record: counted, then closed)
            left = scorer.interrupted_pairs()  # (counted as skipped: interrupted)
            progress = scorer.progress(state.job_id)
            scorer.close()
            restore_hooks()
            reporter.close()
        if left and not interrupted:  # (the stop came during the last batch, with its retry pending)
            interrupted, state.status = True, "interrupted"
        _name_interrupted(left)
        # (still under the signal handler: a late second Ctrl-C does not cut the summary)
        summary = _summary(state, "embedded", progress, time.monotonic() - started)
        summary["by_scorer"] = by_scorer.as_json()
        summary["spend"] = ledger.spend.as_json()
        if scorer.sink_counts:
            endpoints = {s.name: getattr(s, "endpoint", None) for s in built}
            summary["sinks"] = {
                name: {
                    **counts.as_dict(),
                    "endpoint": endpoints.get(name),
                    "dead_letters": [x.model_dump() for x in scorer.sink_dead_letters.get(name, [])],
                }
                for name, counts in scorer.sink_counts.items()
            }
        if out is not None:
            summary["out"] = str(out)
        if as_json:
            click.echo(json.dumps(summary))
        print_summary(summary)
        _report_sinks(summary)
        if out_file is not None and out_file.error is None:
            click.echo(f"  scores written to {out} (compare two runs: tracescore compare OLD.jsonl {out})", err=True)
        # The picture per scorer is the output (stdout); the job's counts above are the footer.
        click.echo(
            "\n"
            + by_scorer.render(
                title=f"scores by scorer ({state.counters.runs_enqueued:,} runs)",
                hint="every score as a row: --table · every record to a file: --out scores.jsonl · "
                "two versions side by side: tracescore compare OLD.jsonl NEW.jsonl",
            ),
            err=as_json or output_closed(),  # (stdout's reader gone: the summary is still said)
        )
        if interrupted:
            if output_closed():
                click.echo(
                    f"stopped: {READER_LEFT}; the summary above"
                    f"{' and --out hold' if out is not None else ' holds'} what was scored before",
                    err=True,
                )
                raise SystemExit(EXIT_OUTPUT_CLOSED)
            click.echo("interrupted (embedded jobs keep no state: run the command again to start over)", err=True)
            raise SystemExit(130)
        if source_failed is not None:
            raise CliError(
                f"{source_failed}; the scores above are the part read before it (embedded jobs keep no state)"
            )
        _out_failed(out, out_file.error if out_file is not None else None)
        _check_outcome(summary)
        _check_sinks(summary)


def _sum_up_interrupted(
    backfill: Backfill,
    state: BackfillState,
    submitter: RedisSubmitter,
    hold: JobHold,
    *,
    started: float,
    as_json: bool,
    resume: str,
    out: Path | None,
    at_start: JobCounters,
    resumed: bool,
) -> None:
    """A Redis job stopped by a signal: its state saved as resumable, the summary a finished job
    prints (the workers' counts so far: unknown when Redis does not answer), the resume line.
    The summary's counts are the saved state's, which the resume goes on from: what was read
    past its checkpoint is read and counted again then (the counts in hand, up to a batch and a
    window ahead, were counted twice by the job's summary once resumed)."""
    import redis

    answering = True
    saved = backfill.saved
    if hold.lost.is_set():
        click.echo(
            f"stopped: this process lost its hold on {state.job_id} (Redis lost the lock, or this process"
            f" was paused past {JobHold.HOLD_S:.0f} s), so another may be running the job",
            err=True,
        )
    else:  # (with the hold lost, the state saved now would overwrite the new holder's)
        try:
            saved = backfill.interrupted()
        except (redis.exceptions.RedisError, StoreKeyTypeError) as exc:
            # (not asked again for the counts: a Redis that did not answer would hold the
            # resume line back one more timeout)
            answering = not isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError)
            click.echo(f"  the job's state was not saved now ({exc}); its last checkpoint stands", err=True)
    saved.status = state.status = "interrupted"
    so_far: dict[str, int] | None = None
    if answering:
        with suppress(redis.exceptions.RedisError, StoreKeyTypeError):
            so_far = submitter.progress(state.job_id)
    summary = _summary(saved, "redis", so_far, time.monotonic() - started)
    _this_run(summary, at_start, saved.counters, resumed=resumed)
    if so_far is None:
        summary["scored"] = summary["failed"] = None
    if as_json:
        click.echo(json.dumps(summary))
    print_summary(summary)
    if hold.lost.is_set():
        click.echo(f"nothing enqueued is lost. Once the other process ends, follow the job with: {resume}", err=True)
    else:
        click.echo(f"interrupted; nothing enqueued is lost. Resume with: {resume}", err=True)
    if out is not None:
        click.echo(
            f"--out {out} was not written (the workers' records are read back at the job's end): give it to"
            f" the resume, which writes the whole job's records: {resume} --out {shlex.quote(str(out))}",
            err=True,
        )


def _run_redis(
    source: TraceSource,
    state: BackfillState,
    settings: Settings,
    reporter: ProgressReporter,
    *,
    no_wait: bool,
    wait_timeout: float | None,
    high_water: int,
    as_json: bool,
    resumed: bool = False,
    registry: Registry | None = None,
    worst: int = 3,
    out: Path | None = None,
    max_cost_usd: float | None = None,
) -> None:
    import redis

    from worker.backfill._submit import RedisSubmitter

    scorer_ids = state.options.scorer_ids
    if len(scorer_ids) > MAX_SCORER_IDS:  # the workers would dead-letter every message (invalid_payload)
        raise CliError(
            f"{len(scorer_ids)} scorers: a request to the workers names at most {MAX_SCORER_IDS};"
            " pick them with --scorer, over several jobs"
        )
    submitter = RedisSubmitter(settings, high_water=high_water)
    what, url = "broker", settings.broker_url
    try:
        submitter.ping_broker()
        what, url = "score store", settings.store_url  # (TRACESCORE_REDIS_URL may name another)
        submitter.ping_store()
    except redis.exceptions.RedisError as exc:
        submitter.close()
        raise unreachable(what, url, exc) from exc
    except StoreKeyTypeError as exc:
        submitter.close()
        raise CliError(f"the broker's queue: {exc}") from exc
    except SettingsError as exc:  # a Redis that evicts keys when full
        submitter.close()
        raise CliError(str(exc)) from exc
    # Redis away mid-job (a restart, a failover): waited out for the workers' budget, said so.
    submitter.ride_out.on_away = reporter.message
    hold = JobHold(submitter.store, state.job_id)
    job_store = RedisJobStore(submitter.store, hold, submitter.ride_out)

    wait_s = JobHold.HOLD_S + 2 if resumed else 0.0

    def waiting() -> None:
        reporter.message(f"backfill {state.job_id} is held by another process: waiting up to {wait_s:.0f} s")

    try:
        held = hold.acquire(wait_s, waiting)
        # What the holder did while this waited is in the stored state, not the one read before.
        fresh = job_store.load(state.job_id) if held and resumed else state
    except redis.exceptions.RedisError as exc:
        hold.release()
        submitter.close()
        raise unreachable("score store", settings.store_url, exc) from exc
    except (StoreKeyTypeError, UnreadableStateError) as exc:
        hold.release()
        submitter.close()
        raise _refused_key(exc, state.job_id, None) from None
    if not held:
        submitter.close()
        raise CliError(
            f"backfill {state.job_id} is being run by another process (a start or a --resume): its progress"
            " is that one's to show; once it ends, --resume follows the job"
        )
    if fresh is None:
        hold.release()
        submitter.close()
        raise CliError(f"backfill {state.job_id}: its state is gone from {redact(settings.store_url)}")
    if max_cost_usd is not None and max_cost_usd != fresh.options.max_cost_usd:
        # (dropped without a word, it left the job's budget-refused runs unscorable for good:
        # a job's limit never resets, and `dlq retry` met the same limit again)
        was = "none" if fresh.options.max_cost_usd is None else f"${fresh.options.max_cost_usd:g}"
        reporter.message(f"--max-cost: the job's limit is now ${max_cost_usd:g} (it was {was})")
        fresh.options.max_cost_usd = max_cost_usd
    try:
        _run_held(source, fresh, settings, reporter, submitter, job_store, hold, no_wait=no_wait,
                  wait_timeout=wait_timeout, as_json=as_json, resumed=resumed, registry=registry, worst=worst,
                  out=out)  # fmt: skip
    finally:
        hold.release()


def _run_held(
    source: TraceSource,
    state: BackfillState,
    settings: Settings,
    reporter: ProgressReporter,
    submitter: RedisSubmitter,
    job_store: RedisJobStore,
    hold: JobHold,
    *,
    no_wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    resumed: bool,
    registry: Registry | None,
    worst: int,
    out: Path | None,
) -> None:
    """``_run_redis`` once the job is this process's: enqueue, follow the workers, sum up."""
    import redis

    state.queue = settings.queue
    verb = "resuming" if resumed else "starting"
    reporter.message(
        f"backfill {state.job_id}: {verb} in Redis mode (broker {redact(settings.broker_url)}, "
        f"queue {settings.queue!r}; workers: {_worker_command(state)})"
    )
    reporter.message(f"reading {state.source_label}; scorers: {', '.join(state.options.scorer_ids)}")
    if not resumed:
        try:
            job_store.save(state)  # resumable from the first moment, even if killed before a batch
        except StoreKeyTypeError as exc:  # (nothing written: the save checks every key first)
            submitter.close()
            raise _refused_key(exc, state.job_id, None) from None
        except redis.exceptions.RedisError as exc:
            submitter.close()
            refusal = _broker_refusal(exc)
            if refusal is None:
                raise
            raise CliError(f"{refusal[0]}; nothing was enqueued") from None
    if state.options.max_cost_usd is not None:
        # The workers read it before each judge call of this job's runs (worker/_budget.py).
        set_job_limit(submitter.store, state.job_id, state.options.max_cost_usd)
    started = time.monotonic()
    at_start = state.counters.model_copy(deep=True)
    enqueued = _Enqueued()
    # (the password as a placeholder: a masked one copied would fail to authenticate)
    given = redact(settings.broker_url).replace(":***@", ":PASSWORD@")
    # (the variable alone does only when it names this broker: --broker may have overridden it)
    from_variable = os.environ.get("TRACESCORE_BROKER_URL", "").strip() == settings.broker_url
    resume = f"tracescore backfill --resume {state.job_id}" + ("" if from_variable else f" --broker {given}")
    try:
        backfill = Backfill(source, state, submitter, job_store=job_store, reporter=reporter, on_batch=enqueued)
        progress: dict[str, int] | None = None
        try:
            with stop_on_signals("batch") as signalled:

                def stop() -> bool:  # Ctrl-C, or the job's hold lost (another process may run it now)
                    return signalled() or hold.lost.is_set()

                backfill.should_stop = stop
                submitter.should_stop = stop
                stall = _StallHint(reporter, state, waits_for="waiting to enqueue:")

                def waiting(pending: int) -> None:
                    backfill.show_waiting(pending)
                    stall.look(pending, pending)

                submitter.on_wait = waiting

                def work() -> None:
                    try:
                        follow()
                    except Exception as exc:
                        # Asked to stop, then the broker refused the batch in hand or stopped
                        # answering: the stop stands (exit 130, the workers' counts unknown), and
                        # the refusal is named. It ended as a lost broker, exit 1 with no summary,
                        # what a Job's SIGTERM met behind a paused Redis; then as a stop that
                        # said nothing of a full or read-only Redis.
                        refusal = _broker_refusal(exc) if signalled() else None
                        if refusal is not None:
                            what, when = refusal
                            reporter.message(f"when the stop was asked, {what}; resume {when}")
                            raise KeyboardInterrupt from exc
                        raise

                def follow() -> None:
                    nonlocal progress
                    if state.status in ("reading", "interrupted"):
                        state.status = "reading"
                        backfill.run()
                    if not no_wait:
                        progress = _wait_for_workers(submitter, state, reporter, wait_timeout, stop)
                        expected = state.expected_scores
                        done = sum(progress.get(k, 0) for k in ("scored", "failed", "skipped"))
                        if done >= expected:
                            state.status = "finished"
                            if not job_store.save(state):
                                raise KeyboardInterrupt  # the hold is another's: stop as on a signal
                            # (it expires in any case; a key refused here is the workers' to
                            # report: the job's summary is what it counted)
                            with suppress(redis.exceptions.RedisError, StoreKeyTypeError):
                                job_store.finished(state.job_id)

                # (the summing up of an interrupted job is still under the handler: a signal there
                # only asks again, and the resume line is not lost)
                if signalled.run(work):
                    reporter.close()
                    _sum_up_interrupted(
                        backfill, state, submitter, hold, started=started, as_json=as_json, resume=resume, out=out,
                        at_start=at_start, resumed=resumed,
                    )  # fmt: skip
                    raise SystemExit(130)
        except SourceError as exc:
            # The source failing mid-job (Tempo down) is no reason to lose the job: what was
            # enqueued stays, and the job goes on from its checkpoint once the source answers.
            with suppress(redis.exceptions.RedisError):  # still "reading" then: resumable too
                backfill.interrupted()
            submitter.close()
            raise CliError(f"{exc}; nothing enqueued is lost. Once the source answers, resume with: {resume}") from None
        except StoreKeyTypeError as exc:
            # A key of the job of another type, met while reading: its last saved checkpoint
            # stands (nothing is saved over it now: the save would meet the same key).
            submitter.close()
            raise _refused_key(exc, state.job_id, resume) from None
        except Exception as exc:
            submitter.close()
            refusal = _broker_refusal(exc)
            if refusal is None:
                raise
            what, when = refusal
            raise CliError(f"{what}; nothing enqueued is lost. {when.capitalize()}, resume with: {resume}") from None
        except BaseException:
            submitter.close()
            raise
        finally:
            reporter.close()
        if progress is None:
            try:
                progress = submitter.progress(state.job_id)
            except StoreKeyTypeError as exc:
                submitter.close()
                raise _refused_key(exc, state.job_id, resume) from None
        elapsed = time.monotonic() - started
        by_scorer: Summary | None = None
        out_error: str | None = None
        # A resume's --out holds the whole job's records (read back by its run ids, below), as
        # the job run without a stop writes them: this run's part alone would be short of them.
        whole_job = resumed and out is not None
        if not no_wait and registry is not None and enqueued.count and not whole_job:
            try:
                with ExitStack() as closing:
                    out_file = closing.enter_context(out.open("w", encoding="utf-8")) if out is not None else None
                    by_scorer = enqueued.summary(submitter.store, registry, state.options.scorer_ids, worst, out_file)
            except SpoolError as exc:
                click.echo(f"  per-scorer summary unavailable: {exc}", err=True)
            except OSError as exc:
                out_error = exc.strerror or str(exc)
            except redis.exceptions.RedisError as exc:
                click.echo(f"  per-scorer summary unavailable: cannot read the scores back ({exc})", err=True)
        if not no_wait and registry is not None and enqueued.lost and not whole_job:
            what = "per-scorer summary and --out" if out is not None else "per-scorer summary"
            click.echo(f"  {what} unavailable: {enqueued.lost}", err=True)
        submitter.close()
        summary = _summary(state, "redis", progress, elapsed)
        _this_run(summary, at_start, state.counters, resumed=resumed)
        summary["throttled_s"] = round(submitter.throttled_s, 3)
        if not no_wait and registry is not None and (enqueued.count or resumed) and state.status == "finished":
            runs = RedisJobStore(store_client(settings))
            try:
                _job_sinks(summary, settings, runs, state, registry, enqueued, reporter, resumed=resumed)
            finally:
                runs.client.close()
        if by_scorer is not None:
            summary["by_scorer"] = by_scorer.as_json()
            summary["records_unreadable"] = dict(enqueued.unreadable)
        if not no_wait:  # (a resume's too: the job's whole spend, before its stop too)
            _set_job_spend(summary, settings, state.job_id)
        job_read: _JobRead | None = None
        if not no_wait and registry is not None and resumed and (whole_job or not (enqueued.count or enqueued.lost)):
            # A resume that enqueued nothing (the job was enqueued or finished already), or one
            # given --out, shows the job's per-scorer summary, read back by its run ids (into
            # --out); else it is this run's.
            runs = RedisJobStore(store_client(settings))
            try:
                with ExitStack() as closing:
                    out_file = closing.enter_context(out.open("w", encoding="utf-8")) if out is not None else None
                    job_read = _job_by_scorer(summary, runs, state, registry, worst, out_file)
            except OSError as exc:
                out_error = exc.strerror or str(exc)
            finally:
                runs.client.close()
        # Every run counted done, yet records missing: no delivery loses a record, so they were
        # made under other ids (another scorer version) or expired since.
        missing: dict[str, int] = {}
        if state.status == "finished":
            missing = dict(job_read[1] if job_read is not None else enqueued.missing if by_scorer is not None else {})
        if missing:
            summary["missing_records"] = missing
        if as_json:
            click.echo(json.dumps(summary))
        print_summary(summary)
        partial = " so far" if state.status != "finished" else ""
        if by_scorer is not None:
            earlier = " (this run's part of a resumed job)" if resumed else ""
            click.echo(
                "\n" + by_scorer.render(title=f"scores by scorer{partial}{earlier} ({enqueued.count:,} runs)"),
                err=as_json,
            )
        elif job_read is not None:
            title = (
                f"scores by scorer, the whole job{partial} ({state.counters.runs_enqueued:,} runs; read back by its"
                " run ids, which keep no agent names)"
            )
            click.echo("\n" + job_read[0].render(title=title), err=as_json)
        _report_sinks(summary)
        if no_wait and state.status == "enqueued":
            click.echo(
                f"  enqueued; the workers score it (tracescore status shows how far). Follow with: {resume}", err=True
            )
        _out_failed(out, out_error)
        if whole_job and not no_wait and job_read is None:
            raise CliError(f"--out {out} holds none of the job's records: {summary.get('by_scorer_unknown')}")
        if missing and registry is not None:
            _missing_records(missing, registry)
        _check_outcome(summary)
        _check_sinks(summary)
        if not no_wait and wait_timeout is not None and state.status != "finished":
            raise WaitTimeoutError(
                f"--wait-timeout {wait_timeout:g}s expired before the workers finished; the job goes on: "
                f"follow it with {resume}"
            )
    finally:
        enqueued.close()


def _resume(
    job_id: str,
    broker: str,
    reporter: ProgressReporter,
    *,
    no_wait: bool,
    wait_timeout: float | None,
    high_water: int,
    as_json: bool,
    max_cost_usd: float | None = None,
    out: Path | None = None,
) -> None:
    import redis

    settings = _settings(broker)
    client = store_client(settings)
    try:
        state = RedisJobStore(client).load(job_id)
    except (StoreKeyTypeError, UnreadableStateError) as exc:
        raise _refused_key(exc, job_id, None) from None
    except redis.exceptions.RedisError as exc:
        raise unreachable("score store", settings.store_url, exc) from exc
    finally:
        client.close()
    if state is None:
        raise CliError(
            f"no backfill job {job_id!r} in {redact(settings.store_url)}: a job's state expires after 7 days, and a"
            " Redis restarted without persistence has lost it; run the backfill again (scores already stored are"
            " not made twice); or the id is not the job's: tracescore status lists the jobs this Redis keeps"
        )
    if state.queue is not None and state.queue != settings.queue:
        # Its workers consume the queue it started on: the rest sent elsewhere would wait there.
        said = f"TRACESCORE_QUEUE says {settings.queue!r}"
        reporter.message(f"the job's queue is {state.queue!r} ({said}): using the job's")
        settings = settings.model_copy(update={"queue": state.queue})
    registry = load_scorers(state.options.scorers_module)
    missing = [s for s in state.options.scorer_ids if s not in registry]
    if missing:
        raise CliError(f"{state.options.scorers_module} no longer defines scorer(s) {', '.join(missing)}")
    try:
        source = source_from_description(state.source)
    except SourceError as exc:
        raise CliError(f"cannot reopen the job's source: {exc}") from exc
    _check_out(out, source, replace_now=False)
    with tuned_gc():
        _run_redis(
            source,
            state,
            settings,
            reporter,
            no_wait=no_wait,
            wait_timeout=wait_timeout,
            high_water=high_water,
            as_json=as_json,
            resumed=True,
            registry=registry,
            max_cost_usd=max_cost_usd,
            out=out,
        )


@dataclass(frozen=True)
class BackfillJob:
    """How a backfill job runs and what it prints: with ``broker`` through the workers (else in
    this process), waiting for them (unless ``no_wait``, at most ``wait_timeout`` s), enqueuing
    with backpressure at ``high_water`` batches, and its outputs (``--json``, ``--out``, OTLP
    write-back, the per-score table, ``worst`` runs per scorer)."""

    reporter: ProgressReporter
    broker: str | None = None
    no_wait: bool = False
    wait_timeout: float | None = None
    high_water: int = 40
    as_json: bool = False
    out: Path | None = None
    otlp: bool = False
    show_table: bool = False
    worst: int = 3
    # In this process only (--sink, --phoenix-url, ...): the workers use their own settings.
    sinks: tuple[str, ...] = ()
    sink_options: dict[str, Any] | None = None

    def start(self, source: TraceSource, state: BackfillState, registry: Registry) -> None:
        """Read ``source`` from ``state``'s checkpoint, score every planned run, print the summary."""
        _check_out(self.out, source, replace_now=not self.broker)
        _start(
            source,
            state,
            registry,
            self.reporter,
            self.broker,
            no_wait=self.no_wait,
            wait_timeout=self.wait_timeout,
            high_water=self.high_water,
            as_json=self.as_json,
            out=self.out,
            otlp=self.otlp,
            show_table=self.show_table,
            worst=self.worst,
            sinks=self.sinks,
            sink_options=self.sink_options,
        )

    def dry_run(self, source: TraceSource, state: BackfillState, registry: Registry | None = None) -> None:
        """Read and plan only: count what would be scored (and, given the scorers, estimate the
        judge tokens and cost)."""
        _dry_run(source, state, self.reporter, self.as_json, registry)

    def resume(self, job_id: str, *, max_cost_usd: float | None = None) -> None:
        """Continue the interrupted Redis job ``job_id`` (needs ``broker``); ``max_cost_usd``
        replaces the job's ``--max-cost`` (the one way to raise it)."""
        if not self.broker:
            raise CliError("--resume needs the Redis the job ran with: pass --broker URL or set TRACESCORE_BROKER_URL")
        _resume(
            job_id,
            self.broker,
            self.reporter,
            no_wait=self.no_wait,
            wait_timeout=self.wait_timeout,
            high_water=self.high_water,
            as_json=self.as_json,
            max_cost_usd=max_cost_usd,
            out=self.out,
        )
