"""The queue contract between producers (the exporter, backfill) and the workers.

It owns the one request shape (``ScoreRequest``: a trace's span records once, the spans to
score among them — one per run —, the scorer ids, source and job), the batch that is one message
(``ScoreBatch``), its wire format (Celery's task protocol 2 in JSON, built without Celery:
``task_message``), cutting requests into messages under the workers' byte cap
(``RequestCutter``; a request too large for one is split run by run, ``ScoreRequest.per_target``),
and the one kombu publisher (``Publisher``; ``QueueKeyError`` when a key it needs on the broker
holds another Redis type) with backpressure as a wrapper (``Backpressure``).
The worker validates each message against ``ScoreBatch`` and reads the runs from the span records.
"""

from tracing._errors import QueueKeyError
from tracing.queue._contract import SCORE_TASK_NAME, ScoreBatch, ScoreRequest, request_json, spans_request
from tracing.queue._cut import Chunk, RequestCutter, RunTooLarge
from tracing.queue._publisher import Backpressure, BatchPublisher, Publisher
from tracing.queue._wire import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MESSAGE_ENVELOPE_BYTES,
    TaskMessage,
    task_message,
    wire_size,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MESSAGE_ENVELOPE_BYTES",
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
    "request_json",
    "spans_request",
    "task_message",
    "wire_size",
]
