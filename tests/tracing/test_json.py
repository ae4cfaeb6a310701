"""The hot paths' JSON (tracing/queue/_json.py) against what it stands in for: pydantic's encoding of a
request, and ``json.loads`` for the guard's screen."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tracing._spans import genai_messages
from tracing import SpanRecord, trace_to_run, valid_text
from tracing._run import SpanRecordEvent
from tracing._text import as_shipped
from tracing.queue import ScoreRequest, parse_json, request_json, spans_request
from tracing.queue._contract import _pydantic_json, encode_request
from worker._guard import _kombu_typed

TRACE = "ab" * 16

# What an attribute can hold: the SDK's value types (sequences arrive as tuples), with text that
# needs escaping and floats JSON cannot spell.
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 5e-324, 1e16, 1e-7, 0.1])
_scalars = st.text() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | _floats
_values = _scalars | st.tuples(_scalars, _scalars) | st.lists(st.text(), max_size=3).map(tuple)
_attributes = st.dictionaries(st.text(max_size=12), _values, max_size=6)


@st.composite
def _requests(draw: Any) -> ScoreRequest:
    n = draw(st.integers(min_value=1, max_value=4))
    span_ids = [f"{i + 1:016x}" for i in range(n)]
    spans = [
        SpanRecord(
            TRACE,
            span_id,
            draw(st.text(max_size=20)),
            span_ids[0] if i else None,
            draw(st.sampled_from(["INTERNAL", "CLIENT"])),
            draw(st.none() | st.integers(min_value=0, max_value=2**64 - 1)),
            draw(st.none() | st.integers(min_value=0, max_value=2**64 - 1)),
            draw(st.sampled_from(["UNSET", "OK", "ERROR"])),
            draw(_attributes),
            tuple(
                SpanRecordEvent(draw(st.text(max_size=8)), draw(st.none() | st.integers(0, 2**63)), draw(_attributes))
                for _ in range(draw(st.integers(0, 2)))
            ),
            draw(st.none() | st.text(max_size=10)),
            draw(st.none() | st.text(max_size=10)),
        )
        for i, span_id in enumerate(span_ids)
    ]
    targets = draw(st.lists(st.sampled_from(span_ids), min_size=1, max_size=n, unique=True))
    return spans_request(
        spans,
        targets,
        draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3)),
        draw(st.none() | _floats.filter(math.isfinite)),
        source=draw(st.sampled_from(["live", "backfill"])),
        job_id=draw(st.none() | st.text(max_size=12)),
    )


@settings(max_examples=300, deadline=None)
@given(_requests())
def test_a_request_is_encoded_as_pydantic_encodes_it(request: ScoreRequest) -> None:
    assert request_json(request) == _pydantic_json(request)


@pytest.mark.parametrize(
    ("value", "why"),
    [(2**70, "an integer past 64 bits"), (b"\x00raw", "bytes that are UTF-8 (a decoded OTLP bytesValue)")],
)
def test_what_orjson_cannot_encode_is_left_to_pydantic(value: Any, why: str) -> None:
    request = spans_request([SpanRecord(TRACE, "1" * 16, "s", attributes={"v": value})], ["1" * 16], ["s"])
    assert request_json(request) == _pydantic_json(request), why


SECRET = "secret-answer-text"
BAD_BYTES = b"\xff\xfe"


def _chat(**fields: Any) -> SpanRecord:
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": f'"{SECRET}"'}
    name = fields.pop("name", "chat m")
    return SpanRecord(TRACE, "1" * 16, name, attributes=attributes | fields.pop("attrs", {}), **fields)


FFFD = "\ufffd"


@pytest.mark.parametrize(
    ("span", "fixed", "texts"),
    [
        (
            _chat(attrs={"gen_ai.prompt.0.content": SECRET.encode() + BAD_BYTES}),
            _chat(attrs={"gen_ai.prompt.0.content": SECRET + FFFD * 2}),
            1,
        ),
        (
            _chat(attrs={"gen_ai.prompt.0.content": SECRET + "\ud800"}),
            _chat(attrs={"gen_ai.prompt.0.content": SECRET + FFFD}),
            1,
        ),
        # (A bad key alone pydantic writes, as three U+FFFD; beside a bad value it is replaced too.)
        (
            _chat(attrs={"gen_ai.prompt.0.\udc80": SECRET, "gen_ai.prompt.1.content": BAD_BYTES}),
            _chat(attrs={"gen_ai.prompt.0." + FFFD: SECRET, "gen_ai.prompt.1.content": FFFD * 2}),
            2,
        ),
        (
            _chat(attrs={"gen_ai.tool.definitions": (SECRET, BAD_BYTES, "\ud83d", b"ok")}),
            _chat(attrs={"gen_ai.tool.definitions": (SECRET, FFFD * 2, FFFD, "ok")}),
            2,
        ),
        (_chat(name="chat \udcff"), _chat(name="chat " + FFFD), 1),
        (
            _chat(service_name="svc\udcff", scope_name="scope\ud800"),
            _chat(service_name="svc" + FFFD, scope_name="scope" + FFFD),
            2,
        ),
        (
            _chat(events=(SpanRecordEvent("gen_ai.choice", 1, {"message": {"content": BAD_BYTES}}),)),
            _chat(events=(SpanRecordEvent("gen_ai.choice", 1, {"message": {"content": FFFD * 2}}),)),
            1,
        ),
    ],
    ids=["bytes", "surrogate", "key", "tuple", "name", "resource", "event"],
)
def test_text_no_json_can_hold_is_sent_with_replacement_characters(
    span: SpanRecord, fixed: SpanRecord, texts: int
) -> None:
    """Bytes that are not UTF-8 and lone surrogates, wherever they sit in a record: pydantic
    refuses the request; ``request_json`` writes it with U+FFFD in place of each bad byte or
    surrogate (the rest as it was), and says so in a log line of ids and counts only."""
    request = spans_request([span], ["1" * 16], ["s"], source="backfill", job_id="j1")
    with pytest.raises(ValueError, match="utf-8"):
        _pydantic_json(request)
    with structlog.testing.capture_logs() as logs:
        text, replaced = encode_request(request)
    assert replaced == texts
    assert text == request_json(spans_request([fixed], ["1" * 16], ["s"], source="backfill", job_id="j1"))
    assert valid_text(span) == (fixed, texts)
    (event,) = logs
    assert event["event"] == "request_text_replaced"
    assert (event["trace_id"], event["runs"], event["texts"]) == (TRACE, 1, texts)
    assert SECRET not in repr(logs)


def test_bytes_are_read_the_same_through_the_queue_as_embedded() -> None:
    """A message attribute sent as bytes with a broken byte in it reads, through the queue, as
    the embedded backfill reads the bytes themselves: the same run, U+FFFD where the byte was."""
    answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Paris is"}]}]).encode()
    answer = answer.replace(b"Paris is", b"Paris \xe9 is")
    root = SpanRecord(TRACE, "1" * 16, "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"})
    chat = SpanRecord(
        TRACE,
        "2" * 16,
        "chat m",
        "1" * 16,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": genai_messages(("user", "Where?")),
            "gen_ai.output.messages": answer,
        },
    )
    request = spans_request([root, chat], ["1" * 16], ["s"])
    embedded = trace_to_run([root, chat], "1" * 16)
    received = ScoreRequest.model_validate_json(request_json(request))
    queued = trace_to_run(received.spans, "1" * 16)
    assert queued.output == embedded.output
    assert [m.text for m in queued.output] == ["Paris \ufffd is"]


_KOMBU = {"__type__": "bytes", "__value__": SECRET}


@pytest.mark.parametrize(
    "span",
    [
        _chat(attrs={"gen_ai.prompt.0.meta": _KOMBU}),
        _chat(attrs={"gen_ai.prompt.0.meta": {"outer": ({"__type__": "uuid", "__value__": 1},)}}),
        _chat(events=(SpanRecordEvent("gen_ai.choice", 1, {"message": _KOMBU}),)),
        _chat(events=(SpanRecordEvent("gen_ai.choice", 1, dict(_KOMBU)),)),
    ],
    ids=["attribute", "nested", "event", "event-attributes"],
)
def test_an_object_kombu_would_decode_is_sent_as_its_json_text(span: SpanRecord) -> None:
    """A kvlist of exactly ``__type__`` and ``__value__`` (an OTLP file may hold one): kombu's
    JSON reader, in the worker's pool, makes a value of such an object or fails, so the guard
    refused the whole message, every trace batched with it. It is sent as its JSON text, counted
    and logged as a replaced text, and read in process (``as_shipped``) as the worker reads it."""
    from kombu.utils.json import loads as kombu_loads

    request = spans_request([span], ["1" * 16], ["s"], source="backfill", job_id="j1")
    with structlog.testing.capture_logs() as logs:
        text, replaced = encode_request(request)
    assert replaced == 1
    received = ScoreRequest.model_validate(kombu_loads(text))  # no ValueError("Unsupported type")
    (sent,) = received.spans
    shipped = [as_shipped(sent.attributes), *(as_shipped(e.attributes) for e in sent.events)]
    in_process = [as_shipped(span.attributes), *(as_shipped(e.attributes) for e in span.events)]
    assert shipped == json.loads(json.dumps(in_process))  # (a tuple is a list after JSON)
    assert not _kombu_typed(json.loads(text))  # the guard's screen lets it through
    assert [e["event"] for e in logs] == ["request_text_replaced"]
    assert SECRET not in repr(logs)


# Text as hostile input brings it: lone surrogates (hypothesis' text() rarely draws one), bytes.
_pieces = st.sampled_from(["a", "é", "🌧", "\ud800", "\udc80", "\udbff\udfff"]) | st.characters()
_hostile_text = st.lists(_pieces, max_size=6).map("".join) | st.binary(max_size=8)
_hostile: Any = st.recursive(
    _hostile_text | st.integers() | st.floats() | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_hostile_text.filter(lambda k: isinstance(k, str)), inner, max_size=3)
    ),
    max_leaves=12,
)


def _write(value: Any) -> None:
    """Write ``value`` as the queue does: bytes as their UTF-8 text, the whole as UTF-8."""
    json.dumps(value, ensure_ascii=False, default=lambda b: b.decode("utf-8")).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(_hostile)
def test_valid_text_makes_any_value_writable_and_leaves_valid_text_alone(value: Any) -> None:
    fixed, changed = valid_text(value)
    _write(fixed)
    assert valid_text(fixed)[1] == 0
    if changed:
        with pytest.raises(UnicodeError):
            _write(value)
    elif not isinstance(value, bytes | bytearray):
        assert fixed is value


def test_the_encoding_reads_back_as_the_request() -> None:
    span = SpanRecord(TRACE, "1" * 16, "chat", attributes={"gen_ai.input.messages": '[{"role":"user"}]', "n": 3})
    request = spans_request([span], ["1" * 16], ["relevancy"], 1733250000.5, source="backfill", job_id="j1")
    assert ScoreRequest.model_validate_json(request_json(request)) == ScoreRequest.model_validate(request.model_dump())


_json_values: Any = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.booleans())
def test_parse_json_reads_what_json_loads_reads(value: Any, ascii_only: bool) -> None:
    # json.dumps writes NaN and Infinity (which orjson refuses) and, with ensure_ascii, lone
    # surrogates as escapes: both go to json.loads.
    text = json.dumps(value, ensure_ascii=ascii_only)
    expected = json.loads(text)
    got = parse_json(text)
    assert json.dumps(got) == json.dumps(expected)  # NaN == NaN, and types, keys and order


@pytest.mark.parametrize(
    "data",
    [
        "NaN",
        "[Infinity, -Infinity, 1e400]",
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        b'\xef\xbb\xbf{"bom": true}',
        '{"utf16": 1}'.encode("utf-16"),
        "[" * 5000 + "]" * 5000,
        '{"broken": ',
        b'{"bad utf-8": "\xff"}',
        "",
        '{"a": 1} trailing',
    ],
)
def test_parse_json_gives_json_loads_value_or_error(data: str | bytes) -> None:
    assert _outcome(parse_json, data) == _outcome(json.loads, data)


def _outcome(parse: Any, data: str | bytes) -> tuple[str, str]:
    """The value as JSON text (NaN == NaN, types and order kept), or the error's type and text."""
    try:
        value = parse(data)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)
    return "value", json.dumps(value)


def test_an_integer_past_64_bits_reads_as_a_float() -> None:
    # The one difference tracing/queue/_json.py names (and what it means to the guard's screen).
    assert parse_json("18446744073709551615") == 2**64 - 1
    assert parse_json("18446744073709551616") == float(2**64)
    assert isinstance(parse_json("18446744073709551616"), float)
