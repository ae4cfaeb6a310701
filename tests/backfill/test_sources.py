"""tracing.sources: reading OTLP files (JSON Lines, JSON, protobuf, gzip, directories)."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.backfill._synth import trace_id, write_otlp_files
from tracing.otlp import decode_otlp_json_line
from tracing.sources import FileSource, Malformed, Position, SourceError, SpanBatch, UnitEnd, open_source


def _span_ids(items: list[object]) -> list[str]:
    return [s.span_id for i in items if isinstance(i, SpanBatch) for s in i.spans]


def test_directory_is_read_in_path_order_gz_and_plain(tmp_path: Path) -> None:
    """A directory yields its files sorted, gzip or not, each followed by a UnitEnd."""
    write_otlp_files(tmp_path / "a", 10, files=2, compress=True)
    write_otlp_files(tmp_path / "b", 4, files=1, compress=False)
    source = FileSource([tmp_path])
    assert [p.name for p in source.files] == ["part-000.jsonl.gz", "part-001.jsonl.gz", "part-000.jsonl"]
    items = list(source.read())
    ends = [i.unit for i in items if isinstance(i, UnitEnd)]
    assert ends == [0, 1, 2]
    assert len(_span_ids(items)) == 14 * 3
    assert source.fraction_done() == 1.0


def test_malformed_lines_are_reported_with_file_and_line_and_skipped(tmp_path: Path) -> None:
    """Bad JSON and bad OTLP lines become Malformed(file:line) items; the good lines still come."""
    (path,) = write_otlp_files(tmp_path, 10, files=1, traces_per_line=5, compress=False)
    good = path.read_text().splitlines()
    path.write_text(
        "\n".join(
            [
                good[0],
                "{not json",
                "",
                '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}',
                good[1],
            ]
        )
        + "\n"
    )
    items = list(FileSource([path]).read())
    bad = [i for i in items if isinstance(i, Malformed)]
    assert [b.where for b in bad] == [f"{path}:2", f"{path}:4"]
    assert bad[0].reason.startswith("not JSON")
    assert "traceId" in bad[1].reason
    assert len(_span_ids(items)) == 30


def test_resume_from_a_position_reads_the_rest(tmp_path: Path) -> None:
    """Reading from a record's position (line + byte offset) yields exactly that record onwards."""
    write_otlp_files(tmp_path, 30, files=2, traces_per_line=3, compress=True)
    source = FileSource([tmp_path])
    everything = list(source.read())
    batches = [i for i in everything if isinstance(i, SpanBatch)]
    middle = batches[len(batches) // 2 + 1]
    rest = list(FileSource([tmp_path]).read(middle.position))
    assert _span_ids(rest) == _span_ids(everything[everything.index(middle) :])
    assert isinstance(rest[0], SpanBatch)
    assert rest[0].where == middle.where


def test_pretty_printed_json_file_is_read_whole(tmp_path: Path) -> None:
    """A *.json file holding one indented OTLP document is read as one record."""
    (source_file,) = write_otlp_files(tmp_path / "src", 2, files=1, traces_per_line=2, compress=False)
    document = json.loads(source_file.read_text().splitlines()[0])
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document, indent=2))
    (batch, end) = list(FileSource([path]).read())
    assert isinstance(batch, SpanBatch)
    assert len(batch.spans) == 6
    assert isinstance(end, UnitEnd)


def test_protobuf_file_with_length_prefixes(tmp_path: Path) -> None:
    """The Collector file exporter's proto format (4-byte big-endian length + message), gzipped."""
    (jsonl,) = write_otlp_files(tmp_path / "src", 6, files=1, traces_per_line=3, compress=False)
    messages = [
        encode_spans(decode_otlp_json_line(line)).SerializeToString() for line in jsonl.read_text().splitlines()
    ]
    path = tmp_path / "traces.pb.gz"
    with gzip.open(path, "wb") as out:
        for body in messages:
            out.write(struct.pack(">I", len(body)) + body)
        out.write(b"\x00\x00\x01")  # a truncated length prefix at the end
    items = list(FileSource([path]).read())
    assert len(_span_ids(items)) == 18
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.where == f"{path}:message 3"
    assert "truncated" in bad.reason
    resumed = list(
        FileSource([path]).read(next(i for i in items if isinstance(i, SpanBatch) and i.position.line == 2).position)
    )
    assert len(_span_ids(resumed)) == 9


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    """Missing paths, unknown file types and empty directories raise SourceError naming the path."""
    with pytest.raises(SourceError, match="no such file"):
        FileSource([tmp_path / "missing.jsonl"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match=r"notes\.txt: unknown file type"):
        FileSource([tmp_path / "notes.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no trace files"):
        FileSource([tmp_path / "empty"])
    with pytest.raises(SourceError, match="cannot be combined"):
        open_source(["tempo+http://localhost:3200", str(tmp_path)])


def test_synthetic_ids_are_valid() -> None:
    """The synthetic traces used here have distinct, non-zero 32-hex ids."""
    ids = {trace_id(i) for i in range(1000)}
    assert len(ids) == 1000
    assert all(len(t) == 32 and int(t, 16) for t in ids)
    assert Position(1, 2, 3) < Position(2, 0, 0)


def test_truncated_gzip_yields_what_it_can_then_says_where_it_broke(tmp_path: Path) -> None:
    """A .gz cut short (a file still being written) gives its whole lines, then one Malformed, then the next file."""
    paths = write_otlp_files(tmp_path, 40, files=2, traces_per_line=4)
    data = paths[0].read_bytes()
    paths[0].write_bytes(data[: len(data) * 2 // 3])
    items = list(FileSource([tmp_path]).read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    complete = [i for i in items if isinstance(i, SpanBatch) and i.position.unit == 0]
    assert complete
    assert bad.where == f"{paths[0]}:{len(complete) + 1}"
    assert "cannot read the file further" in bad.reason
    assert bad.position.line == len(complete) + 1
    assert any(isinstance(i, SpanBatch) and i.position.unit == 1 for i in items)


def test_corrupt_gzip_is_reported_and_the_next_file_is_read(tmp_path: Path) -> None:
    """A .gz whose deflate data is corrupt (zlib.error) gives one Malformed, not a crashed job."""
    paths = write_otlp_files(tmp_path, 40, files=2, traces_per_line=4)
    corrupt_member = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\x07" + b"\x00" * 20  # reserved block type
    paths[0].write_bytes(paths[0].read_bytes() + corrupt_member)
    items = list(FileSource([tmp_path]).read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert "cannot read the file further" in bad.reason
    assert bad.position.unit == 0
    assert any(isinstance(i, SpanBatch) and i.position.unit == 0 for i in items)
    assert any(isinstance(i, SpanBatch) and i.position.unit == 1 for i in items)
