"""OpenTelemetry side of tracescore: span → run transform, the exporter, score write-back."""

from tracing._errors import TraceReadError
from tracing._run import SCORE_TASK_NAME, RunIdentity, ScoreBatch, ScoreRequest, TracedRun
from tracing._transform import find_targets, trace_to_run, trace_to_runs

__all__ = [
    "SCORE_TASK_NAME",
    "RunIdentity",
    "ScoreBatch",
    "ScoreRequest",
    "TraceReadError",
    "TracedRun",
    "find_targets",
    "trace_to_run",
    "trace_to_runs",
]

# Score write-back (worker side of the pipeline).
from tracing._score_record import ScoreRecord, score_id_for
from tracing._score_writer import (
    ConsoleScoreWriter,
    JsonlScoreWriter,
    MemoryScoreWriter,
    OtlpScoreWriter,
    ScoreWriter,
)

__all__ += [
    "ConsoleScoreWriter",
    "JsonlScoreWriter",
    "MemoryScoreWriter",
    "OtlpScoreWriter",
    "ScoreRecord",
    "ScoreWriter",
    "score_id_for",
]
