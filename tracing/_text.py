"""Text every encoder can write: a lone surrogate as U+FFFD.

A Python ``str`` may hold a surrogate code point on its own (``json.loads`` of a ``"\\ud83d"``
escape, half of an emoji cut by a truncation, ``surrogateescape`` decoding). UTF-8 has no
encoding for it, so a record or request holding one would fail to encode on every retry. Each is
replaced by U+FFFD, one for one (a pair split into two code points too: no reader here needs it
joined), wherever text leaves for JSON: score records, sink requests, queue requests.
"""

from __future__ import annotations

import re

__all__ = ["without_lone_surrogates"]

# A str holds a surrogate only when it is lone (a pair is one code point).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> tuple[str, int]:
    """``text`` with each lone surrogate replaced by U+FFFD, and how many there were (``text``
    itself when none: most text is ASCII, and most of the rest has none)."""
    if text.isascii():
        return text, 0
    fixed, n = _LONE_SURROGATE.subn("\ufffd", text)
    return (fixed, n) if n else (text, 0)
