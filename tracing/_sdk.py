"""Reading the OTel SDK's ``ReadableSpan``: the one place that knows its private fields.

The exporter reads every field of every span on the application's hot path. Through the
public properties that is ~11 Python calls a span (and ``attributes`` wraps the dict in a
``MappingProxyType``, ``events`` copies into a tuple). The SDK keeps each property's value in a
private field of the same name, which one C-level ``attrgetter`` reads at once: the fast path.

Private fields are not an API, so the fast path is taken only when
- the installed ``opentelemetry-sdk`` is in the range this project tests (``TESTED_SDK``, kept
  equal to the bounds in pyproject.toml; tests/tracing/test_capture_sdk.py runs the conversion
  on the oldest and the newest), and
- a probe span built at import reads the same through the fields as through the properties,
and only for spans of exactly the SDK's ``ReadableSpan`` class (what every SDK processor hands
an exporter; a subclass may override a property). Anything else reads the public API.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

__all__ = [
    "FAST_PATH",
    "TESTED_SDK",
    "SpanFields",
    "SpanValues",
    "plain_attributes",
    "read_span",
    "sdk_version",
    "span_context",
    "span_values",
]

# (oldest, newest) minor versions of opentelemetry-sdk whose private fields the fast path reads:
# the bounds of pyproject.toml's pin, both tested.
TESTED_SDK = ((1, 27), (1, 45))


@dataclass(slots=True)
class SpanFields:
    """What the exporter reads of one span: plain values, enum names as strings."""

    context: SpanContext
    parent: SpanContext | None
    attributes: Mapping[str, Any]
    name: str
    kind: str  # SpanKind name: INTERNAL, SERVER, ...
    start_ns: int | None
    end_ns: int | None
    status: str  # StatusCode name: UNSET, OK, ERROR
    events: Sequence[Event]
    scope: InstrumentationScope | None
    resource: Resource | None


# ``SpanFields``' values in its field order: what the exporter's filing unpacks at once (a
# ``SpanFields`` built a span and read field by field cost it ~0.4 µs of the ~4 µs a span).
SpanValues = tuple[
    SpanContext,
    SpanContext | None,
    Mapping[str, Any],
    str,
    str,
    int | None,
    int | None,
    str,
    Sequence[Event],
    InstrumentationScope | None,
    Resource | None,
]


def sdk_version() -> tuple[int, int] | None:
    """The installed opentelemetry-sdk's (major, minor), or None when it cannot be told."""
    try:
        major, minor = importlib.metadata.version("opentelemetry-sdk").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


_FIELDS = attrgetter(
    "_context",
    "_parent",
    "_attributes",
    "_name",
    "_kind",
    "_start_time",
    "_end_time",
    "_status",
    "_events",
    "_instrumentation_scope",
    "_resource",
)


def _fast(span: ReadableSpan) -> SpanValues | None:
    """The fields through the private attributes, None when the span has no context."""
    ctx, parent, attributes, name, kind, start, end, status, events, scope, resource = _FIELDS(span)
    if ctx is None:
        return None
    if type(attributes) is BoundedAttributes:
        attrs: Mapping[str, Any] = attributes._dict  # frozen once the span ended
    elif isinstance(attributes, dict):
        attrs = attributes
    else:
        attrs = _public_attributes(span)
    if type(events) is BoundedList:  # its len() is a Python call; the deque's is not
        events = events._dq  # type: ignore[attr-defined]
    # (``status_code`` is a property: a Python call a span)
    status_name = status._status_code._name_ if status is not None else "UNSET"
    kind_name = kind._name_ if kind.__class__ is SpanKind else _kind_name(kind)
    return ctx, parent, attrs, name, kind_name, start, end, status_name, events, scope, resource


def _public(span: ReadableSpan) -> SpanValues | None:
    ctx = span.context
    if ctx is None:
        return None
    status = span.status
    return (
        ctx,
        span.parent,
        _public_attributes(span),
        span.name,
        _kind_name(span.kind),
        span.start_time,
        span.end_time,
        status.status_code.name if status is not None else "UNSET",
        span.events,
        span.instrumentation_scope,
        span.resource,
    )


def _kind_name(kind: object) -> str:
    """The name of a span's kind; ``INTERNAL``, the OTel default, for what is no ``SpanKind``
    (the SDK takes any object there, as for a name: its filing failed, an ``AttributeError``
    counted as an export error, and its run went without the span)."""
    return kind.name if isinstance(kind, SpanKind) else SpanKind.INTERNAL.name


def _public_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    attrs = span.attributes
    return dict(attrs) if attrs is not None else {}


def _probe() -> bool:
    """Whether the private fields read what the properties read, on a span built like the
    SDK builds them (bounded attributes and events)."""
    try:
        ctx = SpanContext(0x1234, 0x5678, is_remote=False)
        attrs = BoundedAttributes(attributes={"k": "v"}, immutable=True)
        events: BoundedList[Event] = BoundedList(4)
        events.append(Event("e", {"a": 1}, timestamp=5))
        span = ReadableSpan(
            name="probe",
            context=ctx,
            attributes=attrs,
            events=events,
            kind=SpanKind.CLIENT,
            status=Status(StatusCode.ERROR),
            start_time=1,
            end_time=2,
            instrumentation_scope=InstrumentationScope("probe.scope"),
        )
        fast_values, public_values = _fast(span), _public(span)
        if fast_values is None or public_values is None:
            return False
        fast, public = SpanFields(*fast_values), SpanFields(*public_values)
        return (
            dict(fast.attributes) == dict(public.attributes)
            and [(e.name, e.timestamp) for e in fast.events] == [(e.name, e.timestamp) for e in public.events]
            and (fast.context, fast.parent, fast.name, fast.kind, fast.start_ns, fast.end_ns, fast.status)
            == (public.context, public.parent, public.name, public.kind, public.start_ns, public.end_ns, public.status)
            and fast.scope is public.scope
            and fast.resource is public.resource
        )
    except Exception:  # an SDK that changed shape: the public API it is
        return False


def _fast_path_allowed() -> bool:
    version = sdk_version()
    return version is not None and TESTED_SDK[0] <= version <= TESTED_SDK[1] and _probe()


FAST_PATH = _fast_path_allowed()


def span_values(span: ReadableSpan) -> SpanValues | None:
    """The fields of ``span`` in ``SpanFields``' order (None when it has no span context): the
    private fields when ``FAST_PATH`` and ``span`` is exactly the SDK's ``ReadableSpan``, else
    the public API."""
    if FAST_PATH and type(span) is ReadableSpan:
        return _fast(span)
    return _public(span)


def read_span(span: ReadableSpan) -> SpanFields | None:
    """The fields of ``span`` by name (None when it has no span context), read as ``span_values``
    reads them."""
    values = span_values(span)
    return None if values is None else SpanFields(*values)


def span_context(span: ReadableSpan) -> SpanContext | None:
    """Only the context: a span of a trace that is not kept costs one field read (a span's
    other fields are cold in the CPU's caches by the time the batch comes here)."""
    ctx: SpanContext | None = span._context if FAST_PATH and type(span) is ReadableSpan else span.context
    return ctx


def plain_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain mapping, without copying on the fast path.

    ``ReadableSpan.attributes`` is a proxy over the SDK's ``BoundedAttributes``, whose ``.get``
    of a missing key goes through a raised ``KeyError``; most keys the transform looks up are
    missing, so the fast path reads the (frozen once the span ended) dict underneath.
    """
    if FAST_PATH and type(span) is ReadableSpan:
        inner = span._attributes
        if type(inner) is BoundedAttributes:
            return inner._dict
        if isinstance(inner, dict):
            return inner
    return _public_attributes(span)
