"""JSON on the queue's hot paths, by orjson: each request a producer encodes, each message the
worker's guard screens.

orjson encodes a request in about three quarters of pydantic's time and parses a message body in
a half to three quarters of the ``json`` module's (``bench/wire_json.py``), and it is strict
RFC 8259 where the ``json`` module is lenient. So:

- ``dumps_or`` writes exactly the text pydantic writes of the same fields (tests/tracing/
  test_json.py compares them), and leaves to pydantic what orjson cannot encode (an integer
  past 64 bits, a lone surrogate, bytes).
- ``loads`` hands what orjson refuses (``NaN`` and ``Infinity``, lone surrogates, a BOM,
  UTF-16, nesting past 1024 levels, broken JSON) to ``json.loads``, whose value or error (type,
  message, position) is then the answer. One difference is left: an integer literal past 64
  bits reads as a float. ``loads`` is for screening a message's shape (``worker._guard``):
  Celery and kombu read the message again themselves. Of the integers the screen checks, a
  priority that large is refused either way (it must be under 256), and a broadcast's ``clock``
  header that large is now refused too, where a Lamport clock never gets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["dumps_or", "loads"]


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``: the same value (integers past 64 bits as floats) or the same error."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps_or(value: Any, fallback: Callable[[], str]) -> str:
    """``value`` (dicts, lists, tuples, dataclasses of JSON values) as compact UTF-8 JSON text,
    keys in order, non-finite floats as null; ``fallback()`` when orjson cannot encode it."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return fallback()
