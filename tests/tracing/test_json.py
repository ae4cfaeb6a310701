"""The hot paths' JSON (tracing/queue/_json.py) against what it stands in for: pydantic's encoding of a
request, and ``json.loads`` for the guard's screen."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracing import SpanRecord
from tracing._run import SpanRecordEvent
from tracing.queue import ScoreRequest, parse_json, request_json, spans_request
from tracing.queue._contract import _pydantic_json

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
    [
        (2**70, "an integer past 64 bits"),
        (b"\x00raw", "bytes (a decoded OTLP bytesValue)"),
        ("\ud800", "a lone surrogate"),
    ],
)
def test_what_orjson_cannot_encode_is_left_to_pydantic(value: Any, why: str) -> None:
    request = spans_request([SpanRecord(TRACE, "1" * 16, "s", attributes={"v": value})], ["1" * 16], ["s"])
    try:
        expected = _pydantic_json(request)
    except Exception as exc:  # pydantic refuses it too: the same error reaches the caller
        with pytest.raises(type(exc)):
            request_json(request)
        return
    assert request_json(request) == expected, why


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
