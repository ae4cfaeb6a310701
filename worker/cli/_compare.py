"""``tracescore compare OLD.jsonl NEW.jsonl``: prints ``worker._compare.compare_files`` as a
table (or JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from worker._compare import compare_files
from worker._progress import ProgressReporter
from worker._terminal import cell
from worker.cli._common import CliError, input_caps, json_option

__all__ = ["compare_command"]


def _fmt(value: float | None) -> str:
    # Scores are usually in [0, 1]; one far outside (1e308) stays a short cell, not 300 digits.
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 1e6 else f"{value:.3g}"


def _render(result: dict[str, Any], width: int = 120) -> str:
    lines = [
        f"compare {result['old']['path']} ({result['old']['records']:,} records) → "
        f"{result['new']['path']} ({result['new']['records']:,} records)",
        "",
        f"{'scorer':<22} {'both':>6} {'mean old':>9} {'mean new':>9} {'delta':>8} {'up':>6} {'down':>6} "
        f"{'same':>6} {'only old':>8} {'only new':>8}  versions",
    ]
    for scorer_id, m in result["by_scorer"].items():
        delta = m["mean_delta"]
        versions = cell(f"{','.join(m['versions_old']) or '-'} → {','.join(m['versions_new']) or '-'}", 40)
        lines.append(
            f"{cell(scorer_id, 22):<22} {m['runs_in_both']:>6,} {_fmt(m['mean_old']):>9} {_fmt(m['mean_new']):>9} "
            f"{'-' if delta is None else f'{delta:+.3f}':>8} {m['up']:>6,} {m['down']:>6,} {m['unchanged']:>6,} "
            f"{m['only_old']:>8,} {m['only_new']:>8,}  {versions}"
        )
    for scorer_id, m in result["by_scorer"].items():
        extra = []
        if m["newly_failed_or_not_scorable"]:
            extra.append(f"{m['newly_failed_or_not_scorable']:,} no longer scored (failed or not scorable)")
        if m["newly_scored"]:
            extra.append(f"{m['newly_scored']:,} newly scored")
        if not m["moved_most"] and not extra:
            continue
        lines += ["", f"{cell(scorer_id, 60)}: moved most" + (f"   ({'; '.join(extra)})" if extra else "")]
        for move in m["moved_most"]:
            delta = "-" if move["delta"] is None else f"{move['delta']:+.3f}"
            run = " ".join(filter(None, (move["run"], move["span_id"])))
            lines.append(f"  {_fmt(move['old'])} → {_fmt(move['new'])} ({delta})  {cell(run, 60)}")
            lines.append("      old: " + cell(move["old_reason"], width - 11))
            lines.append("      new: " + cell(move["new_reason"], width - 11))
    if not result["by_scorer"]:
        lines.append("(no records in either file)")
    for side in ("old", "new"):
        if result["duplicates"][side]:
            lines += [
                "",
                f"{side}: {result['duplicates'][side]:,} record(s) of a run and scorer already read; the last one"
                " counts (a re-score replaces; two different runs under one run id are one here)",
            ]
    return "\n".join(lines)


@click.command("compare")
@click.argument("old", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--top", type=click.IntRange(0, 1000), default=5, show_default=True, help="Runs shown per scorer.")
@json_option("Print the comparison as one JSON object.")
def compare_command(old: Path, new: Path, top: int, as_json: bool) -> None:
    """Show how each scorer's scores moved between two record files (OLD → NEW).

    The files are what `tracescore backfill --out` or `tracescore score --out` write, e.g.
    before and after a scorer's version changed. Records are matched by trace, span and scorer
    (or run id and scorer); malformed lines are reported as file:line, counted and skipped.

    \b
    Example:
      tracescore backfill traces/ --scorers my.scorers --out new.jsonl
      tracescore compare old.jsonl new.jsonl
    """
    # Progress on stderr as score's and backfill's (a bar on a terminal, else a line every 5 s):
    # two files of millions of records take minutes, and nothing was said until the table.
    input_caps()
    reporter = ProgressReporter()
    try:
        result = compare_files(old, new, top=top, warn=reporter.message, progress=reporter)
    except OSError as exc:
        if exc.filename is None:  # the temporary store, not an input
            raise CliError(f"compare failed: {exc}") from exc
        raise CliError(f"cannot read {exc.filename}: {exc.strerror or exc}") from exc
    finally:
        reporter.clear()  # (the table gives the counts; no bar left above it)
    click.echo(json.dumps(result, allow_nan=False) if as_json else _render(result))
    for side in ("old", "new"):
        info = result[side]
        if info["malformed_lines"] and not info["records"]:
            raise CliError(
                f"every line of {info['path']} was malformed ({info['malformed_lines']:,}): no score records"
            )
