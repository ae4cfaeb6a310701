"""Stored OTLP files: JSON Lines (the Collector file exporter), plain JSON, protobuf, gzip, dirs.

- ``*.jsonl`` / ``*.ndjson`` / ``*.json``: one OTLP/JSON ``ExportTraceServiceRequest`` per line
  (the Collector's ``file`` exporter and the OTLP JSON file format). A ``*.json`` file whose
  first line is not a whole JSON document is read as one pretty-printed document, unless that
  fails and its next non-blank line is a JSON object of its own: JSON Lines with a broken
  first line.
- ``*.pb`` / ``*.binpb``: the Collector file exporter's ``format: proto``: each message a
  4-byte big-endian length followed by an ``ExportTraceServiceRequest``.
- Any of these compressed, gzip or zstd, told by the file's first bytes whatever its name
  (``.gz``, ``.zst`` and ``.zstd`` are taken off before the suffix above is read). The
  Collector's file exporter with ``compression: zstd`` writes a file under the ``path`` it is
  given, with no suffix of its own, in one of two layouts: by default each export batch is a
  zstd frame of its own behind the 4-byte length, JSON or protobuf alike (such a length-prefixed
  file named ``*.json`` is told by the zstd frame behind its first 4 bytes); with its
  ``exporter.file.nativeCompression`` feature gate, the file is one zstd stream (a frame per
  flush) of JSON Lines or length-prefixed protobuf. A length-prefixed message is read as JSON
  when it starts with ``{`` (no OTLP protobuf message does), as protobuf otherwise.
- A directory means every such file under it, sorted by path, so the order (and a resume
  position) is stable.

Reading streams: one line (or message) at a time; a bad line is a ``Malformed`` item with its
file and line number, and reading goes on.

Sizes are capped before anything is decoded: a line (or protobuf message, or whole ``*.json``
document) longer than ``max_line_bytes`` is skipped without being held in memory, and a
compressed file stops being read once it has decompressed to ``max_decompressed_bytes`` (a small
gzip or zstd file can hold a huge line: a bomb); a zstd frame's window is bounded by libzstd's
default (128 MiB), so a frame asking for more is an error, not an allocation. The caps are reported
as ``Malformed`` with file:line and the setting to raise (``TRACESCORE_BACKFILL_MAX_LINE_BYTES``,
``TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES``). A file whose ``MAX_BARREN_RECORDS`` lines in a
row hold no span is skipped from there: short lines cost CPU per line, not per byte.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from tracing._errors import json_error
from tracing.otlp import (
    OtlpDecodeError,
    decode_otlp_protobuf_records,
    decode_otlp_records,
    decode_otlp_records_line,
)
from tracing.sources._base import Malformed, Position, SourceError, SourceItem, SpanBatch, UnitEnd
from tracing.sources._compressed import (
    DECOMPRESS_ERRORS,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    MAX_BARREN_RECORDS,
    MAX_DECOMPRESSED_BYTES_ENV,
    SKIP_CHUNK,
    ZSTD_MAGIC,
    byte_cap,
    inflate_frame,
    open_compressed,
    past_decompressed_cap,
)

__all__ = ["MAX_DECOMPRESSED_BYTES_ENV", "MAX_LINE_BYTES_ENV", "FileSource"]

_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
_PROTO_SUFFIXES = (".pb", ".binpb", ".proto")
_COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
MAX_LINE_BYTES_ENV = "TRACESCORE_BACKFILL_MAX_LINE_BYTES"
# While a record too long to read is skipped, an empty SpanBatch at the record's position every
# this many bytes: a caller looks at a stop between items (after a SIGTERM, a backfill went on
# skipping a sparse line of 1 TB for minutes).
SKIP_BEAT_BYTES = 64 * 2**20
# One record (line, protobuf message, whole *.json document): decoding takes several times its
# size in Python objects, so this bounds the backfill's memory. The Collector's file exporter
# writes one export batch per line, far smaller than this.
DEFAULT_MAX_LINE_BYTES = 32 * 2**20
_UNREADABLE: tuple[type[Exception], ...] = (OSError, *DECOMPRESS_ERRORS)


def _trace_files(root: Path) -> list[Path]:
    """The trace files under ``root``, in path order. A directory linked into it is read too
    (``rglob`` passed over it without a word), each real directory once, so a link loop ends."""
    found: list[Path] = []
    seen: set[str] = set()
    for where, subdirectories, names in os.walk(root, followlinks=True):
        real = os.path.realpath(where)
        if real in seen:
            subdirectories.clear()
            continue
        seen.add(real)
        found += [p for name in names if (p := Path(where, name)).is_file() and _kind(p)]
    return sorted(found)


def _barren(what: str) -> str:
    return (
        f"{MAX_BARREN_RECORDS:,} {what} in a row held no span (blank, malformed or empty): the rest of"
        " the file is skipped as not a traces file"
    )


def _unparsed(whole: list[SourceItem]) -> bool:
    """Whether reading a ``*.json`` file as one document failed for want of JSON (not for its size
    or its content)."""
    return len(whole) == 1 and isinstance(whole[0], Malformed) and whole[0].reason.startswith("not JSON")


def _next_record_is_a_line(handle: IO[bytes], max_line: int) -> bool:
    """Whether the first non-blank line after the one just read is a JSON object of its own
    (JSON Lines, whatever that object holds; a pretty-printed document's next line never is);
    the handle is left where it was."""
    mark = handle.tell()
    try:
        for _ in range(MAX_BARREN_RECORDS):
            raw = handle.readline(max_line + 1)
            if not raw:
                return False
            if raw.strip():
                try:
                    return isinstance(json.loads(raw), dict)
                except (ValueError, RecursionError):
                    return False
        return False
    finally:
        handle.seek(mark)


def _record_error(exc: OtlpDecodeError) -> str:
    return exc.reason + (f" at {exc.field}" if exc.field else "")


def _bare_name(path: Path) -> str:
    """The file's name, lowercased, without its compression suffix."""
    name = path.name.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _kind(path: Path) -> str | None:
    name = _bare_name(path)
    if name.endswith(_JSON_SUFFIXES):
        return "json"
    if name.endswith(_PROTO_SUFFIXES):
        return "proto"
    return None


class FileSource:
    """OTLP files, in the order given (directories expanded, sorted), each once."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        max_line_bytes: int | None = None,
        max_decompressed_bytes: int | None = None,
        each_once: bool = True,
    ) -> None:
        if not paths:
            raise SourceError("no input files given")
        # Caps come from the environment on every start and resume (not job state): raising
        # one to read a skipped record again is a matter of setting it and resuming.
        self.max_line_bytes = byte_cap(max_line_bytes, MAX_LINE_BYTES_ENV, DEFAULT_MAX_LINE_BYTES)
        self.max_decompressed_bytes = byte_cap(
            max_decompressed_bytes, MAX_DECOMPRESSED_BYTES_ENV, DEFAULT_MAX_DECOMPRESSED_BYTES
        )
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                found = _trace_files(path)
                if not found:
                    raise SourceError(
                        f"{path}: no trace files in this directory "
                        "(expected *.jsonl, *.json, *.ndjson or *.pb, optionally .gz or .zst)"
                    )
                files.extend(found)
            elif path.is_file():
                if _kind(path) is None:
                    raise SourceError(
                        f"{path}: unknown file type; name it *.jsonl / *.json (OTLP JSON) or *.pb "
                        "(OTLP protobuf), optionally with .gz or .zst"
                    )
                files.append(path)
            elif path.exists():  # a pipe or a device: read once, never resumed from a position
                raise SourceError(f"{path}: not a regular file or a directory")
            else:
                raise SourceError(f"{path}: no such file or directory")
        if each_once:
            # A file named twice (``dir dir/part-001.jsonl.gz``, a link to it) is read once: its
            # first place. (Not for a job's saved list: its checkpoint indexes the list as saved.)
            unique: dict[Path, Path] = {}
            for path in files:
                unique.setdefault(path.resolve(), path)
            files = list(unique.values())
        self.files = files
        self._roots = [str(p) for p in paths]
        self._sizes = [p.stat().st_size for p in files]
        self._total = max(1, sum(self._sizes))
        self._done_bytes = 0
        self._file: IO[bytes] | None = None  # the file being read, compressed or not
        self._last = Position(0)  # where the record after the last one read whole starts

    def fraction_done(self) -> float:
        """Share of the input bytes read so far (compressed bytes for a compressed file)."""
        position = 0
        file = self._file
        if file is not None:
            try:
                position = file.tell()
            except (OSError, ValueError):
                position = 0
        return min(1.0, (self._done_bytes + position) / self._total)

    def describe(self) -> dict[str, Any]:
        # Absolute: `--resume` may run from another directory.
        return {"kind": "files", "files": [os.path.abspath(p) for p in self.files]}

    def label(self) -> str:
        count = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        return f"{count} ({', '.join(self._roots)})" if len(self._roots) <= 2 else count

    def read(self, start: Position | None = None) -> Iterator[SourceItem]:
        start = start or Position(0)
        for index, path in enumerate(self.files):
            if index < start.unit:
                continue
            begin = start if index == start.unit else Position(index)
            self._last = Position(index, max(begin.line, 1), begin.offset)
            self._done_bytes = sum(self._sizes[:index])
            prefixed = _kind(path) == "proto"
            try:
                with open_compressed(path) as (handle, file, compressed):
                    self._file = file
                    budget = self.max_decompressed_bytes if compressed else 2**62
                    # The file exporter's JSON with compression: zstd is length-prefixed frames.
                    prefixed = prefixed or handle.read(8)[4:] == ZSTD_MAGIC
                    # A start position names the record to read first: its number and byte offset.
                    handle.seek(begin.offset)
                    if prefixed:
                        yield from self._read_prefixed(index, path, begin, handle, budget)
                    else:
                        yield from self._read_json(index, path, begin, handle, budget)
            except _UNREADABLE as exc:
                # A truncated, corrupt or unreadable file (e.g. one still being written): report
                # where it broke and go on with the next file.
                broke = self._last
                where = f"{path}:{'message ' if prefixed else ''}{broke.line}"
                yield Malformed(broke, where, f"cannot read the file further: {exc}")
            self._file = None
            self._done_bytes = sum(self._sizes[: index + 1])
            yield UnitEnd(index, Position(index + 1))

    def _too_long(self, what: str, size: int | None = None) -> str:
        got = f" ({size:,} bytes)" if size is not None else ""
        return (
            f"{what}{got} is longer than {self.max_line_bytes:,} bytes; skipped without decoding "
            f"(raise {MAX_LINE_BYTES_ENV} to read it)"
        )

    def _bomb(self) -> str:
        return past_decompressed_cap(self.max_decompressed_bytes)

    def _skip_line(
        self, handle: IO[bytes], budget: int, position: Position, where: str
    ) -> Generator[SpanBatch, None, tuple[int, bool]]:
        """Read past the rest of an over-long line, a chunk at a time, beating (``SKIP_BEAT_BYTES``);
        returns (bytes skipped, whether the line ended within ``budget`` bytes)."""
        skipped, beat = 0, SKIP_BEAT_BYTES
        while skipped <= budget:
            chunk = handle.readline(SKIP_CHUNK)
            skipped += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                return skipped, True
            if skipped >= beat:
                beat += SKIP_BEAT_BYTES
                yield SpanBatch([], position, where)
        return skipped, False

    def _read_json(
        self, index: int, path: Path, begin: Position, handle: IO[bytes], budget: int
    ) -> Iterator[SourceItem]:
        """JSON Lines (``budget``: the decompressed bytes a compressed file may hold)."""
        whole_candidate = _bare_name(path).endswith(".json")
        max_line = self.max_line_bytes
        line, offset = max(begin.line - 1, 0), begin.offset
        readline = handle.readline
        barren = 0  # lines in a row with no span
        while True:
            # Never more than the cap (+1, to tell a line of exactly the cap from a longer one).
            raw = readline(max_line + 1)
            if not raw:
                return
            line += 1
            position = Position(index, line, offset)
            offset += len(raw)
            where = f"{path}:{line}"
            if len(raw) > max_line and raw[-1:] != b"\n":
                skipped, ended = yield from self._skip_line(handle, budget - offset, position, where)
                offset += skipped
                self._last = Position(index, line + 1, offset)
                yield Malformed(position, where, self._too_long("the line"))
                if not ended:
                    yield Malformed(self._last, f"{path}:{line + 1}", self._bomb())
                    return
                continue
            self._last = Position(index, line + 1, offset)
            if offset > budget:
                yield Malformed(position, where, self._bomb())
                return
            if barren >= MAX_BARREN_RECORDS:
                yield Malformed(position, where, _barren("lines"))
                return
            if not raw.strip():
                barren += 1
                continue
            try:
                spans = decode_otlp_records_line(raw, where=where)
            except OtlpDecodeError as exc:
                if whole_candidate and line == 1 and exc.reason.startswith("not JSON"):
                    whole = list(self._read_whole(index, path))
                    if not (_unparsed(whole) and _next_record_is_a_line(handle, max_line)):
                        yield from whole
                        return
                    # JSON Lines after all, with a broken first line: that line alone is lost.
                barren += 1
                yield Malformed(position, where, _record_error(exc))
                continue
            barren = 0 if spans else barren + 1
            yield SpanBatch(spans, position, where)

    def _read_whole(self, index: int, path: Path) -> Iterator[SourceItem]:
        where = f"{path}:1"
        with open_compressed(path) as (handle, _, _):
            data = handle.read(self.max_line_bytes + 1)
        if len(data) > self.max_line_bytes:
            yield Malformed(
                Position(index, 1),
                where,
                self._too_long("line 1 is not a JSON document and the whole file")
                + "; or write one OTLP JSON object per line (JSON Lines)",
            )
            return
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:
            at = f"{path}:{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else where
            yield Malformed(Position(index, 1), at, f"not JSON ({json_error(exc)})")
            return
        try:
            spans = decode_otlp_records(document, where=where)
        except OtlpDecodeError as exc:
            yield Malformed(Position(index, 1), where, _record_error(exc))
            return
        yield SpanBatch(spans, Position(index, 1), where)

    def _read_prefixed(
        self, index: int, path: Path, begin: Position, handle: IO[bytes], budget: int
    ) -> Iterator[SourceItem]:
        """Length-prefixed messages: protobuf, or JSON, each maybe a zstd frame of its own
        (``budget``: the decompressed bytes a compressed file may hold, frames included)."""
        number, offset = max(begin.line - 1, 0), begin.offset
        reader = handle
        inflated = 0  # what the messages' own zstd frames added to the file's bytes
        barren = 0  # messages in a row with no span
        while True:
            header = reader.read(4)
            if not header:
                return
            number += 1
            position = Position(index, number, offset)
            where = f"{path}:message {number}"
            if len(header) < 4:
                yield Malformed(position, where, "truncated length prefix at the end of the file")
                return
            (size,) = struct.unpack(">I", header)
            if size > self.max_line_bytes or offset + 4 + size > budget:
                # Skipped a chunk at a time: the length prefix is untrusted input.
                skipped, beat = 0, SKIP_BEAT_BYTES
                while skipped < size and offset + 4 + skipped <= budget:
                    chunk = reader.read(min(SKIP_CHUNK, size - skipped))
                    if not chunk:
                        break
                    skipped += len(chunk)
                    if skipped >= beat:
                        beat += SKIP_BEAT_BYTES
                        yield SpanBatch([], position, where)
                offset += 4 + skipped
                self._last = Position(index, number + 1, offset)
                if offset > budget:
                    if size > self.max_line_bytes:
                        yield Malformed(position, where, self._too_long("the message", size))
                    yield Malformed(self._last, f"{path}:message {number + 1}", self._bomb())
                    return
                if skipped < size:  # (raising the cap would not help: a garbage file, or cut short)
                    yield Malformed(position, where, _past_the_end(size, skipped))
                    return
                yield Malformed(position, where, self._too_long("the message", size))
                continue
            body = reader.read(size)
            offset += 4 + len(body)
            self._last = Position(index, number + 1, offset)
            if len(body) < size:
                yield Malformed(position, where, f"truncated message ({len(body)} of {size} bytes)")
                return
            if barren >= MAX_BARREN_RECORDS:
                yield Malformed(position, where, _barren("messages"))
                return
            if body[:4] == ZSTD_MAGIC:
                try:
                    frame, body = body, inflate_frame(body, self.max_line_bytes + 1)
                except DECOMPRESS_ERRORS as exc:
                    barren += 1
                    yield Malformed(position, where, f"not a whole zstd frame ({exc})")
                    continue
                inflated += len(body) - len(frame)
                if offset + inflated > self.max_decompressed_bytes:
                    yield Malformed(position, where, self._bomb())
                    return
                if len(body) > self.max_line_bytes:
                    barren += 1
                    yield Malformed(position, where, self._too_long("the message, decompressed,"))
                    continue
            try:
                # No OTLP protobuf message starts with "{" (field 15, a group).
                if body[:1] == b"{":
                    spans = decode_otlp_records_line(body, where=where)
                else:
                    spans = decode_otlp_protobuf_records(body, where=where)
            except OtlpDecodeError as exc:
                barren += 1
                yield Malformed(position, where, _record_error(exc))
                continue
            barren = 0 if spans else barren + 1
            yield SpanBatch(spans, position, where)


def _past_the_end(size: int, left: int) -> str:
    """A length prefix claiming more bytes than the file has left."""
    return (
        f"its length prefix says {size:,} bytes, and the file ends {left:,} bytes later: not a"
        " length-prefixed OTLP protobuf file, or one cut short"
    )
