"""The per-scorer summary of `tracescore score` and `tracescore backfill`, streaming, exit codes."""

from __future__ import annotations

import array
import fcntl
import gzip
import json
import os
import queue
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner, Result

from tests._pty import on_a_terminal
from tests._redis import RedisServer
from worker._summary import Outcome, Summary, percentile
from worker.backfill import print_summary as _print_summary
from worker.cli import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "traces"
V1 = "tests.summary_scorers_v1"  # length, shouting (lower is better), broken (always fails)
NO_BROKER = {"TRACESCORE_BROKER_URL": ""}
TRACESCORE = str(Path(sys.executable).parent / "tracescore")

RUNS = [
    {"run_id": "short", "input": "q", "output": "ab"},
    {"run_id": "long", "input": "q", "output": "a long enough answer."},
    {"run_id": "LOUD", "input": "q", "output": "ALL CAPS!!"},
    {"run_id": "empty", "input": "q", "output": ""},
    {"run_id": "mid", "input": "q", "output": "medium"},
]


def _write_runs(path: Path, runs: list[dict[str, Any]], extra_lines: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in runs) + "".join(line + "\n" for line in extra_lines))
    return path


def _score(*args: str) -> Result:
    return CliRunner().invoke(cli, ["score", *args])


# --- the summary itself ------------------------------------------------------------------------


def test_summary_figures_and_worst_runs_follow_the_direction() -> None:
    """Mean and quantiles are over the scores; the worst runs are the lowest for
    higher-is-better scorers and the highest for lower-is-better ones; failures and
    not-scorable runs are counted apart."""
    from tests.summary_scorers_v1 import length, shouting

    summary = Summary({"length": length, "shouting": shouting}, worst_n=2)
    for i, value in enumerate([0.5, 0.1, 0.9, 0.3, 0.7]):
        summary.add(Outcome(f"r{i}", "length", score=value, reason=f"reason {i}"))
        summary.add(Outcome(f"r{i}", "shouting", score=value, reason=f"reason {i}"))
    summary.add(Outcome("x", "length", error_type="ValueError", error_message="boom"))
    summary.add(Outcome("z", "length", error_type="ValueError", error_message="boom again"))
    summary.add(Outcome("y", "length", not_scorable="preprocess: empty"))
    data = summary.as_json()
    length_json = data["length"]
    assert length_json["runs"] == 8
    assert length_json["scored"] == 5
    assert length_json["mean"] == pytest.approx(0.5)
    assert (length_json["min"], length_json["median"], length_json["max"]) == (0.1, 0.5, 0.9)
    assert length_json["p10"] == pytest.approx(0.18)
    assert length_json["failed_by_reason"] == {"ValueError": 2}
    assert length_json["failure_examples"] == {"ValueError": {"run": "x", "error": "boom"}}  # the first
    assert length_json["not_scorable_reasons"] == {"preprocess: empty": 1}
    assert [w["run"] for w in length_json["worst"]] == ["r1", "r3"]  # 0.1, 0.3
    assert [w["run"] for w in data["shouting"]["worst"]] == ["r2", "r4"]  # 0.9, 0.7
    text = summary.render(width=100)
    assert "shouting ↓" in text
    assert "reason 1" in text
    assert percentile([1.0, 2.0], 0.5) == 1.5


def test_worst_runs_are_kept_in_a_bounded_heap() -> None:
    """A million scores keep only the worst N entries (plus 8 bytes per score)."""
    summary = Summary(["s"], worst_n=3)
    for i in range(20_000):
        summary.add(Outcome(str(i), "s", score=(i * 7919 % 20_000) / 20_000, reason="r" * 1000))
    scorer = summary.by_scorer["s"]
    assert len(scorer._worst) == 3
    assert [w.score for w in scorer.worst()] == [0.0, 0.00005, 0.0001]
    assert all(len(w.reason) <= 300 for w in scorer.worst())


# --- tracescore score --------------------------------------------------------------------------


def test_score_prints_the_per_scorer_summary_by_default(tmp_path: Path) -> None:
    """No per-run table unless --table; the summary shows runs, figures, failures, worst runs."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--scorer", "shouting")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "scores by scorer (5 runs)" in out
    header = next(line for line in out.splitlines() if line.startswith("scorer "))
    assert header.split()[:9] == ["scorer", "runs", "mean", "min", "p10", "median", "p90", "max", "failed"]
    row = next(line for line in out.splitlines() if line.startswith("length "))
    assert row.split()[1:3] == ["5", "0.700"]  # mean of 0.2, 1, 1, 0.6 (and one not scorable)
    assert "length: worst 3 run(s)" in out
    assert "not scorable: 'generate_score: empty output' 1" in out
    worst_long = out.split("shouting: worst")[1].splitlines()[1]
    assert "LOUD" in worst_long  # lower is better: the loudest run is the worst
    assert "run  " not in out  # no per-run table
    table = _score(str(runs), "--scorers", V1, "--scorer", "length", "--table")
    assert table.stdout.splitlines()[0].split() == ["run", "scorer", "score", "reason"]
    assert sum(" length " in line for line in table.stdout.splitlines()) >= 5
    # With --json the table goes to stderr (it was dropped): stdout stays one result a line.
    both = _score(str(runs), "--scorers", V1, "--scorer", "length", "--table", "--json")
    assert [json.loads(line)["scorer_id"] for line in both.stdout.splitlines()] == ["length"] * 5
    assert both.stderr.splitlines()[0].split() == ["run", "scorer", "score", "reason"]


def test_score_json_lines_name_their_input_line(tmp_path: Path) -> None:
    """--json printed a result's run id but not its line, as --out does: a run named after its
    line (line-N) and a later line giving that same id explicitly were two runs a script could not
    tell apart. Every --json line, a failure's too, now carries the input line it came from."""
    runs = tmp_path / "runs.jsonl"
    lines_in = [
        "not json",
        json.dumps({"input": "q", "output": "no id given"}),  # line 2: its run id is line-2
        json.dumps({"run_id": "line-2", "input": "q", "output": "explicit"}),  # line 3: the same id, given
        json.dumps({"run_id": "x", "input": "q", "output": "ab"}),
    ]
    runs.write_text("".join(line + "\n" for line in lines_in))
    result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--scorer", "broken", "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    got = sorted((d["line"], d["run_id"], d["scorer_id"], "error" in d) for d in lines)
    assert got == [
        (2, "line-2", "broken", True),
        (2, "line-2", "length", False),
        (3, "line-2", "broken", True),
        (3, "line-2", "length", False),
        (4, "x", "broken", True),
        (4, "x", "length", False),
    ]
    by_line = {d["line"]: d for d in lines if d["scorer_id"] == "length"}
    assert (by_line[2]["score"], by_line[3]["score"]) == (1.0, 0.8)  # each result is its own line's


def test_score_table_rows_are_worded_as_backfill_and_the_summary_word_them(tmp_path: Path) -> None:
    """One table for both commands: a failure's row is "type: message" and a not-scorable
    run's "step: reason", as backfill's rows and the summary's failure and not-scorable lines."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    result = CliRunner().invoke(cli, ["score", str(runs), "--scorers", V1, "--table"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    rows = {tuple(line.split()[:2]): line for line in result.stdout.splitlines()[2:] if line.strip()}
    assert rows[("empty", "length")].split(None, 3)[2:] == ["n/a", "generate_score: empty output"]
    assert rows[("mid", "broken")].split(None, 3)[2:] == [
        "error",
        "ValueError: scorer 'broken' failed in step generate_score: ValueError: this scorer always fails",
    ]
    assert "not scorable: 'generate_score: empty output' 1" in result.stdout
    assert "failed  short  ValueError: scorer 'broken' failed in step generate_score" in result.stdout


def test_an_outcome_reads_a_record_and_its_json_alike() -> None:
    """Embedded backfill's ScoreRecords and the workers' records read back as JSON (Redis mode)
    become the same outcome, so both summaries count a record the same way."""
    from tracing import ScoreRecord

    records = [
        ScoreRecord(
            score_id="a", trace_id="t1", span_id="s1", span_name="agent", scorer_id="x", score=0.5, reason="ok"
        ),
        ScoreRecord(
            score_id="b", trace_id="t2", span_id="s2", scorer_id="x", error_type="timeout", error_message="slow"
        ),
        ScoreRecord(
            score_id="c",
            trace_id="t3",
            span_id="s3",
            scorer_id="x",
            not_scorable="preprocess: empty",
            judge_models=["m"],
            judge_calls=2,
            cost_usd=None,
        ),
    ]
    for record in records:
        assert Outcome.of_record(record, "label") == Outcome.of_record(json.loads(record.model_dump_json()), "label")
    assert Outcome.of_record(records[0]).label == "agent"  # no agent name: the span's
    assert [Outcome.of_record(r).cells() for r in records] == [
        ("0.500", "ok"),
        ("error", "timeout: slow"),
        ("n/a", "preprocess: empty"),
    ]


def test_score_out_writes_every_record(tmp_path: Path) -> None:
    """--out has one record per (run, scorer): scores, not-scorable runs and failures."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    out = tmp_path / "scores.jsonl"
    result = _score(str(runs), "--scorers", V1, "--out", str(out))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 15
    by = {(r["run_id"], r["scorer_id"]): r for r in records}
    assert by[("short", "length")]["score"] == pytest.approx(0.2)
    assert by[("empty", "length")]["not_scorable"] == "generate_score: empty output"
    assert by[("mid", "broken")]["error_type"] == "ValueError"
    assert {r["scorer_version"] for r in records} == {"1"}


def test_score_exit_codes(tmp_path: Path) -> None:
    """Non-zero when every score failed or every line was malformed; 0 when some scored."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    all_failed = _score(str(runs), "--scorers", V1, "--scorer", "broken")
    assert all_failed.exit_code == 1
    assert "every score failed (5)" in all_failed.stderr
    assert "broken: no scores" in all_failed.stdout  # the summary is still printed
    assert "failed  short  ValueError: scorer 'broken' failed" in all_failed.stdout  # with a first example
    bad = _write_runs(tmp_path / "bad.jsonl", [], ("not json", '{"input": "no output"}'))
    all_bad = _score(str(bad), "--scorers", V1)
    assert all_bad.exit_code == 1
    assert f"{bad}:1: skipped: not JSON" in all_bad.stderr
    assert f"every line of {bad} was malformed (2 lines)" in all_bad.stderr
    mixed = _write_runs(tmp_path / "mixed.jsonl", RUNS[:2], ("garbage",))
    partly = _score(str(mixed), "--scorers", V1)
    assert partly.exit_code == 0, partly.output
    assert "1 bad lines skipped" in partly.stderr


# JSON the parser takes (600 levels) but deeper than the walk over its texts could go: a
# RecursionError ended `score` and `compare` with every run lost.
DEEP_BUT_PARSED = "[" * 600 + '"x"' + "]" * 600


def test_score_reads_hostile_lines_without_losing_the_rest(tmp_path: Path) -> None:
    """A lone surrogate in a run id or answer ended the command (UnicodeEncodeError blamed on
    reading, or PydanticSerializationError with --json) and lost the runs after it; a number
    past 4300 digits, JSON nested past the parser, or parsed but past the text walk did too. Now
    the text is scored with U+FFFD and the three lines are malformed; every other run is scored
    and written."""
    runs = _write_runs(
        tmp_path / "runs.jsonl",
        [*RUNS[:2], {"run_id": "id\ud800x", "input": "q", "output": "cut \udc80 answer"}, *RUNS[2:]],
        ('{"input": "q", "output": ' + "9" * 4301 + "}", "[" * 100_000 + "]" * 100_000, DEEP_BUT_PARSED),
    )
    out = tmp_path / "scores.jsonl"
    for extra in (["--table"], ["--json"]):
        result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--out", str(out), *extra)
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["run_id"] for r in records] == ["short", "long", "id\ufffdx", "LOUD", "empty", "mid"]
        assert f"{runs}:7: skipped: not JSON (a number of more than 4300 digits)" in result.stderr
        assert f"{runs}:8: skipped: not JSON (nested too deeply)" in result.stderr
        assert f"{runs}:9: skipped: nested too deeply" in result.stderr


def test_score_ends_with_exit_1_after_its_summary_when_out_cannot_be_written(tmp_path: Path) -> None:
    """A full disk under --out (/dev/full) ended `score` with an unexpected-error line: no
    summary, --out not named. As backfill: the runs are scored, the summary printed, then one
    line naming --out and the error, exit 1."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    result = _score(str(runs), "--scorers", V1, "--out", "/dev/full")
    assert result.exit_code == 1, result.output
    assert f"scores by scorer ({len(RUNS)} runs)" in result.stdout
    assert "cannot write --out /dev/full: No space left on device; the summary above has the scores" in result.stderr
    assert "every record written to" not in result.stderr
    assert "--verbose" not in result.stderr


def test_score_names_runs_by_their_ids_as_json_writes_them(tmp_path: Path) -> None:
    """A run id that is an object or a list was Python's repr ("{'k': 1}") in the table and
    --out; a number reads as itself, and no id is the line's."""
    ids: list[Any] = [{"k": 1}, ["a", "é"], 7, 0.5, None, "", 0, False, [], {}]
    runs = _write_runs(tmp_path / "runs.jsonl", [{"run_id": i, "input": "q", "output": "ab"} for i in ids])
    out = tmp_path / "scores.jsonl"
    result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--out", str(out))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # 0 and false are ids (JSON's spelling): they were taken for none and renamed line-7, line-8.
    expected = ['{"k": 1}', '["a", "é"]', "7", "0.5", "line-5", "line-6", "0", "false", "line-9", "line-10"]
    assert [r["run_id"] for r in records] == expected


def test_score_reads_a_runs_file_with_a_bom(tmp_path: Path) -> None:
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    runs.write_bytes(b"\xef\xbb\xbf" + runs.read_bytes())
    result = _score(str(runs), "--scorers", V1, "--scorer", "length")
    assert result.exit_code == 0, result.output
    assert "5 runs × 1 scorers" in result.stderr
    assert "0 bad lines skipped" in result.stderr


def test_score_reads_a_compressed_runs_file(tmp_path: Path) -> None:
    """A runs file kept compressed (gzip or zstd, whatever its name) was every line malformed; it
    is scored as the plain file is, its progress the share of its own bytes."""
    plain = _write_runs(tmp_path / "runs.jsonl", RUNS)
    gz = tmp_path / "runs.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    zst = tmp_path / "runs.data"
    zst.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    for path in (gz, zst):
        result = _score(str(path), "--scorers", V1, "--scorer", "length")
        assert result.exit_code == 0, result.output
        assert "5 runs × 1 scorers" in result.stderr
        assert "0 bad lines skipped" in result.stderr


def test_score_refuses_to_write_over_its_runs_file(tmp_path: Path) -> None:
    """--out naming the runs file emptied it before a line was read, then reported 0 runs."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS)
    before = runs.read_text()
    result = _score(str(runs), "--scorers", V1, "--out", str(tmp_path / "." / "runs.jsonl"))
    assert result.exit_code != 0
    assert "is the runs file" in result.output
    assert runs.read_text() == before
    # A hard link to it is the same file under another name: it was emptied, and 0 runs scored.
    (tmp_path / "link.jsonl").hardlink_to(runs)
    linked = _score(str(runs), "--scorers", V1, "--out", str(tmp_path / "link.jsonl"))
    assert linked.exit_code != 0
    assert "is the runs file" in linked.output
    assert runs.read_text() == before


def test_score_streams_its_input(tmp_path: Path) -> None:
    """Rows come out while the input is still being written (a FIFO): runs are read and
    scored in chunks, not loaded whole first."""
    fifo = tmp_path / "runs.fifo"
    os.mkfifo(fifo)
    process = subprocess.Popen(
        [TRACESCORE, "score", str(fifo), "--scorers", V1, "--scorer", "length", "--table", "--chunk", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        with fifo.open("w") as writer:
            for run in RUNS[:2]:
                writer.write(json.dumps(run) + "\n")
            writer.flush()
            seen: list[str] = []
            deadline = time.monotonic() + 30
            while not any(line.startswith("long ") for line in seen):
                assert time.monotonic() < deadline, f"no row while the input was open; got {seen}"
                try:
                    seen.append(lines.get(timeout=0.1))
                except queue.Empty:
                    assert process.poll() is None, process.stderr.read() if process.stderr else ""
            writer.write(json.dumps(RUNS[4]) + "\n")
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


# `score` in a fresh interpreter under tracemalloc: the peak of what Python allocated while it ran
# (the same for the same code and input, whatever the machine's speed or load).
_TRACED_SCORE = (
    "import sys, tracemalloc\n"
    "tracemalloc.start()\n"
    "from worker.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "sys.stdout.flush()\n"
    "sys.stderr.write(f'traced {code} {tracemalloc.get_traced_memory()[1]}\\n')\n"
)


def _score_peak(tmp_path: Path, runs: int) -> int:
    """Python's peak allocation while `score` reads ``runs`` runs (140 bytes a line)."""
    path = tmp_path / f"runs-{runs}.jsonl"
    line = {"input": "what is the weather in paris today", "output": "It is sunny and 21 degrees in Paris today."}
    with path.open("w") as handle:
        for i in range(runs):
            handle.write(json.dumps({"run_id": f"r{i}", **line}) + "\n")
    command = ["score", str(path), "--scorers", V1, "--scorer", "length"]
    done = subprocess.run(
        [sys.executable, "-c", _TRACED_SCORE, *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert f"{runs:,} runs × 1 scorers: {runs:,} scored" in done.stderr, done.stderr[-2000:]
    code, peak = done.stderr.rsplit("traced ", 1)[-1].split()[:2]
    assert code == "0", done.stderr[-2000:]
    return int(peak)


def test_score_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """Twice the runs, about the same memory: the file is read and scored a chunk at a time, and
    only the summary's figures and the ids seen grow (Python's peak 44.1 MiB at 20,000 runs, 46.5
    at 40,000). Scored as one chunk (`--chunk` past the file: every run and result held at once,
    as `score` once read every file) it was 99.0 and 158.7 MiB, and this failed. (It asserted
    peak RSS under 150 MB at 100,000 runs: a memory target, which lives in bench/.)"""
    half, whole = _score_peak(tmp_path, 20_000), _score_peak(tmp_path, 40_000)
    assert whole < 1.3 * half, f"peak {whole / 2**20:.1f} MiB at 40,000 runs, {half / 2**20:.1f} at 20,000"


# --- tracescore backfill -----------------------------------------------------------------------


def test_backfill_exit_code_when_every_line_is_malformed(tmp_path: Path) -> None:
    """A source whose every line is broken exits 1 with a clear line (the summary first)."""
    (tmp_path / "bad.jsonl").write_text("garbage\nmore garbage\n")
    result = CliRunner().invoke(cli, ["backfill", str(tmp_path), "--scorers", V1], env=NO_BROKER)
    assert result.exit_code == 1
    assert "every input line was malformed (2; first at" in result.stderr
    dry = CliRunner().invoke(cli, ["backfill", str(tmp_path), "--scorers", V1, "--dry-run"], env=NO_BROKER)
    assert dry.exit_code == 1


def test_late_roots_are_printed_with_the_window_hint(capsys: pytest.CaptureFixture[str]) -> None:
    """When the assembler counted roots that came after their trace was released, the summary
    says so and names the option that would have kept each trace open (the window, or the memory
    bound); with none, nothing is printed."""
    summary: dict[str, Any] = {
        "job_id": "bf-x",
        "mode": "embedded",
        "status": "finished",
        "traces_read": 10,
        "reading_s": 1.0,
        "elapsed_s": 1.0,
        "runs_enqueued": 10,
        "scorers": ["a"],
        "scores_expected": 10,
        "scored": 10,
        "failed": 0,
        "failed_by_reason": {},
        "traces_skipped": {},
        "scores_skipped": {},
        "traces_unreadable": {},
        "malformed_lines": 0,
        "malformed_where": [],
        "evicted_traces": 0,
        "late_roots": 4,
        "late_roots_by_option": {"--window-spans": 3, "--max-open-spans": 1},
    }
    _print_summary(summary)
    err = capsys.readouterr().err
    assert "late roots        4" in err
    assert "3 past the assembly window, widen it with --window-spans / --window-files" in err
    assert "1 released early by the memory bound, raise --max-open-spans" in err
    _print_summary({**summary, "late_roots": 0})
    assert "late roots" not in capsys.readouterr().err


@pytest.mark.redis
def test_backfill_wait_timeout_exits_3(redis_server: RedisServer) -> None:
    """Redis mode with no worker running: --wait-timeout expires, the summary is printed and
    the exit code is 3 (the job stays resumable)."""
    client = redis_server.client(13)
    client.flushdb()
    try:
        result = CliRunner().invoke(
            cli,
            [
                *("backfill", str(EXAMPLES), "--scorers", "examples.scorers", "--broker", redis_server.url(13)),
                *("--wait-timeout", "0.5", "--json"),
            ],
            env=NO_BROKER,
        )
        assert result.exit_code == 3, result.output
        assert "--wait-timeout 0.5s expired" in result.stderr
        assert "--resume bf-" in result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["runs_enqueued"] == 300
        assert summary["scored"] == 0
    finally:
        client.flushdb()
        client.close()


def test_backfill_reports_late_roots_end_to_end(tmp_path: Path) -> None:
    """A trace whose root span comes after the assembly window (real assembler, real file):
    the summary counts it and names the options that widen the window."""
    from tests.backfill._synth import _line, trace_spans

    children, late_root = trace_spans(0)
    lines = [_line(children)]
    for i in range(1, 6):
        spans, root = trace_spans(i)
        lines.append(_line([*spans, root]))
    (tmp_path / "a.jsonl").write_text("".join(lines))
    (tmp_path / "b.jsonl").write_text(_line([late_root]))  # the next file: past --window-files 0
    args = [str(tmp_path), "--scorers", "tests.backfill.scorers", "--window-spans", "2", "--window-files", "0"]
    result = CliRunner().invoke(cli, ["backfill", *args, "--json"], env=NO_BROKER)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["late_roots"] == 1
    assert "late roots        1" in result.stderr
    assert "--window-spans / --window-files" in result.stderr


@pytest.mark.redis
def test_redis_mode_prints_the_per_scorer_summary(redis_server: RedisServer, tmp_path: Path) -> None:
    """Through a real Celery worker: the backfill reads the workers' records back by their
    deterministic ids and prints the same per-scorer summary as the embedded mode."""
    from tests.backfill._synth import write_otlp_files

    url = redis_server.url(14)
    client = redis_server.client(14)
    client.flushdb()
    write_otlp_files(tmp_path / "in", 30, files=2)
    log = (tmp_path / "worker.log").open("wb")
    env = {
        **os.environ,
        "TRACESCORE_BROKER_URL": url,
        "TRACESCORE_REDIS_URL": url,
        "TRACESCORE_WRITER": "none",
        "PYTHONPATH": str(ROOT),
    }
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "worker", "worker", "--scorers", "tests.backfill.scorers"),
            *("--pool", "solo", "--hostname", "summary@%h", "--loglevel", "info"),
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while b"ready." not in (tmp_path / "worker.log").read_bytes():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the worker did not start in 60 s"
            time.sleep(0.05)
        args = ["backfill", str(tmp_path / "in"), "--scorers", "tests.backfill.scorers", "--broker", url]
        result = CliRunner().invoke(cli, [*args, "--wait-timeout", "120", "--json"], env=NO_BROKER)
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        confident = summary["by_scorer"]["confident"]
        assert (confident["runs"], confident["scored"], confident["failed_by_reason"]) == (30, 24, {"ValueError": 6})
        assert summary["by_scorer"]["answer-words"]["runs"] == 30
        assert "scores by scorer (30 runs)" in result.stderr  # --json: the text goes to stderr
        out = tmp_path / "scores.jsonl"
        again = CliRunner().invoke(cli, [*args, "--wait-timeout", "120", "--out", str(out)], env=NO_BROKER)
        assert again.exit_code == 0, again.output
        assert "scores by scorer (30 runs)" in again.stdout  # already scored: read back all the same
        assert "confident: worst 3 run(s)   (failed: ValueError 6)" in again.stdout
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(records) == 90  # --out: every record the workers stored, for tracescore compare
        assert {r["job_id"] for r in records} == {summary["job_id"]}  # the first job scored them
        no_wait = CliRunner().invoke(cli, [*args, "--no-wait", "--out", str(out)], env=NO_BROKER)
        assert no_wait.exit_code == 1
        assert "drop --no-wait" in no_wait.stderr

        # A sink's queue of another Redis type (hand-edited): the job and its summary stand, the
        # sink figures are said to be unknown and the key is named, never deleted.
        from worker import _keys

        client.sadd(_keys.outbox_sinks_key(), "otlp")
        client.set(_keys.outbox_key("otlp"), "not a queue")
        refused = CliRunner().invoke(cli, [*args, "--wait-timeout", "120", "--json"], env=NO_BROKER)
        assert refused.exit_code == 0, refused.output
        assert "scores by scorer (30 runs)" in refused.stderr
        assert f"sink delivery unknown: Redis key {_keys.outbox_key('otlp')} holds a string" in refused.stderr
        refused_summary = json.loads(refused.stdout.strip().splitlines()[-1])
        assert refused_summary["sinks"] is None  # said, not left out
        assert refused_summary["sinks_unknown"].startswith(f"Redis key {_keys.outbox_key('otlp')} holds a string")
        assert client.get(_keys.outbox_key("otlp")) == b"not a queue"
    finally:
        os.killpg(worker.pid, 15)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait(10)
        log.close()
        client.flushdb()
        client.close()


def test_score_names_a_run_without_input_and_python_only_numbers_as_bad_lines(tmp_path: Path) -> None:
    """A line without "input" was scored (each scorer failing on the missing input, counted as
    failures), although the reject message asks for both; NaN and Infinity, which json.loads
    takes and no JSON writer writes, were scored as numbers. Each is a bad line, named."""
    runs = _write_runs(
        tmp_path / "runs.jsonl",
        RUNS[:2],
        (
            '{"output": "only output"}',
            '{"input": NaN, "output": "a"}',
            '{"input": "q", "output": -Infinity}',
            "[1]",
            '{"input": "q", "output": 1e999}',
        ),
    )
    result = _score(str(runs), "--scorers", V1, "--scorer", "length")
    assert result.exit_code == 0, result.output
    assert (
        f"{runs}:3: skipped: expected an object with at least 'input' and 'output' (it has no 'input')" in result.stderr
    )
    assert f"{runs}:4: skipped: not JSON (NaN is Python's, not a JSON value)" in result.stderr
    assert f"{runs}:5: skipped: not JSON (-Infinity is Python's, not a JSON value)" in result.stderr
    assert f"{runs}:6: skipped: expected an object with at least 'input' and 'output'\n" in result.stderr
    assert f"{runs}:7: skipped: not JSON (1e999 is past the range of a number)" in result.stderr
    assert "2 runs × 1 scorers" in result.stderr
    assert "5 bad lines skipped" in result.stderr


def test_score_names_a_line_that_is_not_utf8_as_a_bad_line(tmp_path: Path) -> None:
    """A Latin-1 byte in a runs file: the run was scored on text with U+FFFD in its place, and
    the footer said "0 bad lines skipped" (audit); backfill skips such a line, named. So does
    ``score`` now, and ``compare`` (the same reader)."""
    runs = _write_runs(tmp_path / "runs.jsonl", RUNS[:2])
    with runs.open("ab") as out:
        out.write(b'{"run_id": "x", "input": "caf\xe9 question", "output": "answer"}\n')
    result = _score(str(runs), "--scorers", V1, "--scorer", "length")
    assert result.exit_code == 0, result.output
    assert f"{runs}:3: skipped: not UTF-8 at byte 29" in result.stderr
    assert "2 runs × 1 scorers" in result.stderr
    assert "1 bad lines skipped" in result.stderr


def test_score_shows_its_progress_on_stderr(tmp_path: Path) -> None:
    """A runs file of judged runs takes hours, and `score` said nothing until its footer
    (audit). Progress goes to stderr as backfill's does: here, not a terminal, a line every 5 s
    (12,000 runs of a scorer that waits 20 ms, 32 at a time: about 8 s)."""
    runs = _write_runs(tmp_path / "runs.jsonl", [{"input": f"q{i}", "output": "a"} for i in range(12_000)])
    result = _score(str(runs), "--scorers", "tests.backfill.slow_scorers", "--scorer", "slow")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("scoring: ")]
    assert progress, result.stderr
    assert progress[0].split()[2] == "runs"
    assert "12,000 runs × 1 scorers" in result.stderr


class _PlainProgress:
    """``score``'s reporter as plain lines at every update, its clock started 10 s before the
    scoring (the ETA shows only after half a second: a fast test would never see one)."""

    def __new__(cls) -> Any:
        from worker._progress import ProgressReporter

        class Reporter(ProgressReporter):
            def start(self, phase: str, at: float | None = None) -> None:
                super().start(phase, at=time.monotonic() - 10)

        return Reporter(tty=False, interval_s=0)  # (on sys.stderr as the command runs: CliRunner's)


def test_score_shows_the_share_of_its_file_done_and_an_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its reader counts the bytes read, and compare and backfill show a share done with an ETA,
    but score showed runs and a rate alone (noticed): each progress line now has the share of the
    file's bytes whose runs were scored and, until the end, an ETA."""
    import re

    import worker.cli._score as score_module

    monkeypatch.setattr(score_module, "ProgressReporter", _PlainProgress)
    runs = _write_runs(tmp_path / "runs.jsonl", [{"input": "q" * (i % 50), "output": "a"} for i in range(450)])
    result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--chunk", "100")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("scoring: ")]
    ends = [len(b"".join(runs.read_bytes().splitlines(keepends=True)[:n])) for n in (100, 200, 300, 400, 450)]
    shares = [f"({end / runs.stat().st_size:.1%})" for end in ends]
    assert [(line.split()[1], line.rsplit(" ", 1)[1]) for line in lines] == list(
        zip(["100", "200", "300", "400", "450"], shares, strict=True)
    ), lines
    assert all(re.search(r"  ETA \d+:\d\d  ", line) for line in lines[:-1]), lines
    assert "ETA" not in lines[-1]  # (done: nothing left to estimate)


def test_score_from_a_pipe_shows_no_share_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe's size is unknown (its stat says 0): runs and a rate, no share, no ETA."""
    import worker.cli._score as score_module

    monkeypatch.setattr(score_module, "ProgressReporter", _PlainProgress)
    fifo = tmp_path / "runs.fifo"
    os.mkfifo(fifo)
    text = "".join(json.dumps({"input": "q", "output": "a"}) + "\n" for _ in range(250))

    def feed() -> None:
        with fifo.open("w") as out:  # (blocks until the command opens it to read)
            out.write(text)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    result = _score(str(fifo), "--scorers", V1, "--scorer", "length", "--chunk", "100")
    feeder.join(10)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("scoring: ")]
    assert [line.split()[1] for line in lines] == ["100", "200", "250"], lines
    assert not [line for line in lines if "%" in line or "ETA" in line], lines


def test_score_draws_its_share_done_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (stderr a pty) the bar shows the share of the file done, as compare's."""
    import re

    runs = _write_runs(tmp_path / "runs.jsonl", [{"input": "q", "output": "a"} for _ in range(3000)])
    shown = on_a_terminal(["score", str(runs), "--scorers", V1, "--scorer", "length", "--chunk", "200"])
    assert shown.returncode == 0
    terminal = shown.text
    # The first chunk's update is drawn at once: 200 of 3,000 equal lines.
    assert re.search(r"\r\x1b\[2K\[#\.{19}\]   6\.7% scoring: 200 runs", terminal), terminal[-2000:]


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="Linux's /proc: a file whose read fails (EIO)")
def test_a_runs_file_whose_read_fails_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """A read error mid-file (a disk, a network mount) was "error: OSError: [Errno 5]
    Input/output error", the file not named (audit)."""
    from worker.cli import main

    assert main(["score", "/proc/self/mem", "--scorers", V1]) == 1
    assert "Input/output error: '/proc/self/mem'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["score", "backfill"])
def test_an_out_file_named_compressed_is_refused_before_any_work(tmp_path: Path, command: str) -> None:
    """``--out scores.jsonl.gz`` wrote plain JSON Lines under a gzip name (zcat refused it): a
    usage error now, before anything is read, naming what --out writes."""
    source = str(_write_runs(tmp_path / "runs.jsonl", RUNS)) if command == "score" else str(EXAMPLES)
    out = tmp_path / "scores.jsonl.gz"
    result = CliRunner().invoke(cli, [command, source, "--scorers", V1, "--out", str(out)], env=NO_BROKER)
    assert result.exit_code == 2, result.output
    assert "names a compressed file; --out writes plain JSON Lines" in result.stderr
    assert not out.exists()


def test_a_compressed_pipe_whose_first_write_is_short_is_read_compressed(tmp_path: Path) -> None:
    """The compression is told by the first 4 bytes, peeked: a pipe's peek gives what one read
    got, so a writer whose first write was shorter (an unbuffered writer, a header written apart)
    had the zstd stream read as plain text, its one run "not UTF-8"."""
    fifo = tmp_path / "runs.fifo"
    os.mkfifo(fifo)
    data = zstandard.ZstdCompressor().compress(json.dumps({"input": "q", "output": "a"}).encode() + b"\n")

    def feed() -> None:
        with fifo.open("wb", buffering=0) as out:  # (blocks until the command opens it to read)
            out.write(data[:2])
            # The rest is written once the reader has taken those 2 bytes (the pipe holds none):
            # its first read has then returned them alone, whatever the machine's speed.
            deadline = time.monotonic() + 30
            while _bytes_in_pipe(out) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.write(data[2:])

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    result = _score(str(fifo), "--scorers", V1, "--scorer", "length")
    feeder.join(10)
    assert result.exit_code == 0, result.output
    assert "not UTF-8" not in result.stderr, result.stderr
    assert "1 runs × 1 scorers" in result.stderr, result.stderr


def test_score_skips_a_run_id_already_seen_and_names_its_line(tmp_path: Path) -> None:
    """Two lines of one run id were both scored: two records of the run, which `compare` then
    named as a duplicate. The first is scored; each later line of an id already seen (here in
    a later chunk too, and an id given as the number and as the text) is skipped, named by its
    line and the first's, not by its content, and counted with the bad lines."""
    runs = _write_runs(
        tmp_path / "runs.jsonl",
        [
            {"run_id": "secret-id", "input": "q", "output": "ab"},
            {"run_id": "long", "input": "q", "output": "a long enough answer."},
            {"run_id": "secret-id", "input": "q", "output": "another answer"},
            {"run_id": 7, "input": "q", "output": "seven"},
            {"run_id": "7", "input": "q", "output": "seven again"},
            {"input": "q", "output": "no id: line-6"},
            {"run_id": "secret-id", "input": "q", "output": "third"},
        ],
    )
    out = tmp_path / "scores.jsonl"
    for extra in ([], ["--json"]):
        result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--chunk", "2", "--out", str(out), *extra)
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [(r["run_id"], r["line"]) for r in records] == [("secret-id", 1), ("long", 2), ("7", 4), ("line-6", 6)]
        assert f"{runs}:3: skipped: a run id already seen (line 1's)" in result.stderr
        assert f"{runs}:5: skipped: a run id already seen (line 4's)" in result.stderr
        assert f"{runs}:7: skipped: a run id already seen (line 1's)" in result.stderr
        skips = [line for line in result.stderr.splitlines() if "already seen" in line]
        assert len(skips) == 3
        assert not [line for line in skips if "secret-id" in line]  # named by its line, not its content
        assert "4 runs × 1 scorers" in result.stderr
        assert "3 bad lines skipped" in result.stderr
        if extra:
            ids = [json.loads(line)["run_id"] for line in result.stdout.splitlines()]
            assert ids == ["secret-id", "long", "7", "line-6"]


def _bytes_in_pipe(end: Any) -> int:
    """How many bytes a pipe holds, asked of either end (Linux answers FIONREAD for both)."""
    held = array.array("i", [0])
    fcntl.ioctl(end.fileno(), termios.FIONREAD, held)
    return held[0]


def test_a_run_without_an_id_and_a_run_whose_id_is_its_name_are_two_runs(tmp_path: Path) -> None:
    """A line without a run id is named ``line-N``; a line whose explicit id was that same text
    (before it or after it) was skipped as "a run id already seen": two different runs taken
    for one. A run without an id is no run id already seen, and never one later lines meet:
    both are scored, each its own --out record (told apart by its line); a real duplicate of
    an explicit id is still skipped."""
    lines: list[dict[str, Any]] = [
        {"run_id": "line-4", "input": "q", "output": "named like line 4"},  # 1
        {"run_id": "a", "input": "q", "output": "ab"},  # 2
        {"run_id": "line-4", "input": "q", "output": "line 1 again"},  # 3: a duplicate of line 1
        {"input": "q", "output": "no id"},  # 4: line-4, another run than line 1's
        {"input": "q", "output": "no id either"},  # 5: line-5
        {"run_id": "b", "input": "q", "output": "ab"},  # 6
        {"run_id": "c", "input": "q", "output": "ab"},  # 7
        {"run_id": None, "input": "q", "output": "null id"},  # 8: line-8
        {"run_id": "line-5", "input": "q", "output": "named like line 5"},  # 9
        {"run_id": "line-5", "input": "q", "output": "line 9 again"},  # 10: a duplicate of line 9
    ]
    runs = _write_runs(tmp_path / "runs.jsonl", lines)
    out = tmp_path / "scores.jsonl"
    result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--chunk", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["run_id"], r["line"]) for r in records] == [
        ("line-4", 1), ("a", 2), ("line-4", 4), ("line-5", 5), ("b", 6), ("c", 7), ("line-8", 8), ("line-5", 9)
    ]  # fmt: skip
    skips = [line for line in result.stderr.splitlines() if "already seen" in line]
    assert skips == [
        f"{runs}:3: skipped: a run id already seen (line 1's)",
        f"{runs}:10: skipped: a run id already seen (line 9's)",
    ]
    assert "8 runs × 1 scorers" in result.stderr


def test_an_explicit_id_that_is_its_own_lines_name_is_compared_as_that_id(tmp_path: Path) -> None:
    """A run whose explicit id is ``line-N`` on line N itself was written to --out exactly as the
    run of line N without an id, and `compare` took it for that: the same run (explicit id
    "line-3") moved to another line in the other file matched nothing (only old 1, only new 1),
    and it matched the other file's id-less run of line 3, another run. The record says whether
    its run gave the id (``run_id_given``): the explicit id meets its twin, the id-less runs of
    line 3 meet each other."""
    old = _write_runs(
        tmp_path / "old.jsonl",
        [
            {"input": "q", "output": "no id"},  # line 1
            {"run_id": "x", "input": "q", "output": "ab"},  # line 2
            {"run_id": "line-3", "input": "q", "output": "named like its line"},  # line 3
        ],
    )
    new = _write_runs(
        tmp_path / "new.jsonl",
        [
            {"run_id": "line-3", "input": "q", "output": "named like its line"},  # line 1
            {"run_id": "x", "input": "q", "output": "ab"},  # line 2
            {"input": "q", "output": "no id"},  # line 3: line-3, another run
        ],
    )
    outs = []
    for runs in (old, new):
        out = tmp_path / f"{runs.stem}.out.jsonl"
        result = _score(str(runs), "--scorers", V1, "--scorer", "length", "--out", str(out))
        assert result.exit_code == 0, result.output
        outs.append(out)
    given = [(r["run_id"], r["line"], r["run_id_given"]) for r in map(json.loads, outs[0].read_text().splitlines())]
    assert given == [("line-1", 1, False), ("x", 2, True), ("line-3", 3, True)]
    compared = CliRunner().invoke(cli, ["compare", str(outs[0]), str(outs[1]), "--json"])
    assert compared.exit_code == 0, compared.output
    rel = json.loads(compared.stdout)["by_scorer"]["length"]
    # Both: "x" and "line-3" (explicit); only old: line 1 without an id; only new: line 3 without one.
    assert (rel["runs_in_both"], rel["only_old"], rel["only_new"]) == (2, 1, 1)
    # Each pair is one run scored alike; the id-less line 3 ("no id") paired with the explicit
    # "line-3" moved.
    assert (rel["up"], rel["down"], rel["unchanged"]) == (0, 0, 2), rel["moved_most"]


def test_score_chunks_hold_at_most_64_mib_of_lines_past_their_last() -> None:
    """A chunk was --chunk lines (1,000) whatever they held: lines of up to 32 MiB each, 2.1 GB
    of memory for 120 lines of 16 MB (800 MB for 40, 300 MB now). A chunk ends at --chunk lines
    or once its lines hold MAX_BATCH_BYTES (64 MiB), the last one's included."""
    from worker._embedded import MAX_BATCH_BYTES
    from worker.cli._score import _chunks, _RunLine

    def sizes(each: int, n: int, count: int) -> list[int]:
        lines = (_RunLine(number, {}, 0, False, each) for number in range(n))
        return [len(chunk) for chunk in _chunks(lines, count)]

    assert MAX_BATCH_BYTES == 64 * 2**20
    assert sizes(20 * 2**20, 10, 1000) == [4, 4, 2]  # 80 MiB: the 64th MiB is in the 4th line
    assert sizes(20 * 2**20, 10, 3) == [3, 3, 3, 1]
    assert sizes(100, 2500, 1000) == [1000, 1000, 500]
    assert sizes(0, 5, 2) == [2, 2, 1]  # (lines that are no run hold nothing)


def test_score_refuses_a_device_and_reads_a_pipe(tmp_path: Path) -> None:
    """/dev/zero was read as one endless line: 100% of a core for ever, and a first SIGTERM
    waited for a chunk that never came. A device is refused by name; a pipe is still read."""
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "score"]
    scorers = ["--scorers", "tests.summary_scorers_v1"]
    refused = subprocess.run([*command, "/dev/zero", *scorers], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    assert "/dev/zero is a device, not a file of runs" in refused.stderr
    fed = subprocess.run(
        [*command, "/dev/stdin", *scorers, "--json"],
        input='{"input": "a question", "output": "an answer"}\n', capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert fed.returncode == 0, fed.stderr
    assert [json.loads(line)["line"] for line in fed.stdout.splitlines()] == [1] * len(fed.stdout.splitlines())
    assert fed.stdout
