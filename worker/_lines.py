"""The JSON Lines files the CLI reads (``compare``'s score records, ``score``'s runs): one line at
a time, whatever the file holds, gzip or zstd compressed or not (as a backfill's files).

Each non-blank line is parsed, or named as the problem that stopped it (not JSON, ``NaN``,
``Infinity`` and numbers past a double's range included; nested too deeply; a number past
Python's 4300 digits; longer than ``MAX_LINE_BYTES``: skipped unread, so a hostile file cannot
take the process's memory). A BOM is dropped, bytes that are not UTF-8 are U+FFFD, and so is
a lone surrogate a ``\\ud800`` escape reads as: no table, record or ``--json`` line could print
it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from tracing import valid_text
from tracing.sources import (
    DECOMPRESS_ERRORS,
    MAX_BARREN_RECORDS,
    max_decompressed_bytes,
    open_compressed,
    past_decompressed_cap,
)

__all__ = ["MAX_LINE_BYTES", "JsonLine", "json_lines", "line_run_id"]


def line_run_id(number: int) -> str:
    """The name ``score`` gives the run of line ``number`` that has no run id, and which its --out
    record carries beside that ``line``: ``compare`` reads a record whose run id is its own
    line's name as that run (any text can be an explicit id, "line-5" too: the line tells them
    apart)."""
    return f"line-{number}"


# As a backfill's default line cap: far past any score record or run, and what a decoded line
# costs in memory stays a small multiple of it.
MAX_LINE_BYTES = 32 * 2**20
_SKIP_CHUNK = 2**20
_BARREN = (
    f"{MAX_BARREN_RECORDS:,} lines in a row held nothing (blank or malformed): the rest of the file is"
    " skipped, not read"
)


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity: json.loads takes them, no JSON writer writes them.
    raise _NotJson(f"{name} is Python's, not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON's syntax, past a double's range
        raise _NotJson(f"{text[:40]} is past the range of a number")
    return value


class JsonLine(NamedTuple):
    """A line of a JSON Lines file: its ``value`` when it parses, else the ``problem``."""

    number: int
    value: Any
    problem: str | None
    read: int  # the file's bytes read so far (the line's end), for a progress fraction
    size: int  # the line's own bytes, decompressed, when it parses (0 when not): what it holds


def json_lines(path: Path) -> Iterator[JsonLine]:
    """A ``JsonLine`` per line; blank lines are passed over. ``OSError`` when the file cannot be
    read, naming it (a read error mid-file did not: "OSError: [Errno 5] Input/output error")."""
    number = at = 0
    try:
        with open_compressed(path) as (handle, file, compressed):
            own_bytes = compressed and file.seekable()  # a compressed file's share: of its own bytes
            budget = max_decompressed_bytes() if compressed else math.inf
            for number, value, problem, read, size in _lines_of(handle, budget):
                at = file.tell() if own_bytes else read
                yield JsonLine(number, value, problem, at, size)
    except DECOMPRESS_ERRORS as exc:  # cut short (being written?) or corrupt: what came before stands
        yield JsonLine(number + 1, None, f"cannot read the file further: {exc}", at, 0)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _lines_of(handle: IO[bytes], budget: float) -> Iterator[tuple[int, Any, str | None, int, int]]:
    """``budget``: the bytes a compressed file may decompress to (a few KB of zstd hold lines of
    gigabytes, each read through to skip it); a plain file's is infinite."""
    number = read = 0
    barren = 0  # lines in a row with nothing read: blank, or a problem
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        read += len(raw)
        if barren >= MAX_BARREN_RECORDS:  # (a few bytes of gzip or zstd hold millions of lines)
            yield number, None, _BARREN, read, 0
            return
        barren += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while read <= budget and (chunk := handle.readline(_SKIP_CHUNK)):
                read += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            yield number, None, f"longer than {MAX_LINE_BYTES:,} bytes; skipped unread", read, 0
            if read > budget:
                yield number + 1, None, past_decompressed_cap(int(budget)), read, 0
                return
            continue
        if read > budget:
            yield number, None, past_decompressed_cap(int(budget)), read, 0
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:  # (replaced, the run was scored on other text, unsaid)
            yield number, None, f"not UTF-8 at byte {exc.start}", read, 0
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not text.strip():
            continue
        try:
            value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        except _NotJson as exc:
            yield number, None, f"not JSON ({exc})", read, 0
            continue
        except json.JSONDecodeError as exc:
            # (some of its messages end in "at", written to precede str()'s ": line 1 column 3")
            yield number, None, f"not JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})", read, 0
            continue
        except RecursionError:
            yield number, None, "not JSON (nested too deeply)", read, 0
            continue
        except ValueError:  # the only other: a number past Python's 4300-digit limit
            yield number, None, "not JSON (a number of more than 4300 digits)", read, 0
            continue
        try:
            fixed = valid_text(value)[0]
        except RecursionError:  # json.loads goes deeper than the walk over its texts
            yield number, None, "nested too deeply", read, 0
            continue
        barren = 0
        yield number, fixed, None, read, len(raw)
