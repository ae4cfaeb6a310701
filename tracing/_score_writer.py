"""``ScoreWriter``: puts scores back into the tracing pipeline (or a file, or the console).

The OTLP writer makes, for each scored span, one carrier span that is a child of the scored
span and links to it, with one ``gen_ai.evaluation.result`` event per score (OpenTelemetry GenAI
semantic conventions). The carrier span is marked ``tracescore.role=score_writer`` so the
capture exporter never scores it (loop guard).

Writers take the records of one scored span at a time; ``flush`` waits for anything buffered.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

from tracing._score_record import ScoreRecord

__all__ = [
    "CARRIER_SPAN_NAME",
    "EVALUATION_EVENT",
    "ROLE_ATTRIBUTE",
    "ROLE_SCORE_WRITER",
    "ConsoleScoreWriter",
    "JsonlScoreWriter",
    "MemoryScoreWriter",
    "OtlpScoreWriter",
    "ScoreWriter",
    "evaluation_attributes",
]

EVALUATION_EVENT = "gen_ai.evaluation.result"
CARRIER_SPAN_NAME = "tracescore.evaluation"
ROLE_ATTRIBUTE = "tracescore.role"
ROLE_SCORE_WRITER = "score_writer"


@runtime_checkable
class ScoreWriter(Protocol):
    """Where finished scores go. ``write`` gets the records of one scored span."""

    def write(self, records: Sequence[ScoreRecord]) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> bool: ...

    def close(self) -> None: ...


def evaluation_attributes(record: ScoreRecord) -> dict[str, Any]:
    """The attributes of one ``gen_ai.evaluation.result`` event (None values left out)."""
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": record.scorer_name or record.scorer_id,
        "tracescore.score.id": record.score_id,
        "tracescore.scorer.id": record.scorer_id,
        "tracescore.scorer.version": record.scorer_version,
        "tracescore.source": record.source,
    }
    optional: dict[str, Any] = {
        "gen_ai.evaluation.score.value": record.score,
        "gen_ai.evaluation.score.label": record.label,
        "gen_ai.evaluation.explanation": record.reason or record.not_scorable or record.error_message,
        "error.type": record.error_type,
        "tracescore.judge.model": ",".join(record.judge_models) or None,
        "gen_ai.usage.input_tokens": record.input_tokens or None,
        "gen_ai.usage.output_tokens": record.output_tokens or None,
        "tracescore.job.id": record.job_id,
        "tracescore.run.id": record.run_id,
        "tracescore.failed_step": record.failed_step,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    return attributes


class OtlpScoreWriter:
    """Carrier spans with evaluation events, exported by its own tracer provider.

    The exporter defaults to the OTLP/HTTP span exporter, configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables; pass ``span_exporter`` (e.g. an in-memory one) to test.
    """

    def __init__(
        self,
        span_exporter: SpanExporter | None = None,
        *,
        service_name: str = "tracescore-worker",
        max_export_batch_size: int = 512,
        schedule_delay_millis: float = 1000,
    ) -> None:
        if span_exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter()
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                span_exporter,
                max_export_batch_size=max_export_batch_size,
                schedule_delay_millis=schedule_delay_millis,
            )
        )
        self._tracer = self._provider.get_tracer("tracescore.score_writer")

    def write(self, records: Sequence[ScoreRecord]) -> None:
        by_span: dict[tuple[str, str], list[ScoreRecord]] = {}
        for record in records:
            by_span.setdefault((record.trace_id, record.span_id), []).append(record)
        for (trace_id, span_id), group in by_span.items():
            scored = SpanContext(
                trace_id=int(trace_id, 16),
                span_id=int(span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            start_ns = int(min(r.scored_at for r in group) * 1e9)
            span = self._tracer.start_span(
                CARRIER_SPAN_NAME,
                context=set_span_in_context(NonRecordingSpan(scored)),
                kind=SpanKind.INTERNAL,
                links=[Link(scored, {"tracescore.link": "scored_span"})],
                attributes={
                    ROLE_ATTRIBUTE: ROLE_SCORE_WRITER,
                    "tracescore.scored.span_id": span_id,
                    "tracescore.scored.span_name": group[0].span_name,
                },
                start_time=start_ns,
            )
            for record in group:
                span.add_event(EVALUATION_EVENT, evaluation_attributes(record), timestamp=int(record.scored_at * 1e9))
            span.end(end_time=max(start_ns, int(max(r.scored_at for r in group) * 1e9)))

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self._provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self._provider.shutdown()


class JsonlScoreWriter:
    """Appends one ``ScoreRecord`` JSON object per line to ``path`` (safe across threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, records: Sequence[ScoreRecord]) -> None:
        text = "".join(r.model_dump_json() + "\n" for r in records)
        with self._lock:
            # One write call per group: concurrent processes appending (O_APPEND) do not interleave.
            self._file.write(text)
            self._file.flush()

    def flush(self, timeout_s: float = 10.0) -> bool:
        with self._lock:
            self._file.flush()
        return True

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ConsoleScoreWriter:
    """One short human-readable line per score, for local runs."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, records: Sequence[ScoreRecord]) -> None:
        stream = self._stream or sys.stdout
        lines = []
        for r in records:
            if r.error_type:
                value = f"error {r.error_type}: {r.error_message or ''}"
            elif r.score is None:
                value = f"not scorable: {r.not_scorable or ''}"
            else:
                value = f"{r.score:.3f}" + (f" ({r.label})" if r.label else "")
            lines.append(f"score trace={r.trace_id} span={r.span_id} scorer={r.scorer_id} {value}\n")
        with self._lock:
            stream.write("".join(lines))
            stream.flush()

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        return None


class MemoryScoreWriter:
    """Keeps every written record in ``records`` (a test double)."""

    def __init__(self) -> None:
        self.records: list[ScoreRecord] = []
        self.writes = 0
        self._lock = threading.Lock()

    def write(self, records: Sequence[ScoreRecord]) -> None:
        with self._lock:
            self.records.extend(records)
            self.writes += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        return None
