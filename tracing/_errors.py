"""Errors of the capture side.

    TraceReadError     a trace (or one span of it) could not be read into a run; carries
                       ``reason`` (a short code the exporter counts by), the span and the attribute.
"""

from __future__ import annotations

__all__ = ["TraceReadError"]


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
