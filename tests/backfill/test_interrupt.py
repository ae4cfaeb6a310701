"""An embedded backfill interrupted while it scores: Ctrl-C twice (the second one stops what is in
flight), as an impatient user does."""

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
    assert job.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in _lines(out)]  # every line whole
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    assert summary["scored"] + summary["failed"] == len(records) < 12000
    by_scorer = summary["by_scorer"]
    assert by_scorer["slow"]["runs"] + by_scorer["block"]["runs"] == len(records)
