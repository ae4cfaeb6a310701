"""Stored OTLP files: JSON Lines (the Collector file exporter), plain JSON, protobuf, gzip, dirs.

- ``*.jsonl`` / ``*.ndjson`` / ``*.json``: one OTLP/JSON ``ExportTraceServiceRequest`` per line
  (the Collector's ``file`` exporter and the OTLP JSON file format). A ``*.json`` file whose
  first line is not a whole JSON document is read as one pretty-printed document.
- ``*.pb`` / ``*.binpb``: the Collector file exporter's ``format: proto``: each message a
  4-byte big-endian length followed by an ``ExportTraceServiceRequest``.
- Any of these gzip-compressed (``.gz``). A directory means every such file under it, sorted
  by path, so the order (and a resume position) is stable.

Reading streams: one line (or message) at a time; a bad line is a ``Malformed`` item with its
file and line number, and reading goes on.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from tracing.otlp import OtlpDecodeError, decode_otlp_json, decode_otlp_json_line, decode_otlp_protobuf
from tracing.sources._base import Malformed, Position, SourceError, SourceItem, SpanBatch, UnitEnd

__all__ = ["FileSource"]

_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
_PROTO_SUFFIXES = (".pb", ".binpb", ".proto")
# A pretty-printed *.json file is parsed whole; bigger ones must be JSON Lines.
_WHOLE_DOCUMENT_LIMIT = 64 * 1024 * 1024


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(_JSON_SUFFIXES):
        return "json"
    if name.endswith(_PROTO_SUFFIXES):
        return "proto"
    return None


def _open(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return gzip.GzipFile(path, "rb")  # type: ignore[return-value]  # GzipFile is a binary IO
    return path.open("rb")


class FileSource:
    """OTLP files, in the order given (directories expanded, sorted)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        if not paths:
            raise SourceError("no input files given")
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                found = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p))
                if not found:
                    raise SourceError(
                        f"{path}: no trace files in this directory "
                        "(expected *.jsonl, *.json, *.ndjson or *.pb, optionally .gz)"
                    )
                files.extend(found)
            elif path.is_file():
                if _kind(path) is None:
                    raise SourceError(
                        f"{path}: unknown file type; name it *.jsonl / *.json (OTLP JSON) or *.pb "
                        "(OTLP protobuf), optionally with .gz"
                    )
                files.append(path)
            else:
                raise SourceError(f"{path}: no such file or directory")
        self.files = files
        self._roots = [str(p) for p in paths]
        self._sizes = [p.stat().st_size for p in files]
        self._total = max(1, sum(self._sizes))
        self._done_bytes = 0
        self._handle: IO[bytes] | None = None
        self._last = Position(0)  # where the record after the last one read whole starts

    def fraction_done(self) -> float:
        """Share of the input bytes read so far (compressed bytes for .gz files)."""
        position = 0
        handle = self._handle
        if handle is not None:
            raw = getattr(handle, "fileobj", None) or handle  # GzipFile: the compressed file
            try:
                position = raw.tell()
            except (OSError, ValueError):
                position = 0
        return min(1.0, (self._done_bytes + position) / self._total)

    def describe(self) -> dict[str, Any]:
        return {"kind": "files", "files": [str(p) for p in self.files]}

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
            try:
                if _kind(path) == "proto":
                    yield from self._read_proto(index, path, begin)
                else:
                    yield from self._read_json(index, path, begin)
            except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
                # A truncated, corrupt (zlib.error: bad deflate data) or unreadable file (e.g. a .gz
                # still being written): report where it broke and go on with the next file.
                broke = self._last
                where = f"{path}:{'message ' if _kind(path) == 'proto' else ''}{broke.line}"
                yield Malformed(broke, where, f"cannot read the file further: {exc}")
            self._handle = None
            self._done_bytes = sum(self._sizes[: index + 1])
            yield UnitEnd(index, Position(index + 1))

    def _read_json(self, index: int, path: Path, begin: Position) -> Iterator[SourceItem]:
        whole_candidate = path.name.lower().removesuffix(".gz").endswith(".json")
        with _open(path) as handle:
            self._handle = handle
            # A start position names the record to read first: its line number and byte offset.
            line, offset = max(begin.line - 1, 0), begin.offset
            if offset:
                handle.seek(offset)
            for raw in handle:
                line += 1
                position = Position(index, line, offset)
                offset += len(raw)
                self._last = Position(index, line + 1, offset)
                if not raw.strip():
                    continue
                where = f"{path}:{line}"
                try:
                    spans = decode_otlp_json_line(raw, where=where)
                except OtlpDecodeError as exc:
                    if whole_candidate and line == 1 and exc.reason.startswith("not JSON"):
                        yield from self._read_whole(index, path)
                        return
                    yield Malformed(position, where, exc.reason + (f" at {exc.field}" if exc.field else ""))
                    continue
                yield SpanBatch(spans, position, where)

    def _read_whole(self, index: int, path: Path) -> Iterator[SourceItem]:
        where = f"{path}:1"
        with _open(path) as handle:
            data = handle.read(_WHOLE_DOCUMENT_LIMIT + 1)
        if len(data) > _WHOLE_DOCUMENT_LIMIT:
            yield Malformed(
                Position(index, 1),
                where,
                "line 1 is not a JSON document and the file is too big to read whole; "
                "write one OTLP JSON object per line (JSON Lines)",
            )
            return
        try:
            spans = decode_otlp_json(json.loads(data), where=where)
        except json.JSONDecodeError as exc:
            yield Malformed(Position(index, 1), f"{path}:{exc.lineno}", f"not JSON ({exc.msg} at column {exc.colno})")
            return
        except OtlpDecodeError as exc:
            yield Malformed(Position(index, 1), where, exc.reason + (f" at {exc.field}" if exc.field else ""))
            return
        yield SpanBatch(spans, Position(index, 1), where)

    def _read_proto(self, index: int, path: Path, begin: Position) -> Iterator[SourceItem]:
        with _open(path) as handle:
            self._handle = handle
            number, offset = max(begin.line - 1, 0), begin.offset
            if offset:
                handle.seek(offset)
            reader = handle
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
                body = reader.read(size)
                offset += 4 + len(body)
                self._last = Position(index, number + 1, offset)
                if len(body) < size:
                    yield Malformed(position, where, f"truncated message ({len(body)} of {size} bytes)")
                    return
                try:
                    spans = decode_otlp_protobuf(body, where=where)
                except OtlpDecodeError as exc:
                    yield Malformed(position, where, exc.reason + (f" at {exc.field}" if exc.field else ""))
                    continue
                yield SpanBatch(spans, position, where)
