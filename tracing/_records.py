"""SDK spans → the compact ``SpanRecord``s the exporter ships, and which records each run needs.

The exporter turns each span into a compacted record when it files it (the SDK span is then
freed) and, on its default path, ships the records as they are: no message is parsed and
nothing is validated in the application (the worker validates the message and reads the run).
Only the attributes and events the transform reads are kept (``tracing._formats.is_read_attribute``
/ ``READ_EVENTS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from tracing._formats import (
    ENVIRONMENT_KEYS,
    NO_ENVIRONMENT,
    READ_ATTRIBUTE_PREFIXES,
    READ_ATTRIBUTES,
    READ_EVENTS,
    environment_of,
    resource_environment,
)
from tracing._markers import ROLE_ATTRIBUTE
from tracing._run import ENVIRONMENT_ATTRIBUTE, SpanRecord, SpanRecordEvent
from tracing._sdk import read_span
from tracing._sizes import RECORD_OVERHEAD_BYTES, events_size, name_size, str_size, text_size

__all__ = [
    "KeyPlan",
    "build_record",
    "compact",
    "key_plan",
    "origin_environment",
    "read_attributes",
    "service_name",
    "span_record",
]


def span_record(span: ReadableSpan) -> SpanRecord:
    """``span`` as a ``SpanRecord``, not validated (its ids come from the SDK's own context)."""
    f = read_span(span)
    if f is None:
        raise ValueError(f"span {span.name!r} has no span context")
    record, _ = build_record(
        "%016x" % f.context.span_id,  # noqa: UP031
        "%016x" % f.parent.span_id if f.parent is not None else None,  # noqa: UP031
        f.name,
        format(f.context.trace_id, "032x"),
        f.attributes,
        f.kind,
        f.start_ns,
        f.end_ns,
        f.status,
        f.events,
        service_name(f.resource),
        f.scope.name if f.scope is not None else None,
        origin_environment(f.resource),
    )
    return record


# Per attribute key tuple (the spans of one instrumentation share theirs, in order): the keys
# the transform does not read among them, or None when it reads them all (the span's own dict,
# frozen once it ended, is then kept as it is: nothing copied); and whether a key among them
# marks the span (``_MARKS``). Bounded: cleared when full.
KeyPlan = tuple[tuple[str, ...] | None, bool]
_PLANS: dict[tuple[str, ...], KeyPlan] = {}
_MAX_PLANS = 1024
# Keys without which a span is no judge's (``tracing.read.is_judge``) and its environment is its
# resource's alone (``environment_of``): most spans carry none, and skip both reads.
_MARKS = frozenset({ROLE_ATTRIBUTE, ENVIRONMENT_ATTRIBUTE, *ENVIRONMENT_KEYS})


def key_plan(attributes: Mapping[str, Any]) -> KeyPlan:
    """What the keys of ``attributes`` say (see ``_PLANS``), worked out once per key tuple."""
    keys = tuple(attributes)
    plan = _PLANS.get(keys)
    if plan is None:
        read, prefixes = READ_ATTRIBUTES, READ_ATTRIBUTE_PREFIXES
        dropped = tuple(k for k in keys if not (k in read or k.startswith(prefixes)))
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[keys] = (dropped or None, not _MARKS.isdisjoint(keys))
    return plan


def read_attributes(attributes: Mapping[str, Any], plan: KeyPlan | None = None) -> tuple[dict[str, Any], int]:
    """The attributes the transform reads (``attributes`` itself when it is a dict holding
    only those) and their approximate text size in bytes (``plan``: ``key_plan(attributes)``,
    when the caller has it)."""
    dropped = (plan or key_plan(attributes))[0]
    if dropped is None:
        out = attributes if isinstance(attributes, dict) else dict(attributes)
    else:  # a C-level copy, then the few unread keys out: cheaper than picking the read ones
        out = dict(attributes)
        for key in dropped:
            del out[key]
    return out, text_size(out)


def compact(record: SpanRecord) -> int:
    """Keep only the attributes the transform reads (in place; idempotent). Returns the
    record's approximate JSON size in bytes (its text values plus a fixed overhead)."""
    record.attributes, size = read_attributes(record.attributes)
    return RECORD_OVERHEAD_BYTES + name_size(record.name) + size + events_size(record.events)


def _span_name(name: object) -> str:
    # The SDK takes any object as a name (update_name(None)); the workers read a string, and
    # refused the whole batch (other traces' runs) over one such span.
    if isinstance(name, str):
        return str(name)
    if name is None:
        return ""
    try:
        return str(name)[:1024]
    except Exception:
        return type(name).__name__


def build_record(
    span_id: str,
    parent_span_id: str | None,
    name: str,
    trace_id: str,
    attributes: Mapping[str, Any],
    kind: str,
    start_ns: int | None,
    end_ns: int | None,
    status: str,
    events: Sequence[Any],
    service: str | None,
    scope: str | None,
    origin: Sequence[Any],
    plan: KeyPlan | None = None,
) -> tuple[SpanRecord, int]:
    """The ``SpanRecord`` of a span from its fields (``tracing._sdk.read_span``; its ids in hex), compacted
    (``compact``), and its approximate JSON size (``origin``: its resource's values of
    ``ENVIRONMENT_KEYS``, ``origin_environment``). The record keeps the span's own attribute
    dict when the transform reads every key of it (the common case): nothing is copied.
    ``ValueError`` for a value the workers would refuse (nested past ``MAX_VALUE_DEPTH``)."""
    if name.__class__ is not str:
        name = _span_name(name)
    if events:
        kept_events = tuple(
            SpanRecordEvent(e.name, e.timestamp, dict(e.attributes or {})) for e in events if e.name in READ_EVENTS
        )
    else:
        kept_events = ()
    if plan is None:
        plan = key_plan(attributes)
    attrs, size = read_attributes(attributes, plan)
    environment = environment_of(attrs, origin) if plan[1] or origin is not NO_ENVIRONMENT else None
    if environment is not None or (plan[1] and ENVIRONMENT_ATTRIBUTE in attrs):
        # Ours to set, never the span's own (a copy: ``attrs`` may be the span's own dict).
        if ENVIRONMENT_ATTRIBUTE in attrs:
            size -= text_size({ENVIRONMENT_ATTRIBUTE: attrs[ENVIRONMENT_ATTRIBUTE]})
        attrs = {key: value for key, value in attrs.items() if key != ENVIRONMENT_ATTRIBUTE}
        if environment is not None:
            attrs[ENVIRONMENT_ATTRIBUTE] = environment
            size += text_size({ENVIRONMENT_ATTRIBUTE: environment})
    # Positional: the cheapest way to build a dataclass (field order of ``SpanRecord``).
    record = SpanRecord(
        trace_id,
        span_id,
        name,
        parent_span_id,
        kind,
        start_ns,
        end_ns,
        status,
        attrs,
        kept_events,
        service,
        scope,
    )
    return record, RECORD_OVERHEAD_BYTES + str_size(name) + size + (events_size(kept_events) if kept_events else 0)


def service_name(resource: Resource | None) -> str | None:
    value = resource.attributes.get("service.name") if resource is not None else None
    return value if isinstance(value, str) else None


def origin_environment(resource: Resource | None) -> tuple[Any, ...]:
    """``resource``'s values of ``ENVIRONMENT_KEYS`` (for ``environment_of``)."""
    return NO_ENVIRONMENT if resource is None else resource_environment(resource.attributes.get)
