"""The embedded mode: the worker's scoring code in this process, no broker, no Redis.

``tracescore backfill`` without a broker, and the exporter's default sink, score here with the
same ``score_batch`` the Celery task calls, a ``MemoryScoreStore`` and a writer — so the results
are the same as through Redis workers, on a machine that has neither.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from scorers import Scorer
from tracing._run import ScoreBatch
from tracing._score_record import ScoreRecord
from tracing._score_writer import ScoreWriter
from tracing._sinks import CallbackSink
from worker._registry import load_registry
from worker._scoring import BatchReport, ScoringDeps, score_batch
from worker._store import MemoryScoreStore, ScoreStore

__all__ = ["EmbeddedScorer", "EmbeddedSink", "TableScoreWriter", "embedded_sink"]


def _cell(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


class TableScoreWriter:
    """Scores as a readable table, one row per score: trace, agent, scorer, score, reason.

    ``agents`` maps scored span ids to agent names (the driver fills it before each batch);
    ``before_write`` lets a progress bar clear its line first.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        agents: Mapping[str, str] | None = None,
        before_write: Callable[[], None] | None = None,
        width: int | None = None,
    ) -> None:
        self.stream = stream or sys.stdout
        self.agents = agents if agents is not None else {}
        self.before_write = before_write
        self.width = width or max(80, min(shutil.get_terminal_size((120, 20)).columns, 160))
        self._header = False
        self._lock = threading.Lock()
        self.rows = 0

    def _line(self, trace: str, agent: str, scorer: str, score: str, reason: str) -> str:
        fixed = f"{trace:<12}  {_cell(agent, 18):<18}  {_cell(scorer, 20):<20}  {score:>7}  "
        return fixed + _cell(reason, max(10, self.width - len(fixed)))

    def write(self, records: Sequence[ScoreRecord]) -> None:
        with self._lock:
            if self.before_write is not None:
                self.before_write()
            out: list[str] = []
            if not self._header:
                out.append(self._line("trace", "agent", "scorer", "score", "reason"))
                out.append(self._line("-" * 12, "-" * 18, "-" * 20, "-" * 7, "-" * 6))
                self._header = True
            for record in records:
                agent = self.agents.get(record.span_id) or record.span_name
                if record.error_type:
                    value, reason = "error", f"{record.error_type}: {record.error_message or ''}"
                elif record.score is None:
                    value, reason = "n/a", record.not_scorable or record.reason or ""
                else:
                    value, reason = f"{record.score:.3f}", record.reason or ""
                out.append(self._line(record.trace_id[:12], agent, record.scorer_id, value, reason))
                self.rows += 1
            self.stream.write("\n".join(out) + "\n")
            self.stream.flush()

    def flush(self, timeout_s: float = 10.0) -> bool:
        self.stream.flush()
        return True

    def close(self) -> None:
        self.flush()


class EmbeddedScorer:
    """A backfill submitter (and a building block for the exporter's in-process sink) that
    scores each batch right here, on one event loop of its own."""

    mode = "embedded"

    def __init__(
        self,
        registry: Mapping[str, Scorer],
        writer: ScoreWriter | None = None,
        *,
        store: ScoreStore | None = None,
        model_concurrency: int = 64,
        run_concurrency: int = 256,
        retry_budget: int = 3,
        retry_backoff_s: float = 1.0,
        agents: dict[str, str] | None = None,
    ) -> None:
        self.store: ScoreStore = store if store is not None else MemoryScoreStore()
        self.writer = writer
        self.deps = ScoringDeps(
            registry=registry,
            store=self.store,
            writer=writer,
            model_concurrency=model_concurrency,
            run_concurrency=run_concurrency,
            checkpoint="none",  # the store dies with the process: nothing to resume from
        )
        self.retry_budget = max(1, retry_budget)
        self.retry_backoff_s = retry_backoff_s
        self.agents = agents
        self.totals = BatchReport(batch_id="*")
        self._runner = asyncio.Runner()
        self._lock = threading.Lock()

    def submit(self, batch: ScoreBatch) -> None:
        report = self.score(batch)
        totals = self.totals
        totals.requests += report.requests
        totals.pairs += report.pairs
        totals.scored += report.scored
        totals.not_scorable += report.not_scorable
        totals.failed.update(report.failed)
        totals.skipped.update(report.skipped)
        totals.written += report.written
        totals.write_failed += report.write_failed

    def score(self, batch: ScoreBatch) -> BatchReport:
        """Score one batch now; transient judge failures are retried like the worker does."""
        with self._lock:
            if self.agents is not None:
                for request in batch.requests:
                    # Runs shipped as spans (the exporter's compact form) are labelled by span name.
                    identity = request.run.identity if request.run is not None else None
                    if identity is not None:
                        self.agents[identity.span_id] = identity.agent_name or identity.span_name
            try:
                for attempt in range(self.retry_budget):
                    final = attempt == self.retry_budget - 1
                    report = self._runner.run(score_batch(batch, self.deps, final_attempt=final))
                    if not report.retry:
                        return report
                    time.sleep(self.retry_backoff_s * 2**attempt)
                return report
            finally:
                if self.agents is not None:
                    for request in batch.requests:
                        if request.run is not None:
                            self.agents.pop(request.run.identity.span_id, None)

    def progress(self, job_id: str) -> dict[str, int]:
        with self._lock:
            return self._runner.run(self.store.job_progress(job_id))

    def pending(self) -> int:
        return 0

    def failed(self) -> Counter[str]:
        return Counter(self.totals.failed)

    def close(self) -> None:
        with self._lock:
            if self.writer is not None:
                self.writer.flush(10.0)
                self.writer.close()
            self._runner.close()


class EmbeddedSink(CallbackSink):
    """A ``CallbackSink`` that scores in process; the exporter's shutdown closes it."""

    def __init__(self, scorer: EmbeddedScorer) -> None:
        super().__init__(scorer.submit)
        self.scorer = scorer

    def close(self) -> None:
        self.scorer.close()


def embedded_sink(
    scorers: str | Mapping[str, Scorer],
    writer: ScoreWriter | None = None,
    *,
    store: ScoreStore | None = None,
) -> EmbeddedSink:
    """The exporter's in-process sink: each batch is scored right away in this process.

    ``scorers`` is a registry module name (``"my_app.scorers"``) or a mapping id → scorer.
    Use it when there is no broker::

        exporter = ScoringSpanExporter(rules=[ScoringRule(scorers=["relevancy"])],
                                       sink=embedded_sink("my_app.scorers", ConsoleScoreWriter()))

    The exporter calls the sink from its own sender thread, so scoring never runs inside the
    application's ``export()`` call.
    """
    registry = load_registry(scorers) if isinstance(scorers, str) else scorers
    return EmbeddedSink(EmbeddedScorer(registry, writer, store=store))
