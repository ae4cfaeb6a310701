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

from tracing._errors import TraceReadError
from tracing._run import SpanRecord
from tracing._sdk import plain_attributes
from tracing._text import as_shipped

__all__ = ["SpanEvent", "SpanLike", "SpanView", "view_spans"]

# What the transform reads: SDK spans (live, or decoded from OTLP) and shipped span records.
SpanLike = ReadableSpan | SpanRecord


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    attributes: Mapping[str, Any]
    body: Any = None  # log-record events carry their payload here


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
        self.attributes: Mapping[str, Any] = as_shipped(plain_attributes(span))
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
            self._events = [SpanEvent(e.name, as_shipped(dict(e.attributes or {}))) for e in raw] if raw else []
        return self._events

    def attr(self, key: str) -> Any:
        return self.attributes.get(key)

    def str_attr(self, *keys: str) -> str | None:
        for key in keys:
            value = self.attributes.get(key)
            if isinstance(value, str) and value:
                return value
        return None

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
        self.attributes = as_shipped(record.attributes)
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
            self._events = [SpanEvent(e.name, as_shipped(dict(e.attributes))) for e in self._record.events]
        return self._events


def view_spans(spans: Sequence[SpanLike]) -> list[SpanView]:
    """Views of ``spans`` with parent/child links resolved inside the trace.

    Raises ``TraceReadError`` (reason ``parent_cycle``) when parent ids form a cycle (a span
    that is its own parent included): every walk up or down the tree would never end.
    """
    views = [RecordView(s) if isinstance(s, SpanRecord) else SpanView(s) for s in spans]
    by_id = {v.sid: v for v in views}
    for v in views:
        if v.parent_sid is not None:
            parent = by_id.get(v.parent_sid)
            if parent is not None:
                v.parent = parent
                parent.children.append(v)
    # Each view is in exactly one children list or is a root, so a walk down from the roots
    # reaches every view unless some hang in (or under) a cycle. O(n), no recursion.
    reached = 0
    stack = [v for v in views if v.parent is None]
    while stack:
        node = stack.pop()
        reached += 1
        stack.extend(node.children)
    if reached != len(views):
        error = _cycle_error(views)
        _unlink(views)
        raise error
    for v in views:
        if len(v.children) > 1:
            v.children.sort(key=SpanView.order_key)
    return views


def _unlink(views: Sequence[SpanView]) -> None:
    # Parent/child links are reference cycles: drop them so plain refcounting frees the views.
    for v in views:
        v.parent = None
        v.children = []


def _cycle_error(views: Sequence[SpanView]) -> TraceReadError:
    """The error naming one cycle (called while the links are still in place)."""
    reached: set[int] = set()
    stack = [v for v in views if v.parent is None]
    while stack:
        node = stack.pop()
        reached.add(id(node))
        stack.extend(node.children)
    # A view no root reaches has a parent, and that parent is not reached either: walking up
    # from one stays among those (finitely many) views, so it comes back to one of them.
    current = next(v for v in views if id(v) not in reached)
    seen: dict[int, int] = {}
    path: list[SpanView] = []
    while id(current) not in seen:
        seen[id(current)] = len(path)
        path.append(current)
        assert current.parent is not None
        current = current.parent
    cycle = path[seen[id(current)] :]
    shown = " -> ".join(v.span_id for v in cycle[:4]) + (" -> ..." if len(cycle) > 4 else "")
    what = (
        "the span is its own parent"
        if len(cycle) == 1
        else f"span parent ids form a cycle of {len(cycle)} spans ({shown} -> {cycle[0].span_id})"
    )
    return TraceReadError(
        "parent_cycle",
        f"{what}: the trace's parent span ids are corrupt and it has no root to read from",
        span_name=cycle[0].name,
        span_id=cycle[0].span_id,
        attribute="parent_span_id",
    )
