"""OpenTelemetry side of tracescore: span → run transform, the exporter, score write-back."""

from tracing._broker import BrokerTLS, redact
from tracing._errors import TraceReadError
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE
from tracing._rules import ScoringRule, sampled
from tracing._run import RunIdentity, SpanRecord, SpanRecordEvent, TracedRun
from tracing._transform import find_targets, read_trace, trace_to_run, trace_to_runs
from tracing.capture import CallbackSink, CelerySink, ScoringSpanExporter, Sink
from tracing.queue import SCORE_TASK_NAME, ScoreBatch, ScoreRequest

__all__ = [
    "JUDGE_ROLE",
    "ROLE_ATTRIBUTE",
    "SCORE_TASK_NAME",
    "BrokerTLS",
    "CallbackSink",
    "CelerySink",
    "RunIdentity",
    "ScoreBatch",
    "ScoreRequest",
    "ScoringRule",
    "ScoringSpanExporter",
    "Sink",
    "SpanRecord",
    "SpanRecordEvent",
    "TraceReadError",
    "TracedRun",
    "find_targets",
    "read_trace",
    "redact",
    "sampled",
    "trace_to_run",
    "trace_to_runs",
]

# Score write-back (worker side of the pipeline): the sinks live in tracing.sinks; the older
# writer names stay importable from here (each of these sinks is also a ScoreWriter).
from tracing._score_record import ScoreRecord, score_id_for
from tracing.sinks import ConsoleSink, JsonlSink, MemorySink, OtlpSink, ScoreSink, ScoreWriter

ConsoleScoreWriter = ConsoleSink
JsonlScoreWriter = JsonlSink
MemoryScoreWriter = MemorySink

__all__ += [
    "ConsoleScoreWriter",
    "ConsoleSink",
    "JsonlScoreWriter",
    "JsonlSink",
    "MemoryScoreWriter",
    "MemorySink",
    "OtlpSink",
    "ScoreRecord",
    "ScoreSink",
    "ScoreWriter",
    "score_id_for",
]

# Stored traces (backfill): OTLP JSON/protobuf decoding, file and Tempo sources, trace assembly.
from tracing.otlp import (  # noqa: E402  (appended after the write-back block)
    OtlpDecodeError,
    decode_otlp_json,
    decode_otlp_json_line,
    decode_otlp_protobuf,
    spans_to_otlp_json,
)
from tracing.sources import FileSource, TempoSource, TraceAssembler, open_source  # noqa: E402

__all__ += [
    "FileSource",
    "OtlpDecodeError",
    "TempoSource",
    "TraceAssembler",
    "decode_otlp_json",
    "decode_otlp_json_line",
    "decode_otlp_protobuf",
    "open_source",
    "spans_to_otlp_json",
]
