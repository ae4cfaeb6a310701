"""Values as JSON holds them: a ``ScoreResult`` travels as JSON (queue messages, checkpoints,
records, ``--json``), and a judge's messages are sent as JSON."""

from __future__ import annotations

import math
from typing import Any

from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

__all__ = ["json_ready", "well_formed"]


def well_formed(text: str) -> str:
    """``text`` as valid Unicode: a lone surrogate (half of an emoji cut by a truncation, or
    decoded with ``surrogateescape``) becomes U+FFFD, a split surrogate pair is joined again.

    Such text cannot be encoded as UTF-8, so hashing it, sending it to a provider or writing it
    as JSON would fail.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 can carry the surrogates ("surrogatepass"); decoding joins pairs and
        # replaces what is left alone.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def json_ready(value: Any) -> Any:
    """``value`` as a ``ScoreResult`` keeps a step result or a judge's answer: pydantic's
    JSON-ready form (a set as a list, a model as a dict, a numpy value as Python's), every string
    and key ``well_formed``, and a NaN or an infinity as None, as every JSON writer (pydantic's,
    JavaScript's ``JSON.stringify``) writes them: so the result reads back from its JSON as it
    was. A value of a type JSON cannot hold raises ``PydanticSerializationError``."""
    try:
        ready = to_jsonable_python(value, fallback=_plain)
    except UnicodeEncodeError:  # (pydantic-core encodes a dict's keys: one held a lone surrogate)
        ready = to_jsonable_python(_keys_well_formed(value), fallback=_plain)
    try:
        encoded = to_json(ready)
    except PydanticSerializationError:
        return _repaired(ready)
    # (a quick look first: the walk below is Python, this check is not; "NaN" inside a string
    # only costs the walk)
    return _repaired(ready) if b"NaN" in encoded or b"Infinity" in encoded else ready


def _plain(value: Any) -> Any:
    """A value pydantic does not know, as plain Python: numpy's scalars and arrays (``tolist``)."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise PydanticSerializationError(f"Unable to serialize unknown type: {type(value)}")


def _repaired(value: Any) -> Any:
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {well_formed(k) if isinstance(k, str) else k: _repaired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    return value


def _keys_well_formed(value: Any) -> Any:
    if isinstance(value, dict):
        return {well_formed(k) if isinstance(k, str) else k: _keys_well_formed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_keys_well_formed(v) for v in value]
    return value
