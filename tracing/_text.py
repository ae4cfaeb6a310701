"""Text every encoder can write: a lone surrogate, or a byte that is not UTF-8, as U+FFFD.

A Python ``str`` may hold a surrogate code point on its own (``json.loads`` of a ``"\\ud83d"``
escape, half of an emoji cut by a truncation, ``surrogateescape`` decoding), and an OTLP
``bytesValue`` bytes that are not UTF-8. Neither can be written as UTF-8, so a record, request
or line holding one would fail to encode, or to print, on every retry. Each bad surrogate or
byte is replaced by U+FFFD, one for one (a pair split into two code points too: no reader here
needs it joined): ``without_lone_surrogates`` for one string (score records, sink requests),
``valid_text`` for a whole value (a queue request whose encoding failed, a line read by
``compare`` or ``score``), ``as_shipped`` for the attributes a trace reader reads in process.

One value that JSON holds is no value on the queue: an object of exactly ``__type__`` and
``__value__`` (an OTLP kvlist may be one), which kombu's JSON reader in the worker's pool turns
into bytes, a UUID, a date... or fails on, so the worker's screen refuses the message and every
trace in it. ``valid_text`` and ``as_shipped`` write such an object as its JSON text (one replaced
text), so the worker and a reader in process read the same string; a record's attributes that
are such an object, as none.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["as_shipped", "printable", "valid_text", "without_lone_surrogates"]

# The keys of an object kombu's JSON reader decodes into a value (kombu.utils.json.object_hook).
# A record's (or event's) attributes that are exactly these (an event's are not filtered by key)
# are sent, and read in process, as none: no reader reads either name, and as text they would
# not be a mapping, which the worker's validation of the request refuses.
_KOMBU_TYPED_KEYS = {"__type__", "__value__"}

# A str holds a surrogate only when it is lone (a pair is one code point).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# C0 and C1 control characters: ESC begins an escape sequence (colour, cursor moves, an OSC
# window title), a newline would forge a line. With them the bidirectional controls, which make
# a terminal show text in another order than it is (a reason that reads "score 0.1" as "1.0"),
# and the Unicode line and paragraph separators, which some terminals break lines at.
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_CONTROLS = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0), *_BIDI, 0x2028, 0x2029], "\ufffd")


def printable(text: str) -> str:
    """``text`` for a terminal (the CLI, the console sink): each control character (bidirectional
    ones too) and each lone surrogate as U+FFFD, so what a trace or a backend's answer holds
    cannot drive the terminal."""
    return without_lone_surrogates(text.translate(_CONTROLS))[0]


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
        if out.keys() == _KOMBU_TYPED_KEYS:
            return _as_json_text(out), changed + 1
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
            old = getattr(value, f.name)
            new, n = valid_text(old)
            if isinstance(old, dict) and isinstance(new, str):
                new = {}  # a record's own attributes, exactly those two keys: see ``_KOMBU_TYPED_KEYS``
            if n:
                updates[f.name] = new
                changed += n
        return (dataclasses.replace(value, **updates), changed) if changed else (value, 0)
    return value, 0


def as_shipped(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """Span or event attributes as a worker reads them after the queue's JSON: bytes (an OTLP
    ``bytesValue``) as their UTF-8 text with U+FFFD for each bad byte, wherever they are, and
    each lone surrogate inside an array or a kvlist as U+FFFD, so a run read in process (an
    embedded backfill, a rule's filter) is the run the worker reads. ``values`` itself when no
    value is bytes, an array or a kvlist (the hot path: one type check a value), else a copy.
    Top-level strings are left as they are."""
    if len(values) == 2 and values.keys() == _KOMBU_TYPED_KEYS:
        return {}
    out: dict[str, Any] | None = None
    for key, value in values.items():
        if type(value) is str or not isinstance(value, bytes | bytearray | tuple | list | dict):
            continue
        fixed = _shipped(value)
        if fixed is not value:
            if out is None:
                out = dict(values)
            out[key] = fixed
    return values if out is None else out


def _shipped(value: Any) -> Any:
    """``value`` with its bytes as text and its lone surrogates as U+FFFD; itself if none."""
    if isinstance(value, str):
        return without_lone_surrogates(value)[0]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        changed, items = False, {}
        for key, item in value.items():
            new_key, new_item = _shipped(key), _shipped(item)
            changed = changed or new_key is not key or new_item is not item
            items[new_key] = new_item
        if items.keys() == _KOMBU_TYPED_KEYS:
            return _as_json_text(items)
        return items if changed else value
    if isinstance(value, list | tuple):
        fixed = [_shipped(item) for item in value]
        if all(a is b for a, b in zip(fixed, value, strict=True)):
            return value
        return fixed if isinstance(value, list) else tuple(fixed)
    return value


def _as_json_text(value: dict[str, Any]) -> str:
    """An object kombu would decode, as the compact JSON text of its (already valid) parts."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
