"""``tracescore compare OLD.jsonl NEW.jsonl``: how each scorer's scores moved between two runs.

Both files are score records as ``tracescore backfill --out`` or ``tracescore score --out``
write them. Records are matched by (trace id, span id, scorer id), or (run id, scorer id) for
``score`` output, whatever the scorer version; the old file is held in memory (one small tuple
per record), the new one is streamed.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from worker._summary import cell
from worker.cli._common import CliError

__all__ = ["compare_command", "compare_files"]

_SHOWN_ERRORS = 10
_SAME = 1e-9  # score differences below this are "unchanged" (float noise)

Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class _Score:
    score: float | None  # None: failed or not scorable
    reason: str
    version: str


@dataclass
class _Moves:
    scorer_id: str
    top: int
    both: int = 0
    only_old: int = 0
    only_new: int = 0
    old_sum: float = 0.0
    new_sum: float = 0.0
    scored_both: int = 0
    up: int = 0
    down: int = 0
    unchanged: int = 0
    newly_failed: int = 0
    newly_scored: int = 0
    versions_old: set[str] = field(default_factory=set)
    versions_new: set[str] = field(default_factory=set)
    _heap: list[tuple[float, int, str, _Score, _Score]] = field(default_factory=list)

    def add(self, run: str, old: _Score, new: _Score) -> None:
        self.both += 1
        self.versions_old.add(old.version)
        self.versions_new.add(new.version)
        if old.score is None or new.score is None:
            if old.score is None and new.score is not None:
                self.newly_scored += 1
            elif new.score is None and old.score is not None:
                self.newly_failed += 1
            return
        self.scored_both += 1
        self.old_sum += old.score
        self.new_sum += new.score
        delta = new.score - old.score
        if delta > _SAME:
            self.up += 1
        elif delta < -_SAME:
            self.down += 1
        else:
            self.unchanged += 1
            return
        entry = (abs(delta), -self.both, run, old, new)
        if len(self._heap) < self.top:
            heapq.heappush(self._heap, entry)
        elif entry[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, entry)

    def moved_most(self) -> list[tuple[str, _Score, _Score]]:
        return [(run, old, new) for _, _, run, old, new in sorted(self._heap, key=lambda e: e[:2], reverse=True)]

    def as_json(self) -> dict[str, Any]:
        n = self.scored_both
        old_mean = self.old_sum / n if n else None
        new_mean = self.new_sum / n if n else None
        return {
            "runs_in_both": self.both,
            "only_old": self.only_old,
            "only_new": self.only_new,
            "scored_in_both": n,
            "mean_old": old_mean,
            "mean_new": new_mean,
            "mean_delta": (self.new_sum - self.old_sum) / n if n else None,
            "up": self.up,
            "down": self.down,
            "unchanged": self.unchanged,
            "newly_failed_or_not_scorable": self.newly_failed,
            "newly_scored": self.newly_scored,
            "versions_old": sorted(self.versions_old),
            "versions_new": sorted(self.versions_new),
            "moved_most": [
                {
                    "run": run,
                    "old": old.score,
                    "new": new.score,
                    "delta": (new.score or 0.0) - (old.score or 0.0),
                    "old_reason": old.reason,
                    "new_reason": new.reason,
                }
                for run, old, new in self.moved_most()
            ],
        }


@dataclass
class _FileReport:
    path: Path
    records: int = 0
    malformed: int = 0
    duplicates: int = 0


def _records(path: Path, report: _FileReport) -> Iterator[tuple[Key, str, _Score]]:
    """(key, run label, score) per good line; bad lines are reported (file:line), counted, skipped."""
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            problem = None
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                data, problem = None, f"not JSON ({exc.msg} at column {exc.colno})"
            if problem is None:
                problem = _problem(data)
            if problem is not None:
                report.malformed += 1
                if report.malformed <= _SHOWN_ERRORS:
                    click.echo(f"{path}:{number}: skipped: {problem}", err=True)
                continue
            report.records += 1
            score = data.get("score")
            if data.get("error_type") or not isinstance(score, int | float) or not math.isfinite(score):
                score = None
            reason = data.get("reason") or data.get("not_scorable") or data.get("error_type") or ""
            trace = data.get("trace_id")
            if trace:
                key: Key = (str(trace), str(data.get("span_id") or ""), str(data["scorer_id"]))
                run = str(trace)
            else:
                key = ("", str(data["run_id"]), str(data["scorer_id"]))
                run = str(data["run_id"])
            yield key, run, _Score(score, str(reason), str(data.get("scorer_version") or "?"))
    if report.malformed > _SHOWN_ERRORS:
        click.echo(f"{path}: … and {report.malformed - _SHOWN_ERRORS:,} more malformed lines", err=True)


def _problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "expected a score record (a JSON object)"
    if not isinstance(data.get("scorer_id"), str):
        return "no 'scorer_id': not a score record from tracescore backfill/score --out"
    if not data.get("trace_id") and not data.get("run_id"):
        return "no 'trace_id' or 'run_id' to match the record by"
    score = data.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        return f"'score' must be a number or null, got {type(score).__name__}"
    return None


def compare_files(old: Path, new: Path, *, top: int = 5) -> dict[str, Any]:
    """Per scorer: runs in both, mean old → new, up/down/unchanged and the runs that moved most."""
    old_report, new_report = _FileReport(old), _FileReport(new)
    previous: dict[Key, tuple[str, _Score]] = {}
    for key, run, score in _records(old, old_report):
        if key in previous:
            old_report.duplicates += 1  # the last record of a key wins, as a re-score replaces
        previous[key] = (run, score)
    moves: dict[str, _Moves] = {}

    def scorer(scorer_id: str) -> _Moves:
        return moves.setdefault(scorer_id, _Moves(scorer_id, top))

    seen: set[Key] = set()
    for key, run, score in _records(new, new_report):
        if key in seen:
            new_report.duplicates += 1
            continue
        seen.add(key)
        match = previous.pop(key, None)
        if match is None:
            scorer(key[2]).only_new += 1
        else:
            scorer(key[2]).add(run, match[1], score)
    for key in previous:
        scorer(key[2]).only_old += 1
    return {
        "old": {"path": str(old), "records": old_report.records, "malformed_lines": old_report.malformed},
        "new": {"path": str(new), "records": new_report.records, "malformed_lines": new_report.malformed},
        "duplicates": {"old": old_report.duplicates, "new": new_report.duplicates},
        "by_scorer": {scorer_id: m.as_json() for scorer_id, m in sorted(moves.items())},
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


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
        versions = f"{','.join(m['versions_old']) or '-'} → {','.join(m['versions_new']) or '-'}"
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
        lines += ["", f"{scorer_id}: moved most" + (f"   ({'; '.join(extra)})" if extra else "")]
        for move in m["moved_most"]:
            lines.append(f"  {_fmt(move['old'])} → {_fmt(move['new'])} ({move['delta']:+.3f})  {move['run']}")
            lines.append("      old: " + cell(move["old_reason"], width - 11))
            lines.append("      new: " + cell(move["new_reason"], width - 11))
    if not result["by_scorer"]:
        lines.append("(no records in either file)")
    return "\n".join(lines)


@click.command("compare")
@click.argument("old", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--top", type=click.IntRange(0, 1000), default=5, show_default=True, help="Runs shown per scorer.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON object.")
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
    result = compare_files(old, new, top=top)
    click.echo(json.dumps(result) if as_json else _render(result))
    for side in ("old", "new"):
        info = result[side]
        if info["malformed_lines"] and not info["records"]:
            raise CliError(
                f"every line of {info['path']} was malformed ({info['malformed_lines']:,}): no score records"
            )
