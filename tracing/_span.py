"""A read-only view of one span, the same for SDK ``ReadableSpan``s, decoded OTLP spans and the
compact ``SpanRecord``s the exporter ships to the worker.

Cheap to build: only ids, name and attributes are read up front; the rest is read from the
span when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from tracing._run import SpanRecord

__all__ = ["SpanEvent", "SpanLike", "SpanView", "plain_attributes", "view_spans"]

# What the transform reads: SDK spans (live, or decoded from OTLP) and shipped span records.
SpanLike = ReadableSpan | SpanRecord


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    attributes: Mapping[str, Any]
    body: Any = None  # log-record events carry their payload here


def plain_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain dict, without copying when possible.

    ``ReadableSpan.attributes`` is a proxy over the SDK's ``BoundedAttributes``, whose ``.get``
    of a missing key goes through a raised ``KeyError``; most keys we look up are missing, so
    the hot path reads the (frozen once the span ended) dict underneath when it is there.
    """
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    if isinstance(inner, dict):
        return inner
    attrs = span.attributes
    return dict(attrs) if attrs is not None else {}


class SpanView:
    __slots__ = ("_events", "_span", "attributes", "children", "kind", "name", "parent", "parent_sid", "sid")

    def __init__(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None:
            raise ValueError(f"span {span.name!r} has no span context")
        self._span = span
        self.sid: int = ctx.span_id
        parent = span.parent
        self.parent_sid: int | None = parent.span_id if parent is not None else None
        self.name: str = span.name
        self.attributes: Mapping[str, Any] = plain_attributes(span)
        self.children: list[SpanView] = []
        self.parent: SpanView | None = None
        self.kind = ""  # filled by the transform (agent/llm/tool/other), once per span
        self._events: list[SpanEvent] | None = None

    # --- read on demand ------------------------------------------------------------------

    @property
    def span_id(self) -> str:
        return format(self.sid, "016x")

    @property
    def trace_id(self) -> str:
        ctx = self._span.context
        return format(ctx.trace_id, "032x") if ctx is not None else ""

    @property
    def start_ns(self) -> int | None:
        return self._span.start_time

    @property
    def end_ns(self) -> int | None:
        return self._span.end_time

    @property
    def service(self) -> str | None:
        resource = self._span.resource
        value = resource.attributes.get("service.name") if resource is not None else None
        return value if isinstance(value, str) else None

    @property
    def events(self) -> list[SpanEvent]:
        if self._events is None:
            raw = self._span.events
            self._events = [SpanEvent(e.name, dict(e.attributes or {})) for e in raw] if raw else []
        return self._events

    def attr(self, key: str) -> Any:
        return self.attributes.get(key)

    def str_attr(self, *keys: str) -> str | None:
        for key in keys:
            value = self.attributes.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    def ancestors(self) -> list[SpanView]:
        out: list[SpanView] = []
        node = self.parent
        while node is not None:
            out.append(node)
            node = node.parent
        return out

    def descendants(self) -> list[SpanView]:
        out: list[SpanView] = []
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    def order_key(self) -> tuple[int, int]:
        return (self.start_ns or 0, self.sid)


class RecordView(SpanView):
    """A ``SpanView`` of a shipped ``SpanRecord`` (everything is already plain data)."""

    __slots__ = ("_record",)

    def __init__(self, record: SpanRecord) -> None:  # not super(): that one reads a ReadableSpan
        self._record = record
        self.sid = int(record.span_id, 16)
        parent = record.parent_span_id
        self.parent_sid = int(parent, 16) if parent else None
        self.name = record.name
        self.attributes = record.attributes
        self.children = []
        self.parent = None
        self.kind = ""
        self._events = None

    @property
    def span_id(self) -> str:
        return self._record.span_id

    @property
    def trace_id(self) -> str:
        return self._record.trace_id

    @property
    def start_ns(self) -> int | None:
        return self._record.start_time_ns

    @property
    def end_ns(self) -> int | None:
        return self._record.end_time_ns

    @property
    def service(self) -> str | None:
        return self._record.service_name

    @property
    def events(self) -> list[SpanEvent]:
        if self._events is None:
            self._events = [SpanEvent(e.name, dict(e.attributes)) for e in self._record.events]
        return self._events


def view_spans(spans: Sequence[SpanLike]) -> list[SpanView]:
    """Views of ``spans`` with parent/child links resolved inside the trace."""
    views = [RecordView(s) if isinstance(s, SpanRecord) else SpanView(s) for s in spans]
    by_id = {v.sid: v for v in views}
    for v in views:
        if v.parent_sid is not None:
            parent = by_id.get(v.parent_sid)
            if parent is not None and parent is not v:
                v.parent = parent
                parent.children.append(v)
    for v in views:
        if len(v.children) > 1:
            v.children.sort(key=SpanView.order_key)
    return views
