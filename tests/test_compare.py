"""`tracescore compare OLD.jsonl NEW.jsonl`: per-scorer movement between two record files."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner, Result

from tests._pty import on_a_terminal
from worker._compare import compare_files
from worker.cli import cli


def _rec(trace: str, scorer: str, score: float | None, reason: str, version: str = "1", **kw: Any) -> dict[str, Any]:
    return {
        "score_id": f"{trace}-{scorer}-{version}",
        "trace_id": trace,
        "span_id": "s" + trace,
        "scorer_id": scorer,
        "scorer_version": version,
        "score": score,
        "reason": reason,
        **kw,
    }


def _write(path: Path, records: list[dict[str, Any]], extra: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(e + "\n" for e in extra))
    return path


def _compare(*args: str) -> Result:
    return CliRunner().invoke(cli, ["compare", *args])


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """Known changes: 'rel' v1 → v2 moves t1 up 0.5, t2 down 0.25, t3 unchanged, t4 fails in
    v2, t5 only old, t6 only new; 'len' is identical in both; one malformed line in new."""
    old = [
        _rec("t1", "rel", 0.25, "old t1"),
        _rec("t2", "rel", 1.0, "old t2"),
        _rec("t3", "rel", 0.5, "old t3"),
        _rec("t4", "rel", 0.75, "old t4"),
        _rec("t5", "rel", 0.0, "old t5"),
        _rec("t1", "len", 0.5, "len"),
        _rec("t2", "len", 0.5, "len"),
    ]
    new = [
        _rec("t1", "rel", 0.75, "new t1", "2"),
        _rec("t2", "rel", 0.75, "new t2", "2"),
        _rec("t3", "rel", 0.5, "new t3", "2"),
        _rec("t4", "rel", None, "", "2", error_type="JudgeServerError"),
        _rec("t6", "rel", 1.0, "new t6", "2"),
        _rec("t1", "len", 0.5, "len"),
        _rec("t2", "len", 0.5, "len"),
    ]
    bad = '{"trace_id": "t9", "scorer_id": "rel", "score": "high"}'
    return _write(tmp_path / "old.jsonl", old), _write(tmp_path / "new.jsonl", new, (bad,))


def test_known_changes_per_scorer(files: tuple[Path, Path]) -> None:
    """Means over runs scored in both, up/down/unchanged, only-old/only-new, versions, and the
    runs that moved most (largest change first) with both reasons."""
    old, new = files
    result = compare_files(old, new, top=5)
    rel = result["by_scorer"]["rel"]
    assert rel["runs_in_both"] == 4
    assert rel["scored_in_both"] == 3
    assert rel["mean_old"] == pytest.approx((0.25 + 1.0 + 0.5) / 3)
    assert rel["mean_new"] == pytest.approx((0.75 + 0.75 + 0.5) / 3)
    assert rel["mean_delta"] == pytest.approx(0.25 / 3)
    assert (rel["up"], rel["down"], rel["unchanged"]) == (1, 1, 1)
    assert (rel["only_old"], rel["only_new"]) == (1, 1)
    assert rel["newly_failed_or_not_scorable"] == 1
    assert (rel["versions_old"], rel["versions_new"]) == (["1"], ["2"])
    moved = rel["moved_most"]
    assert [(m["run"], m["delta"]) for m in moved] == [("t1", 0.5), ("t2", -0.25)]
    assert (moved[0]["old_reason"], moved[0]["new_reason"]) == ("old t1", "new t1")
    length = result["by_scorer"]["len"]
    assert (length["up"], length["down"], length["unchanged"], length["mean_delta"]) == (0, 0, 2, 0.0)
    assert result["new"]["malformed_lines"] == 1


def test_cli_prints_table_and_movers_and_reports_bad_lines(files: tuple[Path, Path]) -> None:
    """The text output has one row per scorer and the movers with both reasons; a malformed
    line is reported as file:line and skipped; --json is the same data."""
    old, new = files
    result = _compare(str(old), str(new), "--top", "1")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("rel "))
    assert row.split()[1:5] == ["4", "0.583", "0.667", "+0.083"]
    assert "0.250 → 0.750 (+0.500)  t1" in result.stdout
    assert "old: old t1" in result.stdout
    assert "new: new t1" in result.stdout
    assert "t2" not in result.stdout.split("moved most")[1]  # --top 1
    assert f"{new}:8: skipped: 'score' must be a number or null, got str" in result.stderr
    as_json = json.loads(_compare(str(old), str(new), "--json").stdout)
    assert as_json["by_scorer"]["rel"]["up"] == 1


def test_score_out_files_compare_across_scorer_versions(tmp_path: Path) -> None:
    """End to end: `score --out` with version 1 and version 2 of a scorer, then compare."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "".join(
            json.dumps({"run_id": rid, "input": "q", "output": out}) + "\n"
            for rid, out in [("a", "exactly ten"), ("b", "done."), ("c", "x")]
        )
    )
    v1, v2 = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    scored = CliRunner().invoke(
        cli, ["score", str(runs), "--scorers", "tests.summary_scorers_v1", "--scorer", "length", "--out", str(v1)]
    )
    assert scored.exit_code == 0, scored.output
    assert (
        CliRunner()
        .invoke(cli, ["score", str(runs), "--scorers", "tests.summary_scorers_v2", "--out", str(v2)])
        .exit_code
        == 0
    )
    rel = compare_files(v1, v2)["by_scorer"]["length"]
    # v2 halves outputs without a final period: a (1.0 → 0.5) and c (0.1 → 0.05) go down, b stays.
    assert (rel["up"], rel["down"], rel["unchanged"]) == (0, 2, 1)
    assert [m["run"] for m in rel["moved_most"]] == ["a", "c"]
    assert rel["moved_most"][0]["old_reason"] == "v1: 11 chars"
    assert rel["moved_most"][0]["new_reason"] == "v2: 11 chars, period=False"


def test_records_of_one_run_twice_are_named_in_the_table(tmp_path: Path) -> None:
    """Two records of one run and scorer in a file (a re-score appended to it; `score` itself
    writes one record a run id): the last counts, as before, and the table now says how many
    were replaced, where only --json counted them and the table showed fewer runs without a word."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "".join(
            json.dumps({"run_id": rid, "input": "q", "output": out}) + "\n"
            for rid, out in [("a", "one answer."), ("b", "x")]
        )
    )
    out = tmp_path / "scores.jsonl"
    scored = CliRunner().invoke(
        cli, ["score", str(runs), "--scorers", "tests.summary_scorers_v1", "--scorer", "length", "--out", str(out)]
    )
    assert scored.exit_code == 0, scored.output
    with out.open("a") as records:
        records.write(out.read_text().splitlines(keepends=True)[0])  # run a's record again
    result = _compare(str(out), str(out))
    assert result.exit_code == 0, result.output
    assert "old: 1 record(s) of a run and scorer already read; the last one counts" in result.stdout
    assert "new: 1 record(s) of a run and scorer already read" in result.stdout
    assert json.loads(_compare(str(out), str(out), "--json").stdout)["duplicates"] == {"old": 1, "new": 1}


def test_unreadable_input_is_a_clear_error(tmp_path: Path) -> None:
    """A file of garbage exits 1 naming it; a missing file is a usage error naming it."""
    good = _write(tmp_path / "good.jsonl", [_rec("t1", "rel", 0.5, "r")])
    bad = _write(tmp_path / "bad.jsonl", [], ("garbage", "[1, 2]", '{"trace_id": "t"}'))
    result = _compare(str(good), str(bad))
    assert result.exit_code == 1
    assert f"{bad}:1: skipped: not JSON" in result.stderr
    assert f"{bad}:2: skipped: expected a score record" in result.stderr
    assert f"{bad}:3: skipped: no 'scorer_id'" in result.stderr
    assert f"every line of {bad} was malformed (3)" in result.stderr
    missing = _compare(str(good), str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2
    assert "nope.jsonl" in missing.stderr


def test_hostile_lines_are_skipped_or_read_and_the_comparison_is_printed(files: tuple[Path, Path]) -> None:
    """A number past 4300 digits, JSON nested past the parser, a score past a double's range,
    lone surrogates in a scorer id and a reason: each ended the command (ValueError,
    RecursionError, OverflowError, UnicodeEncodeError printing the table). Now the first two
    are malformed lines, the score is no score, the text is printed with U+FFFD."""
    old, new = files
    hostile = [
        '{"trace_id": "t1", "scorer_id": "rel", "score": ' + "9" * 4301 + "}",
        "[" * 100_000 + "]" * 100_000,
        '{"trace_id": "t7", "scorer_id": "rel", "score": ' + "9" * 400 + "}",
        '{"trace_id": "t8", "scorer_id": "odd\\ud800", "score": 0.5, "reason": "r"}',
        "[" * 600 + '"x"' + "]" * 600,  # parsed, but past the walk over its texts
    ]
    with new.open("a") as out:
        out.write("".join(line + "\n" for line in hostile))
    with old.open("a") as out:
        out.write('{"trace_id": "t8", "scorer_id": "odd\\ud800", "score": 0.25, "reason": "cut \\udc80"}\n')
    result = _compare(str(old), str(new))
    assert result.exit_code == 0, result.output
    assert f"{new}:9: skipped: not JSON (a number of more than 4300 digits)" in result.stderr
    assert f"{new}:10: skipped: not JSON (nested too deeply)" in result.stderr
    assert f"{new}:13: skipped: nested too deeply" in result.stderr
    assert "odd\ufffd" in result.stdout
    assert "old: cut \ufffd" in result.stdout
    rel = compare_files(old, new)["by_scorer"]["rel"]
    assert rel["only_new"] == 2  # t6, and t7 (no score)


def test_top_zero_and_a_file_against_itself(files: tuple[Path, Path], tmp_path: Path) -> None:
    """--top 0 raised IndexError once a score moved; a file with a re-scored run compared with
    itself reported moves (the first of a key won in NEW, the last in OLD)."""
    old, new = files
    assert _compare(str(old), str(new), "--top", "0").exit_code == 0
    rescored = _write(tmp_path / "r.jsonl", [_rec("t1", "rel", 0.25, "first"), _rec("t1", "rel", 0.75, "again")])
    rel = compare_files(rescored, rescored)["by_scorer"]["rel"]
    assert (rel["up"], rel["down"], rel["unchanged"]) == (0, 0, 1)


def test_a_bom_is_not_part_of_line_one(files: tuple[Path, Path]) -> None:
    """A UTF-8 BOM (a Windows editor's) made line 1 malformed and its record lost."""
    old, new = files
    old.write_bytes(b"\xef\xbb\xbf" + old.read_bytes())
    result = compare_files(old, new)
    assert (result["old"]["records"], result["old"]["malformed_lines"]) == (7, 0)


def test_compressed_record_files_are_read_as_plain_ones(files: tuple[Path, Path]) -> None:
    """``scores.jsonl.gz`` or ``.zst`` (a record file kept compressed) was every line malformed;
    compressed as gzip or zstd, whatever its name, it reads as the plain file does, and one cut
    short keeps what came before it, named."""
    old, new = files
    plain = compare_files(old, new)
    gz = old.with_name("old.jsonl.gz")
    gz.write_bytes(gzip.compress(old.read_bytes()))
    zst = new.with_name("new.records")  # (the name says nothing: the bytes do)
    zst.write_bytes(zstandard.ZstdCompressor().compress(new.read_bytes()))
    read = compare_files(gz, zst)
    assert (read["old"]["path"], read["new"]["path"]) == (str(gz), str(zst))
    assert {**read, "old": plain["old"], "new": plain["new"]} == plain
    assert (read["old"]["records"], read["new"]["records"]) == (plain["old"]["records"], plain["new"]["records"])
    gz.write_bytes(gz.read_bytes()[:-12])  # the trailer and the last block's end gone
    said: list[str] = []
    cut = compare_files(gz, new, warn=said.append)["old"]
    assert cut["malformed_lines"] == 1
    assert [w for w in said if "cannot read the file further" in w], said


def test_a_line_over_the_cap_is_skipped_unread(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """compare and score held a whole line in memory, however long (a 200 MB line took 436 MB):
    a line over the cap is now one malformed line, read no further, and the next lines read."""
    from worker import _lines

    monkeypatch.setattr(_lines, "MAX_LINE_BYTES", 1024)
    old, new = files
    lines = old.read_text().splitlines(keepends=True)
    long_line = json.dumps(_rec("t9", "rel", 0.5, "x" * 5000)) + "\n"
    old.write_text("".join([*lines[:2], long_line, *lines[2:]]))
    result = _compare(str(old), str(new))
    assert result.exit_code == 0, result.output
    assert f"{old}:3: skipped: longer than 1,024 bytes; skipped unread" in result.stderr
    assert compare_files(old, new)["old"]["records"] == 7

    runs = old.parent / "runs.jsonl"
    runs.write_text(
        json.dumps({"run_id": "a", "input": "q", "output": "y" * 5000})
        + "\n"
        + json.dumps({"run_id": "b", "input": "q", "output": "short"})
        + "\n"
    )
    scored = CliRunner().invoke(
        cli, ["score", str(runs), "--scorers", "tests.summary_scorers_v1", "--scorer", "length"]
    )
    assert scored.exit_code == 0, scored.output
    assert f"{runs}:1: skipped: longer than 1,024 bytes; skipped unread" in scored.stderr
    assert "1 runs × 1 scorers" in scored.stderr


def test_scores_at_a_doubles_limit_give_valid_json(tmp_path: Path) -> None:
    """Sums of scores near 1e308 are infinite, which --json printed as Infinity (no JSON parser
    of another language reads it): such figures are null, and the text says '-'."""
    old = _write(tmp_path / "o.jsonl", [_rec("t1", "rel", -1e308, "a"), _rec("t2", "rel", -1e308, "b")])
    new = _write(tmp_path / "n.jsonl", [_rec("t1", "rel", 1e308, "a"), _rec("t2", "rel", 1e308, "b")])
    as_json = _compare(str(old), str(new), "--json")
    assert as_json.exit_code == 0, as_json.output
    rel = json.loads(as_json.stdout, parse_constant=lambda name: pytest.fail(f"{name} in --json"))["by_scorer"]["rel"]
    assert (rel["mean_old"], rel["mean_delta"], rel["moved_most"][0]["delta"]) == (None, None, None)
    text = _compare(str(old), str(new))
    assert text.exit_code == 0, text.output
    assert "1e+308" in text.stdout  # a short cell, not 309 digits breaking the table
    assert max(len(line) for line in text.stdout.splitlines()) < 200


def test_integer_scores_at_a_doubles_limit_give_a_table(tmp_path: Path) -> None:
    """The same with integer scores (JSON's 1 followed by 308 zeros): their difference is an
    integer past a double's range, and the command ended with "error: OverflowError: int too
    large to convert to float", no table, the other runs' moves unsaid."""
    big = 10**308
    old = tmp_path / "o.jsonl"
    new = tmp_path / "n.jsonl"
    old.write_text(
        f'{{"run_id": "r1", "scorer_id": "s", "score": {-big}}}\n{{"run_id": "r2", "scorer_id": "s", "score": 0.5}}\n'
    )
    new.write_text(
        f'{{"run_id": "r1", "scorer_id": "s", "score": {big}}}\n{{"run_id": "r2", "scorer_id": "s", "score": 0.7}}\n'
    )
    as_json = _compare(str(old), str(new), "--json")
    assert as_json.exit_code == 0, as_json.output
    s = json.loads(as_json.stdout)["by_scorer"]["s"]
    assert (s["up"], s["mean_delta"]) == (2, None)
    assert [m["delta"] for m in s["moved_most"]] == [None, pytest.approx(0.2)]
    text = _compare(str(old), str(new))
    assert text.exit_code == 0, text.output
    assert "(+0.200)" in text.stdout, text.stdout
    assert "(-)" in text.stdout, text.stdout


def test_control_characters_from_a_file_never_reach_the_terminal(tmp_path: Path) -> None:
    """Escape sequences in a scorer id, a run, a version or a reason (colour, cursor moves, a
    window title) were printed as they were: each control character is now U+FFFD."""
    esc = "\x1b[31m\x1b]0;owned\x07"
    old = _write(tmp_path / "o.jsonl", [_rec("t1" + esc, "rel" + esc, 0.25, "old" + esc, "1" + esc)])
    new = _write(tmp_path / "n.jsonl", [_rec("t1" + esc, "rel" + esc, 0.75, "new" + esc, "2")])
    result = _compare(str(old), str(new))
    assert result.exit_code == 0, result.output
    assert "rel\ufffd[31m" in result.stdout
    assert "\x1b" not in result.stdout
    assert "\x07" not in result.stdout


def test_two_runs_of_one_trace_that_moved_are_told_apart_by_their_span(tmp_path: Path) -> None:
    """Two agent runs (spans) of one trace both moved: "moved most" named each by the trace id
    alone, so the two lines read as one run twice (re-score audit)."""
    old = _write(
        tmp_path / "old.jsonl",
        [
            _rec("t1", "rel", 0.9, "a", span_id="00000000000000aa"),
            _rec("t1", "rel", 0.2, "b", span_id="00000000000000bb"),
        ],
    )
    new = _write(
        tmp_path / "new.jsonl",
        [
            _rec("t1", "rel", 0.1, "a", span_id="00000000000000aa"),
            _rec("t1", "rel", 0.8, "b", span_id="00000000000000bb"),
        ],
    )
    moved = compare_files(old, new, top=5)["by_scorer"]["rel"]["moved_most"]
    assert [(m["run"], m["span_id"]) for m in moved] == [("t1", "00000000000000aa"), ("t1", "00000000000000bb")]
    text = _compare(str(old), str(new)).stdout
    assert "(-0.800)  t1 00000000000000aa" in text
    assert "(+0.600)  t1 00000000000000bb" in text


def test_integer_scores_past_sqlites_range_and_odd_ids_are_read(tmp_path: Path) -> None:
    """The records are compared in a SQLite file (memory stays flat), whose integers end at 64
    bits: an integer score past them is compared exactly as before (2**63 → 2**63 + 1 moved up),
    a trace id holding NUL and a span id that is a number match their twins, and integer scores
    stay integers in --json."""
    old = _write(
        tmp_path / "o.jsonl",
        [_rec("t\x001", "rel", 10**30, "a"), _rec("t2", "rel", 1, "b", span_id=7), _rec("t3", "rel", 2**63, "c")],
    )
    new = _write(
        tmp_path / "n.jsonl",
        [
            _rec("t\x001", "rel", 2 * 10**30, "a"),
            _rec("t2", "rel", 0, "b", span_id=7),
            _rec("t3", "rel", 2**63 + 1, "c"),
        ],
    )
    result = compare_files(old, new)["by_scorer"]["rel"]
    assert (result["runs_in_both"], result["only_old"], result["only_new"]) == (3, 0, 0)
    assert (result["up"], result["down"]) == (2, 1)
    moved = {m["run"]: (m["old"], m["new"]) for m in result["moved_most"]}
    assert moved == {"t\x001": (10**30, 2 * 10**30), "t2": (1, 0), "t3": (2**63, 2**63 + 1)}
    assert all(isinstance(v, int) for pair in moved.values() for v in pair)


def test_an_unusable_temporary_directory_is_a_clear_error(
    files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare keeps its records in a temporary SQLite file: a TMPDIR it cannot write is named."""
    old, new = files
    gone = tmp_path / "no-such-dir"
    monkeypatch.setattr(tempfile, "tempdir", str(gone))  # (TMPDIR, as the process read it at start)
    result = _compare(str(old), str(new))
    assert result.exit_code == 1, result.output
    assert f"compare failed: cannot make its temporary store in {gone} (TMPDIR)" in result.stderr
    assert "cannot read" not in result.stderr


def _many(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """Two record files of ``n`` records each, every score moved a little."""
    old = _write(tmp_path / "old.jsonl", [_rec(f"t{i}", "rel", 0.25, "old") for i in range(n)])
    new = _write(tmp_path / "new.jsonl", [_rec(f"t{i}", "rel", 0.5, "new", "2") for i in range(n)])
    return old, new


def test_compare_reports_its_progress_per_phase(tmp_path: Path) -> None:
    """84,000 records took 8 s with nothing said, millions far longer (noticed): each file's
    reading, then the comparing, goes to the progress reporter, with how far it got."""
    import io

    from worker._progress import ProgressReporter

    old, new = _many(tmp_path, 2500)
    stream = io.StringIO()
    result = compare_files(old, new, progress=ProgressReporter(stream, tty=False, interval_s=0))
    assert result["by_scorer"]["rel"]["up"] == 2500
    lines = stream.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["reading old"] * 2 + ["reading new"] * 2 + ["comparing"] * 2

    def share(path: Path, n: int) -> str:  # of the file's bytes in its first n lines
        return f"({sum(map(len, path.read_bytes().splitlines(keepends=True)[:n])) / path.stat().st_size:.1%})"

    shown = [(line.split("  ")[0], line.rsplit(" ", 1)[1]) for line in lines]  # (what, the share done)
    assert shown[0] == ("reading old: 1,000 lines", share(old, 1000))
    assert shown[3] == ("reading new: 2,000 lines", share(new, 2000))
    assert shown[5] == ("comparing: 2,000 records", "(80.0%)")


def test_compare_shows_a_progress_bar_on_a_terminal_and_keeps_json_stdout_pure(tmp_path: Path) -> None:
    """As score and backfill do: on a terminal (stderr a pty) the bar is drawn; with --json,
    stdout (a pipe here) holds the one JSON object and nothing else."""
    old, new = _many(tmp_path, 3000)
    shown = on_a_terminal(["compare", str(old), str(new), "--json"])
    assert shown.returncode == 0
    terminal, stdout = shown.text, shown.stdout
    for phase in ("reading old: ", "reading new: ", "comparing: "):
        assert phase in terminal, terminal
    assert "\r\x1b[2K" in terminal  # a redrawn bar, not plain lines
    assert len(stdout.splitlines()) == 1
    assert json.loads(stdout) == compare_files(old, new)


def test_a_compressed_file_of_blank_lines_stops_being_read(tmp_path: Path) -> None:
    """630 bytes of zstd hold 20 million blank lines (4 s to read; a megabyte, hours): compare
    and score had no cap for a compressed file's lines, where a backfill stops a file past
    100,000 lines in a row with nothing in them (MAX_BARREN_RECORDS). Past as many, the rest of
    the file is one malformed line, named, and not read."""
    from tracing.sources._files import MAX_BARREN_RECORDS

    old = _write(tmp_path / "old.jsonl", [_rec("t1", "rel", 0.5, "r")])
    bomb = tmp_path / "new.jsonl.zst"
    bomb.write_bytes(zstandard.ZstdCompressor().compress(b"\n" * (MAX_BARREN_RECORDS * 3) + b"{}\n"))
    said: list[str] = []
    new = compare_files(old, bomb, warn=said.append)["new"]
    assert new["malformed_lines"] == 1, said
    assert [w for w in said if f"{bomb}:{MAX_BARREN_RECORDS + 1}" in w], said


def test_a_compressed_file_past_the_decompressed_cap_stops_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few KB of zstd holding lines of megabytes: each over the line cap is read through to skip
    it, with no cap on the whole (a small file of 4 GiB lines cost minutes). Past the compressed
    files' cap (backfill's, TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES) the rest is one malformed
    line naming the setting, and the records before it stand."""
    monkeypatch.setattr("worker._lines.MAX_LINE_BYTES", 2**20)
    monkeypatch.setenv("TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES", str(8 * 2**20))
    good = json.dumps(_rec("t1", "rel", 0.5, "r")).encode() + b"\n"
    huge = b" " * (3 * 2**20) + b"\n"
    bomb = tmp_path / "new.records"
    bomb.write_bytes(zstandard.ZstdCompressor().compress(good + huge * 40 + good))
    assert bomb.stat().st_size < 100_000
    said: list[str] = []
    old = _write(tmp_path / "old.jsonl", [_rec("t1", "rel", 0.5, "r")])
    new = compare_files(old, bomb, warn=said.append)["new"]
    assert new["records"] == 1
    (past,) = [w for w in said if "decompresses to more than 8,388,608 bytes" in w]
    assert past.startswith(f"{bomb}:5: "), past
    assert "TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES" in past
    assert new["malformed_lines"] == 4  # three lines skipped as too long, then the cap
    plain = tmp_path / "plain.records"
    plain.write_bytes(good + huge * 3 + good)  # 9 MB: a plain file is read whole, whatever its size
    assert compare_files(old, plain)["new"]["records"] == 2


def test_a_bad_decompressed_cap_is_one_line_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It ended as "error: SourceError: ..." and the --verbose hint, from inside the read."""
    monkeypatch.setenv("TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES", "lots")
    old = _write(tmp_path / "old.jsonl", [_rec("t1", "rel", 0.5, "r")])
    result = _compare(str(old), str(old))
    assert result.exit_code == 1, result.output
    assert "TRACESCORE_BACKFILL_MAX_DECOMPRESSED_BYTES='lots' is not a number of bytes" in result.stderr
    assert "--verbose" not in result.stderr


def _run_record(run_id: str, line: int, score: float) -> dict[str, Any]:
    """A record as `score --out` writes it (this release's and the ones before)."""
    return {"run_id": run_id, "line": line, "scorer_id": "len", "scorer_version": "1", "score": score, "reason": "r"}


def test_a_run_without_an_id_is_matched_by_its_line_never_with_an_id_of_its_name(tmp_path: Path) -> None:
    """`score` names a run without an id ``line-N``, and its --out record carries its line N. A
    run whose explicit id is that same text elsewhere in the file (or in the other file) was
    the same run here: one record replaced the other (counted as a duplicate) and the two runs
    were compared as one. A record whose run id is its own line's name is the run of that line
    without an id (so files of earlier releases read the same); any other is its explicit id."""
    old = _write(
        tmp_path / "old.jsonl",
        [_run_record("line-5", 5, 0.1), _run_record("line-5", 9, 0.9), _run_record("x", 3, 0.5)],
    )
    new = _write(
        tmp_path / "new.jsonl",
        [_run_record("line-5", 2, 0.7), _run_record("line-5", 5, 0.3), _run_record("x", 4, 0.5)],
    )
    result = compare_files(old, new)
    assert result["duplicates"] == {"old": 0, "new": 0}
    rel = result["by_scorer"]["len"]
    assert (rel["runs_in_both"], rel["only_old"], rel["only_new"]) == (3, 0, 0)
    # Line 5's run without an id: 0.1 → 0.3; the run of id "line-5" (line 9, then line 2): 0.9 → 0.7.
    assert sorted((m["old"], m["new"]) for m in rel["moved_most"]) == [(0.1, 0.3), (0.9, 0.7)]
    assert (rel["up"], rel["down"], rel["unchanged"]) == (1, 1, 1)


def test_odd_lines_and_run_ids_are_explicit_ids_and_read(tmp_path: Path) -> None:
    """Only an integer ``line`` beside its own name makes a record the run of a line without an
    id: a boolean, a float, a string or a huge integer as the line, or a run id of another
    type, is read as an explicit id, and nothing fails."""
    odd: list[dict[str, Any]] = [
        {**_run_record("line-True", 1, 0.1), "line": True},
        {**_run_record("line-5.0", 1, 0.2), "line": 5.0},
        {**_run_record("line-7", 1, 0.3), "line": "7"},
        {**_run_record("line-" + "9" * 4000, 1, 0.4), "line": int("9" * 4000)},
        {**_run_record("x", 1, 0.5), "run_id": {"line": 5}},
        {**_run_record("x", 1, 0.6), "run_id": 5, "line": 5},
        _run_record("line-7", 7, 0.7),
    ]
    path = _write(tmp_path / "odd.jsonl", odd)
    result = compare_files(path, path)
    assert result["duplicates"] == {"old": 0, "new": 0}
    assert result["by_scorer"]["len"]["runs_in_both"] == len(odd)
