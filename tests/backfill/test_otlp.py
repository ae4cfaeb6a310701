"""tracing.otlp: OTLP/JSON and protobuf into ReadableSpan, and back to OTLP/JSON."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable

import pytest
from google.protobuf.json_format import MessageToDict
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tracing._errors import json_error
from tracing.otlp import (
    OtlpDecodeError,
    decode_otlp_json,
    decode_otlp_json_line,
    decode_otlp_protobuf,
    decode_otlp_records,
    decode_otlp_records_line,
    spans_to_otlp_json,
)


@pytest.fixture(scope="module")
def sdk_spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my.scope", "2.1")
    with tracer.start_as_current_span(
        "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent", "f": 1.5, "tags": ["x", "y"]}
    ) as root:
        with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT) as chat:
            chat.add_event("gen_ai.user.message", {"content": "hi", "n": 2})
            chat.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("linked", links=[Link(root.get_span_context(), {"why": "follows"})]):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _same(a: ReadableSpan, b: ReadableSpan) -> None:
    assert json.loads(a.to_json()) == json.loads(b.to_json())
    assert a.instrumentation_scope == b.instrumentation_scope


def test_json_round_trip_keeps_everything(sdk_spans: list[ReadableSpan]) -> None:
    """Encoded then decoded spans equal the SDK's (ids, parent, resource, scope, events, links, status, times)."""
    line = json.dumps(spans_to_otlp_json(sdk_spans))
    decoded = decode_otlp_json_line(line)
    assert len(decoded) == len(sdk_spans)
    for original, back in zip(sdk_spans, decoded, strict=True):
        _same(original, back)
    chat = next(s for s in decoded if s.name == "chat m")
    assert chat.kind is SpanKind.CLIENT
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.status.description == "boom"
    assert chat.events[0].attributes == {"content": "hi", "n": 2}


def test_protobuf_decodes_like_the_sdk(sdk_spans: list[ReadableSpan]) -> None:
    """The SDK's own OTLP protobuf encoding decodes back to equal spans."""
    decoded = decode_otlp_protobuf(encode_spans(sdk_spans).SerializeToString())
    for original, back in zip(sdk_spans, decoded, strict=True):
        _same(original, back)


def test_protobuf_json_mapping_with_base64_ids_and_snake_case(sdk_spans: list[ReadableSpan]) -> None:
    """protobuf's generic JSON mapping (base64 ids, snake_case names, enum names) is read too."""
    message = encode_spans(sdk_spans)
    for document in (MessageToDict(message), MessageToDict(message, preserving_proto_field_name=True)):
        decoded = decode_otlp_json(document)
        for original, back in zip(sdk_spans, decoded, strict=True):
            _same(original, back)


def test_tempo_batches_envelope(sdk_spans: list[ReadableSpan]) -> None:
    """Tempo's {"batches": [...]} and {"trace": {"resourceSpans": ...}} answers are unwrapped."""
    body = spans_to_otlp_json(sdk_spans)
    assert len(decode_otlp_json({"batches": body["resourceSpans"]})) == len(sdk_spans)
    assert len(decode_otlp_json({"trace": body})) == len(sdk_spans)


def test_errors_name_the_line_and_the_field() -> None:
    """A bad id, a missing name, a bad enum and non-JSON each say where and which field."""
    good_id = "0af7651916cd43dd8448eb211c80319c"
    span = {"traceId": good_id, "spanId": "b7ad6b7169203331", "name": "x"}

    def doc(**changes: object) -> str:
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{**span, **changes}]}]}]})

    with pytest.raises(
        OtlpDecodeError,
        match=r"^f.jsonl:7: id \(a string of 2 chars\) .* at resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]\.traceId$",
    ):
        decode_otlp_json_line(doc(traceId="zz"), where="f.jsonl:7")
    with pytest.raises(OtlpDecodeError, match=r"span has no name at .*spans\[0\]\.name"):
        decode_otlp_json_line(doc(name=None))
    with pytest.raises(OtlpDecodeError, match=r"unknown span kind \(a string of 14 chars\) at .*\.kind"):
        decode_otlp_json_line(doc(kind="SPAN_KIND_NOPE"))
    with pytest.raises(OtlpDecodeError, match=r"all zeros"):
        decode_otlp_json_line(doc(spanId="0" * 16))
    with pytest.raises(OtlpDecodeError, match=r"^a:1: not JSON"):
        decode_otlp_json_line('{"resourceSpans": [', where="a:1")
    with pytest.raises(OtlpDecodeError, match=r"expected 'resourceSpans'"):
        decode_otlp_json({"spans": []})
    with pytest.raises(OtlpDecodeError, match=r"not an OTLP protobuf message"):
        decode_otlp_protobuf(b"\x0a\xff\xff\xff")


def test_a_trace_state_is_kept_when_valid_and_never_logged_when_not(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's tracestate parser logs a member it refuses, and a member may hold a credential:
    an invalid list is dropped (as the SDK drops it) without a log line quoting it."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}

    def state(trace_state: str) -> dict[str, str]:
        line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{**span, "traceState": trace_state}]}]}]})
        (decoded,) = decode_otlp_json_line(line)
        assert decoded.context is not None
        return dict(decoded.context.trace_state.items())

    assert state("vendor=abc, ,tenant@sys=1") == {"vendor": "abc", "tenant@sys": "1"}
    caplog.set_level("DEBUG")
    assert state("vendor=abc,sk-live-Secret9=") == {}
    assert state("Key=sk-live-Secret9") == {}
    assert "Secret9" not in caplog.text


def test_wrongly_typed_fields_are_decode_errors() -> None:
    """A list or object where an enum belongs, or a non-number double, is an OtlpDecodeError, not a crash."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}

    def doc(**changes: object) -> dict[str, object]:
        return {"resourceSpans": [{"scopeSpans": [{"spans": [{**span, **changes}]}]}]}

    with pytest.raises(OtlpDecodeError, match=r"unknown span kind \(a list of 0 items\) at .*\.kind"):
        decode_otlp_json(doc(kind=[]))
    with pytest.raises(OtlpDecodeError, match=r"unknown status code \(an object with 0 keys\) at .*\.status\.code"):
        decode_otlp_json(doc(status={"code": {}}))
    with pytest.raises(OtlpDecodeError, match=r"expected a number, got a string of 3 chars at .*attributes\[0\]"):
        decode_otlp_json(doc(attributes=[{"key": "k", "value": {"doubleValue": "abc"}}]))


_JSON_KEYS = st.sampled_from(
    ["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId", "name", "kind", "status",
     "code", "attributes", "key", "value", "stringValue", "intValue", "doubleValue", "arrayValue", "values",
     "kvlistValue", "bytesValue", "events", "links", "resource", "scope", "startTimeUnixNano"]
)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_JSON_KEYS, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(_JSON_KEYS, _JSON, max_size=6))
def test_any_json_span_decodes_or_raises_a_decode_error(fields: dict[str, object]) -> None:
    """Whatever JSON sits in a span, decoding gives spans or an OtlpDecodeError (the backfill skips the line)."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x", **fields}
    with contextlib.suppress(OtlpDecodeError):
        decode_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


# Scalars a hostile file holds where numbers and ids belong: integers past a double's range,
# digit strings past Python's 4300-digit limit, non-ASCII digits.
_HOSTILE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**330)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["²", "٣", "9" * 5000, "1e400", "NaN", "-0", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_JSON_KEYS, inner, max_size=5),
    max_leaves=25,
)
_READ_ATTRIBUTE = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["gen_ai.agent.name", "gen_ai.output.messages", "gen_ai.operation.name"]),
        "value": st.dictionaries(
            st.sampled_from(["stringValue", "intValue", "doubleValue", "boolValue", "bytesValue", "arrayValue"]),
            _HOSTILE,
            max_size=2,
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(_JSON_KEYS, _HOSTILE, max_size=6), attributes=st.lists(_READ_ATTRIBUTE, max_size=3))
def test_any_hostile_line_decodes_to_records_or_raises_a_decode_error(
    fields: dict[str, object], attributes: list[object]
) -> None:
    """Backfill's path (a line into span records): whatever a span holds, the line decodes or is
    an OtlpDecodeError (skipped and reported); never another exception, which ended the job."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x", **fields}
    span.setdefault("attributes", attributes)
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    with contextlib.suppress(OtlpDecodeError):
        decode_otlp_records_line(line)
    with contextlib.suppress(OtlpDecodeError):
        decode_otlp_json_line(line)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"startTimeUnixNano": "²"}, r"expected an integer, got a string of 1 chars at .*startTimeUnixNano"),
        ({"endTimeUnixNano": "9" * 5000}, r"expected an integer, got a string of 5000 chars at .*endTimeUnixNano"),
        (
            {"attributes": [{"key": "gen_ai.agent.name", "value": {"doubleValue": 10**400}}]},
            r"number out of a double's range at .*attributes\[0\]\.value",
        ),
        # Outside OTLP's fixed64: shipped, such a time failed the OTLP sink's whole batch.
        ({"startTimeUnixNano": "-1"}, r"a time outside 0 \.\. 2\^64-1 nanoseconds .* at .*startTimeUnixNano"),
        ({"startTimeUnixNano": -5}, r"a time outside 0 \.\. 2\^64-1 nanoseconds .* at .*startTimeUnixNano"),
        ({"endTimeUnixNano": "99999999999999999999"}, r"a time outside 0 \.\. 2\^64-1 .* at .*endTimeUnixNano"),
        ({"endTimeUnixNano": 2**70}, r"a time outside 0 \.\. 2\^64-1 .* at .*endTimeUnixNano"),
        # An event's time too (a read event's: the records keep it); -5 and 2^70 were read.
        (
            {"events": [{"name": "gen_ai.choice", "timeUnixNano": "-5"}]},
            r"a time outside 0 \.\. 2\^64-1 .* at .*events\[0\]\.timeUnixNano",
        ),
        (
            {"events": [{"name": "gen_ai.choice", "timeUnixNano": 2**70}]},
            r"a time outside 0 \.\. 2\^64-1 .* at .*events\[0\]\.timeUnixNano",
        ),
    ],
)
def test_numbers_python_cannot_convert_are_decode_errors(change: dict[str, object], reason: str) -> None:
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x", **change}
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    with pytest.raises(OtlpDecodeError, match=reason):
        decode_otlp_records(document)
    with pytest.raises(OtlpDecodeError, match=reason):
        decode_otlp_json(document)


def test_a_number_past_the_4300_digit_limit_makes_the_line_not_json() -> None:
    """Even in an attribute tracescore never reads: the parser refuses the whole line."""
    line = '{"resourceSpans": [], "x": {"intValue": ' + "7" * 4301 + "}}"
    with pytest.raises(OtlpDecodeError, match=r"^f:3: not JSON \(a number of more than 4300 digits\)$"):
        decode_otlp_records_line(line, where="f:3")


def _outcome(decode: Callable[[], object]) -> object:
    try:
        return decode()
    except OtlpDecodeError as exc:
        return f"error: {exc}"


def _by_json_alone(line: bytes) -> object:
    """What ``decode_otlp_records_line`` gave a line when every line went to ``json.loads``."""
    try:
        document = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return f"error: {OtlpDecodeError(f'not JSON ({json_error(exc)})', where='f:1')}"
    return _outcome(lambda: decode_otlp_records(document, where="f:1"))


def _line(span_changes: dict[str, object]) -> bytes:
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x", **span_changes}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


_AGENT_NAME_PAST_64_BITS = [{"key": "gen_ai.agent.name", "value": {"intValue": 2**70 + 1}}]
# 19 digits, below int64's least: orjson reads it as the float -9.223372036854776e18.
_AGENT_NAME_BELOW_INT64 = [{"key": "gen_ai.agent.name", "value": {"intValue": -(2**63) - 1}}]


@pytest.mark.parametrize(
    "line",
    [
        _line({"attributes": _AGENT_NAME_PAST_64_BITS}),
        _line({"attributes": _AGENT_NAME_BELOW_INT64}),
        _line({"attributes": [{"key": "gen_ai.agent.name", "value": {"intValue": -(10**19) + 1}}]}),
        _line({"endTimeUnixNano": 2**70}),
        _line({"attributes": [{"key": "gen_ai.agent.name", "value": {"doubleValue": 10**400}}]}),
        _line({"attributes": [{"key": "gen_ai.agent.name", "value": {"doubleValue": float("nan")}}]}),
        _line({"attributes": [{"key": "not.read", "value": {"doubleValue": float("inf")}}]}),
        _line({"name": "\ud800 alone"}),
        b"\xef\xbb\xbf" + _line({}),
        _line({}).decode().encode("utf-16"),
        b'{"resourceSpans": [], "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
        b'{"resourceSpans": [], "x": ' + b"7" * 4301 + b"}",
        _line({})[:-3],
        b"\xff" + _line({}),
        _line({"events": [{"name": "e", "timeUnixNano": 12345678901234567890}]}),
    ],
    ids=[
        "int-past-64-bits", "int-below-int64", "int-19-nines-negative", "time-past-64-bits", "past-a-double", "nan",
        "infinity-unread", "lone-surrogate",
        "bom", "utf-16", "nested-1100", "4301-digits", "broken", "not-utf-8", "20-digit-time",
    ],
)  # fmt: skip
def test_a_line_of_bytes_reads_as_json_loads_reads_it(line: bytes) -> None:
    """Lines of bytes (a backfill's) go to orjson first; what it reads otherwise than ``json``
    (an integer past 64 bits: a float, its value rounded) or refuses goes to ``json``: the same
    records, or the same error, as when ``json.loads`` read every line."""
    assert _outcome(lambda: decode_otlp_records_line(line, where="f:1")) == _by_json_alone(line)


def test_an_integer_past_64_bits_in_a_line_of_bytes_keeps_its_value() -> None:
    """orjson reads 2**70 + 1 as the float 1.1805916207174113e21: the line goes to ``json``."""
    (span,) = decode_otlp_json_line(_line({"attributes": _AGENT_NAME_PAST_64_BITS}))
    assert (span.attributes or {})["gen_ai.agent.name"] == 2**70 + 1


def test_a_negative_integer_below_int64_in_a_line_of_bytes_keeps_its_value() -> None:
    """-(2**63) - 1 has 19 digits (the 20-digit guard lets it by); orjson reads it as a float,
    which ``_int`` turned into -(2**63), another value than ``json``'s."""
    (span,) = decode_otlp_json_line(_line({"attributes": _AGENT_NAME_BELOW_INT64}))
    assert (span.attributes or {})["gen_ai.agent.name"] == -(2**63) - 1


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(_JSON_KEYS, _HOSTILE, max_size=6), attributes=st.lists(_READ_ATTRIBUTE, max_size=3))
def test_any_hostile_line_of_bytes_reads_as_json_loads_reads_it(
    fields: dict[str, object], attributes: list[object]
) -> None:
    line = _line({"attributes": attributes, **fields})
    assert _outcome(lambda: decode_otlp_records_line(line, where="f:1")) == _by_json_alone(line)


def test_attribute_value_kinds() -> None:
    """Every AnyValue kind decodes: ints as strings, bytes, arrays (tuples), kvlists (dicts)."""
    attributes = [
        {"key": "s", "value": {"stringValue": "a"}},
        {"key": "i", "value": {"intValue": "9007199254740993"}},
        {"key": "d", "value": {"doubleValue": 0.25}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "y", "value": {"bytesValue": base64.b64encode(b"\x00\x01").decode()}},
        {"key": "a", "value": {"arrayValue": {"values": [{"intValue": 1}, {"intValue": "2"}]}}},
        {"key": "m", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}},
        {"key": "empty", "value": {}},
    ]
    span = {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "name": "x",
        "attributes": attributes,
        "kind": "SPAN_KIND_SERVER",
        "status": {"code": "STATUS_CODE_OK"},
    }
    (decoded,) = decode_otlp_json({"resource_spans": [{"scope_spans": [{"spans": [span]}]}]})
    assert dict(decoded.attributes or {}) == {
        "s": "a",
        "i": 9007199254740993,
        "d": 0.25,
        "b": True,
        "y": b"\x00\x01",
        "a": (1, 2),
        "m": {"k": "v"},
    }
    assert decoded.kind is SpanKind.SERVER
    assert decoded.status.status_code is StatusCode.OK


def test_keys_of_a_document_that_is_not_otlp_are_named_only_when_shaped_like_field_names() -> None:
    """A key can be anything (a token, a sentence): only field-name-shaped ones reach the error."""
    document = {"data": [], "traceID": "x", "sk-live-SECRET123 my password": 1, "Bearer SECRET": 2}
    with pytest.raises(OtlpDecodeError) as caught:
        decode_otlp_records(document)
    message = str(caught.value)
    assert "found keys ['data', 'traceID'] (2 other keys not shown)" in message
    assert "SECRET" not in message
    value = {"key": "gen_ai.agent.name", "value": {"Bearer SECRET": "x"}}
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "x",
        "attributes": [value],
    }
    with pytest.raises(OtlpDecodeError, match=r"unknown AnyValue kind \[\] \(1 other key not shown\)") as caught:
        decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    assert "SECRET" not in str(caught.value)
