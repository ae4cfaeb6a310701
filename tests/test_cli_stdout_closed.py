"""A command whose stdout reader leaves early (``tracescore ... --table | head``).

The table raised BrokenPipeError into the score writers: ``--out`` stopped at the first rows
(35 of 1,500 records) while the summary said every record was written, stderr got a traceback
per batch, and the job went on paying for scores no one would see (audit). Now the command
stops after the batch or chunk in hand, as on Ctrl-C, with ``--out`` and the summary (stderr)
holding the same scores, and exits 141, as a process SIGPIPE ends.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._pty import on_a_terminal
from tests.backfill._synth import write_otlp_files

ROOT = Path(__file__).resolve().parent.parent


def _read_one_line_then_leave(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``tracescore args``, read the first line of its stdout, close the pipe (as ``head -1``
    does), and return its exit code and stderr."""
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", *args]
    env = {"PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": "", "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        assert process.stdout.readline()
        process.stdout.close()
        err = process.stderr.read()
        return process.wait(timeout=120), err


def _stopped_cleanly(code: int, err: str) -> None:
    assert code == 141, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "BrokenPipeError" not in err
    assert "stopped: stdout was closed (its reader ended)" in err
    assert "scores by scorer (" in err  # the summary, which goes to stdout else (review)


def test_backfill_table_into_a_closed_pipe_stops_with_out_whole(tmp_path: Path) -> None:
    write_otlp_files(tmp_path / "in", 3000, files=2)
    out = tmp_path / "out.jsonl"
    options = ["--scorers", "tests.backfill.slow_scorers", "--scorer", "block", "--batch-size", "100"]
    code, err = _read_one_line_then_leave(
        ["backfill", str(tmp_path / "in"), *options, "--table", "--out", str(out)], ROOT
    )
    _stopped_cleanly(code, err)
    scored = re.search(r"runs scored\s+([\d,]+)", err)
    assert scored is not None, err
    records = out.read_text().splitlines()
    assert 0 < len(records) == int(scored.group(1).replace(",", "")) < 3000
    assert len({json.loads(r)["score_id"] for r in records}) == len(records)


def test_backfill_table_into_a_closed_pipe_without_out_says_so_in_a_sentence(tmp_path: Path) -> None:
    """Without --out the stop line read "the summary above hold what was scored before"."""
    write_otlp_files(tmp_path / "in", 3000, files=2)
    options = ["--scorers", "tests.backfill.slow_scorers", "--scorer", "block", "--batch-size", "100"]
    code, err = _read_one_line_then_leave(["backfill", str(tmp_path / "in"), *options, "--table"], ROOT)
    _stopped_cleanly(code, err)
    assert "; the summary above holds what was scored before" in err, err[-3000:]


@pytest.mark.parametrize("shown", ["--table", "--json"])
def test_score_into_a_closed_pipe_stops_with_out_whole(shown: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "".join(
            json.dumps({"run_id": f"r{i}", "input": f"question {i} about Paris", "output": "answer " * (i % 30)}) + "\n"
            for i in range(40_000)
        )
    )
    out = tmp_path / "out.jsonl"
    code, err = _read_one_line_then_leave(
        ["score", str(runs), "--scorers", "examples.scorers", shown, "--out", str(out)], ROOT
    )
    _stopped_cleanly(code, err)
    held = re.search(r"hold the ([\d,]+) runs scored before the stop", err)
    assert held is not None, err
    runs_scored = int(held.group(1).replace(",", ""))
    assert 0 < runs_scored < 40_000
    assert len(out.read_text().splitlines()) == runs_scored * 5  # examples.scorers: five scorers


def test_every_writer_gets_the_records_whichever_fails() -> None:
    """The table's writer failing kept the records from ``--out`` after it (audit): each writer
    is given them, and the first failure is raised after."""
    from worker.backfill._job import _Fanout

    got: list[list[str]] = []

    class Failing:
        def write(self, records: list[str]) -> None:
            raise OSError(5, "Input/output error")

    class Keeping:
        def write(self, records: list[str]) -> None:
            got.append(records)

    fanout = _Fanout([Failing(), Keeping()])  # type: ignore[list-item]
    with pytest.raises(OSError, match="Input/output error"):
        fanout.write(["r1", "r2"])
    assert got == [["r1", "r2"]]


def test_a_closed_output_is_one_commands_not_the_next_ones() -> None:
    """An application running ``worker.cli.main`` again after a command whose reader left: the
    next one took its stdout for closed too (``score --json`` printed nothing; review)."""
    import os

    from worker._terminal import output_closed, outputs_open, reader_left

    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stream:
        reader_left(stream)
        assert output_closed()
        stream.write("dropped, not raised")
        stream.flush()
    outputs_open()
    assert not output_closed()


def test_score_json_on_a_terminal_is_not_glued_to_the_progress_bar(tmp_path: Path) -> None:
    """stdout and stderr one terminal: each chunk's first JSON line came right after the bar's
    text, on its line (review). The bar is cleared first now."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q", "output": "a"}) + "\n" for i in range(3000)))
    shown = on_a_terminal(
        ["score", str(runs), "--scorers", "examples.scorers", "--json", "--chunk", "200"], stdout_too=True
    )
    assert shown.returncode == 0
    text = shown.text
    assert "scoring: " in text  # the bar was drawn
    assert not re.search(r"scoring: [^\r\n]*\{\"run_id\"", text), text[-2000:]
