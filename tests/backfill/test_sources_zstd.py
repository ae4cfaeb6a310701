"""tracing.sources: the Collector file exporter's ``compression: zstd`` files, both layouts.

By default the exporter compresses each export batch into a zstd frame of its own and writes it
behind a 4-byte big-endian length, JSON or protobuf alike; with its
``exporter.file.nativeCompression`` feature gate it writes one zstd stream, a frame per flush, of
JSON Lines (or length-prefixed protobuf). The files carry the name the Collector is given: the
layout is told by their bytes, and hostile bytes are named, counted and passed.
"""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import pytest
import zstandard
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.backfill._synth import write_otlp_files
from tracing.otlp import decode_otlp_json_line
from tracing.sources import FileSource, Malformed, SpanBatch, UnitEnd

TRACES = 12
PER_LINE = 3
SPANS = TRACES * 3  # _synth: a root and two children a trace


def _lines(tmp_path: Path) -> list[bytes]:
    """The export batches as the file exporter's JSON marshaller writes them, one a line."""
    (jsonl,) = write_otlp_files(tmp_path / "src", TRACES, files=1, traces_per_line=PER_LINE, compress=False)
    return jsonl.read_bytes().splitlines()


def _proto(line: bytes) -> bytes:
    return bytes(encode_spans(decode_otlp_json_line(line)).SerializeToString())


def _prefixed(bodies: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(body)) + body for body in bodies)


def _frames(chunks: list[bytes]) -> bytes:
    """One zstd frame a chunk, back to back: the native stream, a frame per flush."""
    return b"".join(zstandard.ZstdCompressor().compress(chunk) for chunk in chunks)


def _span_ids(items: list[object]) -> list[str]:
    return [s.span_id for i in items if isinstance(i, SpanBatch) for s in i.spans]


def _layouts(tmp_path: Path) -> dict[str, Path]:
    lines = _lines(tmp_path)
    compress = zstandard.ZstdCompressor().compress
    files = {
        # default: a frame a batch, behind its length; the Collector's `path: traces.json`
        "traces.json": _prefixed([compress(line) for line in lines]),
        "traces.pb": _prefixed([compress(_proto(line)) for line in lines]),
        # nativeCompression: one stream (here three flushes) of JSON Lines / length-prefixed protobuf
        "native.jsonl.zst": _frames([b"".join(line + b"\n" for line in lines[i::3]) for i in range(3)]),
        "native.json": _frames([b"".join(line + b"\n" for line in lines)]),
        "native.pb.zst": _frames(
            [_prefixed([_proto(line) for line in lines[:2]]), _prefixed(list(map(_proto, lines[2:])))]
        ),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    return paths


def test_each_layout_reads_every_span_once(tmp_path: Path) -> None:
    """Each of the exporter's zstd layouts, under the names it may be given, reads every span, and
    a resume from any record reads exactly the rest."""
    for name, path in _layouts(tmp_path).items():
        source = FileSource([path])
        items = list(source.read())
        assert not [i for i in items if isinstance(i, Malformed)], name
        assert len(set(_span_ids(items))) == len(_span_ids(items)) == SPANS, name
        assert isinstance(items[-1], UnitEnd)
        assert source.fraction_done() == 1.0
        batches = [i for i in items if isinstance(i, SpanBatch)]
        for batch in batches[1:]:
            rest = list(FileSource([path]).read(batch.position))
            assert _span_ids(rest) == _span_ids(items[items.index(batch) :]), (name, batch.where)


def test_a_directory_finds_zst_files_and_a_gzip_named_jsonl_is_read(tmp_path: Path) -> None:
    """``.zst`` is taken off as ``.gz`` is when a directory is searched; compression is read from
    the bytes, so a gzip file named ``*.jsonl`` is read too (it was 'not UTF-8' line by line)."""
    lines = _lines(tmp_path)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl.zst").write_bytes(_frames([b"\n".join(lines) + b"\n"]))
    (folder / "b.jsonl").write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    (folder / "notes.zst").write_bytes(b"")
    source = FileSource([folder])
    assert [p.name for p in source.files] == ["a.jsonl.zst", "b.jsonl"]
    items = list(source.read())
    assert not [i for i in items if isinstance(i, Malformed)]
    assert len(_span_ids(items)) == 2 * SPANS


def test_progress_is_the_share_of_compressed_bytes(tmp_path: Path) -> None:
    """Part-way through a zstd stream the share read is the compressed file's position."""
    paths = _layouts(tmp_path)
    source = FileSource([paths["native.jsonl.zst"]])
    shares = [source.fraction_done() for _ in source.read()]
    assert shares[0] > 0.0
    assert shares == sorted(shares)
    assert shares[-1] == 1.0


def test_a_bad_frame_is_one_malformed_message_and_the_rest_is_read(tmp_path: Path) -> None:
    """In the default layout each frame stands alone: a garbled one is its message's error."""
    lines = _lines(tmp_path)
    compress = zstandard.ZstdCompressor().compress
    frames = [compress(line) for line in lines]
    frames[1] = frames[1][:8] + bytes(len(frames[1]) - 8)  # the magic kept, the rest zeros
    path = tmp_path / "traces.json"
    path.write_bytes(_prefixed(frames))
    items = list(FileSource([path]).read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.where == f"{path}:message 2"
    assert bad.reason.startswith("not a whole zstd frame")
    assert len(_span_ids(items)) == SPANS - PER_LINE * 3


def test_a_stream_cut_short_gives_what_it_holds_then_says_where_it_broke(tmp_path: Path) -> None:
    """A native stream still being written: its whole lines, one Malformed, then the next file."""
    lines = _lines(tmp_path)
    data = _frames([b"".join(line + b"\n" for line in lines)])
    cut = tmp_path / "a.jsonl.zst"
    cut.write_bytes(data[: len(data) * 2 // 3])
    whole = tmp_path / "b.jsonl.zst"
    whole.write_bytes(data)
    items = list(FileSource([cut, whole]).read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.position.unit == 0
    assert "cannot read the file further" in bad.reason
    assert len(_span_ids([i for i in items if isinstance(i, SpanBatch) and i.position.unit == 1])) == SPANS


def test_a_frame_asking_for_a_huge_window_is_refused_not_allocated(tmp_path: Path) -> None:
    """A frame declaring a 1 GiB window (libzstd's default limit is 128 MiB) is an error naming it."""
    params = zstandard.ZstdCompressionParameters(window_log=30, write_content_size=False)
    out = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(out, closefd=False) as writer:
        writer.write(b"\n".join(_lines(tmp_path)) + b"\n")
    path = tmp_path / "big-window.jsonl.zst"
    path.write_bytes(out.getvalue())
    (bad, end) = list(FileSource([path]).read())
    assert isinstance(bad, Malformed)
    assert "too much memory" in bad.reason
    assert isinstance(end, UnitEnd)


@pytest.mark.parametrize("layout", ["stream", "frames"])
def test_a_zstd_bomb_stops_at_the_decompressed_cap(tmp_path: Path, layout: str) -> None:
    """A few kilobytes decompressing to far more than the cap: the file stops being read there,
    named with the setting to raise, whether the file is a stream or frames behind lengths."""
    blank = b" " * (4 * 2**20)  # (not newlines: 100,000 empty lines end a file first)
    if layout == "stream":
        path, data = tmp_path / "bomb.jsonl.zst", _frames([blank] * 4)
    else:
        path, data = tmp_path / "bomb.json", _prefixed([zstandard.ZstdCompressor().compress(b"{" + blank)] * 4)
    path.write_bytes(data)
    assert len(data) < 10_000
    source = FileSource([path], max_decompressed_bytes=6 * 2**20, max_line_bytes=5 * 2**20)
    items = list(source.read())
    bad = [i for i in items if isinstance(i, Malformed)]
    assert "TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES" in bad[-1].reason
    assert isinstance(items[-1], UnitEnd)


def test_a_frame_over_the_line_cap_is_skipped_and_the_next_read(tmp_path: Path) -> None:
    """A message whose frame decompresses past the line cap is skipped, the next one read."""
    lines = _lines(tmp_path)
    compress = zstandard.ZstdCompressor().compress
    path = tmp_path / "traces.json"
    path.write_bytes(_prefixed([compress(b"{" + b" " * 3 * 2**20 + b"}"), *map(compress, lines)]))
    items = list(FileSource([path], max_line_bytes=2**20).read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.where == f"{path}:message 1"
    assert "TRACESCORE_BACKFILL_MAX_LINE_BYTES" in bad.reason
    assert len(_span_ids(items)) == SPANS


def test_a_stream_that_starts_with_a_skippable_frame_is_read_as_zstd(tmp_path: Path) -> None:
    """A zstd file may start with a skippable frame (magic 0x184D2A50..5F: pzstd writes one before
    each frame, the seekable format's tools too); ``zstd -d`` reads it. Told by the standard frame
    magic alone, it was read as plain text: every line malformed, "not UTF-8"."""
    lines = _lines(tmp_path)
    skippable = struct.pack("<II", 0x184D2A5E, 4) + b"\x00\x01\x02\x03"
    path = tmp_path / "traces.jsonl.zst"
    path.write_bytes(skippable + _frames([b"".join(line + b"\n" for line in lines)]))
    items = list(FileSource([path]).read())
    assert not [i.reason for i in items if isinstance(i, Malformed)]
    assert len(_span_ids(items)) == SPANS
