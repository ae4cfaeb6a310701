"""``tracescore score``: score a JSON Lines file of runs in this process and print a table."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from scorers import Scorer, ScorerError, ScoreResult, ScorerRunError
from worker._cli_common import CliError
from worker._registry import RegistryError, load_registry

__all__ = ["score_command"]


def _read_runs(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, run) pairs; a line that is not a JSON object yields an error string."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                run = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, f"not JSON ({exc.msg} at column {exc.colno})"
                continue
            if not isinstance(run, dict) or "output" not in run:
                yield number, "expected an object with at least 'input' and 'output'"
                continue
            yield number, run


async def _score_all(
    scorers: list[Scorer], runs: list[tuple[int, dict[str, Any]]], concurrency: int
) -> list[tuple[int, str, Scorer, ScoreResult | ScorerError]]:
    gate = asyncio.Semaphore(concurrency)

    async def one(
        number: int, run: dict[str, Any], scorer: Scorer
    ) -> tuple[int, str, Scorer, ScoreResult | ScorerError]:
        run_id = str(run.get("run_id") or f"line-{number}")
        async with gate:
            try:
                result: ScoreResult | ScorerError = await scorer.run(
                    input=run.get("input"),
                    output=run["output"],
                    run_id=run_id,
                    ground_truth=run.get("ground_truth"),
                    request_context=run.get("request_context"),
                )
            except ScorerError as exc:
                result = exc
        return number, run_id, scorer, result

    return await asyncio.gather(*(one(n, r, s) for n, r in runs for s in scorers))


def _cell(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command("score")
@click.argument("runs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scorers", "module", required=True, help="Module that defines the scorers, e.g. examples.scorers.")
@click.option("--scorer", "only", multiple=True, help="Only this scorer id (repeatable).")
@click.option("--concurrency", default=32, show_default=True, help="Runs scored at once.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result per line instead of a table.")
def score_command(runs_file: Path, module: str, only: tuple[str, ...], concurrency: int, as_json: bool) -> None:
    """Score the runs in RUNS_FILE (JSON Lines of {input, output, ...}) right here, no broker.

    \b
    Example:
      tracescore score examples/runs.jsonl --scorers examples.scorers
      tracescore score runs.jsonl --scorers my.scorers --scorer relevancy --json
    """
    try:
        registry = load_registry(module)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc
    unknown = [s for s in only if s not in registry]
    if unknown:
        raise CliError(f"unknown scorer id(s) {', '.join(unknown)}; {module} has: {', '.join(registry)}")
    scorers = [registry[s] for s in (only or registry)]

    runs: list[tuple[int, dict[str, Any]]] = []
    bad = 0
    for number, run in _read_runs(runs_file):
        if isinstance(run, str):
            bad += 1
            click.echo(f"{runs_file}:{number}: skipped: {run}", err=True)
        else:
            runs.append((number, run))

    started = time.perf_counter()
    scored = asyncio.run(_score_all(scorers, runs, max(1, concurrency)))
    elapsed = time.perf_counter() - started

    failures: Counter[str] = Counter()
    rows: list[tuple[str, str, str, str]] = []
    for number, run_id, scorer, result in scored:
        if isinstance(result, ScoreResult):
            if as_json:
                click.echo(result.model_dump_json())
            value = "n/a" if result.score is None else f"{result.score:.3f}"
            note = result.reason or (result.not_scorable or {}).get("reason", "")
        else:
            failures[type(result.cause if isinstance(result, ScorerRunError) else result).__name__] += 1
            if as_json:
                click.echo(json.dumps({"run_id": run_id, "scorer_id": scorer.id, "error": str(result)}))
            value, note = "error", str(result)
            click.echo(f"{runs_file}:{number}: {result}", err=True)
        rows.append((run_id, scorer.id, value, note))

    if not as_json:
        widths = (max([6, *(len(r[0]) for r in rows)]), max([6, *(len(r[1]) for r in rows)]), 7)
        click.echo(f"{'run':<{widths[0]}}  {'scorer':<{widths[1]}}  {'score':>{widths[2]}}  reason")
        for run_id, scorer_id, value, note in rows:
            click.echo(f"{run_id:<{widths[0]}}  {scorer_id:<{widths[1]}}  {value:>{widths[2]}}  {_cell(note, 70)}")
    summary = (
        f"{len(runs)} runs × {len(scorers)} scorers: {len(rows) - sum(failures.values())} scored, "
        f"{sum(failures.values())} failed{' ' + dict(failures).__repr__() if failures else ''}, "
        f"{bad} bad lines skipped, {elapsed:.2f}s"
    )
    click.echo(summary, err=as_json)
