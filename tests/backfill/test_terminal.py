"""What the backfill prints about its input cannot drive the terminal: a file named with escape
sequences, or with bytes that are not UTF-8, is shown with U+FFFD, and nothing fails to print."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._pty import on_a_terminal
from tracing._errors import json_error

ROOT = Path(__file__).resolve().parents[2]
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))
ESCAPES = "\x1b]0;owned\x07\x1b[31m"


def _inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(ROOT / "examples" / "traces" / "traces-000.jsonl.gz", "rb") as handle:
        good = handle.readline()
    (folder / f"a{ESCAPES}.jsonl").write_bytes(b'{"bad\x01\n' + good)
    # A name that is not UTF-8: Python reads it as a lone surrogate (surrogateescape).
    (folder / os.fsdecode(b"b\xff.jsonl")).write_bytes(b"{broken\n")
    return folder


@pytest.mark.parametrize("mode", ["--dry-run", "--table"])
def test_file_names_print_without_control_characters(tmp_path: Path, mode: str) -> None:
    folder = _inputs(tmp_path)
    result = subprocess.run(
        [TRACESCORE, "backfill", str(folder), "--scorers", "examples.scorers", mode],
        capture_output=True,
        env={**os.environ, "TRACESCORE_BROKER_URL": ""},
        timeout=120,
        check=False,
    )
    out = result.stdout.decode("utf-8") + result.stderr.decode("utf-8")  # valid UTF-8, both
    assert result.returncode == 0, out[-2000:]
    for control in ("\x1b", "\x07", "\\udcff", "\udcff"):
        assert control not in out
    assert "a\ufffd]0;owned\ufffd\ufffd[31m.jsonl:1: skipped: not JSON (Invalid control character at line 1" in out
    assert "b\ufffd.jsonl:1: skipped: not JSON" in out
    assert "at at" not in out


def test_an_error_naming_such_a_file_prints_without_them(tmp_path: Path) -> None:
    """Every line malformed ends the command with an error naming the first: printable too."""
    folder = _inputs(tmp_path)
    (folder / f"a{ESCAPES}.jsonl").write_bytes(b"{broken\n")
    result = subprocess.run(
        [TRACESCORE, "backfill", str(folder), "--scorers", "examples.scorers", "--dry-run"],
        capture_output=True,
        env={**os.environ, "TRACESCORE_BROKER_URL": ""},
        timeout=120,
        check=False,
    )
    err = result.stderr.decode("utf-8")
    assert result.returncode == 1
    assert "every input line was malformed (2; first at" in err
    assert "\x1b" not in err
    assert "\x07" not in err


@pytest.mark.parametrize("kind", ["missing", "dangling link"])
def test_a_missing_source_is_named_without_its_control_characters_on_a_terminal(tmp_path: Path, kind: str) -> None:
    """A source that does not exist (or a link to nowhere) is a usage error naming it: that line
    went out as given, and on a terminal (where click strips no escapes) its name recoloured it."""
    name = tmp_path / f"gone{ESCAPES}.jsonl"
    if kind == "dangling link":
        name.symlink_to(tmp_path / "nowhere")
    seen = on_a_terminal(["backfill", str(name), "--scorers", "examples.scorers", "--dry-run"], stdout_too=True)
    assert seen.returncode == 2, seen.text
    assert "Invalid value for SOURCES" in seen.text
    assert "gone\ufffd]0;owned\ufffd\ufffd[31m.jsonl: " in seen.text, seen.text
    assert "\x1b" not in seen.text
    assert "\x07" not in seen.text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b'{"a\x01', "Invalid control character at line 1 column 4"),
        (b'{"a', "Unterminated string starting at line 1 column 2"),
        (b'{"a": 1,\n}', "Expecting property name enclosed in double quotes at line 2 column 1"),
        (b"\xff", "not UTF-8 at byte 0"),
        (b"[" * 100_000, "nested too deeply"),
        (b"1" + b"0" * 5000, "a number of more than 4300 digits"),
    ],
)
def test_json_errors_name_the_problem_once_and_quote_nothing(text: bytes, reason: str) -> None:
    with pytest.raises((ValueError, RecursionError)) as caught:
        json.loads(text)
    assert json_error(caught.value) == reason


def test_compare_and_score_name_a_json_error_once(tmp_path: Path) -> None:
    from worker._lines import json_lines

    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"a\x01\n{"a')  # the last line unended: its newline would be the control character
    problems = [line.problem for line in json_lines(path)]
    assert problems == [
        "not JSON (Invalid control character at column 4)",
        "not JSON (Unterminated string starting at column 2)",
    ]


def test_json_output_escapes_c1_control_characters(tmp_path: Path) -> None:
    """`score --json` (as `scores` and `dlq list`): a run's text holding a C1 control character
    (U+009B, a CSI a terminal acts on as on ESC) is escaped by JSON, never written raw; the line
    still reads back as the same text."""
    runs = tmp_path / "runs.jsonl"
    answer = "It is sunny \x9b2J\x9b31m in Paris."
    runs.write_text(
        json.dumps({"run_id": "r1", "input": {"input_messages": ["Weather in Paris?"]},
                    "output": [{"role": "assistant", "content": {"parts": [answer]}}]}) + "\n"
    )  # fmt: skip
    result = subprocess.run(
        [TRACESCORE, "score", str(runs), "--scorers", "examples.scorers", "--json"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")[-2000:]
    assert b"\xc2\x9b" not in result.stdout
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines
    assert any(answer in json.dumps(line, ensure_ascii=False) for line in lines)


@pytest.mark.parametrize("control", ["\u202e", "\u2066", "\u200f", "\u061c", "\u2028"])
def test_bidirectional_controls_and_line_separators_are_not_printed(control: str) -> None:
    """A judge's reason holding U+202E (right-to-left override) printed as it was in the score
    table and the summary: the terminal showed the rest of the line reversed."""
    from tracing import printable

    assert printable(f"score 0.1{control}0 fine") == "score 0.1\ufffd0 fine"
    assert printable("naïve café, 日本語, emoji 🙂") == "naïve café, 日本語, emoji 🙂"
