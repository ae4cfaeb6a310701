"""The tracing package's exception tree, grouped by who must handle the error.

    TracingError                    anything tracing/ raises on purpose            category
    ├── TraceReadError (ValueError) a trace (or one span of it) could not be read
    │                               into a run; ``reason`` is a counter key        invalid_input
    ├── MessageShapeError (ValueError)  a chat message payload of no known shape   invalid_input
    ├── OtlpDecodeError (ValueError)    input that is not valid OTLP (file:line,
    │                               JSON path)                                     invalid_input
    ├── RunTooLarge (ValueError)    one run's request is over the workers' message
    │                               cap by itself (TRACESCORE_MAX_PAYLOAD_BYTES)   invalid_input
    ├── QueueKeyError               a broker key the queue needs holds another
    │                               Redis type: nothing was sent (retried)        config
    └── SourceError                 a trace source cannot be read at all (missing
                                    path, unreachable backend, bad arguments)      config

``category`` is the scorers' ``ErrorCategory`` (``scorers.judge.ErrorCategory``), decided per
class here.
Vendor errors (JSON, protobuf, HTTP) are translated into this tree where they are read
(``tracing.otlp``, ``tracing.sources``); none escapes a decoder.

Messages of these errors reach logs, error records and dead letters: they say what was wrong
and where (span, attribute, index, expected shape) and describe a bad value only by its shape
(``shape_of``), never by quoting it: span attributes hold prompts, answers and secrets.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from scorers.judge import ErrorCategory
    from tracing.queue import ScoreRequest

__all__ = [
    "MessageShapeError",
    "OtlpDecodeError",
    "QueueKeyError",
    "RunTooLarge",
    "SourceError",
    "TraceReadError",
    "TracingError",
    "json_error",
    "shape_of",
]


def shape_of(value: Any) -> str:
    """What a bad value is, for an error message, without any of its content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"a string of {len(value)} chars"
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, Mapping):
        return f"an object with {len(value)} keys"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    return f"a {type(value).__name__}"


def json_error(exc: BaseException) -> str:
    """Why ``json.loads`` refused a text, by position, never quoting it (``str()`` of some
    decoders does)."""
    if isinstance(exc, json.JSONDecodeError):
        # Some of its messages end in "at", written to precede str()'s ": line 1 column 3".
        return f"{exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start}"
    if isinstance(exc, ValueError):  # json.loads's one other: an integer past int()'s digit limit
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return type(exc).__name__


class TracingError(Exception):
    """Base of the errors tracing/ raises on purpose."""

    _category: ClassVar[ErrorCategory] = "internal"

    @property
    def category(self) -> ErrorCategory:
        """What kind of failure this is (see ``scorers._errors.ErrorCategory``)."""
        return self._category


class TraceReadError(TracingError, ValueError):
    """A trace that ``trace_to_run`` cannot read. Never a guess: the run is refused.

    ``reason`` is a stable short code (``no_target``, ``bad_json``, ``bad_message``,
    ``no_content``, ``unknown_role``, ``unknown_span``, ``parent_cycle``) used as a counter key; ``span_name``,
    ``span_id`` and ``attribute`` say where the problem is.
    """

    _category: ClassVar[ErrorCategory] = "invalid_input"

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        span_name: str | None = None,
        span_id: str | None = None,
        attribute: str | None = None,
    ) -> None:
        self.reason = reason
        self.span_name = span_name
        self.span_id = span_id
        self.attribute = attribute
        where = ""
        if span_id is not None or span_name is not None:
            where = f"span {span_name!r} ({span_id})" if span_name is not None else f"span {span_id}"
            if attribute is not None:
                where += f", attribute {attribute!r}"
            where += ": "
        super().__init__(f"{where}{message}")


class MessageShapeError(TracingError, ValueError):
    """A message payload that is not one of the known shapes. ``reason`` is a counter key.

    The message names the field and the expected shape, never the payload (see ``shape_of``).
    """

    _category: ClassVar[ErrorCategory] = "invalid_input"

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)

    def at(self, where: str) -> MessageShapeError:
        """The same error, its message prefixed with where in the payload it is."""
        return MessageShapeError(self.reason, f"{where}: {self}")


class OtlpDecodeError(TracingError, ValueError):
    """Input that is not valid OTLP: ``where`` is the file:line, ``field`` the JSON path."""

    _category: ClassVar[ErrorCategory] = "invalid_input"

    def __init__(self, message: str, *, where: str = "", field: str = "") -> None:
        self.where = where
        self.field = field
        self.reason = message
        prefix = f"{where}: " if where else ""
        at = f" at {field}" if field else ""
        super().__init__(f"{prefix}{message}{at}")


class SourceError(TracingError):
    """The source cannot be read at all (missing path, unreachable backend, bad arguments)."""

    _category: ClassVar[ErrorCategory] = "config"


class QueueKeyError(TracingError):
    """A key the queue needs on the broker (its list, kombu's binding set) holds another Redis
    type (an operator's or another program's key): Redis answered WRONGTYPE and nothing was
    sent. Not the batch's fault: a producer retries it, and sending resumes once the key is
    moved aside. Its text names the key and the types, never the message (Redis's own error
    quotes the command, which holds the message)."""

    _category: ClassVar[ErrorCategory] = "config"

    def __init__(self, key: str, found: str, expected: str) -> None:
        remedy = (
            "rename the key aside (the workers stop on it too)"
            if expected == "list"  # the queue itself: what is in it may be needed
            else "it holds no message: delete it (a worker rebuilds it as it starts)"
        )
        super().__init__(
            f"Redis key {key!r} on the broker holds a {found}, where the queue keeps a {expected}; "
            f"nothing was sent: {remedy}"
        )
        self.key, self.found, self.expected = key, found, expected

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.found, self.expected))


def _runs(span_ids: list[str]) -> str:
    if len(span_ids) == 1:
        return f"span {span_ids[0]}"
    return f"{len(span_ids)} runs (spans {', '.join(span_ids[:3])}{', ...' if len(span_ids) > 3 else ''})"


class RunTooLarge(TracingError, ValueError):
    """One request's JSON is over the workers' message cap by itself: no message can carry it."""

    _category: ClassVar[ErrorCategory] = "invalid_input"

    def __init__(self, request: ScoreRequest, size: int, max_payload_bytes: int) -> None:
        # Ids and sizes only: the spans are the agent's content.
        super().__init__(
            f"trace {request.trace_id} {_runs(request.target_span_ids)}: {size:,} bytes, over"
            f" TRACESCORE_MAX_PAYLOAD_BYTES ({max_payload_bytes:,} with the message envelope)"
        )
        self.trace_id = request.trace_id
        self.span_id = request.target_span_ids[0]  # the first run's (a request's runs share a trace)
        self.size = size
        self.max_payload_bytes = max_payload_bytes
