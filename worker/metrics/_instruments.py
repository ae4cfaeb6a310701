"""The recording API: every metric the worker processes write, defined once.

``prometheus_client`` is imported on first use, not with this module: the worker's parent
sets ``PROMETHEUS_MULTIPROC_DIR`` before anything records (``_node.start_node_metrics``), and
the client picks its value store (in-memory, or the shared files of the prefork pool) when it
is imported. A process that never starts a node (``tracescore score``, tests) records into
the client's in-memory values, which nobody reads.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from scorers import JudgeUsage
from tracing import ScoreRecord

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "RECORDED",
    "judge_request_context",
    "observe_batch",
    "observe_broadcast_refused",
    "observe_judge_usage",
    "observe_key_repairs",
    "observe_limiter_wait",
    "observe_records",
    "observe_skipped",
    "observe_unreadable",
    "process_started",
    "reset",
]

# Judge answers take seconds; batches up to the task's time limit (minutes).
_JUDGE_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BATCH_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_LATENCY_BUCKETS: Final = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0)

# A record of a scorer the worker does not know carries the id the message asked for: a
# label value anyone who can publish could pick, so it is folded into one.
UNKNOWN_SCORER: Final = "(unknown)"


@dataclass(frozen=True)
class MetricSpec:
    """One metric as exposed: its Prometheus name (series names add ``_total``,
    ``_bucket``/``_sum``/``_count``), type, labels and help text."""

    name: str
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str


# Everything the worker processes record (the scrape-time gauges are in _collector.py).
RECORDED: Final = (
    MetricSpec(
        "tracescore_runs",
        "counter",
        ("scorer", "outcome", "reason"),
        "Scorer runs finished and stored, by outcome (scored, not_scorable, failed) and reason "
        "(the error_type of failed runs); retry: left unrecorded for another delivery (reason: the "
        "transient error's type, or deferred: claimed by another delivery)",
    ),
    MetricSpec(
        "tracescore_runs_skipped",
        "counter",
        ("scorer", "reason"),
        "Scorer runs a message named that were not scored, by reason: already_scored (a stored record "
        "kept), duplicate (named again in the same message, or recorded first by another delivery)",
    ),
    MetricSpec(
        "tracescore_run_latency_seconds",
        "histogram",
        ("scorer", "source"),
        "From the run's hand-over to the queue (enqueued_at) until its score was stored",
    ),
    MetricSpec("tracescore_batch_duration_seconds", "histogram", (), "Time to score one queue message (a batch)"),
    MetricSpec(
        "tracescore_judge_requests",
        "counter",
        ("model", "outcome"),
        "Requests to judge models, by outcome: ok, or the judge error's type (JudgeRateLimitError is a 429)",
    ),
    MetricSpec(
        "tracescore_judge_request_duration_seconds",
        "histogram",
        ("model",),
        "Duration of one judge request (the provider's answer or error)",
    ),
    MetricSpec(
        "tracescore_judge_retries",
        "counter",
        ("model",),
        "Judge requests sent again after a failed request of the same judge call",
    ),
    MetricSpec(
        "tracescore_judge_tokens",
        "counter",
        ("scorer", "model", "kind"),
        "Judge tokens paid for (every answered judge call, stored or not), by kind: input, output, "
        "cached_input (a part of input)",
    ),
    MetricSpec(
        "tracescore_judge_cost_usd",
        "counter",
        ("scorer", "model"),
        "Judge cost in US dollars by the price table, counted when a call is paid (as the spend ledger)",
    ),
    MetricSpec(
        "tracescore_judge_unpriced_calls",
        "counter",
        ("scorer", "model"),
        "Answered judge calls to a model with no price (their cost is not in the cost counter)",
    ),
    MetricSpec(
        "tracescore_limiter_waits",
        "counter",
        ("model",),
        "Judge calls that had to wait for the shared rate limiter (its per-minute budget, or a 429 pause)",
    ),
    MetricSpec(
        "tracescore_limiter_wait_seconds",
        "counter",
        ("model",),
        "Seconds judge calls spent waiting for the shared rate limiter",
    ),
    MetricSpec(
        "tracescore_store_unreadable_values",
        "gauge",
        ("key",),
        "Reads of values in Redis that could not be read, skipped (since this node started), by key: a "
        "counter or spend field that was not a number (its name), a score_record or checkpoint that did "
        "not validate; each read counts, so a value left unfixed keeps it rising",
    ),
    MetricSpec(
        "tracescore_store_key_repairs",
        "counter",
        ("where",),
        "Keys of ours found holding another Redis type and deleted so the store rebuilds them, by the "
        "store path that found them (a refused key raises StoreKeyTypeError instead); unacked_mutex: "
        "kombu's restore lock, released when nobody could ever take it",
    ),
    MetricSpec(
        "tracescore_broadcasts_refused",
        "counter",
        ("reason",),
        "Broadcasts (Celery remote control on the pub/sub channel) refused before kombu decoded them, "
        "by reason; a broadcast is no queue's message and is not dead-lettered",
    ),
    MetricSpec(
        "tracescore_worker_processes",
        "gauge",
        (),
        "Worker processes scoring on this node (the prefork pool's children, or the worker itself)",
    ),
)


class _Instruments:
    def __init__(self) -> None:
        self.runs: Counter = _build("tracescore_runs")
        self.skipped: Counter = _build("tracescore_runs_skipped")
        self.run_latency: Histogram = _build("tracescore_run_latency_seconds", buckets=_LATENCY_BUCKETS)
        self.batch_duration: Histogram = _build("tracescore_batch_duration_seconds", buckets=_BATCH_BUCKETS)
        self.judge_requests: Counter = _build("tracescore_judge_requests")
        self.judge_duration: Histogram = _build("tracescore_judge_request_duration_seconds", buckets=_JUDGE_BUCKETS)
        self.judge_retries: Counter = _build("tracescore_judge_retries")
        self.tokens: Counter = _build("tracescore_judge_tokens")
        self.cost: Counter = _build("tracescore_judge_cost_usd")
        self.unpriced: Counter = _build("tracescore_judge_unpriced_calls")
        self.limiter_waits: Counter = _build("tracescore_limiter_waits")
        self.limiter_wait_seconds: Counter = _build("tracescore_limiter_wait_seconds")
        self.key_repairs: Counter = _build("tracescore_store_key_repairs")
        self.broadcasts_refused: Counter = _build("tracescore_broadcasts_refused")
        # A gauge (its name and type predate the multiprocess files); "sum" keeps what exited
        # children counted, as a counter would.
        self.unreadable: Gauge = _build("tracescore_store_unreadable_values", multiprocess_mode="sum")
        # livesum: a dead child's file is removed (mark_process_dead), so the sum is the live ones.
        self.processes: Gauge = _build("tracescore_worker_processes", multiprocess_mode="livesum")
        self._children: dict[tuple[object, ...], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: the client's ``labels`` checks and locks on every
        call (~1.4 µs), and each run counts under a few label sets that repeat."""
        key = (id(metric), *values)  # (the metrics live as long as this object)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found


def _build(name: str, **options: Any) -> Any:
    from prometheus_client import Counter, Gauge, Histogram

    spec = next(s for s in RECORDED if s.name == name)
    kind = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[spec.kind]
    # Not in the client's global registry: the node serves the multiprocess files (or, in one
    # process, nothing) through a registry of its own.
    return kind(spec.name, spec.help, spec.labels, registry=None, **options)


_lock = threading.Lock()
_instruments: _Instruments | None = None


def _metrics() -> _Instruments:
    global _instruments
    if _instruments is None:
        with _lock:
            if _instruments is None:
                _instruments = _Instruments()
    return _instruments


def reset() -> None:
    """Build the metric objects again on next use (the node switched the client to its files)."""
    global _instruments
    with _lock:
        _instruments = None


def observe_records(records: Sequence[ScoreRecord], retried: Sequence[tuple[str | None, str]] = ()) -> None:
    """Count the records just stored (first writes only: a duplicate is not counted twice) and
    the runs left unrecorded for another delivery, as ``(scorer_id, reason)``: the transient
    error's type, or ``deferred`` (claimed by another delivery; a scorer the worker does not
    know as None)."""
    if not records and not retried:
        return
    m = _metrics()
    # Counted per label set, one increment each: a batch's hundreds of records share a few.
    runs: dict[tuple[str, str, str], int] = {}
    for scorer_id, error_type in retried:
        key = (UNKNOWN_SCORER if scorer_id is None else scorer_id, "retry", error_type)
        runs[key] = runs.get(key, 0) + 1
    for record in records:
        scorer = UNKNOWN_SCORER if record.error_type == "UnknownScorerError" else record.scorer_id
        if record.error_type:
            key = (scorer, "failed", record.error_type)
        elif record.score is None:
            key = (scorer, "not_scorable", "")
        else:
            key = (scorer, "scored", "")
        runs[key] = runs.get(key, 0) + 1
        # (a hand-made message's NaN or infinity is no time: an infinite sample left the
        # histogram's sum +Inf for good; the run is counted all the same)
        if record.enqueued_at is not None and math.isfinite(latency := record.scored_at - record.enqueued_at):
            m.child(m.run_latency, scorer, record.source).observe(max(0.0, latency))
    for labels, n in runs.items():
        m.child(m.runs, *labels).inc(n)


def observe_skipped(skips: Iterable[tuple[str | None, str]]) -> None:
    """Count runs not scored, as ``(scorer_id, reason)``: ``already_scored`` or ``duplicate``
    (a scorer the worker does not know as None: its id is the message's to pick)."""
    counted: dict[tuple[str, str], int] = {}
    for scorer_id, reason in skips:
        key = (UNKNOWN_SCORER if scorer_id is None else scorer_id, reason)
        counted[key] = counted.get(key, 0) + 1
    if not counted:
        return
    m = _metrics()
    for labels, n in counted.items():
        m.child(m.skipped, *labels).inc(n)


def observe_judge_usage(scorer_id: str, model_id: str, usage: JudgeUsage, cost_usd: float | None) -> None:
    """One answered judge call: its tokens and cost, counted where it is paid (the budget
    guard's ``after_call``, beside the spend ledger), so a run retried, cancelled or replaced
    later is counted once per call it paid, and under the one model it called (the label the
    dashboard's ``model=~"$model"`` filter matches; the ledger keeps spend per model alike)."""
    if usage.input_tokens == 0 and usage.output_tokens == 0:
        return
    m = _metrics()
    for kind, tokens in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cached_input", usage.cached_input_tokens),
    ):
        if tokens:
            m.tokens.labels(scorer_id, model_id, kind).inc(tokens)
    if cost_usd is None:
        m.unpriced.labels(scorer_id, model_id).inc()
    elif cost_usd > 0:
        m.cost.labels(scorer_id, model_id).inc(cost_usd)


def observe_batch(seconds: float) -> None:
    """One queue message scored (or given up on) in ``seconds``."""
    _metrics().batch_duration.observe(seconds)


def observe_limiter_wait(model_id: str, seconds: float) -> None:
    """One judge call waited ``seconds`` in total for the shared rate limiter."""
    m = _metrics()
    m.limiter_waits.labels(model_id).inc()
    m.limiter_wait_seconds.labels(model_id).inc(seconds)


def observe_key_repairs(where: str, keys: int) -> None:
    """``keys`` wrong-typed keys repaired by the store path ``where`` (a fixed name, never a key)."""
    _metrics().key_repairs.labels(where).inc(keys)


def observe_broadcast_refused(reason: str) -> None:
    """One broadcast refused by the consumer's screen, for ``reason`` (a fixed name)."""
    _metrics().broadcasts_refused.labels(reason).inc()


def observe_unreadable(key: str) -> None:
    """A value read back from Redis at ``key`` (a fixed name, or a reason) was not a number."""
    _metrics().unreadable.labels(key).inc()


def process_started() -> None:
    """This process scores (a pool child after its fork, or a threads/solo worker)."""
    _metrics().processes.set(1)


# The model whose last request failed in this task: the judge's next request to it is a retry.
# (A judge call's attempts run one after another in one task; a task is one run.)
_failed_model: ContextVar[str | None] = ContextVar("tracescore_metrics_failed_model", default=None)


def judge_request_context(
    inner: Callable[[str], AbstractContextManager[None]] | None,
) -> Callable[[str], AbstractContextManager[None]]:
    """A judge ``call_context`` (see ``scorers.judge.JudgeHooks``) that times and counts every
    provider request around ``inner`` (the judge span, kept as it was)."""
    if inner is not None and getattr(inner, "_tracescore_metered", False):
        return inner  # a runtime built again in this process: count each request once

    @contextmanager
    def context(model_id: str) -> Iterator[None]:
        m = _metrics()
        if _failed_model.get() == model_id:
            m.judge_retries.labels(model_id).inc()
        outcome = "ok"
        started = time.perf_counter()
        try:
            if inner is None:
                yield
            else:
                with inner(model_id):
                    yield
        except asyncio.CancelledError:
            outcome = "cancelled"  # the run's timeout, or the batch being stopped
            raise
        except Exception as exc:  # the judge's errors (it wraps any other inside)
            outcome = type(exc).__name__
            raise
        finally:
            m.judge_requests.labels(model_id, outcome).inc()
            m.judge_duration.labels(model_id).observe(time.perf_counter() - started)
            _failed_model.set(model_id if outcome != "ok" else None)

    context._tracescore_metered = True  # type: ignore[attr-defined]
    return context
