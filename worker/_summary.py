"""The per-scorer summary that ``tracescore backfill`` and ``tracescore score`` print.

Both commands turn each (run, scorer) result into one ``Outcome`` — from a ``ScoreRecord`` (the
workers' and embedded backfill's records, or their JSON read back from Redis) or from a
``ScoreResult`` / ``ScorerError`` (``tracescore score``) — and feed it to one
``SummaryScoreWriter``: the summary and, with ``--table``, a ``ScoreTable`` row.

One accumulator per scorer, fed one score at a time so a file of any size is summarised in
bounded memory: the scores themselves (8 bytes each in an ``array``, enough for millions),
failure and not-scorable counts, and the worst few runs in a heap. ``render`` prints the table
and the worst runs; ``as_json`` gives the same figures to scripts.
"""

from __future__ import annotations

import heapq
import math
import shutil
import threading
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from scorers import Scorer, ScorerError, ScoreResult, ScorerRunError
from scorers.judge import JudgeCallRefused, ModelPrice
from tracing import ScoreRecord
from worker._record_fields import judge_spend, not_scorable_text
from worker._terminal import cell, send

__all__ = [
    "Outcome",
    "ScoreTable",
    "ScorerSummary",
    "Spend",
    "Summary",
    "SummaryScoreWriter",
    "cell",
    "percentile",
    "spend_lines",
]

Direction = Literal["higher", "lower"]
_BARS = "▁▂▃▄▅▆▇█"
_REASON_CHARS = 300  # a kept worst run's reason; enough for the widest terminal line
_DISTINCT_REASONS = 50  # not-scorable / failure reasons counted one by one; the rest are "other"


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th quantile (0–1) of sorted values, interpolating linearly between ranks."""
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One (run, scorer) result as the summary, the table and ``score --out`` show it, with
    ``ScoreRecord``'s field names: a failure (``error_type``), a not-scorable run
    (``not_scorable``: "step: reason") or a score."""

    run: str
    scorer_id: str
    label: str = ""
    scorer_version: str = "1"
    score: float | None = None
    reason: str | None = None
    not_scorable: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    failed_step: str | None = None
    cost_usd: float | None = 0.0  # None: a judge model without a price
    judge_models: Sequence[str] = ()
    judge_calls: int = 0

    @classmethod
    def of_record(cls, record: ScoreRecord | Mapping[str, Any], label: str = "") -> Outcome:
        """A record, or its JSON parsed (the workers' records read back); the run is its trace.
        Its judge spend is left out: summaries show the ledger's, call by call (``Spend``)."""
        # A model's __dict__ is its fields: no copy, as fast as the parsed JSON's dict.
        fields: Mapping[str, Any] = record if isinstance(record, Mapping) else record.__dict__
        return cls(
            fields["trace_id"],
            fields["scorer_id"],
            label=label or fields.get("span_name") or "",
            scorer_version=fields.get("scorer_version") or "1",
            score=fields.get("score"),
            reason=fields.get("reason"),
            not_scorable=fields.get("not_scorable"),
            error_type=fields.get("error_type"),
            error_message=fields.get("error_message"),
            failed_step=fields.get("failed_step"),
        )

    @classmethod
    def of_result(
        cls, run: str, scorer: Scorer, result: ScoreResult | ScorerError, prices: Mapping[str, ModelPrice]
    ) -> Outcome:
        """What a scorer returned for ``run`` (``tracescore score``), worded as the worker's
        records are, with what its judge calls cost by ``prices`` (a failed run's too: its
        ``partial`` result holds the steps that were paid for)."""
        spent = result if isinstance(result, ScoreResult) else getattr(result, "partial", None)
        judged = judge_spend(spent if isinstance(spent, ScoreResult) else None, prices)
        if isinstance(result, ScoreResult):
            return cls(
                run,
                scorer.id,
                scorer_version=scorer.version,
                score=result.score,
                reason=result.reason,
                not_scorable=not_scorable_text(result),
                **judged,
            )
        cause = result.cause if isinstance(result, ScorerRunError) else result
        # A refused judge call says why (budget_exhausted, ...), and RunLimitError "timeout" /
        # "memory", as the worker's records do.
        refused = cause.error_type if isinstance(cause, JudgeCallRefused) else None
        return cls(
            run,
            scorer.id,
            scorer_version=scorer.version,
            error_type=refused or getattr(result, "error_type", None) or type(cause).__name__,
            error_message=str(result),
            failed_step=getattr(result, "failed_step", None),
            **judged,
        )

    def cells(self) -> tuple[str, str]:
        """The table's score and reason: as the summary words failures and not-scorable runs."""
        if self.error_type:
            return "error", f"{self.error_type}: {self.error_message or ''}"
        if self.score is None:
            return "n/a", self.not_scorable or self.reason or ""
        return f"{self.score:.3f}", self.reason or ""


@dataclass(order=True)
class _Worst:
    badness: float  # the heap keeps the largest: -score for higher-is-better scorers
    order: int  # ties: the first seen stays
    score: float = field(compare=False)
    run: str = field(compare=False)
    label: str = field(compare=False)
    reason: str = field(compare=False)


def _count(counter: Counter[str], key: str) -> None:
    if key in counter or len(counter) < _DISTINCT_REASONS:
        counter[key] += 1
    else:
        counter["other"] += 1


@dataclass
class ScorerSummary:
    """Everything the summary shows for one scorer."""

    scorer_id: str
    direction: Direction = "higher"
    score_range: tuple[float, float] | None = None
    worst_n: int = 3
    scores: array[float] = field(default_factory=lambda: array("d"))
    failed: Counter[str] = field(default_factory=Counter)
    # The first failure of each kind (run, message): what to look at first.
    failure_examples: dict[str, tuple[str, str]] = field(default_factory=dict)
    not_scorable: Counter[str] = field(default_factory=Counter)
    _worst: list[_Worst] = field(default_factory=list)
    _seen: int = 0

    @property
    def runs(self) -> int:
        return len(self.scores) + sum(self.failed.values()) + sum(self.not_scorable.values())

    def add_score(self, score: float, run: str, label: str, reason: str) -> None:
        self.scores.append(score)
        self._seen += 1
        if self.worst_n <= 0:
            return
        badness = score if self.direction == "lower" else -score
        full = len(self._worst) >= self.worst_n
        if full and (badness, -self._seen) <= (self._worst[0].badness, self._worst[0].order):
            return  # the common case: not among the worst, nothing to build
        entry = _Worst(badness, -self._seen, score, run, label, cell(reason, _REASON_CHARS))
        if full:
            heapq.heapreplace(self._worst, entry)
        else:
            heapq.heappush(self._worst, entry)

    def add_failure(self, error_type: str, run: str = "", message: str = "") -> None:
        kind = error_type or "error"
        _count(self.failed, kind)
        if kind not in self.failure_examples and len(self.failure_examples) < _DISTINCT_REASONS:
            self.failure_examples[kind] = (run, cell(message, _REASON_CHARS))

    def add_not_scorable(self, reason: str) -> None:
        _count(self.not_scorable, cell(reason or "no reason given", 80))

    def worst(self) -> list[_Worst]:
        return sorted(self._worst, reverse=True)

    def stats(self) -> dict[str, float]:
        ordered = sorted(self.scores)
        if not ordered:
            return {}
        return {
            "mean": math.fsum(ordered) / len(ordered),
            "min": ordered[0],
            "p10": percentile(ordered, 0.1),
            "median": percentile(ordered, 0.5),
            "p90": percentile(ordered, 0.9),
            "max": ordered[-1],
        }

    def histogram(self, bins: int = 10) -> tuple[float, float, list[int]]:
        """(low, high, counts): over the scorer's declared range, else the observed one."""
        if not self.scores:
            return 0.0, 0.0, []
        low, high = min(self.scores), max(self.scores)
        if self.score_range is not None and all(math.isfinite(v) for v in self.score_range):
            low, high = min(low, self.score_range[0]), max(high, self.score_range[1])
        counts = [0] * bins
        span = high - low
        for value in self.scores:
            index = int((value - low) / span * bins) if span > 0 else 0
            counts[min(max(index, 0), bins - 1)] += 1
        return low, high, counts

    def as_json(self) -> dict[str, Any]:
        stats = self.stats()
        return {
            "direction": self.direction,
            "runs": self.runs,
            "scored": len(self.scores),
            **{k: round(v, 6) for k, v in stats.items()},
            "failed": sum(self.failed.values()),
            "failed_by_reason": dict(self.failed),
            "failure_examples": {k: {"run": run, "error": msg} for k, (run, msg) in self.failure_examples.items()},
            "not_scorable": sum(self.not_scorable.values()),
            "not_scorable_reasons": dict(self.not_scorable),
            "worst": [{"score": w.score, "run": w.run, "label": w.label, "reason": w.reason} for w in self.worst()],
        }


def _sparkline(counts: list[int]) -> str:
    top = max(counts, default=0)
    if top == 0:
        return ""
    return "".join(" " if c == 0 else _BARS[min(len(_BARS) - 1, (c * len(_BARS) - 1) // top)] for c in counts)


def _number(value: float) -> str:
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.4g}"


@dataclass
class Spend:
    """Judge spend, call by call: USD per scorer and per model called, every judge call sent
    (failed ones too), and the calls to models with no price, per model. Tallied in process
    (``add_call``: the in-memory ledger of ``score`` and an embedded backfill) or read from a
    Redis job's spend hash, which the workers' ledger adds to the same way (``of_job``): one
    meaning on both paths, the calls of a run that got no record (a stop, a replaced try) too."""

    by_scorer: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_model: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: int = 0
    unpriced_calls: Counter[str] = field(default_factory=Counter)
    # A job's hash whose spend an earlier release first counted, which kept no count of calls
    # (``calls`` holds this release's calls alone), or whose count is no number: ``judge_calls`` null.
    calls_unknown: bool = False

    def add_call(self, scorer_id: str, model: str, cost_usd: float | None) -> None:
        """One judge call by ``scorer_id``'s run: its cost (0 for a failed call, None: no price)."""
        self.calls += 1
        if cost_usd is None:
            self.unpriced_calls[model] += 1
        elif cost_usd:  # (a failed or free call names no scorer or model: the hash has no field for it)
            self.by_scorer[scorer_id] += cost_usd
            self.by_model[model] += cost_usd

    @classmethod
    def of_job(cls, fields: Mapping[str, float | None]) -> Spend:
        """A job's spend hash (``worker._budget``: ``scorer:<id>``, ``model:<id>``, ``total``,
        ``calls``, ``unpriced:<model>``, ``calls_unknown``); a field that is no number (None,
        counted where it was read) is left out. A hash with spend and no ``calls`` (an earlier
        release's) or an unreadable one, or marked when this release first counted a call in one,
        has unknown calls."""
        # (no calls field, or one that is no number: left out, the calls are not known to be 0)
        spend = cls(calls_unknown="calls_unknown" in fields or (bool(fields) and fields.get("calls") is None))
        for name, value in fields.items():
            if value is None:
                continue
            kind, _, key = name.partition(":")
            if kind == "scorer":
                spend.by_scorer[key] += value
            elif kind == "model":
                spend.by_model[key] += value
            elif kind == "unpriced":
                spend.unpriced_calls[key] += int(value)
            elif name == "calls":
                spend.calls = int(value)
        return spend

    def as_json(self) -> dict[str, Any]:
        return {
            "total_usd": sum(self.by_scorer.values()),
            "by_scorer": dict(self.by_scorer),
            "by_model": dict(self.by_model),
            "judge_calls": None if self.calls_unknown else self.calls,
            "unpriced_calls": dict(self.unpriced_calls),
        }


def spend_lines(spend: Mapping[str, Any] | None) -> list[str]:
    """A ``Spend.as_json()`` for a summary footer (nothing when no judge was called)."""
    # (a job's hash an earlier release wrote counts no calls: its spend is shown all the same)
    if not spend or not (spend.get("judge_calls") or spend.get("total_usd") or spend.get("unpriced_calls")):
        return []
    calls = spend["judge_calls"]
    said = (
        f"{calls:,} judge calls"
        if calls is not None
        else "judge calls unknown: the job's spend was first counted by an earlier release, which kept no"
        " count of calls, or its count is no number"
    )
    out = [f"  judge spend       {spend['total_usd']:.4f} USD   ({said})"]
    out += [f"    scorer {k}: {v:.4f} USD" for k, v in sorted(spend["by_scorer"].items(), key=lambda kv: -kv[1])]
    out += [f"    model  {k}: {v:.4f} USD" for k, v in sorted(spend["by_model"].items(), key=lambda kv: -kv[1])]
    out += [
        f"    model  {k}: unpriced ({v:,} calls; add it to TRACESCORE_PRICES)"
        for k, v in spend.get("unpriced_calls", {}).items()
    ]
    return out


class Summary:
    """The per-scorer summary of one command: add scores as they come, render once at the end."""

    def __init__(self, scorers: Mapping[str, Scorer] | Iterable[str], *, worst_n: int = 3) -> None:
        self.worst_n = worst_n
        self.by_scorer: dict[str, ScorerSummary] = {}
        self._lock = threading.Lock()
        items = scorers.items() if isinstance(scorers, Mapping) else ((s, None) for s in scorers)
        for scorer_id, scorer in items:
            self._scorer(scorer_id, scorer)

    def _scorer(self, scorer_id: str, scorer: Scorer | None = None) -> ScorerSummary:
        summary = self.by_scorer.get(scorer_id)
        if summary is None:
            direction: Direction = "lower" if getattr(scorer, "direction", "higher") == "lower" else "higher"
            summary = ScorerSummary(scorer_id, direction, getattr(scorer, "score_range", None), worst_n=self.worst_n)
            self.by_scorer[scorer_id] = summary
        return summary

    def add(self, outcome: Outcome) -> None:
        """One outcome: an error, a not-scorable run, or a score. (Its judge spend is the
        ledger's, call by call: ``Spend``.)"""
        with self._lock:
            summary = self._scorer(outcome.scorer_id)
            if outcome.error_type:
                summary.add_failure(outcome.error_type, outcome.run, outcome.error_message or "")
            elif outcome.score is None or not math.isfinite(outcome.score):
                summary.add_not_scorable(outcome.not_scorable or outcome.reason or "")
            else:
                summary.add_score(outcome.score, outcome.run, outcome.label, outcome.reason or "")

    @property
    def scores_total(self) -> int:
        return sum(s.runs for s in self.by_scorer.values())

    @property
    def not_scorable_total(self) -> int:
        return sum(sum(s.not_scorable.values()) for s in self.by_scorer.values())

    @property
    def failed_total(self) -> int:
        return sum(sum(s.failed.values()) for s in self.by_scorer.values())

    def as_json(self) -> dict[str, Any]:
        return {scorer_id: s.as_json() for scorer_id, s in self.by_scorer.items()}

    def render(self, width: int | None = None, *, title: str = "", hint: str = "") -> str:
        """The table (runs, mean, min/p10/median/p90/max, failed, not scorable, distribution),
        then each scorer's worst runs with their reasons; ``title`` above, ``hint`` below."""
        width = width or max(80, min(shutil.get_terminal_size((120, 20)).columns, 160))
        if not self.by_scorer:
            return "no scorers"
        name_w = max(12, *(len(s) + 2 for s in self.by_scorer))
        head = (
            f"{'scorer':<{name_w}} {'runs':>6} {'mean':>6} {'min':>6} {'p10':>6} {'median':>6} {'p90':>6} "
            f"{'max':>6} {'failed':>6} {'n/a':>5}  distribution"
        )
        lines = [title] if title else []
        lines += [head, "-" * min(width, len(head) + 6)]
        lower = False
        for scorer_id, s in self.by_scorer.items():
            name = scorer_id + (" ↓" if s.direction == "lower" else "")
            lower = lower or s.direction == "lower"
            stats = s.stats()
            figures = " ".join(
                f"{_number(stats[k]) if stats else '-':>6}" for k in ("mean", "min", "p10", "median", "p90", "max")
            )
            low, high, counts = s.histogram()
            spark = f"{low:g} [{_sparkline(counts)}] {high:g}" if counts else ""
            lines.append(
                f"{name:<{name_w}} {s.runs:>6,} {figures} {sum(s.failed.values()):>6,} "
                f"{sum(s.not_scorable.values()):>5,}  {spark}"
            )
        if lower:
            lines.append("↓ lower is better (its worst runs are its highest scores)")
        shown = [w for s in self.by_scorer.values() for w in s.worst()]
        runs_shown = [w.run for w in shown] + [
            r for s in self.by_scorer.values() for r, _ in s.failure_examples.values()
        ]
        run_w = min(40, max((len(r) for r in runs_shown), default=0))
        label_w = min(18, max((len(w.label) for w in shown), default=0))
        for scorer_id, s in self.by_scorer.items():
            notes = []
            if s.failed:
                notes.append("failed: " + ", ".join(f"{k} {v:,}" for k, v in s.failed.most_common(3)))
            if s.not_scorable:
                notes.append(
                    "not scorable: " + ", ".join(f"{cell(k, 60)!r} {v:,}" for k, v in s.not_scorable.most_common(2))
                )
            worst = s.worst()
            if not worst and not notes:
                continue
            lines.append("")
            lines.append(
                (f"{scorer_id}: worst {len(worst)} run(s)" if worst else f"{scorer_id}: no scores")
                + (f"   ({'; '.join(notes)})" if notes else "")
            )
            for w in worst:
                label = f"{cell(w.label, label_w):<{label_w}}  " if label_w else ""
                fixed = f"  {_number(w.score):>7}  {cell(w.run, run_w):<{run_w}}  {label}"
                lines.append(fixed + cell(w.reason, max(10, width - len(fixed))))
            for kind, (run, message) in list(s.failure_examples.items())[:3]:
                fixed = f"  {'failed':>7}  {cell(run, run_w):<{run_w}}  "
                lines.append(fixed + cell(f"{kind}: {message}", max(10, width - len(fixed))))
        if hint:
            lines += ["", hint]
        return "\n".join(lines)


class ScoreTable:
    """One row per score as it is made (``--table``): run, scorer, score, reason; for traces
    (``backfill``) the trace id's first 12 characters and the agent instead of the run."""

    def __init__(
        self,
        stream: IO[str],
        *,
        traces: bool = False,
        width: int | None = None,
        before_write: Callable[[], None] | None = None,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        self.stream = stream
        self.traces = traces
        self.width = width or max(80, min(shutil.get_terminal_size((120, 20)).columns, 160))
        self.before_write = before_write  # a progress bar clears its line first
        # Its reader gone (``| head``): no more rows, and the command asked to stop (``reader_left``).
        self.on_closed = on_closed
        self.closed = False
        self._header = False

    def _line(self, run: str, label: str, scorer: str, score: str, reason: str) -> str:
        lead = f"{run[:12]:<12}  {cell(label, 18):<18}  " if self.traces else f"{cell(run, 24):<24}  "
        fixed = f"{lead}{cell(scorer, 20):<20}  {score:>7}  "
        return fixed + cell(reason, max(10, self.width - len(fixed)))

    def rows(self, outcomes: Sequence[Outcome]) -> None:
        if not outcomes:
            return
        if self.before_write is not None:
            self.before_write()
        lines = []
        if not self._header:
            run = "trace" if self.traces else "run"
            lines.append(self._line(run, "agent", "scorer", "score", "reason"))
            lines.append(self._line("-" * (12 if self.traces else 24), "-" * 18, "-" * 20, "-" * 7, "-" * 6))
            self._header = True
        lines += [self._line(o.run, o.label, o.scorer_id, *o.cells()) for o in outcomes]
        self._send(lambda: self.stream.write("\n".join(lines) + "\n"))

    def flush(self) -> None:
        self._send(self.stream.flush)

    def _send(self, write: Callable[[], object]) -> None:
        if not self.closed:
            self.closed = not send(self.stream, write, self.on_closed or (lambda: None))


class SummaryScoreWriter:
    """Feeds the summary and, given a ``table``, a row per score: ``score`` adds its outcomes,
    embedded backfill writes its records (a ``ScoreWriter``; ``agents`` maps scored span ids to
    agent names, the records' labels)."""

    def __init__(
        self, summary: Summary, table: ScoreTable | None = None, agents: Mapping[str, str] | None = None
    ) -> None:
        self.summary = summary
        self.table = table
        self.agents = agents if agents is not None else {}
        self._lock = threading.Lock()  # one batch's rows together

    def add(self, outcomes: Sequence[Outcome]) -> None:
        with self._lock:
            for outcome in outcomes:
                self.summary.add(outcome)
            if self.table is not None:
                self.table.rows(outcomes)

    def write(self, records: Sequence[ScoreRecord]) -> None:
        self.add([Outcome.of_record(r, self.agents.get(r.span_id, "")) for r in records])
        self.flush()

    def flush(self, timeout_s: float = 10.0) -> bool:
        if self.table is not None:
            self.table.flush()
        return True

    def close(self) -> None:
        self.flush()
