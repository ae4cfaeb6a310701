"""Compressed input files, told by their first bytes (gzip, zstd), whatever their names.

Backfill's trace files, ``score``'s runs and ``compare``'s records are read through
``open_compressed``; a file that breaks while it is decompressed (cut short, or corrupt) raises
one of ``DECOMPRESS_ERRORS``, which its reader names with where it stopped. Each reader stops a
compressed file past ``max_decompressed_bytes()`` and after ``MAX_BARREN_RECORDS`` empty records
in a row: a few bytes of gzip or zstd can hold gigabytes.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import zstandard

from tracing.sources._base import SourceError

__all__ = [
    "DECOMPRESS_ERRORS",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "MAX_BARREN_RECORDS",
    "MAX_DECOMPRESSED_BYTES_ENV",
    "SKIP_CHUNK",
    "ZSTD_MAGIC",
    "Opened",
    "byte_cap",
    "inflate_frame",
    "max_decompressed_bytes",
    "open_compressed",
    "past_decompressed_cap",
]

_GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A skippable frame's magic, 0x184D2A50..5F little-endian (its low 4 bits free): a zstd file may
# start with one (pzstd writes one before each frame), and libzstd passes over it.
_SKIPPABLE_TAIL = b"\x2a\x4d\x18"
# Records (lines, protobuf messages) in a row that hold nothing (blank, malformed, empty): past
# this, the rest of the file is skipped, by each reader of these files. A bomb of short lines
# costs a few microseconds a line, so a byte cap alone let an 8 MB .gz of 8 GiB of newlines read
# for hours; no traces, runs or records file has this many empty records in a row.
MAX_BARREN_RECORDS = 100_000
_ZSTD_FEED = 1024
MAX_DECOMPRESSED_BYTES_ENV = "TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES"
# Per compressed file, decompressed (backfill's, score's, compare's): stops a gzip or zstd bomb
# from costing minutes of CPU.
DEFAULT_MAX_DECOMPRESSED_BYTES = 8 * 2**30
SKIP_CHUNK = 2**20  # what a reader reads at a time of what it skips unread
# A compressed file cut short (EOFError) or holding bytes that do not decompress; a file that
# cannot be read at all is an OSError, as any file's.
DECOMPRESS_ERRORS: tuple[type[Exception], ...] = (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)


class _ZstdStream(io.RawIOBase):
    """A zstd file's decompressed bytes, every frame in turn (the Collector's file exporter ends a
    frame at each flush). A file that ends inside a frame is an ``EOFError``, as gzip's is: the
    library's stream reader ends such a file quietly, as if whole. Input goes in by
    ``_ZSTD_FEED`` bytes, so one call's output is bounded (zstd's largest ratio is about
    32,000). Seekable as a gzip file is, since a resume starts at a decompressed offset and a
    ``*.json`` file is looked ahead in: forward by reading, back by starting over."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file  # at its start: not sought there, so a pipe is read too
        self._start()

    def _start(self) -> None:
        self._frame: Any = None  # the frame being read (a decompressobj); None between frames
        self._input = b""  # read from the file, not yet fed
        self._output, self._taken = b"", 0
        self._position = 0

    def _decompress(self) -> bytes:
        """The next decompressed bytes; ``b""`` at the end of the file, between frames."""
        while True:
            data, self._input = self._input or self._file.read(_ZSTD_FEED), b""
            if not data:
                if self._frame is not None:
                    raise EOFError("the file ends inside a zstd frame (cut short, or still being written)")
                return b""
            if self._frame is None:
                self._frame = zstandard.ZstdDecompressor().decompressobj()
            out: bytes = self._frame.decompress(data)
            if self._frame.eof:
                self._input, self._frame = self._frame.unused_data, None
            if out:
                return out

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._taken == len(self._output):
            self._output, self._taken = self._decompress(), 0
        count = min(len(buffer), len(self._output) - self._taken)
        buffer[:count] = self._output[self._taken : self._taken + count]
        self._taken += count
        self._position += count
        return count

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("a zstd stream cannot be sought from its end")
        if offset < self._position:
            self._file.seek(0)
            self._start()
        scratch = bytearray(min(SKIP_CHUNK, max(offset - self._position, 1)))
        while self._position < offset and self.readinto(memoryview(scratch)[: offset - self._position]):
            pass
        return self._position


class _Rejoined(io.RawIOBase):
    """A pipe's first bytes, read whole to tell its compression, then the rest of the pipe."""

    def __init__(self, head: bytes, file: io.BufferedReader) -> None:
        self._head, self._file = head, file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._head:
            return self._file.readinto(buffer)
        count = min(len(buffer), len(self._head))
        buffer[:count], self._head = self._head[:count], self._head[count:]
        return count


def byte_cap(value: int | None, env: str, default: int) -> int:
    """A size cap: ``value``, else the environment's ``env`` (``_`` allowed), else ``default``;
    at least 1024 bytes (``SourceError`` naming the variable otherwise)."""
    if value is None:
        raw = os.environ.get(env, "").strip().replace("_", "")
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SourceError(f"{env}={raw!r} is not a number of bytes (e.g. {default})") from None
    if value < 1024:
        raise SourceError(f"{env} must be at least 1024 bytes, got {value}")
    return value


def max_decompressed_bytes() -> int:
    """How many bytes a compressed input file may decompress to (``MAX_DECOMPRESSED_BYTES_ENV``,
    else 8 GiB); ``SourceError`` naming the variable when it is no such number."""
    return byte_cap(None, MAX_DECOMPRESSED_BYTES_ENV, DEFAULT_MAX_DECOMPRESSED_BYTES)


def past_decompressed_cap(cap: int) -> str:
    """What a reader says of a compressed file it stops at ``cap`` decompressed bytes."""
    return (
        f"the file decompresses to more than {cap:,} bytes; the rest of it is skipped (raise"
        f" {MAX_DECOMPRESSED_BYTES_ENV} to read it)"
    )


class Opened(NamedTuple):
    """An input file opened by ``open_compressed``."""

    handle: IO[bytes]  # its bytes, decompressed
    file: IO[bytes]  # the file itself, whose position measures the progress
    compressed: bool


@contextlib.contextmanager
def open_compressed(path: Path) -> Iterator[Opened]:
    """The file's bytes, decompressed as its first bytes say (gzip, zstd), whatever its name (the
    Collector's file exporter names its files as told); the file itself, whose position measures
    the progress; and whether it was compressed."""
    with path.open("rb") as file:
        magic = file.peek(4)[:4]  # (a pipe cannot be sought back to its start)
        source: IO[bytes] = file
        if len(magic) < 4 and not file.seekable():  # a pipe's peek holds what one read got
            magic = file.read(4)
            source = io.BufferedReader(_Rejoined(magic, file))
        handle: IO[bytes]
        if magic.startswith(_GZIP_MAGIC):
            handle = gzip.GzipFile(fileobj=source, mode="rb")  # type: ignore[assignment]  # a binary IO
        elif magic == ZSTD_MAGIC or (magic[1:] == _SKIPPABLE_TAIL and magic[0] & 0xF0 == 0x50):
            handle = io.BufferedReader(_ZstdStream(source))
        else:
            yield Opened(source, file, compressed=False)
            return
        with handle:
            yield Opened(handle, file, compressed=True)


def inflate_frame(frame: bytes, at_most: int) -> bytes:
    """One zstd frame held in memory (a length-prefixed message of its own), decompressed a
    slice at a time: at most ``at_most`` bytes, whatever size its header declares."""
    with io.BufferedReader(_ZstdStream(io.BytesIO(frame))) as reader:
        return reader.read(at_most)
