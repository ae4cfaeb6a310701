"""Hostile and broken input files: size caps before decoding, bad lines, gzip bombs.

Every bad record is one ``Malformed`` item with file:line (or file:message N); reading goes on
with the next record or file, and the traces already read are kept.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.backfill._synth import trace_id, trace_spans
from tracing.otlp import OtlpDecodeError, decode_otlp_json
from tracing.sources import FileSource, Malformed, SourceError, SpanBatch, UnitEnd

ROOT = Path(__file__).resolve().parents[2]
MAX_LINE_BYTES_ENV = "TRACESCORE_BACKFILL_MAX_LINE_BYTES"
MAX_DECOMPRESSED_BYTES_ENV = "TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES"


def _doc(i: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    children, root = trace_spans(i)
    if extra:
        root["attributes"] = [*root["attributes"], extra]
    return {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": [*children, root]}]}]}


def _line(i: int, extra: dict[str, Any] | None = None) -> bytes:
    return json.dumps(_doc(i, extra), separators=(",", ":")).encode() + b"\n"


def _traces(items: list[Any]) -> set[str]:
    return {s.trace_id for i in items if isinstance(i, SpanBatch) for s in i.spans}


def _bad(items: list[Any]) -> list[Malformed]:
    return [i for i in items if isinstance(i, Malformed)]


def test_a_line_over_the_cap_is_skipped_undecoded_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 MB line under a 1 MiB cap is one Malformed (file:2, the cap's setting); lines 1 and 3 read."""
    monkeypatch.setenv(MAX_LINE_BYTES_ENV, str(2**20))
    big = {"key": "blob", "value": {"stringValue": "x" * 3_000_000}}
    path = tmp_path / "t.jsonl"
    path.write_bytes(_line(1) + _line(2, big) + _line(3))
    items = list(FileSource([path]).read())
    (bad,) = _bad(items)
    assert bad.where == f"{path}:2"
    assert MAX_LINE_BYTES_ENV in bad.reason
    assert "1,048,576" in bad.reason
    assert _traces(items) == {trace_id(1), trace_id(3)}
    # Positions stay exact after a skipped line: resuming at line 3 reads line 3.
    third = next(i for i in items if isinstance(i, SpanBatch) and i.position.line == 3)
    assert _traces(list(FileSource([path]).read(third.position))) == {trace_id(3)}


def test_bad_lines_are_one_malformed_each_and_lose_nothing(tmp_path: Path) -> None:
    """Invalid UTF-8, 100,000 nested brackets and a BOM: reading goes on, every good trace is read."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + _line(1)  # a BOM on line 1: read (it is valid UTF-8 JSON)
        + _line(2).replace(b"weather-agent", b"weather-\xff\xfeagent")  # invalid UTF-8
        + b"[" * 100_000 + b"]" * 100_000 + b"\n"  # nested beyond any parser
        + _line(4)
        + b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{" * 50_000 + b"\n"  # cut short, deep
        + _line(6)
    )  # fmt: skip
    items = list(FileSource([path]).read())
    bad = _bad(items)
    assert [b.where for b in bad] == [f"{path}:2", f"{path}:3", f"{path}:5"]
    assert "utf-8" in bad[0].reason.lower()
    assert "nested too deeply" in bad[1].reason
    assert _traces(items) == {trace_id(1), trace_id(4), trace_id(6)}
    assert isinstance(items[-1], UnitEnd)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(depth):
        value = {"arrayValue": {"values": [value]}}
    return value


def test_deeply_nested_attribute_values_are_an_otlp_error() -> None:
    """An arrayValue nested a few hundred levels (valid JSON) is an OtlpDecodeError, not RecursionError."""
    _, root = trace_spans(1)
    root["attributes"] = [{"key": "deep", "value": _nested(2000)}]
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [root]}]}]}
    with pytest.raises(OtlpDecodeError, match="nested too deeply"):
        decode_otlp_json(document, where="f:1")


def test_a_job_state_names_its_files_so_that_resume_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job started on relative paths kept them: `--resume` from another directory failed with
    "cannot reopen the job's source"."""
    from tracing.sources import source_from_description

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "t.jsonl").write_bytes(_line(1) + _line(2))
    monkeypatch.chdir(tmp_path / "job")
    described = FileSource(["t.jsonl"]).describe()
    monkeypatch.chdir(tmp_path)
    assert _traces(list(source_from_description(described).read())) == {trace_id(1), trace_id(2)}


def test_a_pipe_or_a_device_is_named_as_such_not_as_missing(tmp_path: Path) -> None:
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        with pytest.raises(SourceError, match="not a regular file or a directory"):
            FileSource([path])


def test_protobuf_attribute_values_are_capped_at_the_json_depth() -> None:
    """A protobuf arrayValue nested 33-47 levels (protobuf's own parser stops near 48) was
    read, where OTLP/JSON stops at MAX_VALUE_DEPTH: both stop there now."""
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    from tracing.otlp import MAX_VALUE_DEPTH, decode_otlp_protobuf_records

    def message(depth: int) -> bytes:
        data = TracesData()
        span = data.resource_spans.add().scope_spans.add().spans.add()
        span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "invoke_agent a"
        attribute = span.attributes.add()
        attribute.key = "gen_ai.agent.name"
        value = attribute.value
        for _ in range(depth):
            value = value.array_value.values.add()
        value.string_value = "leaf"
        return data.SerializeToString()

    (record,) = decode_otlp_protobuf_records(message(MAX_VALUE_DEPTH))
    assert record.attributes["gen_ai.agent.name"]
    with pytest.raises(OtlpDecodeError, match="nested too deeply") as too_deep:
        decode_otlp_protobuf_records(message(MAX_VALUE_DEPTH + 1), where="f.pb:message 1")
    assert too_deep.value.where == "f.pb:message 1"


def test_a_json_file_whose_line_1_is_not_utf8_is_reported_and_the_next_file_read(tmp_path: Path) -> None:
    """*.json with bad bytes on line 1 (read as a whole document) was an uncaught UnicodeDecodeError."""
    bad_file = tmp_path / "a.json"
    bad_file.write_bytes(b'{"resourceSpans": [\xff\xfe\n]}\n')
    nested = tmp_path / "b.json"
    nested.write_bytes(b"[" * 100_000 + b"\n" + b"]" * 100_000)
    good = tmp_path / "c.jsonl"
    good.write_bytes(_line(7))
    items = list(FileSource([bad_file, nested, good]).read())
    assert [b.where for b in _bad(items)] == [f"{bad_file}:1", f"{nested}:1"]
    assert _traces(items) == {trace_id(7)}


def test_decompressed_size_cap_stops_a_gz_file_and_reads_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .gz past its decompressed cap: the lines before it are read, one Malformed, the next file read."""
    monkeypatch.setenv(MAX_DECOMPRESSED_BYTES_ENV, str(64 * 1024))
    first = tmp_path / "a.jsonl.gz"
    lines = [_line(i) for i in range(40)]  # ~4 KB each: ~160 KB in all
    first.write_bytes(gzip.compress(b"".join(lines)))
    second = tmp_path / "b.jsonl.gz"
    second.write_bytes(gzip.compress(_line(99)))
    items = list(FileSource([tmp_path]).read())
    (bad,) = _bad(items)
    assert bad.where.startswith(f"{first}:")
    assert MAX_DECOMPRESSED_BYTES_ENV in bad.reason
    read_before = [i for i in items if isinstance(i, SpanBatch) and i.position.unit == 0]
    assert 0 < len(read_before) < 40
    assert sum(len(line) for line in lines[: len(read_before)]) <= 64 * 1024
    assert bad.position.line == len(read_before) + 1
    assert trace_id(99) in _traces(items)


def test_protobuf_message_over_the_cap_is_skipped_and_the_rest_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A length prefix over the cap: that message is one Malformed (file:message N), the next ones read."""
    monkeypatch.setenv(MAX_LINE_BYTES_ENV, str(2**20))
    big = {"key": "blob", "value": {"stringValue": "y" * 2_000_000}}
    bodies = [encode_spans(decode_otlp_json(_doc(i, big if i == 2 else None))).SerializeToString() for i in (1, 2, 3)]
    for name, opener in (("t.pb", open), ("t.pb.gz", gzip.open)):
        path = tmp_path / name
        with opener(path, "wb") as out:
            for body in bodies:
                out.write(struct.pack(">I", len(body)) + body)
            out.write(struct.pack(">I", 3_000_000_000))  # a lying prefix at the end: 3 GB
        items = list(FileSource([path]).read())
        assert [b.where for b in _bad(items)] == [f"{path}:message 2", f"{path}:message 4"], name
        assert "(raise TRACESCORE_BACKFILL_MAX_LINE_BYTES to read it)" in _bad(items)[0].reason
        # Past the end of the file, no setting would read it (it advised raising the cap: audit).
        assert _bad(items)[1].reason == (
            "its length prefix says 3,000,000,000 bytes, and the file ends 0 bytes later: not a"
            " length-prefixed OTLP protobuf file, or one cut short"
        )
        assert _traces(items) == {trace_id(1), trace_id(3)}


def test_bad_cap_settings_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(_line(1))
    monkeypatch.setenv(MAX_LINE_BYTES_ENV, "lots")
    with pytest.raises(SourceError, match=MAX_LINE_BYTES_ENV):
        FileSource([path])
    monkeypatch.setenv(MAX_LINE_BYTES_ENV, "16_777_216")
    assert FileSource([path]).max_line_bytes == 16 * 2**20


# --- the gzip bomb: peak memory, measured in a subprocess ---------------------------------------

BOMB_LINE_BYTES = 300 * 2**20


def _write_bomb(path: Path) -> None:
    """Good trace, then one ~300 MB JSON line (a few hundred KB compressed), then a good trace."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    chunk = b"a" * 2**20
    with path.open("wb") as out:
        out.write(compressor.compress(_line(1)))
        out.write(compressor.compress(b'{"resourceSpans":[],"padding":"'))
        for _ in range(BOMB_LINE_BYTES // len(chunk)):
            out.write(compressor.compress(chunk))
        out.write(compressor.compress(b'"}\n'))
        out.write(compressor.compress(_line(2)))
        out.write(compressor.flush())


def _read_and_measure(path: str) -> dict[str, Any]:
    """Read the file; the peak of Python's allocations while reading (tracemalloc: the same for
    the same code and input, where RSS moves with the allocator and what else the process did).
    A line held whole is a bytes object, which it counts; zlib's own state (a window) it does not."""
    tracemalloc.start()
    try:
        items = list(FileSource([path]).read())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {
        "peak_mb": peak / 2**20,
        "bad": [[b.where, b.reason] for b in _bad(items)],
        "traces": sorted(_traces(items)),
    }


def test_gzip_bomb_line_is_skipped_in_bounded_memory(tmp_path: Path) -> None:
    """A ~300 KB .gz holding a 300 MB line: skipped with a Malformed, the reader's allocations
    peak < 48 MB (the old reader held the whole line and parsed it: well over 600 MB). In a
    subprocess, so that a regression holds the line there, not in the test run."""
    path = tmp_path / "bomb.jsonl.gz"
    _write_bomb(path)
    assert path.stat().st_size < 2 * 2**20
    code = (
        "import json, sys\n"
        "from tests.backfill.test_sources_hostile import _read_and_measure\n"
        "print(json.dumps(_read_and_measure(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", MAX_LINE_BYTES_ENV: str(8 * 2**20)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peak_mb"] < 48, result
    assert result["traces"] == sorted([trace_id(1), trace_id(2)])
    assert [where for where, _ in result["bad"]] == [f"{path}:2"]
    assert MAX_LINE_BYTES_ENV in result["bad"][0][1]


def test_a_tempo_trace_over_the_cap_is_malformed_and_not_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tempo's answer for one trace is read up to the cap only: over it, one Malformed naming
    the trace and the setting; the other traces are read."""
    from tests.backfill._synth import BASE_NS
    from tests.backfill.faketempo import FakeTempo
    from tracing.sources import TempoSource

    monkeypatch.setenv(MAX_LINE_BYTES_ENV, str(2**20))
    fake = FakeTempo().start()
    try:
        big = {"key": "blob", "value": {"stringValue": "z" * 2_000_000}}
        for i in range(3):
            fake.add(decode_otlp_json(_doc(i, big if i == 1 else None)))
        source = TempoSource(fake.url, since_ns=BASE_NS - 10**9, until_ns=BASE_NS + 10 * 10**9)
        items = list(source.read())
    finally:
        fake.stop()
    (bad,) = _bad(items)
    assert bad.where == f"tempo trace {trace_id(1)}"
    assert MAX_LINE_BYTES_ENV in bad.reason
    assert _traces(items) == {trace_id(0), trace_id(2)}


def test_backfill_counts_bad_lines_and_scores_every_good_trace(tmp_path: Path) -> None:
    """Through the driver (dry run): the bad lines are counted with file:line, nothing else is
    lost (a RecursionError used to end the whole job, losing the traces assembled so far)."""
    from worker.backfill._driver import Backfill
    from worker.backfill._state import BackfillOptions, BackfillState

    path = tmp_path / "t.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + _line(1) + b"[" * 100_000 + b"\n" + _line(2).replace(b"agent", b"\xc3(agent") + _line(3)
    )
    source = FileSource([path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    state = BackfillState(job_id="bf-bad", source=source.describe(), options=options)
    done = Backfill(source, state, None).run()
    assert done.counters.malformed == 2
    assert done.counters.malformed_where == [f"{path}:2", f"{path}:3"]
    assert done.counters.runs_read == 2


def test_a_json_lines_file_named_json_with_a_broken_first_line_loses_that_line_alone(tmp_path: Path) -> None:
    """A ``*.json`` file whose line 1 is no document is read whole; when that fails too and its
    next non-blank line is a JSON object, it is JSON Lines with a broken first line (all its
    lines were lost before).
    A broken pretty-printed document stays one Malformed, not one a line."""
    path = tmp_path / "t.json"
    path.write_bytes(_line(1)[:100] + b"\n" + _line(2) + _line(3) + b"not json\n" + _line(5))
    items = list(FileSource([path]).read())
    assert [b.where for b in _bad(items)] == [f"{path}:1", f"{path}:4"]
    assert _traces(items) == {trace_id(2), trace_id(3), trace_id(5)}

    # The next line blank, or a JSON object that is no OTLP document: still JSON Lines (every
    # good line after them was lost when line 2 had to decode as OTLP).
    for name, second in (("blank", b"\n\n"), ("not-otlp", b'{"resourceSpans": 5}\n')):
        lines = tmp_path / f"{name}.json"
        lines.write_bytes(_line(1)[:100] + b"\n" + second + _line(2) + _line(3))
        items = list(FileSource([lines]).read())
        assert _traces(items) == {trace_id(2), trace_id(3)}, name
        assert _bad(items)[0].where == f"{lines}:1"

    pretty = tmp_path / "p.json"
    pretty.write_text(json.dumps(_doc(1), indent=2)[:-30])
    items = list(FileSource([pretty]).read())
    assert len(_bad(items)) == 1
    assert _bad(items)[0].reason.startswith("not JSON")
    assert _traces(items) == set()


@pytest.mark.parametrize("gz", [False, True])
def test_a_file_of_records_holding_no_span_is_given_up_after_a_bounded_run(tmp_path: Path, gz: bool) -> None:
    """A short-line bomb (newlines, ``{}``, empty protobuf messages) cost microseconds a record
    up to the 8 GiB cap: hours. After MAX_BARREN_RECORDS in a row the rest of the file is one
    Malformed; one record fewer, and the trace after them is read."""
    from tracing.sources._files import MAX_BARREN_RECORDS

    opener: Any = gzip.open if gz else open
    suffix = ".gz" if gz else ""
    for n, read in ((MAX_BARREN_RECORDS - 1, True), (MAX_BARREN_RECORDS, False)):
        lines = tmp_path / f"t{n}.jsonl{suffix}"
        with opener(lines, "wb") as out:
            out.write(_line(1) + b"\n" * (n // 2) + b"{}\n" * (n - n // 2) + _line(2))
        items = list(FileSource([lines]).read())
        assert (trace_id(2) in _traces(items)) is read
        assert [b.where for b in _bad(items)] == ([] if read else [f"{lines}:{n + 2}"])

        body = encode_spans(decode_otlp_json(_doc(2))).SerializeToString()
        messages = tmp_path / f"t{n}.pb{suffix}"
        with opener(messages, "wb") as out:
            out.write(struct.pack(">I", 0) * n + struct.pack(">I", len(body)) + body)
        items = list(FileSource([messages]).read())
        assert (trace_id(2) in _traces(items)) is read
        if not read:
            (bad,) = _bad(items)
            assert bad.where == f"{messages}:message {n + 1}"
            assert "in a row held no span" in bad.reason


def test_a_protobuf_message_of_only_fields_otlp_lacks_is_not_otlp(tmp_path: Path) -> None:
    """Garbage that parses as protobuf made of unknown fields, or of field 1 with another wire type,
    decoded to zero spans without a word, message after message, until 100,000 in a row stopped
    the file. Now each is a Malformed (file:message N) saying it is not OTLP; a legitimate message
    without spans (empty, or resource spans holding none) is still read quietly."""
    trace = encode_spans(decode_otlp_json(_doc(1))).SerializeToString()
    garbage = [
        b"\x08\x01",  # field 1 as a varint: resourceSpans has another wire type
        b"\x10\x96\x01\x1a\x03abc",  # fields 2 and 3: not in ExportTraceServiceRequest
        b"\x0a\x04\x08\x01\x10\x02",  # a resourceSpans whose fields are all unknown
    ]
    legal = [
        b"",  # an empty ExportTraceServiceRequest
        b"\x0a\x00",  # one empty resourceSpans
        b"\x0a\x09\x12\x07\x0a\x05\x0a\x03lib",  # a resourceSpans whose scopeSpans hold no span
    ]
    path = tmp_path / "t.pb"
    path.write_bytes(b"".join(struct.pack(">I", len(body)) + body for body in [trace, *garbage, *legal, trace]))
    items = list(FileSource([path]).read())
    bad = _bad(items)
    assert [b.where for b in bad] == [f"{path}:message {n}" for n in (2, 3, 4)]
    assert [b.reason for b in bad] == [
        f"not an OTLP protobuf message: no spans, and {unknown} of its {size} bytes are fields OTLP traces"
        " do not have (or of another wire type)"
        for unknown, size in ((2, 2), (8, 8), (4, 6))
    ]
    assert [len(i.spans) for i in items if isinstance(i, SpanBatch)] == [3, 0, 0, 0, 3]
