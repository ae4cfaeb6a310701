"""A span record's approximate JSON size: what the exporter's buffer and queue, the backfill's
assembler and its in-process batches count their bounds in. No OpenTelemetry SDK here: the
backfill's job states, which ``tracescore status`` reads, load the assembler."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tracing._run import SpanRecord, SpanRecordEvent

__all__ = [
    "MAX_VALUE_DEPTH",
    "RECORD_OVERHEAD_BYTES",
    "events_size",
    "name_size",
    "record_size",
    "str_size",
    "text_size",
    "value_size",
]

# How deep an attribute value may nest (lists and mappings, or OTLP's arrayValue / kvlistValue,
# in one another). The workers refuse a message nesting past 100 levels (worker._guard), a whole
# batch at once, and a value travels about ten levels down a message: 32 leaves room, and no
# instrumentation nests near it.
MAX_VALUE_DEPTH = 32

# A record's JSON apart from its name and attributes (ids, times, kind, status, origin): a rough
# upper bound, for sizing batches.
RECORD_OVERHEAD_BYTES = 600


# CPython holds a str of any character past ASCII at 1, 2 or 4 bytes a character (the widest
# one's), after a header: ``sys.getsizeof`` tells which in O(1).
_WIDE_HEADER = sys.getsizeof("é") - 2


def str_size(text: str) -> int:
    """The bytes ``text`` holds: its length if ASCII, else its length times its width (2 or 4
    for a prompt in Japanese or with an emoji, each counted once a character before: the bounds
    let 2 to 4 times their bytes in). Its UTF-8 JSON is at most twice this."""
    if text.isascii():
        return len(text)
    return len(text) * ((sys.getsizeof(text) - _WIDE_HEADER) // (len(text) + 1))


def record_size(record: SpanRecord) -> int:
    """``record``'s approximate JSON size in bytes, as ``compact`` counts it (nothing changed)."""
    return RECORD_OVERHEAD_BYTES + name_size(record.name) + text_size(record.attributes) + events_size(record.events)


def name_size(name: object) -> int:
    # A span name is the app's to choose (a prompt pasted into it): 200 kB names went past
    # max_buffer_bytes and max_queue_bytes uncounted.
    return str_size(name) if isinstance(name, str) else 0


def events_size(events: Sequence[SpanRecordEvent]) -> int:
    # Older GenAI conventions carry message content in events.
    return sum(100 + text_size(e.attributes) for e in events) if events else 0


def text_size(attributes: Mapping[str, Any]) -> int:
    # The read attributes are nearly always text, a handful a span: a plain loop costs less
    # than setting up ``sum(map(...))`` (and raising out of it for the first number). Keys count
    # as values do: OpenInference's flattened ones (``llm.input_messages.7.message.content``)
    # made a span of short messages six times the size counted.
    size = 0
    for key, value in attributes.items():
        if value.__class__ is not str:  # a number or a sequence among them: its text counts too
            return sum(len(k) + 6 + value_size(v) for k, v in attributes.items())
        # (the quotes, colon and comma around them; a key is ASCII but for a rare app's own)
        size += len(key) + (len(value) if value.isascii() else str_size(value)) + 6
    return size


def value_size(value: Any, depth: int = 0) -> int:
    # A sequence counted by its items, not their text, let 2 MiB strings in a tuple past
    # max_buffer_bytes and max_queue_bytes unseen.
    if isinstance(value, str):
        return str_size(value)
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, list | tuple | dict):
        if depth >= MAX_VALUE_DEPTH:
            # The SDK takes mappings and sequences of any depth; shipped, one such span got its
            # whole batch (other traces' runs) refused by the workers, uncounted here.
            raise ValueError(f"an attribute value nesting deeper than {MAX_VALUE_DEPTH} levels")
        if isinstance(value, dict):
            return 2 + sum(len(k) + 4 + value_size(v, depth + 1) for k, v in value.items())
        return 2 + sum(value_size(v, depth + 1) for v in value) + len(value)
    return 8  # a number, a bool, null
