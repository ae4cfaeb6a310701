"""Issue 10 in the embedded (no-broker) commands: `tracescore score` and `tracescore backfill`
without a broker give a run that hangs (sync step, async step, a C call nothing can interrupt)
or allocates until the memory cap one error record (`timeout` / `memory`) in the summary and
`--out`, score the other runs, and finish. Real subprocesses, real time, polled with a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer
from tests.worker._workers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCORERS = "tests.backfill.hanging_scorers"
TIMEOUT_S = 2
# Generous: the run timeout, the watchdog's grace, a fresh interpreter's imports on a busy box.
DEADLINE_S = 90


def _tracescore(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run `tracescore ARGS` and wait for it with a deadline (killed, and the test fails, past it)."""
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRACESCORE_BROKER_URL": "",
        "TRACESCORE_RUN_TIMEOUT_SECONDS": str(TIMEOUT_S),
        **env,
    }
    full_env.pop("PYTHONFAULTHANDLER", None)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    cmd = [str(Path(sys.executable).with_name("tracescore")), *args]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        finished = wait_for(lambda: proc.poll() is not None, DEADLINE_S, interval=0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert finished, f"tracescore {' '.join(args)} still running after {DEADLINE_S} s:\n{err.read_text()[-3000:]}"
    return proc.returncode, out.read_text(), err.read_text()


def _runs_file(tmp_path: Path, n: int, marked: int | set[int]) -> Path:
    path = tmp_path / "runs.jsonl"
    marks = marked if isinstance(marked, set) else {marked}
    with path.open("w") as f:
        for i in range(n):
            question = f"question {i}" + (" TRAP" if i in marks else "")
            run = {
                "run_id": f"run-{i}",
                "input": {"input_messages": [question]},
                "output": [{"role": "assistant", "content": f"answer number {i} in five words"}],
            }
            f.write(json.dumps(run) + "\n")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("scorer", "mode", "error_type", "env"),
    [
        ("trap", "spin", "timeout", {}),  # a sync step that never returns: interrupted
        ("trap-async", "stuck", "timeout", {}),  # an async step that never returns: cancelled
        ("trap", "sleep", "timeout", {}),  # a C call: the stuck loop is abandoned
        # allocates until the cap; a run timeout it cannot reach first on a loaded machine (at
        # 2 s it sometimes did, and the run was a timeout, not the memory record under test)
        ("trap", "hog", "memory", {"TRACESCORE_MEMORY_LIMIT_MB": "2048", "TRACESCORE_RUN_TIMEOUT_SECONDS": "60"}),
    ],
    ids=["sync-spin", "async-stuck", "c-call-sleep", "memory-hog"],
)
def test_score_records_the_hanging_run_and_scores_the_others(
    tmp_path: Path, scorer: str, mode: str, error_type: str, env: dict[str, str]
) -> None:
    runs = _runs_file(tmp_path, n=6, marked=2)
    out = tmp_path / "scores.jsonl"
    code, stdout, stderr = _tracescore(
        tmp_path,
        ["score", str(runs), "--scorers", SCORERS, "--scorer", scorer, "--scorer", "words", "--out", str(out)],
        {"TRAP_MODE": mode, **env},
    )
    assert code == 0, stderr[-3000:]
    records = _records(out)
    assert len(records) == 12  # 6 runs x 2 scorers, each exactly once
    failed = [r for r in records if r.get("error_type")]
    assert [(r["run_id"], r["scorer_id"], r["error_type"]) for r in failed] == [("run-2", scorer, error_type)]
    if error_type == "timeout":
        assert f"TRACESCORE_RUN_TIMEOUT_SECONDS ({float(TIMEOUT_S)} s)" in failed[0]["error_message"] or (
            f"TRACESCORE_RUN_TIMEOUT_SECONDS is {float(TIMEOUT_S)}" in failed[0]["error_message"]
        )
    else:
        assert "ran out of memory" in failed[0]["error_message"]
    assert "TRAP" not in failed[0]["error_message"]  # no agent content in the error
    scored = [r for r in records if not r.get("error_type")]
    assert len(scored) == 11
    assert all(r["score"] is not None for r in scored)
    assert "6 runs × 2 scorers: 11 scored, 0 not scorable, 1 failed" in stderr
    row = next(line.split() for line in stdout.splitlines() if line.startswith(f"{scorer} "))
    assert (row[1], row[8]) == ("6", "1"), stdout  # the scorer's summary row: 6 runs, 1 failed


def test_score_gives_runs_blocking_one_after_another_each_a_timeout(tmp_path: Path) -> None:
    """Two runs in a row blocked in C past the timeout (each returns later, so each is
    interrupted): the second's step started before the loop turned, the watchdog took the two
    for one block, declared the loop wedged and blamed the first run, which had its record:
    the command ended with LoopWedgedError and no summary or records. Each is a timeout now.
    The watchdog's warnings go to stderr: with --json, stdout is JSON alone (they were on it)."""
    runs = _runs_file(tmp_path, n=4, marked={1, 2})
    out = tmp_path / "scores.jsonl"
    args = ["score", str(runs), "--scorers", SCORERS, "--scorer", "trap", "--scorer", "words", "--out", str(out)]
    code, stdout, stderr = _tracescore(tmp_path, [*args, "--concurrency", "1", "--json"], {"TRAP_MODE": "nap"})
    assert code == 0, stderr[-3000:]
    assert "loop_blocked_interrupting" in stderr
    assert len([json.loads(line) for line in stdout.splitlines()]) == 8
    records = _records(out)
    assert len(records) == 8
    failed = sorted((r["run_id"], r["error_type"]) for r in records if r.get("error_type"))
    assert failed == [("run-1", "timeout"), ("run-2", "timeout")]
    assert "4 runs × 2 scorers: 6 scored, 0 not scorable, 2 failed" in stderr


def test_backfill_without_broker_records_a_run_stuck_in_a_c_call(tmp_path: Path) -> None:
    """The embedded backfill (EmbeddedScorer → score_batch): the run whose question names Oslo
    sleeps in C forever; it becomes a `timeout` record, every other run is scored once, the
    command ends and its summary counts the failure."""
    traces = tmp_path / "traces"
    traces.mkdir()
    write_otlp_files(traces, 16, files=2, compress=False)
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "trap", "--scorer", "words"]
    code, stdout, stderr = _tracescore(
        tmp_path, [*args, "--out", str(out), "--json"], {"TRAP_MODE": "sleep", "TRAP_MARKER": "Oslo"}
    )
    records = _records(out)
    assert len(records) == 32, stderr[-3000:]  # 16 runs x 2 scorers, each exactly once
    assert len({r["score_id"] for r in records}) == 32
    failed = [r for r in records if r.get("error_type")]
    assert len(failed) == 2, failed  # traces 4 and 12 ask about Oslo
    assert {(r["scorer_id"], r["error_type"]) for r in failed} == {("trap", "timeout")}
    assert all("could not be interrupted" in r["error_message"] for r in failed)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0, stderr[-3000:]
    assert summary["status"] == "finished"
    assert summary["failed"] == 2, summary
    assert summary["failed_by_reason"] == {"timeout": 2}, summary
    assert summary["scored"] == 30, summary


def test_backfill_without_broker_keeps_what_the_stuck_loop_recorded_once(
    tmp_path: Path, fake_llm_env: dict[str, str]
) -> None:
    """A batch whose loop is replaced (a run stuck in C) is scored again on the fresh loop. That
    rerun scored again the retryable failures the stuck loop had recorded: every `costly` run,
    refused by a spent budget, was recorded (and written to the summary and --out) once more per
    replaced loop. Now they stay as recorded: one record per (run, scorer)."""
    traces = tmp_path / "traces"
    traces.mkdir()
    write_otlp_files(traces, 16, files=2, compress=False)
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "trap-async", "--scorer", "costly"]
    code, stdout, stderr = _tracescore(
        tmp_path,
        [*args, "--out", str(out), "--json"],
        {
            **fake_llm_env,
            "TRAP_MODE": "late-sleep",
            "TRAP_MARKER": "Oslo",
            "TRACESCORE_BUDGETS": json.dumps({"scorers": {"costly": 0}}),
        },
    )
    records = _records(out)
    assert "embedded_loop_wedged_replaced" in stderr  # the path under test
    assert len(records) == 32, stderr[-3000:]  # 16 runs x 2 scorers, each exactly once
    assert len({r["score_id"] for r in records}) == 32
    assert sorted({(r["scorer_id"], r["error_type"]) for r in records}, key=str) == sorted(
        {("trap-async", None), ("trap-async", "timeout"), ("costly", "budget_exhausted")}, key=str
    )
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0, stderr[-3000:]
    assert summary["failed_by_reason"] == {"timeout": 2, "budget_exhausted": 16}, summary
    costly = summary["by_scorer"]["costly"]
    assert (costly["runs"], costly["failed"]) == (16, 16), costly


def test_backfill_without_broker_abandons_the_stuck_loops_runs(
    tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]
) -> None:
    """The run naming Oslo blocks its loop in C for 8 s: the loop is replaced at about 5 s and the
    batch's rest scored again on a fresh one. The abandoned loop was left to itself: once the C
    call returned, its runs carried on beside their rerun, each asking (and paying) `plain`'s
    judge a second time, and storing `costly`'s budget refusal (a retryable record) over the
    rerun's, written a second time to --out and the summary. Now nothing more runs on the
    abandoned loop: one judge call per run (a call in flight as the loop blocked excepted, at
    most one: TRACESCORE_MODEL_CONCURRENCY=1) and one record per (run, scorer)."""
    traces = tmp_path / "traces"
    traces.mkdir()
    write_otlp_files(traces, 8, files=1, compress=False)  # one batch; trace 4 asks about Oslo
    out = tmp_path / "scores.jsonl"
    # A slow judge, one call at a time: the fresh loop is still at work when the nap ends.
    fake_llm.latency_ms = 1000
    args = ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "trap-async"]
    code, stdout, stderr = _tracescore(
        tmp_path,
        [*args, "--scorer", "costly", "--scorer", "plain", "--out", str(out), "--json"],
        {
            **fake_llm_env,
            "TRAP_MODE": "late-nap",
            "TRAP_MARKER": "Oslo",
            "TRAP_NAP_S": "8",
            "TRACESCORE_MODEL_CONCURRENCY": "1",
            "TRACESCORE_BUDGETS": json.dumps({"scorers": {"costly": 0}}),
        },
    )
    assert "embedded_loop_wedged_replaced" in stderr  # the path under test
    asked = [r.user_text for r in fake_llm.requests]
    assert all(text.startswith("PLAIN") for text in asked), asked
    # Once a run, but for the one in flight as the loop blocked (asked again on the fresh loop).
    assert 8 <= len(asked) <= 9, asked
    records = _records(out)
    assert len(records) == 24, stderr[-3000:]  # 8 runs x 3 scorers, each exactly once
    assert len({r["score_id"] for r in records}) == 24
    assert sorted({(r["scorer_id"], r["error_type"]) for r in records}, key=str) == sorted(
        {("trap-async", None), ("trap-async", "timeout"), ("costly", "budget_exhausted"), ("plain", None)}, key=str
    )
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0, stderr[-3000:]
    assert summary["failed_by_reason"] == {"timeout": 1, "budget_exhausted": 8}, summary
    costly = summary["by_scorer"]["costly"]
    assert (costly["runs"], costly["failed"]) == (8, 8), costly
