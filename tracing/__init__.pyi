"""The names ``tracing`` exports, for type checkers; ``__init__.py`` loads each from the module
named here on first use."""

# The subpackages: attributes of the package (as when it imported them all), loaded on first use.
from . import capture, otlp, queue, read, sinks, sources
from ._broker import BrokerTLS, redact
from ._errors import TraceReadError
from ._markers import JUDGE_ROLE, ROLE_ATTRIBUTE
from ._rules import ScoringRule, sampled
from ._run import RunIdentity, SpanRecord, SpanRecordEvent, TracedRun
from ._text import printable, valid_text
from ._transform import find_targets, read_trace, trace_to_run, trace_to_runs
from .capture import CallbackSink, CelerySink, ScoringSpanExporter, Sink
from .queue import SCORE_TASK_NAME, ScoreBatch, ScoreRequest

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
    "capture",
    "find_targets",
    "otlp",
    "printable",
    "queue",
    "read",
    "read_trace",
    "redact",
    "sampled",
    "sinks",
    "sources",
    "trace_to_run",
    "trace_to_runs",
    "valid_text",
]

# Score write-back (worker side of the pipeline): the sinks live in tracing.sinks; the older
# writer names stay importable from here (each of these sinks is also a ScoreWriter).
from ._score_record import ScoreRecord, score_id_for
from .sinks import ConsoleSink, JsonlSink, MemorySink, OtlpSink, ScoreSink, ScoreWriter

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
from .otlp import (  # noqa: E402  (appended after the write-back block)
    OtlpDecodeError,
    decode_otlp_json,
    decode_otlp_json_line,
    decode_otlp_protobuf,
    spans_to_otlp_json,
)
from .sources import FileSource, TempoSource, TraceAssembler, open_source  # noqa: E402

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
