"""Errors of the capture side.

    TraceReadError     a trace (or one span of it) could not be read into a run; carries
                       ``reason`` (a short code the exporter counts by), the span and the attribute.

Messages of these errors reach logs, error records and dead letters: they say what was wrong
and where (span, attribute, index, expected shape) and describe a bad value only by its shape
(``shape_of``), never by quoting it: span attributes hold prompts, answers and secrets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["TraceReadError", "json_error", "shape_of"]


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
    """Why a JSON text did not parse, by position: ``str()`` of some decoders quotes the text."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return type(exc).__name__


class TraceReadError(ValueError):
    """A trace that ``trace_to_run`` cannot read. Never a guess: the run is refused.

    ``reason`` is a stable short code (``no_target``, ``bad_json``, ``bad_message``,
    ``no_content``, ``unknown_role``, ``unknown_span``, ``parent_cycle``) used as a counter key; ``span_name``,
    ``span_id`` and ``attribute`` say where the problem is.
    """

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
            where = f"span {span_name!r} ({span_id})"
            if attribute is not None:
                where += f", attribute {attribute!r}"
            where += ": "
        super().__init__(f"{where}{message}")
