"""Commands interrupted while they score in this process (an embedded backfill, `score`): SIGTERM,
or Ctrl-C twice (the second one stops what is in flight), as an impatient user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.backfill._synth import write_otlp_files

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("gap_s", [0.01, 0.05, 0.3])
def test_a_second_ctrl_c_leaves_whole_lines_and_a_summary_that_adds_up(tmp_path: Path, gap_s: float) -> None:
    """The second Ctrl-C closed --out under the runs still in flight: each wrote into a closed
    file (191 "I/O operation on closed file" tracebacks in the audit), and the summary counted
    scores --out never got. Now the runs in flight are stopped before --out is closed: --out
    holds whole lines, as many as the summary's scored and failed scores."""
    write_otlp_files(tmp_path / "traces", 6000, files=1)
    out = tmp_path / "scores.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": ""}
    command = [str(Path(sys.executable).with_name("tracescore")), "backfill", str(tmp_path / "traces")]
    job = subprocess.Popen(
        [*command, "--scorers", "tests.backfill.slow_scorers", "--out", str(out), "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(_lines(out)) < 2000 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_lines(out)) >= 2000, "not enough scores written"
        job.send_signal(signal.SIGINT)
        time.sleep(gap_s)
        job.send_signal(signal.SIGINT)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    # (a second Ctrl-C landing after the command finished kills it by SIGINT: a shell's 130 too)
    assert job.returncode in (130, -signal.SIGINT), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in _lines(out)]  # every line whole
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    assert summary["scored"] + summary["failed"] == len(records) < 12000
    by_scorer = summary["by_scorer"]
    assert by_scorer["slow"]["runs"] + by_scorer["block"]["runs"] == len(records)


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["sigterm", "ctrl-c-twice"])
def test_score_interrupted_prints_its_summary_and_exits_130(tmp_path: Path, signals: list[signal.Signals]) -> None:
    """`score` took SIGTERM by Python's default (exit 143, no word, a chunk's records cut
    part-way) and Ctrl-C printed only "aborted". Now the first signal stops it after the chunk
    it is scoring, the second at once (that chunk dropped): either way the summary is printed
    and --out holds whole records of exactly the runs it counts, exit 130."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q", "output": "a"}) + "\n" for i in range(20_000)))
    out = tmp_path / "scores.jsonl"
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    options = ["--scorers", "tests.backfill.slow_scorers", "--chunk", "500", "--out", str(out)]
    job = subprocess.Popen(
        [tracescore, "score", str(runs), *options],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(_lines(out)) < 1000 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_lines(out)) >= 1000, "no chunk scored"
        for sig in signals:
            job.send_signal(sig)
            time.sleep(0.05)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    # (a second Ctrl-C landing after the command finished kills it by SIGINT: a shell's 130 too)
    assert job.returncode in (130, -signal.SIGINT if len(signals) > 1 else 130), stderr[-3000:]
    assert "stopping after the current chunk" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "scores by scorer (" in stdout
    records = [json.loads(line) for line in _lines(out)]
    scored_runs = len(records) // 2
    assert len(records) == 2 * scored_runs
    assert {r["run_id"] for r in records} == {f"r{i}" for i in range(scored_runs)}
    assert f"interrupted: the summary and --out hold the {scored_runs:,} runs scored before the stop" in stderr
    assert scored_runs < 20_000
