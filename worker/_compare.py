"""How each scorer's scores moved between two record files (``tracescore compare OLD NEW``).

Both files are score records as ``tracescore backfill --out`` or ``tracescore score --out``
write them. Records are matched by (trace id, span id, scorer id), or (run id, scorer id) for
``score`` output (a run without an id by its line, never with an explicit id of its name),
whatever the scorer version (the last record of a key counts on each side).
Each side is read into a SQLite file in a temporary directory, not into memory: a backfill's
millions of records held as Python objects took about 830 bytes each (670 MB for two files of
400,000), so memory stays flat whatever the files' size, and the disk holds about their size
meanwhile.
"""

from __future__ import annotations

import heapq
import io
import math
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker._lines import json_lines, line_run_id
from worker._progress import ProgressReporter

__all__ = ["compare_files"]

_SHOWN_ERRORS = 10
_PROGRESS_EVERY = 1000  # lines or rows between two calls of ``progress`` (it decides what to show)
_SAME = 1e-9  # score differences below this are "unchanged" (float noise)


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
    _heap: list[tuple[float, int, str, str, _Score, _Score]] = field(default_factory=list)

    def add(self, run: str, span: str, old: _Score, new: _Score) -> None:
        """One run in both files: ``run`` its trace id (or run id), ``span`` its span id ("" for
        a record of ``score``: one run a run id)."""
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
        entry = (abs(delta), -self.both, run, span, old, new)
        if len(self._heap) < self.top:
            heapq.heappush(self._heap, entry)
        elif self._heap and entry[:2] > self._heap[0][:2]:  # (--top 0: no heap at all)
            heapq.heapreplace(self._heap, entry)

    def moved_most(self) -> list[tuple[str, str, _Score, _Score]]:
        ordered = sorted(self._heap, key=lambda e: e[:2], reverse=True)
        return [(run, span, old, new) for _, _, run, span, old, new in ordered]

    def as_json(self) -> dict[str, Any]:
        n = self.scored_both
        old_mean = _number(self.old_sum / n) if n else None
        new_mean = _number(self.new_sum / n) if n else None
        return {
            "runs_in_both": self.both,
            "only_old": self.only_old,
            "only_new": self.only_new,
            "scored_in_both": n,
            "mean_old": old_mean,
            "mean_new": new_mean,
            "mean_delta": _number((self.new_sum - self.old_sum) / n) if n else None,
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
                    "span_id": span or None,
                    "old": old.score,
                    "new": new.score,
                    "delta": _number((new.score or 0.0) - (old.score or 0.0)),
                    "old_reason": old.reason,
                    "new_reason": new.reason,
                }
                for run, span, old, new in self.moved_most()
            ],
        }


@dataclass
class _FileReport:
    path: Path
    records: int = 0
    malformed: int = 0
    duplicates: int = 0


_Row = tuple[str, str, str, str, float | int | str | None, str, str]  # key (3), run, score, reason, version
_INT64 = (-(2**63), 2**63 - 1)


def _score(stored: float | int | str | None) -> float | int | None:
    """A score as read back: an integer past 64 bits went in as its digits."""
    return int(stored) if isinstance(stored, str) else stored


def _records(
    path: Path, report: _FileReport, warn: Callable[[str], None], progress: ProgressReporter, phase: str
) -> Iterator[_Row]:
    """A row per good line (see ``_Row``); bad lines are reported (file:line), counted, skipped."""
    size = path.stat().st_size  # (0 for a pipe or a /proc file: no fraction then)
    progress.start(phase)
    for number, data, problem, read, _ in json_lines(path):
        if number % _PROGRESS_EVERY == 0:
            progress.update(phase, number, "lines", read / size if size else None)
        if problem is None:
            problem = _problem(data)
        if problem is not None:
            report.malformed += 1
            if report.malformed <= _SHOWN_ERRORS:
                warn(f"{path}:{number}: skipped: {problem}")
            continue
        report.records += 1
        score = data.get("score")
        if data.get("error_type") or not _finite(score):
            score = None
        elif isinstance(score, int) and not _INT64[0] <= score <= _INT64[1]:
            score = str(score)  # past SQLite's integers: kept exact as text (``_score``)
        reason = data.get("reason") or data.get("not_scorable") or data.get("error_type") or ""
        trace = data.get("trace_id")
        if trace:
            key: tuple[str, str, str] = (str(trace), str(data.get("span_id") or ""), str(data["scorer_id"]))
            run = str(trace)
        else:
            # A run of `score` without an id is its line's (``line_run_id``): any text can be an
            # explicit id, "line-5" too, so the two kinds are kept apart (the span column, unshown
            # for these records, says which). The record says which (``run_id_given``); one of an
            # earlier release, which does not, is its line's when its id is its line's name.
            run = str(data["run_id"])
            line, given = data.get("line"), data.get("run_id_given")
            named = type(line) is not int or data["run_id"] != line_run_id(line)
            of_line = not (given if type(given) is bool else named)
            key = ("", ("line:" if of_line else "id:") + run, str(data["scorer_id"]))
        yield (*key, run, score, str(reason), str(data.get("scorer_version") or "?"))
    if report.malformed > _SHOWN_ERRORS:
        warn(f"{path}: … and {report.malformed - _SHOWN_ERRORS:,} more malformed lines")


def _load(db: sqlite3.Connection, table: str, rows: Iterator[_Row]) -> int:
    """``rows`` into ``table``, the last of a key replacing its values in the first one's place
    (the order runs are met in, for ties among the runs that moved most); its distinct keys."""
    db.execute(
        f"CREATE TABLE {table} (trace TEXT, span TEXT, scorer TEXT, run TEXT, score, reason TEXT, version TEXT,"
        " UNIQUE (trace, span, scorer))"
    )
    db.execute("BEGIN")  # one transaction: a commit a row took four times as long
    db.executemany(
        f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (trace, span, scorer) DO UPDATE SET"
        " run = excluded.run, score = excluded.score, reason = excluded.reason, version = excluded.version",
        rows,
    )
    db.execute("COMMIT")
    (keys,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(keys)


def _number(value: float) -> float | None:
    # Scores near a double's limit sum to infinity, which JSON cannot spell, and two integer
    # scores there differ by an integer past a double's range: no figure instead.
    try:
        return value if math.isfinite(value) else None
    except OverflowError:
        return None


def _finite(score: Any) -> bool:
    try:
        return isinstance(score, int | float) and math.isfinite(score)
    except OverflowError:  # an integer past a double's range
        return False


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


def _ignore(_: str) -> None:
    pass


def compare_files(
    old: Path,
    new: Path,
    *,
    top: int = 5,
    warn: Callable[[str], None] = _ignore,
    progress: ProgressReporter | None = None,
) -> dict[str, Any]:
    """Per scorer: runs in both, mean old → new, up/down/unchanged and the runs that moved most.
    Malformed lines go to ``warn`` (file:line, the first few per file) and are counted; how far
    it got goes to ``progress`` every thousand lines or rows (millions of records take minutes),
    as phases ``reading old`` and ``reading new`` (lines) and ``comparing`` (the new file's
    records); a file that cannot be opened, or a temporary store that cannot be written (a full
    disk), raises ``OSError``."""
    if progress is None:  # (one that shows nothing: its interval never passes)
        progress = ProgressReporter(io.StringIO(), tty=False, interval_s=math.inf)
    old_report, new_report = _FileReport(old), _FileReport(new)
    moves: dict[str, _Moves] = {}

    def scorer(scorer_id: str) -> _Moves:
        return moves.setdefault(scorer_id, _Moves(scorer_id, top))

    try:
        store = tempfile.TemporaryDirectory(prefix="tracescore-compare-")
    except OSError as exc:
        raise OSError(f"cannot make its temporary store in {tempfile.gettempdir()} (TMPDIR): {exc.strerror}") from exc
    with store as tmp:
        db = sqlite3.connect(Path(tmp) / "compare.db", isolation_level=None)
        try:
            # Rebuilt from the files on any failure: no journal, no syncs.
            db.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -32768;")
            # The last record of a key wins on each side, as a re-score replaces; a file
            # compared with itself moves nothing.
            for table, path, report in (("old", old, old_report), ("new", new, new_report)):
                keys = _load(db, table, _records(path, report, warn, progress, f"reading {table}"))
                report.duplicates = report.records - keys
            new_keys = keys  # (the last loaded: the rows compared below)
            progress.start("comparing")
            matched = db.execute(
                "SELECT n.trace, n.span, n.scorer, n.run, n.score, n.reason, n.version, o.score, o.reason, o.version,"
                " o.rowid IS NOT NULL FROM new AS n LEFT JOIN old AS o"
                " ON o.trace = n.trace AND o.span = n.span AND o.scorer = n.scorer ORDER BY n.rowid"
            )
            for done, (
                trace,
                span,
                scorer_id,
                run,
                score,
                reason,
                version,
                old_score,
                old_reason,
                old_version,
                in_old,
            ) in enumerate(matched, 1):
                if done % _PROGRESS_EVERY == 0:
                    progress.update("comparing", done, "records", done / new_keys)
                if not in_old:
                    scorer(scorer_id).only_new += 1
                    continue
                scorer(scorer_id).add(
                    run,
                    span if trace else "",
                    _Score(_score(old_score), old_reason, old_version),
                    _Score(_score(score), reason, version),
                )
            only_old = db.execute(
                "SELECT o.scorer, count(*) FROM old AS o WHERE NOT EXISTS (SELECT 1 FROM new AS n"
                " WHERE n.trace = o.trace AND n.span = o.span AND n.scorer = o.scorer) GROUP BY o.scorer"
            )
            for scorer_id, count in only_old:
                scorer(scorer_id).only_old += count
        except sqlite3.Error as exc:
            raise OSError(f"its temporary store in {tmp} (TMPDIR) failed: {exc}") from exc
        finally:
            db.close()
    return {
        "old": {"path": str(old), "records": old_report.records, "malformed_lines": old_report.malformed},
        "new": {"path": str(new), "records": new_report.records, "malformed_lines": new_report.malformed},
        "duplicates": {"old": old_report.duplicates, "new": new_report.duplicates},
        "by_scorer": {scorer_id: m.as_json() for scorer_id, m in sorted(moves.items())},
    }
