"""Text every encoder can write: a lone surrogate, or a byte that is not UTF-8, as U+FFFD.

A Python ``str`` may hold a surrogate code point on its own (``json.loads`` of a ``"\\ud83d"``
escape, half of an emoji cut by a truncation, ``surrogateescape`` decoding), and an OTLP
``bytesValue`` bytes that are not UTF-8. Neither can be written as UTF-8, so a record, request
or line holding one would fail to encode, or to print, on every retry. Each bad surrogate or
byte is replaced by U+FFFD, one for one (a pair split into two code points too: no reader here
needs it joined): ``without_lone_surrogates`` for one string (score records, sink requests),
``valid_text`` for a whole value (a queue request whose encoding failed, a line read by
``compare`` or ``score``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["valid_text", "without_lone_surrogates"]

# A str holds a surrogate only when it is lone (a pair is one code point).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> tuple[str, int]:
    """``text`` with each lone surrogate replaced by U+FFFD, and how many there were (``text``
    itself when none: most text is ASCII, and most of the rest has none)."""
    if text.isascii():
        return text, 0
    fixed, n = _LONE_SURROGATE.subn("\ufffd", text)
    return (fixed, n) if n else (text, 0)


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
