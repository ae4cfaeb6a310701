"""tracing.otlp's two decoders of one document: the SDK's ``ReadableSpan`` (everything) and the
backfill's ``SpanRecord`` (what the readers use) walk it alike, for OTLP/JSON and protobuf.

The expected record fields are derived here from the ReadableSpan by hand (not with
``span_record``, which the protobuf records path itself uses), so both sides are checked.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.trace import ReadableSpan

from tracing._formats import READ_EVENTS, environment_of, is_read_attribute
from tracing._records import compact, origin_environment
from tracing._run import ENVIRONMENT_ATTRIBUTE, SpanRecord, SpanRecordEvent
from tracing.otlp import (
    OtlpDecodeError,
    decode_otlp_json,
    decode_otlp_json_line,
    decode_otlp_protobuf,
    decode_otlp_protobuf_records,
    decode_otlp_records,
    decode_otlp_records_line,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"
OTHER_TRACE = "1bf7651916cd43dd8448eb211c80319d"


def _s(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


# Two resources, a scope-less ScopeSpans, the pre-0.15 instrumentationLibrarySpans form, snake_case
# and base64 ids, kinds and status codes by name and number, read and unread attributes and events.
DOCUMENT: dict[str, Any] = {
    "resourceSpans": [
        {
            "resource": {
                "attributes": [
                    _s("service.name", "shop"),
                    _s("host.name", "h1"),
                    _s("deployment.environment.name", "Prod"),
                ]
            },
            "schemaUrl": "https://opentelemetry.io/schemas/1.21.0",
            "scopeSpans": [
                {
                    "scope": {"name": "shop.agent", "version": "1.2", "attributes": [_s("lib", "x")]},
                    "spans": [
                        {
                            "traceId": TRACE,
                            "spanId": "b7ad6b7169203331",
                            "name": "invoke_agent a",
                            "kind": "SPAN_KIND_INTERNAL",
                            "startTimeUnixNano": "1000",
                            "endTimeUnixNano": "9000",
                            "attributes": [
                                _s("gen_ai.operation.name", "invoke_agent"),
                                _s("gen_ai.agent.name", "a"),
                                _s("langfuse.environment", "staging"),  # before the resource's
                                _s("http.route", "/not/read"),
                                {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}},
                            ],
                        },
                        {
                            "traceId": TRACE,
                            "spanId": "c7ad6b7169203332",
                            "parentSpanId": "b7ad6b7169203331",
                            "name": "chat gpt",
                            "kind": 3,
                            "startTimeUnixNano": 2000,
                            "endTimeUnixNano": "8000",
                            "status": {"code": "STATUS_CODE_ERROR", "message": "boom"},
                            "attributes": [
                                _s("gen_ai.operation.name", "chat"),
                                _s("gen_ai.request.model", "gpt"),
                                _s("llm.input_messages.0.message.role", "user"),
                                {"key": "not.read.flag", "value": {"boolValue": True}},
                                _s("deployment.environment", "dev"),  # after the resource's key before it
                            ],
                            "events": [
                                {
                                    "timeUnixNano": "2500",
                                    "name": "gen_ai.user.message",
                                    "attributes": [_s("content", "hi"), {"key": "n", "value": {"intValue": 2}}],
                                },
                                {"timeUnixNano": "2600", "name": "exception", "attributes": [_s("k", "v")]},
                                {"timeUnixNano": "2700", "name": "gen_ai.choice", "attributes": []},
                            ],
                        },
                    ],
                },
                {
                    "spans": [
                        {
                            "traceId": TRACE,
                            "spanId": "d7ad6b7169203333",
                            "parentSpanId": "c7ad6b7169203332",
                            "name": "execute_tool w",
                            "kind": "SPAN_KIND_CLIENT",
                            "status": {"code": 1},
                            "startTimeUnixNano": "3000",
                            "endTimeUnixNano": "4000",
                            "attributes": [_s("gen_ai.tool.name", "w")],
                        }
                    ]
                },
            ],
        },
        {
            "resource": {
                "attributes": [
                    _s("deployment", "prod"),
                    # the first key set decides, and a number is no environment (Langfuse: default)
                    {"key": "deployment.environment.name", "value": {"intValue": "3"}},
                    _s("deployment.environment", "qa"),
                ]
            },
            "instrumentationLibrarySpans": [
                {
                    "instrumentationLibrary": {"name": "old.lib"},
                    "spans": [
                        {
                            "trace_id": _b64(OTHER_TRACE),
                            "span_id": _b64("e7ad6b7169203334"),
                            "name": "server",
                            "kind": 2,
                            "start_time_unix_nano": "5000",
                            "end_time_unix_nano": "6000",
                            "attributes": [_s("session.id", "s1")],
                        }
                    ],
                }
            ],
        },
    ]
}


def _expected_record(span: ReadableSpan) -> SpanRecord:
    """What the records path must give of ``span``: the fields both carry, read off the SDK span."""
    context = span.get_span_context()
    assert context is not None
    service = span.resource.attributes.get("service.name")
    attributes = {k: v for k, v in (span.attributes or {}).items() if is_read_attribute(k)}
    environment = environment_of(span.attributes or {}, origin_environment(span.resource))
    if environment is not None:
        attributes[ENVIRONMENT_ATTRIBUTE] = environment
    return SpanRecord(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        name=span.name,
        parent_span_id=f"{span.parent.span_id:016x}" if span.parent is not None else None,
        kind=span.kind.name,
        start_time_ns=span.start_time,
        end_time_ns=span.end_time,
        status=span.status.status_code.name,
        attributes=attributes,
        events=tuple(
            SpanRecordEvent(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events if e.name in READ_EVENTS
        ),
        service_name=service if isinstance(service, str) else None,
        scope_name=span.instrumentation_scope.name if span.instrumentation_scope is not None else None,
    )


def _assert_agree(spans: list[ReadableSpan], records: list[SpanRecord]) -> None:
    assert len(spans) == len(records) == 4
    for span, record in zip(spans, records, strict=True):
        assert record == _expected_record(span)


def test_json_paths_agree_on_every_shared_field() -> None:
    """decode_otlp_json and decode_otlp_records give the same spans, field by field."""
    spans = decode_otlp_json(DOCUMENT)
    records = decode_otlp_records(DOCUMENT)
    _assert_agree(spans, records)
    # The document's own values, so that agreement is not two equal mistakes.
    assert [r.service_name for r in records] == ["shop", "shop", "shop", None]
    assert [r.scope_name for r in records] == ["shop.agent", "shop.agent", None, "old.lib"]
    assert [r.kind for r in records] == ["INTERNAL", "CLIENT", "CLIENT", "SERVER"]
    assert [r.status for r in records] == ["UNSET", "ERROR", "OK", "UNSET"]
    assert [r.environment for r in records] == ["staging", "Prod", "Prod", None]
    assert records[3].trace_id == OTHER_TRACE
    assert records[1].attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt",
        "llm.input_messages.0.message.role": "user",
        "deployment.environment": "dev",
        "tracescore.environment": "Prod",
    }
    assert [(e.name, e.time_ns) for e in records[1].events] == [("gen_ai.user.message", 2500), ("gen_ai.choice", 2700)]
    assert spans[0].resource.attributes["host.name"] == "h1"  # the SDK path keeps the whole resource
    line = json.dumps(DOCUMENT)
    assert decode_otlp_records_line(line) == records
    _assert_agree(decode_otlp_json_line(line), records)


def test_protobuf_paths_agree_on_every_shared_field() -> None:
    """decode_otlp_protobuf and decode_otlp_protobuf_records agree, and give the JSON path's records."""
    data = encode_spans(decode_otlp_json(DOCUMENT)).SerializeToString()
    spans = decode_otlp_protobuf(data)
    records = decode_otlp_protobuf_records(data)
    _assert_agree(spans, records)
    # The SDK's encoder puts a scope-less span under an empty scope (name ""): not the decoders' doing.
    from_json = {
        r.span_id: dataclasses.replace(r, scope_name=r.scope_name or "") for r in decode_otlp_records(DOCUMENT)
    }
    assert {r.span_id: r for r in records} == from_json


def _doc(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """DOCUMENT with the item at ``path`` replaced by ``value``."""
    doc = copy.deepcopy(DOCUMENT)
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


_SPAN1 = ("resourceSpans", 0, "scopeSpans", 0, "spans", 1)
_RS0 = ("resourceSpans", 0)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (_doc((*_SPAN1, "traceId"), "zz"), r"id \(a string of 2 chars\) is neither 32 hex digits"),
        (_doc((*_SPAN1, "spanId"), "0" * 16), r"id is all zeros"),
        (_doc((*_SPAN1, "parentSpanId"), 7), r"id must be a string, got int"),
        (_doc((*_SPAN1, "name"), None), r"span has no name"),
        (_doc((*_SPAN1, "kind"), "SPAN_KIND_NOPE"), r"unknown span kind"),
        (_doc((*_SPAN1, "status"), {"code": {}}), r"unknown status code"),
        (_doc((*_SPAN1, "startTimeUnixNano"), "soon"), r"expected an integer"),
        (_doc((*_SPAN1, "attributes"), {"a": 1}), r"expected a list, got dict"),
        (_doc((*_SPAN1, "attributes", 0, "value"), {"doubleValue": "abc"}), r"expected a number"),
        # These read as the text "{...}" and as True before.
        (_doc((*_SPAN1, "attributes", 0, "value"), {"stringValue": {"a": 1}}), r"expected a string, got an object"),
        (_doc((*_SPAN1, "attributes", 0, "value"), {"boolValue": "false"}), r"expected true or false, got a string"),
        (_doc((*_RS0, "scopeSpans", 0, "scope", "name"), ["x"]), r"expected a string, got a list .*scope\.name"),
        (_doc((*_SPAN1, "events", 0), "e"), r"expected an object, got str"),
        (_doc((*_SPAN1, "events", 0, "timeUnixNano"), [1]), r"expected an integer"),
        (_doc(_SPAN1, ["not", "a", "span"]), r"expected an object, got list"),
        (_doc((*_RS0, "scopeSpans"), {"spans": []}), r"expected a list"),
        (_doc((*_RS0, "scopeSpans", 0, "scope"), "x"), r"expected an object, got str"),
        (_doc((*_RS0, "resource", "attributes"), "x"), r"expected a list, got str"),
        (_doc(("resourceSpans",), {}), r"expected a list, got dict"),
        ({"spans": []}, r"not an OTLP traces document"),
    ],
)
def test_json_malformations_give_the_same_error_through_both_paths(document: Any, message: str) -> None:
    """The same OtlpDecodeError (message, place and field) whichever decoder reads the document."""
    with pytest.raises(OtlpDecodeError, match=message) as sdk:
        decode_otlp_json(document, where="f.jsonl:3")
    with pytest.raises(OtlpDecodeError) as rec:
        decode_otlp_records(document, where="f.jsonl:3")
    assert (str(rec.value), rec.value.field, rec.value.where) == (str(sdk.value), sdk.value.field, sdk.value.where)
    assert sdk.value.where == "f.jsonl:3"


def test_values_the_readers_do_not_read_are_not_decoded_for_records() -> None:
    """The asymmetry on purpose: a malformed unread attribute, event or link fails the SDK
    path only; the records path never decodes it."""
    for path, value in [
        ((*_SPAN1, "attributes", 3, "value"), {"doubleValue": "abc"}),
        ((*_SPAN1, "events", 1, "timeUnixNano"), "soon"),
        ((*_SPAN1, "links"), [{"traceId": "zz", "spanId": "b7ad6b7169203331"}]),
        ((*_RS0, "resource", "attributes", 1, "value"), {"doubleValue": "abc"}),
    ]:
        document = _doc(path, value)
        with pytest.raises(OtlpDecodeError):
            decode_otlp_json(document)
        assert len(decode_otlp_records(document)) == 4


def _pb(**span_fields: Any) -> bytes:
    message = TracesData()
    span = message.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex("b7ad6b7169203331"), "x"
    for key, value in span_fields.items():
        if key == "link":
            link = span.links.add()
            link.trace_id, link.span_id = value
        else:
            setattr(span, key, value)
    return message.SerializeToString()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_pb(trace_id=b""), r"missing id at resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]\.traceId$"),
        (_pb(span_id=b"\x01\x02\x03"), r"id has 3 bytes, expected 8 at .*spans\[0\]\.spanId$"),
        (_pb(parent_span_id=b"\x01"), r"id has 1 bytes, expected 8 at .*spans\[0\]\.parentSpanId$"),
        (b"\x0a\xff\xff\xff", r"not an OTLP protobuf message"),
    ],
)
def test_protobuf_malformations_give_the_same_error_through_both_paths(data: bytes, message: str) -> None:
    with pytest.raises(OtlpDecodeError, match=message) as sdk:
        decode_otlp_protobuf(data, where="t.pb")
    with pytest.raises(OtlpDecodeError) as rec:
        decode_otlp_protobuf_records(data, where="t.pb")
    assert (str(rec.value), rec.value.field, rec.value.where) == (str(sdk.value), sdk.value.field, sdk.value.where)


def _nested_past_the_cap(attributes: Any, key: str, text: str) -> None:
    """An attribute ``key`` whose value is ``text`` 40 arrayValues deep: past the 32 levels a
    value may nest, short of the protobuf parser's own limit."""
    kv = attributes.add()
    kv.key = key
    value = kv.value
    for _ in range(40):
        value = value.array_value.values.add()
    value.string_value = text


def test_what_the_readers_do_not_use_costs_no_protobuf_message_its_records() -> None:
    """Backfill's protobuf records were made from whole SDK spans: a link without a span id, or
    an attribute no reader uses nested past the 32-level cap, lost every trace of the message,
    where OTLP/JSON skips what it does not read. The records path decodes only what is read."""
    deep = TracesData()
    span = deep.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex("b7ad6b7169203331"), "x"
    _nested_past_the_cap(span.attributes, "app.unread", "deep")
    read = span.attributes.add()
    read.key, read.value.string_value = "gen_ai.operation.name", "chat"
    for data in (deep.SerializeToString(), _pb(link=(bytes.fromhex(TRACE), b""))):
        with pytest.raises(OtlpDecodeError):
            decode_otlp_protobuf(data, where="t.pb")  # the whole span, as the SDK holds it
        (record,) = decode_otlp_protobuf_records(data, where="t.pb")
        assert (record.trace_id, record.span_id) == (TRACE, "b7ad6b7169203331")
    (record,) = decode_otlp_protobuf_records(deep.SerializeToString())
    assert record.attributes == {"gen_ai.operation.name": "chat"}


def test_a_null_inside_a_structured_value_reads_alike_on_every_path() -> None:
    """The SDK keeps ``{"type": "json", "value": None}`` as given and protobuf keeps the null,
    but OTLP/JSON dropped a null inside a kvlistValue, and the readers test for keys ("value" in
    a result): one span read as three runs. spans_to_otlp_json wrote None as the text "None",
    which hid it from the tests."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tracing._records import span_record
    from tracing.otlp import spans_to_otlp_json

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    value = {"type": "json", "value": None, "items": [1, None]}
    provider.get_tracer("t").start_span("tool", attributes={"output.value": value}).end()  # type: ignore[dict-item]
    (span,) = memory.get_finished_spans()
    assert json.dumps(span.attributes["output.value"]) == json.dumps(value)  # type: ignore[index]
    exporter = span_record(span).attributes["output.value"]
    (from_json,) = decode_otlp_records(spans_to_otlp_json([span]))
    (from_protobuf,) = decode_otlp_protobuf_records(encode_spans([span]).SerializeToString())
    on_the_wire = [
        json.dumps(v)
        for v in (exporter, from_json.attributes["output.value"], from_protobuf.attributes["output.value"])
    ]
    assert on_the_wire == [json.dumps(value)] * 3


@pytest.mark.parametrize("bad", [{"intValue": "abc"}, {"weird": 1}, {"stringValue": 5}])
def test_an_environment_that_does_not_decode_is_none_and_loses_no_span(bad: dict[str, Any]) -> None:
    """The resource's (or a span's) environment is decoded now, where before only service.name
    was: one that does not decode is none (Langfuse's default), not the whole line lost."""
    document = _doc((*_RS0, "resource", "attributes", 2, "value"), bad)  # its deployment.environment.name
    records = decode_otlp_records(document)
    assert [r.environment for r in records] == ["staging", "dev", None, None]
    spans = copy.deepcopy(document)
    spans["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][2]["value"] = bad  # langfuse.environment
    assert [r.environment for r in decode_otlp_records(spans)] == [None, "dev", None, None]


def test_a_long_environment_is_cut_and_counted() -> None:
    """A resource's environment goes into every record of its spans: a 1 MB one made each run
    too large to send. Langfuse keeps 40 characters; the records keep 256, and count them."""
    document = _doc((*_RS0, "resource", "attributes", 2, "value"), {"stringValue": "x" * 1_000_000})
    records = decode_otlp_records(document)
    assert [len(r.environment or "") for r in records] == [7, 256, 256, 0]
    assert all(compact(r) < 2_000 for r in records)


@pytest.mark.parametrize("own", [{"stringValue": "x" * 1_000_000}, {"intValue": "zz"}, {"stringValue": "prod"}])
def test_a_spans_own_tracescore_environment_is_never_taken(own: dict[str, Any]) -> None:
    """The attribute that carries the environment to the worker is ours: a span's own (any size,
    malformed or not) was kept, unbounded, over what Langfuse reads, or lost the line (review)."""
    document = copy.deepcopy(DOCUMENT)
    for s, i in ((0, 0), (1, 0)):  # the agent span (its langfuse.environment) and the tool span (none)
        document["resourceSpans"][0]["scopeSpans"][s]["spans"][i]["attributes"].append(
            {"key": "tracescore.environment", "value": own}
        )
    del document["resourceSpans"][0]["resource"]["attributes"][2]  # (no resource environment)
    assert [r.environment for r in decode_otlp_records(document)] == ["staging", "dev", None, None]
    if "stringValue" in own:  # (the SDK's decoder, which makes the protobuf, decodes every value)
        data = encode_spans(decode_otlp_json(document)).SerializeToString()
        assert [r.environment for r in decode_otlp_protobuf_records(data)] == ["staging", "dev", None, None]


def test_an_environment_nested_too_deeply_in_protobuf_loses_no_span() -> None:
    """The protobuf decoder read the environment keys (and a span's own tracescore.environment)
    strictly: one nested past the limit lost the whole message (review)."""
    message = TracesData()
    rs = message.resource_spans.add()
    _nested_past_the_cap(rs.resource.attributes, "deployment.environment.name", "x")
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex("b7ad6b7169203331"), "x"
    _nested_past_the_cap(span.attributes, "tracescore.environment", "y")
    (record,) = decode_otlp_protobuf_records(message.SerializeToString())
    assert record.environment is None
