"""SDK spans → the compact ``SpanRecord``s the exporter ships, and which records each run needs.

The exporter turns each span into a record when it files it (the SDK span is then freed) and,
on its default path, ships the records as they are: no message is parsed and nothing is
validated in the application (the worker validates the message and reads the run). Only the
attributes and events the transform reads are kept (``tracing._formats.is_read_attribute`` /
``READ_EVENTS``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from tracing._formats import READ_ATTRIBUTE_PREFIXES, READ_ATTRIBUTES, READ_EVENTS, SpanKind, classify
from tracing._run import SpanRecord, SpanRecordEvent
from tracing._span import plain_attributes

__all__ = ["build_record", "compact", "plan_runs", "service_name", "span_record"]


def span_record(span: ReadableSpan) -> SpanRecord:
    """``span`` as a ``SpanRecord``, not validated (its ids come from the SDK's own context)."""
    ctx = span.context
    if ctx is None:
        raise ValueError(f"span {span.name!r} has no span context")
    scope = span.instrumentation_scope
    record = build_record(
        span,
        ctx,
        span.parent,
        span.name,
        format(ctx.trace_id, "032x"),
        plain_attributes(span),
        service_name(span.resource),
        scope.name if scope is not None else None,
    )
    compact(record)
    return record


# A record's JSON apart from its text attribute values (ids, name, times, keys): a rough
# upper bound, for sizing batches.
RECORD_OVERHEAD_BYTES = 600


def compact(record: SpanRecord) -> int:
    """Keep only the attributes the transform reads (in place; idempotent). Returns the
    record's approximate JSON size in bytes (its text values plus a fixed overhead)."""
    keys, prefixes = READ_ATTRIBUTES, READ_ATTRIBUTE_PREFIXES
    kept = {k: v for k, v in record.attributes.items() if k in keys or k.startswith(prefixes)}
    record.attributes = kept
    size = RECORD_OVERHEAD_BYTES + _text_size(kept)
    for event in record.events:  # older GenAI conventions carry message content in events
        size += 100 + _text_size(event.attributes)
    return size


def _text_size(attributes: Mapping[str, Any]) -> int:
    try:  # the read attributes are nearly always text: one C-level pass
        return sum(map(len, attributes.values()))
    except TypeError:  # a number among them (a sequence counts its items: small anyway)
        return sum(len(v) for v in attributes.values() if isinstance(v, str))


def build_record(
    span: ReadableSpan,
    ctx: SpanContext,
    parent: SpanContext | None,
    name: str,
    trace_id: str,
    attributes: Mapping[str, Any],
    service: str | None,
    scope: str | None,
) -> SpanRecord:
    """``span_record`` from what the exporter has read already (every property read of an SDK
    span is a Python call: on its hot path each one counts), with ``attributes`` as given: the
    exporter passes the span's own (immutable once ended) dict and ``compact``s the record
    right before the hand-off, so the kept copy only lives while the batch is being sent
    (objects that live on in buffers are what makes the cyclic GC work)."""
    # The SDK's events property copies them through a generator; the list underneath is read
    # as is when there (most spans have none).
    raw_events = getattr(span, "_events", None)
    if raw_events is None:
        raw_events = span.events
    events: tuple[SpanRecordEvent, ...] = (
        tuple(
            SpanRecordEvent(e.name, e.timestamp, dict(e.attributes or {})) for e in raw_events if e.name in READ_EVENTS
        )
        if raw_events
        else ()
    )
    status = span.status
    # Positional: the cheapest way to build a dataclass (field order of ``SpanRecord``).
    return SpanRecord(
        trace_id,
        "%016x" % ctx.span_id,  # %-formatting: twice as fast as format() for this  # noqa: UP031
        name,
        "%016x" % parent.span_id if parent is not None else None,  # noqa: UP031
        span.kind._name_,  # Enum.name is a descriptor call; _name_ is the same string
        span.start_time,
        span.end_time,
        status.status_code._name_ if status is not None else "UNSET",
        # Every attribute for now: ``compact`` keeps the read ones before the hand-off.
        attributes if isinstance(attributes, dict) else dict(attributes),
        events,
        service,
        scope,
    )


def service_name(resource: Resource | None) -> str | None:
    value = resource.attributes.get("service.name") if resource is not None else None
    return value if isinstance(value, str) else None


def plan_runs(
    records: Sequence[SpanRecord],
    *,
    kinds: Sequence[SpanKind] | None = None,
    exclude_under: Collection[str] = (),
) -> list[tuple[SpanRecord, list[SpanRecord]]]:
    """The trace's runs, each as (target span, the records its transform reads), in start order.

    Targets are chosen as ``trace_to_run`` chooses them (top-level agent spans, else top-level
    LLM spans) from names and kind attributes only (``kinds``, when the caller classified the
    spans already); a target at or under a span id in ``exclude_under`` is left out (the loop
    guard). A run reads its target and the target's descendants: ancestors and unrelated spans
    are not shipped.
    """
    if kinds is None:
        kinds = [classify(r.name, r.attributes) for r in records]
    if not exclude_under and kinds.count("agent") == 1:
        # The common case, cheaply: one agent span, and it is the trace's only (local) root.
        root = records[kinds.index("agent")]
        ids = {r.span_id for r in records}
        if [r for r in records if r.parent_span_id not in ids] == [root]:
            return [(root, records if isinstance(records, list) else list(records))]
    kind_of = {r.span_id: k for r, k in zip(records, kinds, strict=True)}
    parent_of = {r.span_id: r.parent_span_id for r in records}
    limit = len(records)

    def chain(span_id: str) -> list[str]:
        out: list[str] = []
        parent = parent_of[span_id]
        while parent is not None and parent in parent_of and len(out) < limit:  # bounded: cycles end
            out.append(parent)
            parent = parent_of[parent]
        return out

    agents = [r for r, k in zip(records, kinds, strict=True) if k == "agent"]
    if agents:
        targets = [r for r in agents if not any(kind_of[a] == "agent" for a in chain(r.span_id))]
    else:
        targets = [
            r
            for r, k in zip(records, kinds, strict=True)
            if k == "llm" and not any(kind_of[a] in ("agent", "llm") for a in chain(r.span_id))
        ]
    if exclude_under:
        targets = [
            t
            for t in targets
            if t.span_id not in exclude_under and not any(a in exclude_under for a in chain(t.span_id))
        ]
    if not targets:
        return []
    if len(targets) == 1:
        roots = [sid for sid, parent in parent_of.items() if parent is None or parent not in parent_of]
        if roots == [targets[0].span_id]:  # the common case: one run owns the whole trace
            return [(targets[0], list(records))]
    groups: dict[str, list[SpanRecord]] = {t.span_id: [] for t in targets}
    for r in records:
        group = groups.get(r.span_id)
        if group is None:
            group = next((groups[a] for a in chain(r.span_id) if a in groups), None)
        if group is not None:
            group.append(r)
    targets.sort(key=lambda t: (t.start_time_ns or 0, t.span_id))
    return [(t, groups[t.span_id]) for t in targets]
