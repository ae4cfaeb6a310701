"""JSON on the queue's hot paths, by orjson: each request a producer encodes, each message the
worker's guard screens.

orjson encodes a request in about three quarters of pydantic's time and parses a message body in
a half to three quarters of the ``json`` module's (``bench/wire_json.py``), and it is strict
RFC 8259 where the ``json`` module is lenient. So:

- ``dumps_or`` writes exactly the text pydantic writes of the same fields (tests/tracing/
  test_json.py compares them), and leaves to pydantic what orjson cannot encode (an integer
  past 64 bits, a lone surrogate, bytes).
- ``valid_text`` makes text that no JSON encoder can write (bytes that are not UTF-8, e.g. an
  OTLP ``bytesValue``; a lone surrogate, e.g. a ``\\ud800`` escape in an OTLP file) writable,
  with U+FFFD in place of each bad byte or surrogate: what the trace readers make of bytes
  (``decode("utf-8", "replace")``). Only called when an encoding failed, so it costs nothing on
  the way of valid text.
- ``loads`` hands what orjson refuses (``NaN`` and ``Infinity``, lone surrogates, a BOM,
  UTF-16, nesting past 1024 levels, broken JSON) to ``json.loads``, whose value or error (type,
  message, position) is then the answer. One difference is left: an integer literal past 64
  bits reads as a float. ``loads`` is for screening a message's shape (``worker._guard``):
  Celery and kombu read the message again themselves. Of the integers the screen checks, a
  priority that large is refused either way (it must be under 256), and a broadcast's ``clock``
  header that large is now refused too, where a Lamport clock never gets.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import orjson

from tracing._text import without_lone_surrogates

__all__ = ["dumps_or", "loads", "valid_text"]


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


def valid_text(value: Any) -> tuple[Any, int]:
    """``value`` with every text in it UTF-8 encodable, and how many texts (keys or values) had
    to change: bytes read as UTF-8 with U+FFFD for each byte that is not (bytes that are valid
    UTF-8 become their text, as pydantic writes them, uncounted), and each lone surrogate of a
    string replaced by U+FFFD. Walks dicts, lists, tuples and dataclasses (the span records);
    returns the same object where nothing changed, and copies only what did."""
    if isinstance(value, str):
        fixed, n = without_lone_surrogates(value)
        return fixed, min(n, 1)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8"), 0
        except UnicodeDecodeError:
            return bytes(value).decode("utf-8", "replace"), 1
    if isinstance(value, dict):
        changed, out = 0, {}
        for key, item in value.items():
            new_key, k = valid_text(key)
            new_item, v = valid_text(item)
            changed += k + v
            out[new_key] = new_item
        return (out, changed) if changed else (value, 0)
    if isinstance(value, list | tuple):
        pairs = [valid_text(item) for item in value]
        changed = sum(n for _, n in pairs)
        if not changed:
            return value, 0
        items = [item for item, _ in pairs]
        return (items if isinstance(value, list) else tuple(items)), changed
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        updates, changed = {}, 0
        for f in dataclasses.fields(value):
            new, n = valid_text(getattr(value, f.name))
            if n:
                updates[f.name] = new
                changed += n
        return (dataclasses.replace(value, **updates), changed) if changed else (value, 0)
    return value, 0
