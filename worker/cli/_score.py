"""``tracescore score``: score a JSON Lines file of runs in this process and print a summary.

The file is streamed: runs are read and scored in chunks of ``--chunk`` lines, so memory
stays bounded whatever the file size. Scoring is ``EmbeddedScorer.score_runs`` (the worker's
limits and retries), and each outcome goes to the summary and table that backfill prints too
(``worker._summary``); this module reads the file and writes ``--out`` / ``--json``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import click

from scorers import ScoreResult
from worker._budget import install_local_guard, parse_budgets, parse_prices
from worker._embedded import MAX_BATCH_BYTES, EmbeddedScorer, cli_limits
from worker._interrupt import stop_on_signals
from worker._lines import json_lines, line_run_id
from worker._progress import ProgressReporter
from worker._registry import RegistryError, load_registry
from worker._summary import Outcome, ScoreTable, Summary, SummaryScoreWriter, spend_lines
from worker._terminal import EXIT_OUTPUT_CLOSED, READER_LEFT, output_closed, send
from worker.cli._common import (
    CliError,
    cli_settings,
    input_caps,
    json_line,
    json_option,
    names_an_input,
    out_option,
)

__all__ = ["score_command"]

_MESSAGES_SHOWN = 20  # per kind (bad lines, failures) on stderr; all are counted


class _RunLine(NamedTuple):
    number: int
    run: dict[str, Any] | str  # the run's keyword arguments, or why the line is none
    read: int  # the file's bytes read so far
    named: bool  # whether the line gave a run id
    size: int  # the line's bytes: what its run holds in memory, about


def _read_runs(path: Path) -> Iterator[_RunLine]:
    """A ``_RunLine`` per line; a line that is not a run object gives an error string."""
    for number, run, problem, read, size in json_lines(path):
        if problem is not None:
            yield _RunLine(number, problem, read, False, 0)
            continue
        missing = [k for k in ("input", "output") if k not in run] if isinstance(run, dict) else None
        if missing is None or missing:
            lacks = f" (it has no {' and no '.join(repr(k) for k in missing)})" if missing else ""
            yield _RunLine(number, f"expected an object with at least 'input' and 'output'{lacks}", read, False, 0)
            continue
        run_id = _run_id(run.get("run_id"))
        kwargs = {
            "input": run["input"],
            "output": run["output"],
            "run_id": line_run_id(number) if run_id is None else run_id,
            "ground_truth": run.get("ground_truth"),
            "request_context": run.get("request_context"),
        }
        yield _RunLine(number, kwargs, read, run_id is not None, size)


def _chunks(lines: Iterator[_RunLine], count: int) -> Iterator[list[_RunLine]]:
    """``lines`` in lists of ``count`` lines, or fewer once they hold ``MAX_BATCH_BYTES`` (1,000
    lines of up to 32 MiB each, MAX_LINE_BYTES, were held at once)."""
    batch: list[_RunLine] = []
    held = 0
    for line in lines:
        batch.append(line)
        held += line.size
        if len(batch) >= count or held >= MAX_BATCH_BYTES:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def _a_file_or_a_pipe(path: Path) -> None:
    """A device is no file of runs: /dev/zero was read as one line for ever (a first Ctrl-C waits
    for the chunk, which never came). A pipe is one (`<(zcat runs.gz)`, /dev/stdin fed by one)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise CliError(f"{path} is a device, not a file of runs: give a file, or a pipe")


def _size(path: Path) -> int | None:
    """The bytes ``path`` holds, for a share done; None when it cannot tell: a pipe, a FIFO,
    ``/dev/stdin`` fed by one, a ``/proc`` file (their size says 0 whatever comes)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) and info.st_size else None


def _run_id(value: Any) -> str | None:
    """A run's id as text: an object, a list or a boolean as its JSON (not Python's repr, which
    --out and ``compare`` would then carry), anything else as ``str``; None when none is given
    (absent, null, or an empty string, object or list): the run is then its line's
    (``line_run_id``). 0 and false are ids like any other: taken for none, they were renamed
    ``line-N`` and could meet another run of that id."""
    if value is None or (isinstance(value, str | dict | list) and not value):
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list | bool) else str(value)


def _digest(run_id: str) -> bytes:
    return hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _out_line(number: int, outcome: Outcome, named: bool) -> str:
    """One --out line: ScoreRecord's field names, so ``tracescore compare`` reads both kinds;
    ``run_id_given`` (``named``): whether the line gave the run id, false for a run named after its
    line (``line_run_id``): an explicit id may be that same text, on that same line too."""
    record: dict[str, Any] = {
        "run_id": outcome.run,
        "line": number,
        "run_id_given": named,
        "scorer_id": outcome.scorer_id,
        "scorer_version": outcome.scorer_version,
        "score": outcome.score,
    }
    if outcome.error_type:
        record.update(
            error_type=outcome.error_type, error_message=outcome.error_message, failed_step=outcome.failed_step
        )
    else:
        record.update(reason=outcome.reason, not_scorable=outcome.not_scorable)
    record.update(judge_models=list(outcome.judge_models), judge_calls=outcome.judge_calls, cost_usd=outcome.cost_usd)
    return json.dumps(record) + "\n"


class _OutLines:
    """``--out``: its first write error (a full disk) is kept and no later line is tried, so the
    command scores on, prints its summary, and then ends with that error (exit 1)."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self.error: str | None = None

    def write(self, line: str) -> None:
        if self.error is None:
            try:
                self._file.write(line)
            except OSError as exc:
                self.error = exc.strerror or str(exc)

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:  # what a failed write left buffered
            self.error = self.error or exc.strerror or str(exc)


class _Limited:
    """Messages to stderr, the first few of each kind; the rest are only counted."""

    def __init__(self, what: str, say: Callable[[str], None]) -> None:
        self.what = what
        self.say = say  # (the progress reporter's: its bar is cleared first)
        self.count = 0

    def __call__(self, message: str) -> None:
        self.count += 1
        if self.count <= _MESSAGES_SHOWN:
            self.say(message)

    def close(self) -> None:
        if self.count > _MESSAGES_SHOWN:
            click.echo(f"… and {self.count - _MESSAGES_SHOWN:,} more {self.what} (not shown)", err=True)


@click.command("score")
@click.argument("runs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scorers", "module", required=True, help="Module that defines the scorers, e.g. examples.scorers.")
@click.option("--scorer", "only", multiple=True, help="Only this scorer id (repeatable).")
@click.option("--concurrency", type=click.IntRange(1), default=32, show_default=True, help="Runs scored at once.")
@click.option(
    "--chunk",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="Lines read and scored at a time (fewer once they hold 64 MiB: memory stays bounded).",
)
@click.option("--table", "show_table", is_flag=True, help="Also print one row per score as it is made.")
@click.option(
    "--worst", type=click.IntRange(0, 100), default=3, show_default=True, help="Worst runs listed per scorer."
)
@out_option("Write every score record as JSON Lines here (for tracescore compare).")
@json_option("Print one JSON result per line on stdout; the summary goes to stderr.")
def score_command(
    runs_file: Path,
    module: str,
    only: tuple[str, ...],
    concurrency: int,
    chunk: int,
    show_table: bool,
    worst: int,
    out: Path | None,
    as_json: bool,
) -> None:
    """Score the runs in RUNS_FILE (JSON Lines of {input, output, ...}) right here, no broker,
    and print a summary per scorer: runs, mean, distribution, failures and the worst runs.

    \b
    Example:
      tracescore score examples/runs.jsonl --scorers examples.scorers
      tracescore score runs.jsonl --scorers my.scorers --scorer relevancy --out scores.jsonl
    """
    input_caps()
    _a_file_or_a_pipe(runs_file)
    if out is not None and names_an_input(out, [runs_file]):
        raise CliError(f"--out {out} is the runs file: writing it would empty it before it is read")
    try:
        registry = load_registry(module)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc
    unknown = [s for s in only if s not in registry]
    if unknown:
        raise CliError(f"unknown scorer id(s) {', '.join(unknown)}; {module} has: {', '.join(registry)}")
    scorers = {s: registry[s] for s in (only or registry)}
    summary = Summary(scorers, worst_n=worst)
    # With --json, stdout is one JSON result a line: the table goes to stderr.
    # Progress on stderr (a bar on a terminal, else a line every 5 s): a file of judged runs
    # takes hours, and nothing was said until the footer.
    reporter = ProgressReporter()
    table = ScoreTable(sys.stderr if as_json else sys.stdout, before_write=reporter.clear) if show_table else None
    shown = SummaryScoreWriter(summary, table)
    bad_lines = _Limited("malformed lines", reporter.message)
    failures = _Limited("failed scores", reporter.message)
    not_scored = _Limited("scores not scored (interrupted)", reporter.message)
    runs_total = 0
    started = time.perf_counter()

    # The worker's limits (TRACESCORE_RUN_TIMEOUT_SECONDS, the memory cap): a run that hangs or
    # runs out of memory is a timeout/memory error and the chunk's other runs are scored.
    settings = cli_settings()
    prices = parse_prices(settings.prices)
    try:  # TRACESCORE_BUDGETS, held in this process as an embedded backfill holds them
        ledger, restore_hooks = install_local_guard(parse_budgets(settings.budgets), prices=prices)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    scorer = EmbeddedScorer(
        scorers,
        settings=settings,
        run_timeout_s=cli_limits(settings),
        model_concurrency=settings.model_concurrency,
        run_concurrency=concurrency,
        prices=prices,
    )
    try:
        out_file = _OutLines(out) if out is not None else None
    except OSError as exc:
        scorer.close()
        restore_hooks()
        raise CliError(f"cannot write --out {out}: {exc.strerror or exc}") from exc
    # (held to the end: a signal while closing or summing up only asks again)
    with stop_on_signals("chunk") as stop:
        gone = functools.partial(stop.ask, READER_LEFT)
        scorer.should_stop = stop  # (a first Ctrl-C ends a retry's backoff: no retry starts)
        if table is not None:
            table.on_closed = gone

        def emit(write: Callable[[], object]) -> None:
            if output_closed():
                return
            reporter.clear()  # (a JSON line on the terminal after the bar's, not glued to it)
            send(sys.stdout, write, gone)

        size = _size(runs_file)

        def work() -> None:
            nonlocal runs_total
            chunks = _chunks(_read_runs(runs_file), chunk)
            # Each run id's first line: a later line of an id seen is skipped (two records of a run
            # were two scores, which compare then named). Kept as a 16-byte digest, about 100 bytes
            # a run whatever the id's length. A line without an id is a run of its own: its name
            # (line-N) may be another line's explicit id, and then they are two runs (the skip took
            # one for the other).
            seen: dict[bytes, int] = {}
            while not stop() and (batch := next(chunks, None)) is not None:
                runs: list[tuple[int, dict[str, Any], bool]] = []
                read = batch[-1].read  # (the chunk's last line's end: the share done once it is scored)
                for number, run, _, named, _ in batch:
                    if isinstance(run, str):
                        bad_lines(f"{runs_file}:{number}: skipped: {run}")
                    elif named and (first := seen.setdefault(_digest(run["run_id"]), number)) != number:
                        bad_lines(f"{runs_file}:{number}: skipped: a run id already seen (line {first}'s)")
                    else:
                        runs.append((number, run, named))
                scored = list(scorer.score_runs([run for _, run, _ in runs]))  # (a second signal drops the chunk)
                with stop.deferred():  # its records are written whole
                    runs_total += len(runs)
                    for index, result, outcome in scored:
                        number, _, named = runs[index]
                        if result is None:  # a stop came before its retry: not recorded, not failed
                            not_scored(
                                f"{runs_file}:{number}: run {outcome.run}: scorer {outcome.scorer_id} not scored"
                                " (interrupted: stopped before its retry)"
                            )
                            if as_json:
                                line = json.dumps(
                                    {
                                        "line": number,
                                        "run_id": outcome.run,
                                        "scorer_id": outcome.scorer_id,
                                        "skipped": "interrupted",
                                    }
                                )
                                emit(functools.partial(click.echo, line))
                            continue
                        if out_file is not None:
                            out_file.write(_out_line(number, outcome, named))
                        if not isinstance(result, ScoreResult):
                            failures(f"{runs_file}:{number}: {result}")
                        if as_json:
                            line = (
                                json_line(result, line=number)
                                if isinstance(result, ScoreResult)
                                else json.dumps(
                                    {
                                        "line": number,
                                        "run_id": outcome.run,
                                        "scorer_id": outcome.scorer_id,
                                        "error": str(result),
                                    }
                                )
                            )
                            emit(functools.partial(click.echo, line))
                        shown.add([outcome])
                    # Each chunk's rows reach a pipe now, not when the buffer fills.
                    shown.flush()
                    emit(sys.stdout.flush)
                    skipped = f"{bad_lines.count:,} bad lines skipped" if bad_lines.count else ""
                    # The share of the file's bytes read (its ETA with it), as compare's and
                    # backfill's; a pipe's size is unknown: none (a file growing meanwhile, 100 %).
                    done = min(1.0, read / size) if size else None
                    reporter.update("scoring", runs_total, "runs", done, extra=skipped)

        reporter.start("scoring")
        try:
            stopped = stop.run(work) or stop()
        finally:
            reporter.close()
            scorer.close()
            restore_hooks()
            if out_file is not None:
                out_file.close()
            bad_lines.close()
            failures.close()
            not_scored.close()
        elapsed = time.perf_counter() - started

        not_scorable = summary.not_scorable_total
        footer = (
            f"{runs_total:,} runs × {len(scorers)} scorers: "
            f"{summary.scores_total - summary.failed_total - not_scorable:,} scored, {not_scorable:,} not scorable, "
            f"{summary.failed_total:,} failed, "
            + (f"{not_scored.count:,} not scored (interrupted), " if not_scored.count else "")
            + f"{bad_lines.count:,} bad lines skipped, {elapsed:.2f}s"
            + (f"; every record written to {out}" if out_file is not None and out_file.error is None else "")
        )
        click.echo(
            "\n"
            + summary.render(
                title=f"scores by scorer ({runs_total:,} runs)",
                hint="every score as a row: --table · every record to a file: --out scores.jsonl",
            ),
            err=as_json or output_closed(),  # (stdout's reader gone: the summary is still said)
        )
        for line in spend_lines(ledger.spend.as_json()):
            click.echo(line, err=True)
        click.echo(footer, err=True)
        if stopped:
            why = f"stopped: {READER_LEFT}" if output_closed() else "interrupted"
            but = f", but for the {not_scored.count:,} scores named above as not scored" if not_scored.count else ""
            click.echo(
                f"{why}: the summary{' and --out' if out_file is not None else ''} hold the {runs_total:,} runs"
                f" scored before the stop{but}",
                err=True,
            )
            raise SystemExit(EXIT_OUTPUT_CLOSED if output_closed() else 130)
        if out_file is not None and out_file.error is not None:
            raise CliError(
                f"cannot write --out {out}: {out_file.error}; the summary above has the scores, the file does not"
            )
        if bad_lines.count and not runs_total:
            raise CliError(f"every line of {runs_file} was malformed ({bad_lines.count:,} lines)")
        if summary.failed_total and summary.failed_total == summary.scores_total:
            raise CliError(f"every score failed ({summary.failed_total:,}); see the errors above")
