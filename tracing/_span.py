"""A read-only view of one span, the same for SDK ``ReadableSpan``s and decoded OTLP spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["SpanEvent", "SpanView", "view_spans"]


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    attributes: Mapping[str, Any]
    body: Any = None  # log-record events carry their payload here


@dataclass(slots=True)
class SpanView:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    parent_is_remote: bool
    attributes: Mapping[str, Any]
    events: list[SpanEvent]
    start_ns: int | None
    end_ns: int | None
    scope: str
    service: str | None
    children: list[SpanView] = field(default_factory=list)
    parent: SpanView | None = None

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


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def view_span(span: ReadableSpan) -> SpanView:
    ctx = span.context
    if ctx is None:
        raise ValueError(f"span {span.name!r} has no span context")
    parent = span.parent
    resource = span.resource
    service = resource.attributes.get("service.name") if resource is not None else None
    scope = span.instrumentation_scope
    events = [SpanEvent(e.name, dict(e.attributes or {})) for e in span.events]
    return SpanView(
        name=span.name,
        trace_id=_hex(ctx.trace_id, 32),
        span_id=_hex(ctx.span_id, 16),
        parent_id=_hex(parent.span_id, 16) if parent is not None else None,
        parent_is_remote=bool(parent is not None and parent.is_remote),
        attributes=span.attributes or {},
        events=events,
        start_ns=span.start_time,
        end_ns=span.end_time,
        scope=scope.name if scope is not None else "",
        service=service if isinstance(service, str) else None,
    )


def view_spans(spans: Sequence[ReadableSpan]) -> list[SpanView]:
    """Views of ``spans`` with parent/child links resolved inside the trace."""
    views = [view_span(s) for s in spans]
    by_id = {v.span_id: v for v in views}
    for v in views:
        if v.parent_id is not None:
            parent = by_id.get(v.parent_id)
            if parent is not None and parent is not v:
                v.parent = parent
                parent.children.append(v)
    for v in views:
        v.children.sort(key=lambda c: (c.start_ns or 0, c.span_id))
    return views
