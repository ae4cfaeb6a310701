"""The names ``tracing.queue`` exports, for type checkers; ``__init__.py`` loads each from the
module named here on first use."""

from ._contract import (
    MAX_BATCH_PAIRS,
    MAX_SCORER_IDS,
    PLAIN_ID_PATTERN,
    PLAIN_ID_RULE,
    SCORE_TASK_NAME,
    ScoreBatch,
    ScoreRequest,
    plain_id,
    request_json,
    shown_id,
    spans_request,
)
from ._cut import Chunk, RequestCutter, RunTooLarge
from ._limits import DEFAULT_MAX_PAYLOAD_BYTES, MESSAGE_ENVELOPE_BYTES
from ._publisher import Backpressure, BatchPublisher, Publisher, QueueKeyError, query_password_problem
from ._wire import TaskMessage, parse_json, task_message, wire_size

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_BATCH_PAIRS",
    "MAX_SCORER_IDS",
    "MESSAGE_ENVELOPE_BYTES",
    "PLAIN_ID_PATTERN",
    "PLAIN_ID_RULE",
    "SCORE_TASK_NAME",
    "Backpressure",
    "BatchPublisher",
    "Chunk",
    "Publisher",
    "QueueKeyError",
    "RequestCutter",
    "RunTooLarge",
    "ScoreBatch",
    "ScoreRequest",
    "TaskMessage",
    "parse_json",
    "plain_id",
    "query_password_problem",
    "request_json",
    "shown_id",
    "spans_request",
    "task_message",
    "wire_size",
]
