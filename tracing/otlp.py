"""OTLP traces to span records (backfill's path) and to and from OpenTelemetry SDK ``ReadableSpan`` objects.

Backfill decodes straight into the compact ``SpanRecord`` the exporter ships
(:func:`decode_otlp_records`): only the attributes and events the trace readers use are decoded
(``tracing._formats.is_read_attribute`` / ``READ_EVENTS``); others are skipped undecoded (so a
malformed value there is not an error), and links, flags and trace state are not read.

Decoding reads what stored traces look like in the wild:

- OTLP/JSON (the OTel Collector's file exporter, the OTLP HTTP JSON body): one
  ``ExportTraceServiceRequest`` object (``{"resourceSpans": [...]}``) per line. Trace and span
  ids are hex as the OTLP/JSON spec says; base64 ids (protobuf's generic JSON mapping, Tempo's
  API) are accepted too, as are ``snake_case`` field names, integer enums or their names, and
  64-bit integers as strings or numbers. Tempo's ``{"batches": [...]}`` and
  ``{"trace": {"resourceSpans": ...}}`` envelopes are unwrapped.
- OTLP/protobuf: the bytes of an ``ExportTraceServiceRequest`` (or Tempo's ``Trace`` message,
  which has the same wire layout).

Every decoding error is an :class:`OtlpDecodeError` naming where (file:line, when the caller
gives it) and which field (``resourceSpans[0].scopeSpans[1].spans[3].traceId``) was wrong.

Encoding (:func:`spans_to_otlp_json`) writes the Collector file exporter's form, used by the
examples and the benchmark to produce realistic input.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson
from opentelemetry.proto.common.v1.common_pb2 import AnyValue as PbAnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans as PbResourceSpans
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue

from tracing._errors import OtlpDecodeError, json_error, shape_of
from tracing._formats import (
    ENVIRONMENT_KEYS,
    READ_ATTRIBUTE_PREFIXES,
    READ_ATTRIBUTES,
    READ_EVENTS,
    environment_of,
    is_read_attribute,
    resource_environment,
)
from tracing._run import ENVIRONMENT_ATTRIBUTE, SpanRecord, SpanRecordEvent, otlp_time
from tracing._sizes import MAX_VALUE_DEPTH

__all__ = [
    "OtlpDecodeError",
    "decode_otlp_json",
    "decode_otlp_json_line",
    "decode_otlp_protobuf",
    "decode_otlp_protobuf_records",
    "decode_otlp_records",
    "decode_otlp_records_line",
    "spans_to_otlp_json",
]

_Value = Any  # an attribute value: str, bool, int, float, bytes, a list of them, or a mapping


# --- JSON ----------------------------------------------------------------------------------

_KINDS = {
    "SPAN_KIND_UNSPECIFIED": SpanKind.INTERNAL,
    "SPAN_KIND_INTERNAL": SpanKind.INTERNAL,
    "SPAN_KIND_SERVER": SpanKind.SERVER,
    "SPAN_KIND_CLIENT": SpanKind.CLIENT,
    "SPAN_KIND_PRODUCER": SpanKind.PRODUCER,
    "SPAN_KIND_CONSUMER": SpanKind.CONSUMER,
}
# OTLP numbers kinds from 1 (INTERNAL); the SDK enum numbers them from 0.
_KIND_NUMBERS = {
    0: SpanKind.INTERNAL,
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}
_OTLP_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_STATUS = {
    "STATUS_CODE_UNSET": StatusCode.UNSET,
    "STATUS_CODE_OK": StatusCode.OK,
    "STATUS_CODE_ERROR": StatusCode.ERROR,
    "UNSET": StatusCode.UNSET,
    "OK": StatusCode.OK,
    "ERROR": StatusCode.ERROR,
}
_STATUS_NUMBERS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_OTLP_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_UNSET_STATUS = Status(StatusCode.UNSET)
_HEX = frozenset("0123456789abcdefABCDEF")
_FIELD_NAME = re.compile(r"[A-Za-z_.]{1,32}")


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _list(obj: Mapping[str, Any], camel: str, snake: str, field: str, where: str) -> list[Any]:
    value = _get(obj, camel, snake)
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpDecodeError(f"expected a list, got {type(value).__name__}", where=where, field=f"{field}.{camel}")
    return value


def _enum_value(value: Any) -> str:
    """An enum field's bad value for an error: a number as is, anything else by its shape only
    (a document can hold anything where an enum belongs, and error texts reach logs)."""
    return repr(value) if type(value) is int else f"({shape_of(value)})"


def _key_names(obj: Mapping[Any, Any]) -> str:
    """An object's first keys for an error, those shaped like a format's field names (letters,
    ``_`` and ``.``, up to 32): a document that is not OTLP may be anything, and a key of
    another shape (a token, a sentence) is only counted, never echoed."""
    names = sorted(k for k in obj if isinstance(k, str) and _FIELD_NAME.fullmatch(k))
    others = len(obj) - len(names)
    shown = repr(names[:5]) if names else "[]"
    if len(names) > 5:
        shown += f" and {len(names) - 5} more"
    if others:
        shown += f" ({others} other key{'s' if others > 1 else ''} not shown)"
    return shown


def _object(value: Any, field: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise OtlpDecodeError(f"expected an object, got {type(value).__name__}", where=where, field=field)
    return value


def _id(value: Any, size: int, field: str, where: str, *, required: bool = True, suffix: str = "") -> int:
    """A hex id (OTLP/JSON) or a base64 one (protobuf JSON mapping); 0 when absent and optional.

    The error's field is ``field.suffix`` when a suffix is given (built only on error).
    """
    if value is None or value == "":
        if required:
            raise OtlpDecodeError("missing id", where=where, field=f"{field}.{suffix}" if suffix else field)
        return 0
    if type(value) is str and len(value) == size * 2 and _HEX.issuperset(value):
        number = int(value, 16)
    else:
        at = f"{field}.{suffix}" if suffix else field
        if not isinstance(value, str):
            raise OtlpDecodeError(f"id must be a string, got {type(value).__name__}", where=where, field=at)
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != size:
            raise OtlpDecodeError(
                f"id ({shape_of(value)}) is neither {size * 2} hex digits nor base64 of {size} bytes",
                where=where,
                field=at,
            )
        number = int.from_bytes(raw, "big")
    if number == 0 and required:
        raise OtlpDecodeError("id is all zeros (invalid)", where=where, field=f"{field}.{suffix}" if suffix else field)
    return number


def _int(value: Any, field: str, where: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise OtlpDecodeError("expected an integer, got a boolean", where=where, field=field)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise OtlpDecodeError(f"expected an integer, got {shape_of(value)}", where=where, field=field)


def _time_ns(value: Any, field: str, name: str, where: str) -> int | None:
    # Hot path (two per span): a timestamp is a short decimal string. int() would refuse "²"
    # (a digit, not a decimal) and a string past 4300 digits with errors no reader expects.
    # Up to 19 digits it is inside fixed64 (10**19 < 2**64).
    if type(value) is str and len(value) < 20 and value.isdecimal():
        return int(value)
    number = _int(value, f"{field}.{name}", where)
    if number is not None and not otlp_time(number):
        raise OtlpDecodeError(
            "a time outside 0 .. 2^64-1 nanoseconds (OTLP's fixed64)", where=where, field=f"{field}.{name}"
        )
    return number


def _text(value: Any, field: str, where: str) -> str:
    """A proto3 JSON string field: a string, or null for the default (the empty string)."""
    if type(value) is str:
        return value
    if value is None:
        return ""
    raise OtlpDecodeError(f"expected a string, got {shape_of(value)}", where=where, field=field)


def _any_value(value: Any, field: str, where: str, depth: int = 0) -> _Value:
    if not isinstance(value, dict):
        raise OtlpDecodeError(f"expected an AnyValue object, got {type(value).__name__}", where=where, field=field)
    if not value:
        return None
    for key, kind in value.items():
        if key in ("stringValue", "string_value"):
            return _text(kind, field, where)
        if key in ("boolValue", "bool_value"):
            if kind is None or kind is False or kind is True:  # proto3 JSON: null is the default
                return bool(kind)
            raise OtlpDecodeError(f"expected true or false, got {shape_of(kind)}", where=where, field=field)
        if key in ("intValue", "int_value"):
            return _int(kind, field, where)
        if key in ("doubleValue", "double_value"):
            if isinstance(kind, str):  # NaN / Infinity are strings in proto JSON
                try:
                    return float(kind)
                except ValueError:
                    raise OtlpDecodeError(
                        f"expected a number, got {shape_of(kind)}", where=where, field=field
                    ) from None
            if not isinstance(kind, int | float):
                raise OtlpDecodeError(f"expected a number, got {shape_of(kind)}", where=where, field=field)
            try:
                return float(kind)
            except OverflowError:  # an integer literal past a double's range
                raise OtlpDecodeError("number out of a double's range", where=where, field=field) from None
        if key in ("bytesValue", "bytes_value"):
            try:
                return base64.b64decode(kind)
            except (binascii.Error, TypeError, ValueError) as exc:
                raise OtlpDecodeError(f"bytesValue is not base64 ({exc})", where=where, field=field) from None
        if key in ("arrayValue", "array_value", "kvlistValue", "kvlist_value") and depth >= MAX_VALUE_DEPTH:
            raise OtlpDecodeError(
                f"attribute value nested too deeply (over {MAX_VALUE_DEPTH} arrayValue/kvlistValue levels)",
                where=where,
                field=field,
            )
        if key in ("arrayValue", "array_value"):
            items = _list(_object(kind, field, where), "values", "values", field, where)
            return tuple(
                _any_value(v, f"{field}.arrayValue.values[{i}]", where, depth + 1) for i, v in enumerate(items)
            )
        if key in ("kvlistValue", "kvlist_value"):
            items = _list(_object(kind, field, where), "values", "values", field, where)
            return _attributes(items, f"{field}.kvlistValue", where, depth=depth + 1)
    raise OtlpDecodeError(f"unknown AnyValue kind {_key_names(value)}", where=where, field=field)


def _attributes(
    items: Iterable[Any], field: str, where: str, *, only_read: bool = False, depth: int = 0
) -> dict[str, _Value]:
    """Decoded attributes; ``only_read``: just those the trace readers use (backfill's hot path);
    ``depth``: how many values they sit in."""
    out: dict[str, _Value] = {}
    read, prefixes = READ_ATTRIBUTES, READ_ATTRIBUTE_PREFIXES
    for i, item in enumerate(items):
        key = item.get("key") if isinstance(item, dict) else None
        if not isinstance(key, str):
            raise OtlpDecodeError("expected {key, value}", where=where, field=f"{field}[{i}]")
        if only_read and not (key in read or key.startswith(prefixes)):
            continue
        raw = item.get("value")
        if raw is None:
            if depth:  # a null inside a kvlist is kept, as the SDK and protobuf keep it
                out[key] = None
            continue
        # Fast path: most attribute values are strings (no error path to build).
        if type(raw) is dict and len(raw) == 1:
            text = raw.get("stringValue")
            if type(text) is str:
                out[key] = text
                continue
        value = _lenient(key, raw, f"{field}[{i}].value", where, depth)
        # A null attribute is none (the SDK drops it); a null inside a kvlist is a key the
        # readers test for ("role" in data): dropping it read the run otherwise than the exporter.
        if value is not None or depth:
            out[key] = value
    return out


def _set_environment(attributes: dict[str, _Value], resource: tuple[Any, ...]) -> None:
    """The record's ``ENVIRONMENT_ATTRIBUTE`` from its span's and resource's environment, in
    place of any the span had of its own."""
    attributes.pop(ENVIRONMENT_ATTRIBUTE, None)
    if (environment := environment_of(attributes, resource)) is not None:
        attributes[ENVIRONMENT_ATTRIBUTE] = environment


# Values decoded only to find where a span ran (or to drop a span's own ENVIRONMENT_ATTRIBUTE).
_LENIENT = frozenset({*ENVIRONMENT_KEYS, ENVIRONMENT_ATTRIBUTE})


def _lenient(key: str, raw: Any, field: str, where: str, depth: int = 0) -> _Value:
    """``_any_value``, except that an environment's value that does not decode is none: Langfuse
    files its span under its default, and the span itself is as good as before it was read."""
    if key not in _LENIENT:
        return _any_value(raw, field, where, depth)
    try:
        return _any_value(raw, field, where, depth)
    except OtlpDecodeError:
        return None


def _kind(value: Any, field: str, where: str) -> SpanKind:
    if value is None:
        return SpanKind.INTERNAL
    try:
        kind = _KINDS.get(value) if isinstance(value, str) else _KIND_NUMBERS.get(value)
    except TypeError:  # a list or an object: not even hashable
        kind = None
    if kind is None:
        raise OtlpDecodeError(f"unknown span kind {_enum_value(value)}", where=where, field=field)
    return kind


def _status(value: Any, field: str, where: str) -> Status:
    if not value:
        return _UNSET_STATUS
    status = _object(value, field, where)
    code_value = status.get("code", 0)
    try:
        code = _STATUS.get(code_value) if isinstance(code_value, str) else _STATUS_NUMBERS.get(code_value)
    except TypeError:  # a list or an object: not even hashable
        code = None
    if code is None:
        raise OtlpDecodeError(f"unknown status code {_enum_value(code_value)}", where=where, field=f"{field}.code")
    message = status.get("message") or None
    return Status(code, message if code is StatusCode.ERROR else None)


# A W3C tracestate list member (key=value), checked here: the SDK's parser logs a member it
# refuses, and a member may hold a credential.
_TRACE_STATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def _trace_state(value: Any) -> TraceState | None:
    """The span's tracestate; none when it is not a valid W3C list (as the SDK reads it)."""
    if not value or not isinstance(value, str):
        return None
    members = (m.strip(" \t") for m in value.split(","))
    if not all(_TRACE_STATE_MEMBER.fullmatch(m) for m in members if m):
        return None
    return TraceState.from_header([value])


def _json_span(
    raw: Any, resource: Resource, scope: InstrumentationScope | None, field: str, where: str
) -> ReadableSpan:
    # Hot path (every span of a backfill): error field paths are only built when an error is raised.
    span = _object(raw, field, where)
    trace_id = _id(_get(span, "traceId", "trace_id"), 16, field, where, suffix="traceId")
    span_id = _id(_get(span, "spanId", "span_id"), 8, field, where, suffix="spanId")
    parent_id = _id(
        _get(span, "parentSpanId", "parent_span_id"), 8, field, where, required=False, suffix="parentSpanId"
    )
    raw_flags = span.get("flags")
    flags = TraceFlags(((_int(raw_flags, f"{field}.flags", where) or 1) if raw_flags is not None else 1) & 0xFF)
    name = span.get("name")
    if not isinstance(name, str):
        raise OtlpDecodeError("span has no name", where=where, field=f"{field}.name")
    trace_state = _get(span, "traceState", "trace_state")
    context = SpanContext(trace_id, span_id, False, flags, _trace_state(trace_state) if trace_state else None)
    parent = SpanContext(trace_id, parent_id, False, flags) if parent_id else None
    raw_events = span.get("events")
    events = (
        [
            _json_event(e, f"{field}.events[{i}]", where)
            for i, e in enumerate(_list(span, "events", "events", field, where))
        ]
        if raw_events
        else []
    )
    raw_links = span.get("links")
    links = (
        [_json_link(k, f"{field}.links[{i}]", where) for i, k in enumerate(_list(span, "links", "links", field, where))]
        if raw_links
        else []
    )
    raw_attributes = span.get("attributes")
    if raw_attributes is not None and not isinstance(raw_attributes, list):
        raise OtlpDecodeError(
            f"expected a list, got {type(raw_attributes).__name__}", where=where, field=f"{field}.attributes"
        )
    start = _get(span, "startTimeUnixNano", "start_time_unix_nano")
    end = _get(span, "endTimeUnixNano", "end_time_unix_nano")
    kind = span.get("kind")
    status = span.get("status")
    return ReadableSpan(
        name=name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=_attributes(raw_attributes, f"{field}.attributes", where) if raw_attributes else {},
        events=events,
        links=links,
        kind=SpanKind.INTERNAL if kind is None else _kind(kind, f"{field}.kind", where),
        status=_status(status, f"{field}.status", where) if status else _UNSET_STATUS,
        start_time=_time_ns(start, field, "startTimeUnixNano", where),
        end_time=_time_ns(end, field, "endTimeUnixNano", where),
        instrumentation_scope=scope,
    )


def _json_event(raw: Any, field: str, where: str) -> Event:
    event = _object(raw, field, where)
    return Event(
        name=str(event.get("name", "")),
        attributes=_attributes(_list(event, "attributes", "attributes", field, where), f"{field}.attributes", where),
        timestamp=_time_ns(_get(event, "timeUnixNano", "time_unix_nano"), field, "timeUnixNano", where),
    )


def _json_link(raw: Any, field: str, where: str) -> Link:
    link = _object(raw, field, where)
    flags = _int(link.get("flags"), f"{field}.flags", where) or 0
    context = SpanContext(
        _id(_get(link, "traceId", "trace_id"), 16, f"{field}.traceId", where),
        _id(_get(link, "spanId", "span_id"), 8, f"{field}.spanId", where),
        True,
        TraceFlags(flags & 0xFF),
        _trace_state(_get(link, "traceState", "trace_state")),
    )
    return Link(
        context, _attributes(_list(link, "attributes", "attributes", field, where), f"{field}.attributes", where)
    )


# Resource and scope builders: what each decoder keeps of a ResourceSpans' resource and a
# ScopeSpans' scope (``_walk_json`` has already checked that both are objects).


def _json_resource(rs: Mapping[str, Any], attributes: list[Any], field: str, where: str) -> Resource:
    return Resource(
        _attributes(attributes, f"{field}.resource.attributes", where), _get(rs, "schemaUrl", "schema_url") or ""
    )


def _json_scope(ss: Mapping[str, Any], scope: Mapping[str, Any], field: str, where: str) -> InstrumentationScope:
    return InstrumentationScope(
        _text(scope.get("name"), f"{field}.scope.name", where),
        scope.get("version") or None,
        _get(ss, "schemaUrl", "schema_url") or None,
        _attributes(_list(scope, "attributes", "attributes", field, where), f"{field}.scope.attributes", where) or None,
    )


# --- JSON straight to span records (backfill) ------------------------------------------------

_KIND_NAMES: dict[str | int, str] = {
    **{name: kind.name for name, kind in _KINDS.items()},
    **{number: kind.name for number, kind in _KIND_NUMBERS.items()},
}
_STATUS_NAMES: dict[str | int, str] = {
    **{name: code.name for name, code in _STATUS.items()},
    **{number: code.name for number, code in _STATUS_NUMBERS.items()},
}


def _hex_id(value: Any, size: int, field: str, where: str, *, required: bool = True, suffix: str = "") -> str | None:
    """``_id`` as lowercase hex (None when absent and optional); hex input passes as is."""
    if type(value) is str and len(value) == size * 2 and _HEX.issuperset(value) and value.strip("0"):
        return value.lower()
    number = _id(value, size, field, where, required=required, suffix=suffix)
    return None if number == 0 else format(number, f"0{size * 2}x")


def _read_attributes(items: Any, field: str, where: str) -> dict[str, _Value]:
    """The attributes the trace readers use; the others' values are not decoded."""
    if type(items) is not list:
        raise OtlpDecodeError(f"expected a list, got {type(items).__name__}", where=where, field=field)
    return _attributes(items, field, where, only_read=True)


# What a record takes of its resource: service.name, and the values of ENVIRONMENT_KEYS.
_RecordResource = tuple[str | None, tuple[Any, ...]]


def _json_record(raw: Any, resource: _RecordResource, scope: str | None, field: str, where: str) -> SpanRecord:
    # Hot path (every span of a backfill): error field paths are only built when an error is raised.
    span = _object(raw, field, where)
    trace_id = _hex_id(_get(span, "traceId", "trace_id"), 16, field, where, suffix="traceId")
    span_id = _hex_id(_get(span, "spanId", "span_id"), 8, field, where, suffix="spanId")
    raw_parent = _get(span, "parentSpanId", "parent_span_id")
    parent_id = _hex_id(raw_parent, 8, field, where, required=False, suffix="parentSpanId") if raw_parent else None
    name = span.get("name")
    if type(name) is not str:
        raise OtlpDecodeError("span has no name", where=where, field=f"{field}.name")
    raw_events = span.get("events")
    events: tuple[SpanRecordEvent, ...] = ()
    if raw_events:
        kept: list[SpanRecordEvent] = []
        for i, e in enumerate(_list(span, "events", "events", field, where)):
            event = _object(e, f"{field}.events[{i}]", where)
            event_name = str(event.get("name", ""))
            if event_name in READ_EVENTS:
                at = f"{field}.events[{i}]"
                kept.append(
                    SpanRecordEvent(
                        event_name,
                        _time_ns(_get(event, "timeUnixNano", "time_unix_nano"), at, "timeUnixNano", where),
                        _attributes(_list(event, "attributes", "attributes", at, where), f"{at}.attributes", where),
                    )
                )
        events = tuple(kept)
    raw_attributes = span.get("attributes")
    start = _get(span, "startTimeUnixNano", "start_time_unix_nano")
    end = _get(span, "endTimeUnixNano", "end_time_unix_nano")
    kind = span.get("kind")
    if kind is None:
        kind_name = "INTERNAL"
    else:
        try:
            kind_name = _KIND_NAMES[kind] if type(kind) in (str, int) else ""
        except KeyError:
            kind_name = ""
        if not kind_name:
            raise OtlpDecodeError(f"unknown span kind {_enum_value(kind)}", where=where, field=f"{field}.kind")
    status = span.get("status")
    status_name = "UNSET"
    if status:
        code = _object(status, f"{field}.status", where).get("code", 0)
        try:
            status_name = _STATUS_NAMES[code] if type(code) in (str, int) else ""
        except KeyError:
            status_name = ""
        if not status_name:
            raise OtlpDecodeError(f"unknown status code {_enum_value(code)}", where=where, field=f"{field}.status.code")
    attributes = _read_attributes(raw_attributes, f"{field}.attributes", where) if raw_attributes else {}
    _set_environment(attributes, resource[1])
    # Positional, in SpanRecord's field order: the cheapest way to build the dataclass.
    return SpanRecord(
        trace_id,  # type: ignore[arg-type]  # required: never None
        span_id,  # type: ignore[arg-type]
        name,
        parent_id,
        kind_name,
        _time_ns(start, field, "startTimeUnixNano", where),
        _time_ns(end, field, "endTimeUnixNano", where),
        status_name,
        attributes,
        events,
        resource[0],
        scope,
    )


def _record_resource(rs: Mapping[str, Any], attributes: list[Any], field: str, where: str) -> _RecordResource:
    """The record's resource: only service.name and ENVIRONMENT_KEYS are decoded (the other
    attributes are not read, so a malformed value there is no error here)."""
    found: dict[str, Any] = {}
    for item in attributes:
        if type(item) is dict and ((key := item.get("key")) == "service.name" or key in ENVIRONMENT_KEYS):
            found[key] = _lenient(key, item.get("value") or {}, f"{field}.resource.attributes", where)
    service = found.get("service.name")
    return (service if isinstance(service, str) else None), resource_environment(found.get)


def _scope_name(ss: Mapping[str, Any], scope: Mapping[str, Any], field: str, where: str) -> str:
    return _text(scope.get("name"), f"{field}.scope.name", where)


# --- the walk of an OTLP/JSON document (both decoders) ---------------------------------------

_R = TypeVar("_R")  # what a builder keeps of a resource
_S = TypeVar("_S")  # ... of a scope
_T = TypeVar("_T")  # ... of a span


def _resource_spans_list(document: Any, where: str) -> tuple[list[Any], str]:
    """The ResourceSpans list of one document, and its field name (for error paths)."""
    body = _object(document, "$", where)
    if "trace" in body and isinstance(body["trace"], dict):  # Tempo /api/v2/traces
        body = body["trace"]
    for key in ("resourceSpans", "resource_spans", "batches"):
        if key in body:
            value = body[key]
            if not isinstance(value, list):
                raise OtlpDecodeError(f"expected a list, got {type(value).__name__}", where=where, field=key)
            return value, key
    if not body:
        return [], "resourceSpans"
    raise OtlpDecodeError(
        f"not an OTLP traces document: expected 'resourceSpans' (or 'batches'), found keys {_key_names(body)}",
        where=where,
    )


def _walk_json(
    document: Any,
    where: str,
    resource_of: Callable[[Mapping[str, Any], list[Any], str, str], _R],
    scope_of: Callable[[Mapping[str, Any], Mapping[str, Any], str, str], _S],
    span_of: Callable[[Any, _R, _S | None, str, str], _T],
) -> list[_T]:
    """Every span of one parsed document, built by ``span_of`` with what ``resource_of`` and
    ``scope_of`` built of its resource and scope (None when the ScopeSpans has no scope).

    The envelope, the structure checks and their error paths live here once; the builders
    decide what is decoded (the SDK's span: everything; a record: what the readers use). They
    are called back rather than fed from a generator: resuming a generator once a span would
    cost backfill's hot loop more than the call it replaces.
    """
    resource_spans, key = _resource_spans_list(document, where)
    out: list[_T] = []
    append = out.append
    try:
        for r, raw_rs in enumerate(resource_spans):
            rs_field = f"{key}[{r}]"
            rs = _object(raw_rs, rs_field, where)
            raw_resource = _object(rs.get("resource") or {}, f"{rs_field}.resource", where)
            resource = resource_of(
                rs, _list(raw_resource, "attributes", "attributes", rs_field, where), rs_field, where
            )
            scope_list = _get(rs, "scopeSpans", "scope_spans")
            scope_key = "scopeSpans"
            if scope_list is None:  # OTLP < 0.15 and older Tempo/Jaeger JSON
                scope_list = _get(rs, "instrumentationLibrarySpans", "instrumentation_library_spans") or []
                scope_key = "instrumentationLibrarySpans"
            if not isinstance(scope_list, list):
                raise OtlpDecodeError("expected a list", where=where, field=f"{rs_field}.{scope_key}")
            for s, raw_ss in enumerate(scope_list):
                ss_field = f"{rs_field}.{scope_key}[{s}]"
                ss = _object(raw_ss, ss_field, where)
                raw_scope = _get(ss, "scope", "instrumentationLibrary") or {}
                scope = (
                    scope_of(ss, _object(raw_scope, f"{ss_field}.scope", where), ss_field, where) if raw_scope else None
                )
                for i, raw_span in enumerate(_list(ss, "spans", "spans", ss_field, where)):
                    append(span_of(raw_span, resource, scope, f"{ss_field}.spans[{i}]", where))
    except RecursionError:  # attribute values nested (arrayValue/kvlistValue) beyond the stack
        raise OtlpDecodeError("attribute values nested too deeply", where=where) from None
    return out


def decode_otlp_json(document: Any, *, where: str = "") -> list[ReadableSpan]:
    """The spans of one parsed OTLP/JSON ``ExportTraceServiceRequest`` (or ``TracesData``)."""
    return _walk_json(document, where, _json_resource, _json_scope, _json_span)


def decode_otlp_json_line(line: str | bytes, *, where: str = "") -> list[ReadableSpan]:
    """Parse and decode one line of an OTLP/JSON Lines file (bytes: UTF-8, a BOM allowed)."""
    return decode_otlp_json(_parse_line(line, where), where=where)


def decode_otlp_records(document: Any, *, where: str = "") -> list[SpanRecord]:
    """The span records of one parsed OTLP/JSON ``ExportTraceServiceRequest`` (or ``TracesData``):
    what the exporter would ship of the same spans (only what the trace readers use)."""
    return _walk_json(document, where, _record_resource, _scope_name, _json_record)


def decode_otlp_records_line(line: str | bytes, *, where: str = "") -> list[SpanRecord]:
    """Parse one line of an OTLP/JSON Lines file (bytes: UTF-8, a BOM allowed) into span records."""
    return decode_otlp_records(_parse_line(line, where), where=where)


# Each digit and each minus as "0": a line holding 20 digits in a row may hold an integer literal
# past 64 bits, and one holding a minus and 19 digits an integer below int64's least
# (-9223372036854775809 .. -9999999999999999999), each of which orjson reads as a float (its
# value rounded) where ``json`` keeps it exact. Both read as 20 zeros: one search, as for the
# digits alone. (19 digits alone stay on orjson: unsigned, they fit its 64 bits.)
_DIGITS_AS_ZERO = bytes.maketrans(b"-123456789", b"0000000000")
_TWENTY_DIGITS = b"0" * 20


def _parse_line(line: str | bytes, where: str) -> Any:
    """``json.loads(line)``: the same value or the same error. A line of bytes goes to orjson
    first (a backfill's lines: about 60% of ``json``'s time, bench/backfill.py's reading), unless
    it may hold an integer past 64 bits or below int64's least; what orjson refuses (NaN and
    Infinity, lone surrogates, a BOM, UTF-16, nesting past 1024 levels, broken JSON) ``json``
    reads, or refuses with its own error, as before."""
    if isinstance(line, bytes) and _TWENTY_DIGITS not in line.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(line.removeprefix("\ufeff") if isinstance(line, str) else line)
    except (ValueError, RecursionError) as exc:  # RecursionError: e.g. 100,000 nested brackets
        raise OtlpDecodeError(f"not JSON ({json_error(exc)})", where=where) from None


# --- protobuf ------------------------------------------------------------------------------


class _NestedTooDeep(Exception):
    """A protobuf attribute value past ``MAX_VALUE_DEPTH`` (named with its place by the caller)."""


def _pb_lenient(key: str, value: PbAnyValue) -> _Value:
    """``_pb_value``, except that an environment's value nested too deeply is none (``_lenient``)."""
    if key not in _LENIENT:
        return _pb_value(value)
    try:
        return _pb_value(value)
    except (RecursionError, _NestedTooDeep):
        return None


def _pb_value(value: PbAnyValue, depth: int = 0) -> _Value:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value" or kind == "kvlist_value":
        if depth >= MAX_VALUE_DEPTH:  # the same cap as OTLP/JSON's
            raise _NestedTooDeep
        if kind == "array_value":
            return tuple(_pb_value(v, depth + 1) for v in value.array_value.values)
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def _pb_attributes(items: Iterable[Any]) -> dict[str, _Value]:
    out: dict[str, _Value] = {}
    for kv in items:
        value = _pb_value(kv.value)
        if value is not None:
            out[kv.key] = value
    return out


def _pb_id(raw: bytes, size: int, field: str, where: str, *, required: bool = True) -> int:
    if not raw:
        if required:
            raise OtlpDecodeError("missing id", where=where, field=field)
        return 0
    if len(raw) != size:
        raise OtlpDecodeError(f"id has {len(raw)} bytes, expected {size}", where=where, field=field)
    return int.from_bytes(raw, "big")


def _pb_resource_spans(rs_list: Sequence[PbResourceSpans], where: str) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for r, rs in enumerate(rs_list):
        resource = Resource(_pb_attributes(rs.resource.attributes), rs.schema_url or "")
        for s, ss in enumerate(rs.scope_spans):
            scope = None
            if ss.HasField("scope"):
                scope = InstrumentationScope(
                    ss.scope.name,
                    ss.scope.version or None,
                    ss.schema_url or None,
                    _pb_attributes(ss.scope.attributes) or None,
                )
            for i, span in enumerate(ss.spans):
                field = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                trace_id = _pb_id(span.trace_id, 16, f"{field}.traceId", where)
                span_id = _pb_id(span.span_id, 8, f"{field}.spanId", where)
                parent_id = _pb_id(span.parent_span_id, 8, f"{field}.parentSpanId", where, required=False)
                flags = TraceFlags((span.flags or 1) & 0xFF)
                status_code = _STATUS_NUMBERS.get(span.status.code, StatusCode.UNSET)
                spans.append(
                    ReadableSpan(
                        name=span.name,
                        context=SpanContext(trace_id, span_id, False, flags, _trace_state(span.trace_state)),
                        parent=SpanContext(trace_id, parent_id, False, flags) if parent_id else None,
                        resource=resource,
                        attributes=_pb_attributes(span.attributes),
                        events=[
                            Event(e.name, _pb_attributes(e.attributes), e.time_unix_nano or None) for e in span.events
                        ],
                        links=[
                            Link(
                                SpanContext(
                                    _pb_id(link.trace_id, 16, f"{field}.links[{j}].traceId", where),
                                    _pb_id(link.span_id, 8, f"{field}.links[{j}].spanId", where),
                                    True,
                                    TraceFlags(link.flags & 0xFF),
                                    _trace_state(link.trace_state),
                                ),
                                _pb_attributes(link.attributes),
                            )
                            for j, link in enumerate(span.links)
                        ],
                        kind=_KIND_NUMBERS.get(span.kind, SpanKind.INTERNAL),
                        status=Status(
                            status_code, span.status.message or None if status_code is StatusCode.ERROR else None
                        ),
                        start_time=span.start_time_unix_nano or None,
                        end_time=span.end_time_unix_nano or None,
                        instrumentation_scope=scope,
                    )
                )
    return spans


def decode_otlp_protobuf(data: bytes, *, where: str = "") -> list[ReadableSpan]:
    """The spans of a protobuf ``ExportTraceServiceRequest`` / ``TracesData`` / Tempo ``Trace``.

    All three put their ``ResourceSpans`` in field 1, so one message type reads them all.
    """
    return _pb_decode(data, where, _pb_resource_spans)


def decode_otlp_protobuf_records(data: bytes, *, where: str = "") -> list[SpanRecord]:
    """The span records of an OTLP/protobuf ``ExportTraceServiceRequest`` (or Tempo ``Trace``).

    As from OTLP/JSON, only what the readers use is decoded (the read attributes and events,
    the resource's service.name and environment): a malformed value elsewhere, or a link without ids, is no
    error, where decoding every span whole lost the message over it. (The protobuf parser
    itself still refuses a message nesting past 100 levels, read or not: some 32 levels of
    kvlistValue, 48 of arrayValue.)"""
    return _pb_decode(data, where, _pb_records)


def _pb_decode(data: bytes, where: str, read: Callable[[Sequence[PbResourceSpans], str], list[_T]]) -> list[_T]:
    """Parse ``data`` as ``TracesData`` and ``read`` its resource spans, errors as ``OtlpDecodeError``."""
    message = TracesData()
    try:
        message.ParseFromString(data)
    except Exception as exc:  # protobuf raises its own DecodeError (not exported with types)
        raise OtlpDecodeError(f"not an OTLP protobuf message ({exc})", where=where) from None
    try:
        spans = read(message.resource_spans, where)
    except (RecursionError, _NestedTooDeep):
        raise OtlpDecodeError(
            f"attribute value nested too deeply (over {MAX_VALUE_DEPTH} arrayValue/kvlistValue levels)", where=where
        ) from None
    if not spans and data:
        # The parser keeps a field it does not know (or of another wire type) as unknown, so
        # garbage that happens to parse decoded to no spans without a word. A message without
        # spans is legal OTLP, but not one holding what OTLP does not have.
        size = message.ByteSize()
        message.DiscardUnknownFields()
        if (unknown := size - message.ByteSize()) > 0:
            raise OtlpDecodeError(
                f"not an OTLP protobuf message: no spans, and {unknown:,} of its {size:,} bytes are fields"
                " OTLP traces do not have (or of another wire type)",
                where=where,
            )
    return spans


def _pb_records(rs_list: Sequence[PbResourceSpans], where: str) -> list[SpanRecord]:
    records: list[SpanRecord] = []
    for r, rs in enumerate(rs_list):
        found = {
            kv.key: _pb_lenient(kv.key, kv.value)
            for kv in rs.resource.attributes
            if kv.key == "service.name" or kv.key in ENVIRONMENT_KEYS
        }
        service = found.get("service.name")
        service = service if isinstance(service, str) else None
        environment = resource_environment(found.get)
        for s, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name if ss.HasField("scope") else None
            for i, span in enumerate(ss.spans):
                field = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                trace_id = _pb_id(span.trace_id, 16, f"{field}.traceId", where)
                span_id = _pb_id(span.span_id, 8, f"{field}.spanId", where)
                parent_id = _pb_id(span.parent_span_id, 8, f"{field}.parentSpanId", where, required=False)
                attributes: dict[str, _Value] = {}
                for kv in span.attributes:
                    key = kv.key  # (ENVIRONMENT_ATTRIBUTE is ours to set: not read)
                    if (
                        is_read_attribute(key)
                        and key != ENVIRONMENT_ATTRIBUTE
                        and (value := _pb_lenient(key, kv.value)) is not None
                    ):
                        attributes[key] = value
                _set_environment(attributes, environment)
                events = tuple(
                    SpanRecordEvent(e.name, e.time_unix_nano or None, _pb_attributes(e.attributes))
                    for e in span.events
                    if e.name in READ_EVENTS
                )
                records.append(
                    SpanRecord(
                        f"{trace_id:032x}",
                        f"{span_id:016x}",
                        span.name,
                        f"{parent_id:016x}" if parent_id else None,
                        _KIND_NUMBERS.get(span.kind, SpanKind.INTERNAL).name,
                        span.start_time_unix_nano or None,
                        span.end_time_unix_nano or None,
                        _STATUS_NUMBERS.get(span.status.code, StatusCode.UNSET).name,
                        attributes,
                        events,
                        service,
                        scope,
                    )
                )
    return records


# --- encoding (the Collector file exporter's form) -----------------------------------------


def _encode_value(value: Any) -> dict[str, Any]:
    if value is None:  # an empty AnyValue: null inside a kvlist or an array
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _encode_attributes(value)}}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_encode_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _encode_attributes(attributes: Mapping[str, AttributeValue] | Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _encode_value(v)} for k, v in (attributes or {}).items()]


def _encode_span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
    }
    if context.trace_state:
        out["traceState"] = context.trace_state.to_header()
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    out["flags"] = int(context.trace_flags) | 0x100  # bit 8: "has is_remote" per OTLP 1.1
    out["name"] = span.name
    out["kind"] = _OTLP_KIND[span.kind]
    out["startTimeUnixNano"] = str(span.start_time or 0)
    out["endTimeUnixNano"] = str(span.end_time or 0)
    out["attributes"] = _encode_attributes(span.attributes)
    if span.events:
        out["events"] = [
            {"timeUnixNano": str(e.timestamp), "name": e.name, "attributes": _encode_attributes(e.attributes)}
            for e in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": _encode_attributes(link.attributes),
            }
            for link in span.links
        ]
    status: dict[str, Any] = {}
    if span.status.status_code is not StatusCode.UNSET:
        status["code"] = _OTLP_STATUS[span.status.status_code]
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    return out


def spans_to_otlp_json(spans: Iterable[ReadableSpan]) -> dict[str, Any]:
    """One ``ExportTraceServiceRequest`` as OTLP/JSON (hex ids), grouped by resource and scope."""
    by_resource: dict[int, tuple[Resource, dict[tuple[str, str, str], list[dict[str, Any]]]]] = {}
    scopes: dict[tuple[str, str, str], InstrumentationScope | None] = {}
    for span in spans:
        entry = by_resource.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "", scope.schema_url or "") if scope else ("", "", "")
        scopes.setdefault(key, scope)
        entry[1].setdefault(key, []).append(_encode_span(span))
    resource_spans = []
    for resource, groups in by_resource.values():
        scope_spans = []
        for key, encoded in groups.items():
            scope = scopes[key]
            block: dict[str, Any] = {"scope": {"name": key[0]}, "spans": encoded}
            if key[1]:
                block["scope"]["version"] = key[1]
            if scope is not None and scope.attributes:
                block["scope"]["attributes"] = _encode_attributes(scope.attributes)
            if key[2]:
                block["schemaUrl"] = key[2]
            scope_spans.append(block)
        rs: dict[str, Any] = {
            "resource": {"attributes": _encode_attributes(resource.attributes)},
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        resource_spans.append(rs)
    return {"resourceSpans": resource_spans}
