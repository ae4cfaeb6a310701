"""`tracescore backfill` in embedded mode (no broker): table, summary, filters, bad input."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from tests.backfill._synth import BASE_NS, trace_id, write_otlp_files
from tracing import sampled
from worker._registry import load_registry
from worker.cli import cli
from worker.cli._backfill import parse_time

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces"
NO_BROKER = {"TRACESCORE_BROKER_URL": ""}
SCORERS = "tests.backfill.scorers"  # answer-words, mentions-city, confident (fails on every 5th synthetic trace)


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["backfill", *args], env=NO_BROKER)


def _summary(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def test_examples_print_the_per_scorer_summary() -> None:
    """The README command: every example trace scored by every example scorer, shown as one
    summary row per scorer (runs, mean, quantiles, failures) and each scorer's worst runs."""
    registry = load_registry("examples.scorers")
    result = _run(str(EXAMPLES), "--scorers", "examples.scorers")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "scores by scorer (300 runs)" in lines
    header = lines.index(next(line for line in lines if line.startswith("scorer ")))
    rows = {line.split()[0]: line.split() for line in lines[header + 2 : header + 2 + len(registry)]}
    assert set(rows) == set(registry)
    assert all(row[1] == "300" for row in rows.values())
    assert len({row[2] for row in rows.values()}) > 2  # scorers' means differ
    worst = [line for line in lines if line.startswith("    ") and line.split()[0].replace(".", "").isdigit()]
    assert len(worst) == 3 * len(registry)
    assert {w.split()[2] for w in worst} <= {"weather-agent", "shop-assistant", "travel-helper"}
    assert "trace  " not in result.stdout  # no per-run table by default
    assert "embedded mode" in result.stderr
    assert "traces read       300" in result.stderr
    assert f"scored            {300 * len(registry):,}" in result.stderr


def test_table_option_prints_one_row_per_score() -> None:
    """--table adds the per-run table (trace, agent, scorer, score, reason) before the summary."""
    n_scorers = len(load_registry("examples.scorers"))
    result = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--table")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["trace", "agent", "scorer", "score", "reason"]
    rows = lines[2 : lines.index("")]
    assert len(rows) == 300 * n_scorers
    assert {row.split()[1] for row in rows} == {"weather-agent", "shop-assistant", "travel-helper"}
    assert len({row.split()[3] for row in rows}) > 5  # poor and good answers score differently
    assert "scores by scorer (300 runs)" in lines


def test_with_json_the_table_goes_to_stderr_and_stdout_is_one_json_object() -> None:
    """--json --table: stdout held the table's rows before the JSON, which no parser reads."""
    result = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--scorer", "question-overlap", "--json", "--table")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["by_scorer"]["question-overlap"]["runs"] == 300
    table = [line for line in result.stderr.splitlines() if line.split()[:2] == ["trace", "agent"]]
    assert len(table) == 1
    assert result.stderr.count("question-overlap") >= 300


def test_json_summary_has_the_per_scorer_figures(tmp_path: Path) -> None:
    """--json keeps its keys and adds by_scorer (runs, mean, quantiles, failures, worst runs)."""
    write_otlp_files(tmp_path, 30, files=1)
    summary = _summary(_run(str(tmp_path), "--scorers", SCORERS, "--json"))
    confident = summary["by_scorer"]["confident"]
    assert confident["runs"] == 30
    assert confident["failed_by_reason"] == {"ValueError": 6}
    assert confident["scored"] == 24
    assert set(summary["by_scorer"]) == {"answer-words", "mentions-city", "confident"}
    assert len(summary["by_scorer"]["answer-words"]["worst"]) == 3


def test_a_scorer_named_twice_is_scored_and_counted_once(tmp_path: Path) -> None:
    """``--scorer x --scorer x``: the workers score a run's scorer once, and the job expected
    two scores of it (a Redis job then waited for good; audit)."""
    write_otlp_files(tmp_path, 30, files=1)
    twice = ["--scorer", "answer-words", "--scorer", "mentions-city", "--scorer", "answer-words"]
    summary = _summary(_run(str(tmp_path), "--scorers", SCORERS, *twice, "--json"))
    assert summary["scorers"] == ["answer-words", "mentions-city"]
    assert summary["scores_expected"] == summary["scored"] + summary["failed"] == 60


def test_a_sample_that_is_not_a_finite_number_is_a_usage_error() -> None:
    """``--sample nan`` passed click's range (every comparison with nan is false) and ended in
    pydantic's raw validation text, exit 1 (audit)."""
    result = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--sample", "nan")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--sample': 'nan' is not a finite number" in result.stderr


@pytest.mark.parametrize(
    ("source", "line", "said"),
    [
        ('import os\nVALUE = os.environ["TRACESCORE_TEST_UNSET_VARIABLE"]\n', 2, "KeyError: 'TRACESCORE_TEST_"),
        ("def broken(:\n    pass\n", 1, "SyntaxError: "),
    ],
    ids=["raises", "syntax"],
)
def test_a_scorer_module_that_fails_while_importing_is_named_with_where(
    source: str, line: int, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own code failing (not an ImportError) was "error: KeyError: '...'" and the
    --verbose hint, naming neither the module nor the line (audit)."""
    (tmp_path / "failing_scorers.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACESCORE_TEST_UNSET_VARIABLE", raising=False)
    monkeypatch.delitem(sys.modules, "failing_scorers", raising=False)
    result = _run(str(EXAMPLES), "--scorers", "failing_scorers")
    assert result.exit_code == 1, result.output
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith(
        f"Error: scorer module 'failing_scorers' failed while importing at {tmp_path / 'failing_scorers.py'}:{line}: "
    ), error
    assert said in error


def test_resume_refuses_options_the_job_fixed_at_its_start() -> None:
    """``--resume JOB --sample 0.1 --since 1h SOURCES``: the job's own were used, these ignored
    without a word (audit). A usage error names each."""
    result = _run("--resume", "bf-x", "--sample", "0.1", "--since", "1h", "--scorer", "a", str(EXAMPLES))
    assert result.exit_code == 2, result.output
    assert "--resume continues the job as it started" in result.stderr
    assert "drop SOURCES, --scorer, --since, --sample, or start a new job" in result.stderr


def test_options_that_would_be_ignored_are_said_or_refused(tmp_path: Path) -> None:
    """--no-wait or --wait-timeout with no broker, --out with --dry-run: ignored without a word;
    --otlp with --sink none: --otlp won (audit). The first two say so, the last is a usage error."""
    out = tmp_path / "x.jsonl"
    dry = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--dry-run", "--out", str(out), "--wait-timeout", "5")
    assert dry.exit_code == 0, dry.output
    assert "note: --no-wait and --wait-timeout follow Redis workers" in dry.stderr
    assert f"note: --dry-run scores nothing, so --out {out} is not written" in dry.stderr
    assert not out.exists()
    both = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--otlp", "--sink", "none")
    assert both.exit_code == 2, both.output
    assert "--sink none delivers nowhere" in both.stderr


def test_a_sink_line_names_where_the_sink_writes_password_masked() -> None:
    """A sink that never answered: its retries are logged by the backend's name, and the summary
    line did not say which URL was tried (audit). It does, its password masked."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://user:s3cret-pw@127.0.0.1:{port}"
    result = CliRunner().invoke(
        cli,
        ["backfill", str(EXAMPLES / "traces-000.jsonl.gz"), "--scorers", "examples.scorers", "--sink", "phoenix"],
        env={**NO_BROKER, "TRACESCORE_PHOENIX_URL": url, "TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "1"},
    )
    assert result.exit_code == 4, result.output
    assert "  sink phoenix      delivered 0, failed 0, pending " in result.stderr
    assert f"(http://user:***@127.0.0.1:{port})" in result.stderr
    assert "s3cret-pw" not in result.output


def test_dry_run_counts_without_scoring() -> None:
    """--dry-run says how many runs and scores, with which scorers, and scores nothing."""
    result = _run(str(EXAMPLES), "--scorers", SCORERS, "--scorer", "answer-words", "--scorer", "confident", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would score 300 runs from 300 traces with 2 scorers (answer-words, confident): 600 scores" in result.stdout
    assert "trace  " not in result.stdout


def test_malformed_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    """A broken line is reported with file and line; every other trace is still scored."""
    paths = write_otlp_files(tmp_path, 30, files=2, traces_per_line=5)
    with gzip.open(paths[1], "rt") as handle:
        lines = handle.read().splitlines()
    lines.insert(1, '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 42}]}]}]}')
    lines.insert(3, "garbage")
    with gzip.open(paths[1], "wt") as out:
        out.write("\n".join(lines) + "\n")
    result = _run(str(tmp_path), "--scorers", SCORERS, "--json")
    summary = _summary(result)
    assert f"{paths[1]}:2: skipped: id must be a string" in result.stderr
    assert f"{paths[1]}:4: skipped: not JSON" in result.stderr
    assert summary["malformed_lines"] == 2
    assert summary["malformed_where"] == [f"{paths[1]}:2", f"{paths[1]}:4"]
    assert summary["traces_read"] == 30
    assert summary["scored"] == 84
    assert summary["failed_by_reason"] == {"ValueError": 6}


def test_sample_is_deterministic_and_matches_the_exporter(tmp_path: Path) -> None:
    """--sample keeps exactly the traces the exporter's sampled() keeps."""
    write_otlp_files(tmp_path, 200, files=1)
    summary = _summary(_run(str(tmp_path), "--scorers", SCORERS, "--sample", "0.3", "--json", "--dry-run"))
    expected = sum(sampled(trace_id(i), 0.3) for i in range(200))
    assert summary["runs_to_score"] == expected
    assert summary["traces_skipped"] == {"sampled_out": 200 - expected}


def test_since_until_filter_on_trace_start(tmp_path: Path) -> None:
    """--since/--until keep traces that started in [since, until)."""
    write_otlp_files(tmp_path, 50, files=1)  # trace i starts at BASE_NS + i seconds
    since, until = str(BASE_NS / 1e9 + 10), str(BASE_NS / 1e9 + 20)
    summary = _summary(
        _run(str(tmp_path), "--scorers", SCORERS, "--since", since, "--until", until, "--json", "--dry-run")
    )
    assert summary["runs_to_score"] == 10
    assert summary["traces_skipped"] == {"before_since": 10, "after_until": 30}


def test_unreadable_traces_are_counted_by_reason(tmp_path: Path) -> None:
    """A trace with no agent and no LLM span is reported and counted, not fatal."""
    write_otlp_files(tmp_path, 5, files=1)
    stray = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "GET /health", "startTimeUnixNano": "1"}
                        ]
                    }
                ]
            }
        ]
    }
    (tmp_path / "stray.jsonl").write_text(json.dumps(stray) + "\n")
    result = _run(str(tmp_path), "--scorers", SCORERS, "--json")
    summary = _summary(result)
    assert summary["traces_unreadable"] == {"no_target": 1}
    assert f"trace {'ab' * 16}: not scored (no_target)" in result.stderr
    assert summary["scored"] + summary["failed"] == 15


def test_out_writes_score_records_as_json_lines(tmp_path: Path) -> None:
    """--out writes one ScoreRecord per score, tagged with the job and source=backfill."""
    write_otlp_files(tmp_path / "in", 12, files=2)
    out = tmp_path / "scores.jsonl"
    summary = _summary(_run(str(tmp_path / "in"), "--scorers", SCORERS, "--out", str(out), "--json"))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 36
    assert {r["job_id"] for r in records} == {summary["job_id"]}
    assert {r["source"] for r in records} == {"backfill"}
    assert len({r["score_id"] for r in records}) == 36

    # Run again: the file holds this run's records, as `score --out` and --out with a broker
    # write it (it was appended to: 72 lines, two jobs).
    again = _summary(_run(str(tmp_path / "in"), "--scorers", SCORERS, "--out", str(out), "--json"))
    assert {json.loads(line)["job_id"] for line in out.read_text().splitlines()} == {again["job_id"]}
    assert len(out.read_text().splitlines()) == 36


def test_an_out_that_cannot_be_written_ends_the_job_with_exit_1(tmp_path: Path) -> None:
    """README's exit 1 for an unwritable --out: a full disk (/dev/full) printed a traceback a
    batch, then "scores written to", and exited 0; a path that cannot be created was a bare
    PermissionError; an --out naming an input file had the records appended to the traces."""
    write_otlp_files(tmp_path / "in", 6, files=1)
    (source,) = (tmp_path / "in").iterdir()
    before = source.read_bytes()
    full = _run(str(source), "--scorers", SCORERS, "--out", "/dev/full")
    assert full.exit_code == 1, full.output
    assert "cannot write --out /dev/full: No space left on device" in full.stderr
    assert "Traceback" not in full.output
    assert "scores written to" not in full.stderr
    assert "scores by scorer (6 runs)" in full.stdout  # the summary still comes first

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    nowhere = _run(str(source), "--scorers", SCORERS, "--out", str(blocked / "scores.jsonl"))
    assert nowhere.exit_code == 1, nowhere.output
    assert f"cannot write --out {blocked / 'scores.jsonl'}: Not a directory" in nowhere.stderr
    assert "traces read" not in nowhere.stderr  # refused before any work

    if Path("/proc/version").exists():  # opened for writing, but not for appending (re-score audit)
        special = _run(str(source), "--scorers", SCORERS, "--out", "/proc/version")
        assert special.exit_code == 1, special.output
        assert "cannot write --out /proc/version: " in special.stderr
        assert "--verbose" not in special.stderr

    into_input = _run(str(tmp_path / "in"), "--scorers", SCORERS, "--out", str(source))
    assert into_input.exit_code == 2, into_input.output  # (a .gz: refused by its name first)
    assert "names a compressed file" in into_input.stderr
    assert source.read_bytes() == before
    (tmp_path / "link.bak").hardlink_to(source)  # the same file under another name
    into_link = _run(str(tmp_path / "in"), "--scorers", SCORERS, "--out", str(tmp_path / "link.bak"))
    assert into_link.exit_code == 1, into_link.output
    assert "is one of the input files" in into_link.stderr
    assert source.read_bytes() == before

    # With a broker the file is checked before the broker is reached (this one is not there).
    unwritable = ["--out", str(blocked / "x.jsonl"), "--broker", "redis://127.0.0.1:1/0"]
    broker = CliRunner().invoke(cli, ["backfill", str(source), "--scorers", SCORERS, *unwritable])
    assert broker.exit_code == 1, broker.output
    assert "cannot write --out" in broker.stderr


@pytest.mark.parametrize(
    "args",
    [
        [str(EXAMPLES), "--scorers", "nope.mod"],
        [str(EXAMPLES), "--scorers", "examples.scorers", "--scorer", "missing"],
        ["--resume", "bf-x"],
    ],
)
def test_usage_errors_are_one_line(args: list[str]) -> None:
    """Missing source, missing or bad scorers, unknown scorer id, resume without broker: one clear line."""
    result = _run(*args)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: ")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--scorers", "examples.scorers"], "Error: give a source (trace files"),
        ([str(EXAMPLES)], "Error: give the scorers with --scorers my.module"),
    ],
)
def test_a_missing_source_or_scorers_module_is_a_usage_error(args: list[str], said: str) -> None:
    """Exit 2, as `score` without --scorers (both exited 1, the README's code for an error)."""
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert "backfill --help' for help." in result.stderr


def test_a_missing_input_file_is_a_usage_error(tmp_path: Path) -> None:
    """README's exit 2 for a missing input file (as score and compare): backfill exited 1."""
    result = _run(str(tmp_path / "none.jsonl"), "--scorers", "examples.scorers")
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'none.jsonl'}: no such file or directory" in result.stderr
    # A symlink loop or a dangling link is no file either (exit 1, "no such file", before).
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    looping = _run(str(tmp_path / "loop_a"), "--scorers", "examples.scorers")
    assert looping.exit_code == 2, looping.output
    assert f"{tmp_path / 'loop_a'}: a symbolic link that leads nowhere" in looping.stderr
    # A time window that is empty is a bad option value (exit 1 before).
    reversed_window = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--since", "2h", "--until", "3h")
    assert reversed_window.exit_code == 2, reversed_window.output
    assert "--since must be before --until" in reversed_window.stderr


def test_unreachable_broker_error_hides_the_password() -> None:
    """A broker URL with a password that cannot be reached is one error line without the password."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    broker = f"redis://:s3cret@127.0.0.1:{port}/12"
    result = _run(str(EXAMPLES), "--scorers", "examples.scorers", "--broker", broker)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: cannot reach the broker at redis://")
    assert f"***@127.0.0.1:{port}/12" in result.stderr  # the redaction's exact form belongs to worker._app
    assert "s3cret" not in result.output


def test_tracescores_own_traces_are_never_scored(tmp_path: Path) -> None:
    """The exporter's loop guard applies: a trace from tracescore's own services is skipped."""
    write_otlp_files(tmp_path, 4, files=1)
    with gzip.open(tmp_path / "part-000.jsonl.gz", "rt") as handle:
        own = json.loads(handle.readline())
    own["resourceSpans"][0]["resource"]["attributes"] = [
        {"key": "service.name", "value": {"stringValue": "tracescore-worker"}}
    ]
    for span in own["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["traceId"] = "ee" * 16
    (tmp_path / "own.jsonl").write_text(json.dumps(own) + "\n")
    summary = _summary(_run(str(tmp_path), "--scorers", SCORERS, "--json", "--dry-run"))
    assert summary["traces_skipped"] == {"loop_guard": 1}
    assert summary["runs_to_score"] == 4


def test_time_arguments() -> None:
    """--since/--until take ISO 8601 (UTC unless an offset is given), a duration ago, or epoch seconds."""
    assert parse_time("2026-11-30T10:00:00Z") == 1_796_032_800 * 10**9
    assert parse_time("2026-11-30T11:00:00+01:00") == 1_796_032_800 * 10**9
    assert parse_time("2026-11-30") == 1_795_996_800 * 10**9
    assert parse_time("1796032800.5") == 1_796_032_800_500_000_000
    assert parse_time("2h", now=10_000.0) == (10_000 - 7200) * 10**9
    assert parse_time("7d", now=1_000_000.0) == (1_000_000 - 7 * 86400) * 10**9
    with pytest.raises(click.BadParameter, match="not a time"):
        parse_time("yesterday")
    for huge in ("1e400", "inf", "1" + "0" * 400 + "d"):  # OverflowError, exit 1, before
        with pytest.raises(click.BadParameter, match="out of range"):
            parse_time(huge)
    assert _run("--since", "1e400", str(EXAMPLES), "--scorers", SCORERS).exit_code == 2  # a usage error


def test_an_agent_named_with_a_lone_surrogate_is_printed_and_written(tmp_path: Path) -> None:
    """An agent name holding a lone surrogate (a "\\ud800" escape in the file) made the command
    fail printing its summary (UnicodeEncodeError, exit 1), and the table writer lose its
    trace's records from --out. It is labelled with U+FFFD, as its score records are."""
    from tests.backfill.test_batch_bytes import big_trace_line

    lines = [big_trace_line(i) for i in (1, 2, 3)]
    lines[1] = lines[1].replace('"weather-agent"', '"agent\\ud800x"')
    assert "ud800" in lines[1]
    source = tmp_path / "t.jsonl"
    source.write_text("".join(lines))
    out = tmp_path / "scores.jsonl"
    result = _run(str(source), "--scorers", SCORERS, "--table", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "agent\ufffdx" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 * 3


def test_table_with_a_broker_says_it_prints_nothing() -> None:
    """--table is for scoring in this process: with a broker it was ignored without a word."""
    result = CliRunner().invoke(
        cli,
        ["backfill", str(EXAMPLES), "--scorers", "examples.scorers", "--table", "--broker", "redis://127.0.0.1:1/0"],
    )
    assert "note: --table prints scores made in this process; with a broker the workers make them" in result.stderr


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        ("5", "SCORERS is an int, not a list of scorers (or a dict of id -> scorer)"),
        ('"answer-words"', "SCORERS is a str, not a list of scorers (or a dict of id -> scorer)"),
        ("[object()]", "SCORERS holds things that are not scorers: an object"),
    ],
    ids=["int", "str", "object"],
)
def test_a_scorers_list_that_is_not_one_is_named(
    declared: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SCORERS = 5`` ended as "error: TypeError: 'int' object is not iterable" and the --verbose
    hint; a string was taken letter by letter. Each is named, with what SCORERS should be."""
    (tmp_path / "odd_scorers.py").write_text(f"SCORERS = {declared}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "odd_scorers", raising=False)
    result = _run(str(EXAMPLES), "--scorers", "odd_scorers")
    assert result.exit_code == 1, result.output
    (error,) = result.stderr.strip().splitlines()
    assert error == f"Error: scorer module 'odd_scorers': {said}", error


def test_more_scorers_than_a_request_carries_are_refused_before_a_broker_not_in_process() -> None:
    """The workers refuse a request naming more than ``MAX_SCORER_IDS`` scorers (invalid_payload):
    a job through a broker with more would have had every message dead-lettered. It is refused
    at once, naming the bound and what to do, before the broker is reached (this one is not
    there); in this process, with no message, all are scored."""
    from tracing.queue import MAX_SCORER_IDS

    sources = (str(EXAMPLES), "--scorers", "tests.backfill.many_scorers")
    result = _run(*sources, "--broker", "redis://127.0.0.1:1/0")
    assert result.exit_code == 1, result.output
    assert f"{MAX_SCORER_IDS + 1} scorers" in result.stderr
    assert f"at most {MAX_SCORER_IDS}" in result.stderr
    assert "--scorer" in result.stderr
    assert "cannot reach" not in result.stderr
    summary = _summary(_run(*sources, "--json"))
    assert len(summary["scorers"]) == MAX_SCORER_IDS + 1
