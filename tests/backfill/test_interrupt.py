"""Commands interrupted while they score in this process (an embedded backfill, `score`): SIGTERM,
or Ctrl-C twice (the second one stops what is in flight), as an impatient user does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer, Reply

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _interrupted(
    args: list[str], out: Path, *, after_lines: int, signals: list[signal.Signals], gap_s: float
) -> tuple[int, str, str]:
    """Run ``tracescore ARGS`` until ``out`` has ``after_lines`` lines, send ``signals``
    ``gap_s`` apart; its exit code, stdout and stderr."""
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": ""}
    job = subprocess.Popen(
        [tracescore, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(_lines(out)) < after_lines and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_lines(out)) >= after_lines, "not enough scores written"
        for sig in signals:
            job.send_signal(sig)
            time.sleep(gap_s)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, stdout, stderr


@pytest.mark.parametrize("gap_s", [0.01, 0.05, 0.3])
def test_a_second_ctrl_c_leaves_whole_lines_and_a_summary_that_adds_up(tmp_path: Path, gap_s: float) -> None:
    """The second Ctrl-C closed --out under the runs still in flight: each wrote into a closed
    file (191 "I/O operation on closed file" tracebacks in the audit), and the summary counted
    scores --out never got. Now the runs in flight are stopped before --out is closed: --out
    holds whole lines, as many as the summary's scored and failed scores, and the scores of the
    batch cut short are named and counted as not scored (interrupted)."""
    write_otlp_files(tmp_path / "traces", 6000, files=1)
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(tmp_path / "traces"), "--scorers", "tests.backfill.slow_scorers", "--out", str(out)]
    returncode, stdout, stderr = _interrupted(
        [*args, "--json"], out, after_lines=2000, signals=[signal.SIGINT, signal.SIGINT], gap_s=gap_s
    )
    # (a second Ctrl-C landing after the command finished kills it by SIGINT: a shell's 130 too)
    assert returncode in (130, -signal.SIGINT), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in _lines(out)]  # every line whole
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    assert summary["scored"] + summary["failed"] == len(records) < 12000
    # The runs of the batch cut short are not scored (interrupted): every score expected is counted.
    left = summary["scores_skipped"].get("interrupted", 0)
    assert summary["scored"] + summary["failed"] + left == summary["scores_expected"]
    assert stderr.count("not scored (interrupted: stopped before its retry, or cut short") == min(left, 20)
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
    options = ["--scorers", "tests.backfill.slow_scorers", "--chunk", "500", "--out", str(out)]
    returncode, stdout, stderr = _interrupted(
        ["score", str(runs), *options], out, after_lines=1000, signals=signals, gap_s=0.05
    )
    # (a second Ctrl-C landing after the command finished kills it by SIGINT: a shell's 130 too)
    assert returncode in (130, -signal.SIGINT if len(signals) > 1 else 130), stderr[-3000:]
    assert "stopping after the current chunk" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "scores by scorer (" in stdout
    records = [json.loads(line) for line in _lines(out)]
    scored_runs = len(records) // 2
    assert len(records) == 2 * scored_runs
    assert {r["run_id"] for r in records} == {f"r{i}" for i in range(scored_runs)}
    assert f"interrupted: the summary and --out hold the {scored_runs:,} runs scored before the stop" in stderr
    assert scored_runs < 20_000


# --- a first Ctrl-C while a retry's backoff is pending ------------------------------------------

# Judge scorers over the real OpenAI SDK (tests/fakellm): "costly" answered, "plain" answering 503.
JUDGE_SCORERS = ["--scorers", "tests.worker.budget_scorers", "--scorer", "costly", "--scorer", "plain"]
BACKOFF_S = 20.0  # the batch's retries wait 20, 40 and 80 s: 140 s, where the stop must take seconds
STOP_WITHIN_S = 10.0


def _stopped_in_a_backoff(
    args: list[str],
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    *,
    plain_calls: int,
    failing: str = "PLAIN",
    **more_env: str,
) -> tuple[int, str, str, float]:
    """Run ``tracescore ARGS`` with the judge answering prompts with ``failing`` ("plain"'s) 503
    until its first try asked ``plain_calls`` times (its retry's backoff then pending), send one
    SIGINT; its exit code, stdout, stderr and how long it took to end after the signal."""
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains=failing)
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    env = {
        **os.environ,
        **fake_llm_env,
        "PYTHONPATH": str(ROOT),
        "TRACESCORE_BROKER_URL": "",
        "TRACESCORE_BUDGETS": "",
        "TRACESCORE_RETRY_BUDGET": "3",
        "TRACESCORE_RETRY_BACKOFF_SECONDS": str(BACKOFF_S),
        **more_env,
    }
    job = subprocess.Popen(
        [tracescore, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while _asked(fake_llm, failing) < plain_calls and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert _asked(fake_llm, failing) == plain_calls, "the first try did not ask the judge"
        job.send_signal(signal.SIGINT)
        sent = time.monotonic()
        while job.poll() is None and time.monotonic() < sent + STOP_WITHIN_S:
            time.sleep(0.02)
        took = time.monotonic() - sent
        if job.poll() is None:
            job.kill()
        stdout, stderr = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert took < STOP_WITHIN_S, f"still running {took:.1f} s after the Ctrl-C: {stderr[-2000:]}"
    assert _asked(fake_llm, failing) == plain_calls  # no retry started after the Ctrl-C
    return job.returncode, stdout, stderr, took


def _asked(fake_llm: FakeLLMServer, prompt: str) -> int:
    return sum(prompt in r.user_text for r in fake_llm.requests)


@pytest.mark.parametrize(
    ("window", "read"),
    [([], 12), (["--window-spans", "3"], None)],
    ids=["traces-released-waiting", "traces-still-assembling"],
)
def test_a_first_ctrl_c_in_a_retry_backoff_stops_at_once_and_accounts_for_every_trace(
    tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], window: list[str], read: int | None
) -> None:
    """An embedded backfill whose batch had a transient judge failure waited out its retries on
    the first Ctrl-C (2 + 4 + 8 s by default, here 140 s) with nothing said, and the traces read
    but not yet in a batch (released and waiting, or still assembling) were gone from the
    summary. Now the Ctrl-C cuts the backoff short and starts no retry: the pairs that waited
    for it are not scored (interrupted) — named, counted as skipped, never a failure — and the
    traces not yet handed over are counted as read and skipped (interrupted), named too."""
    write_otlp_files(tmp_path / "traces", 12, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(tmp_path / "traces"), *JUDGE_SCORERS, "--batch-size", "2", *window, "--json"]
    returncode, stdout, stderr, _ = _stopped_in_a_backoff(
        [*args, "--out", str(out)], fake_llm, fake_llm_env, plain_calls=2
    )
    assert returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in _lines(out)]
    assert summary["status"] == "interrupted"
    # The batch in hand: its "costly" pairs scored, its "plain" pairs not scored (interrupted).
    assert summary["runs_enqueued"] == summary["runs_read"] == 2
    assert (summary["scored"], summary["failed"]) == (2, 0)
    assert summary["scores_skipped"] == {"interrupted": 2}
    assert summary["scores_expected"] == summary["scored"] + summary["failed"] + 2
    assert sorted(r["scorer_id"] for r in records) == ["costly", "costly"]
    assert stderr.count("scorer plain not scored (interrupted") == 2
    # Every trace read is accounted for: scored, or skipped (interrupted) and named.
    interrupted = summary["traces_skipped"].get("interrupted", 0)
    assert interrupted > 0
    assert summary["traces_read"] == summary["runs_enqueued"] + interrupted
    if read is not None:
        assert summary["traces_read"] == read
    assert stderr.count("not scored (interrupted): read when the backfill was stopped") == interrupted


def test_score_a_first_ctrl_c_in_a_retry_backoff_stops_at_once_and_names_what_it_left(
    tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]
) -> None:
    """`tracescore score`'s first Ctrl-C waited out the chunk's retries (here 140 s). Now it cuts
    the backoff short and starts no retry: the pairs that waited for it are named and counted as
    not scored (interrupted), left out of --out (not recorded as failures), and the footer's
    counts add up to the runs read times the scorers."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q?", "output": "a."}) + "\n" for i in range(6)))
    out = tmp_path / "scores.jsonl"
    args = ["score", str(runs), *JUDGE_SCORERS, "--chunk", "2", "--out", str(out), "--json"]
    returncode, stdout, stderr, _ = _stopped_in_a_backoff(args, fake_llm, fake_llm_env, plain_calls=2)
    assert returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in _lines(out)]
    assert sorted((r["run_id"], r["scorer_id"], r.get("error_type")) for r in records) == [
        ("r0", "costly", None),
        ("r1", "costly", None),
    ]
    for run in ("r0", "r1"):
        assert f"run {run}: scorer plain not scored (interrupted" in stderr
    assert "2 runs × 2 scorers: 2 scored, 0 not scorable, 0 failed, 2 not scored (interrupted)" in stderr
    # --json names each pair's input line, the ones not scored too.
    shown = sorted(
        (d["line"], d["run_id"], d["scorer_id"], d.get("skipped")) for d in map(json.loads, stdout.splitlines())
    )
    assert shown == [
        (1, "r0", "costly", None),
        (1, "r0", "plain", "interrupted"),
        (2, "r1", "costly", None),
        (2, "r1", "plain", "interrupted"),
    ]


@pytest.mark.parametrize("sample", [None, "0.5"])
def test_a_first_ctrl_c_counts_the_traces_read_and_not_yet_scored(tmp_path: Path, sample: str | None) -> None:
    """The first Ctrl-C of an embedded backfill ends it after the batch in hand; the traces read
    and not yet in a batch (here all 3,000 of one file are released together at its end) were
    left out of the summary, which said 200 or 400 traces read. Now each is read as any other
    (with --sample, the ones sampled out are counted so, not as interrupted) and the ones it
    would have scored are skipped (interrupted), so the summary accounts for every trace read."""
    from tests.backfill._synth import trace_id
    from tracing._rules import sampled

    write_otlp_files(tmp_path / "traces", 3000, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(tmp_path / "traces"), "--scorers", "tests.backfill.slow_scorers", "--out", str(out)]
    if sample is not None:
        args += ["--sample", sample]
    returncode, stdout, stderr = _interrupted(
        [*args, "--json"], out, after_lines=400 if sample is None else 200, signals=[signal.SIGINT], gap_s=0.05
    )
    assert returncode == 130, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    assert summary["runs_enqueued"] < 3000
    assert summary["traces_read"] == 3000
    skipped = summary["traces_skipped"]
    sampled_out = sum(not sampled(trace_id(i), float(sample or 1)) for i in range(3000))
    assert skipped.get("sampled_out", 0) == sampled_out
    assert summary["traces_read"] == summary["runs_enqueued"] + skipped["interrupted"] + sampled_out
    assert summary["runs_read"] == summary["runs_enqueued"]
    assert summary["scored"] + summary["failed"] == len(_lines(out)) == 2 * summary["runs_enqueued"]


# A two-step judge scorer: its first step ("CLAIMS") answered and paid, its second ("GRADE")
# answering 503; the Ctrl-C comes in the backoff before the retry that would resume after CLAIMS.
PRICES = json.dumps({"openai/fake-judge": {"input": 100.0, "output": 200.0}})
CALL_USD = (1000 * 100.0 + 100 * 200.0) / 1e6  # each answer: 1,000 input and 100 output tokens


@pytest.mark.parametrize("command", ["backfill", "score"])
def test_a_first_ctrl_c_leaves_the_answered_steps_of_an_unscored_pair_in_the_spend(
    tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], command: str
) -> None:
    """A pair a first Ctrl-C left unscored (interrupted) had paid for its answered judge steps,
    but it has no record, and the summary's judge spend was summed from the records: those
    calls were left out of it (0 USD shown, 0.24 paid). The spend shown is the ledger's now:
    the judge's answered calls × their price, per scorer and model, and every call it got."""
    fake_llm.rule(Reply.auto(input_tokens=1000, output_tokens=100), user_contains="CLAIMS")
    scorer = ["--scorers", "tests.worker.budget_scorers", "--scorer", "two-steps"]
    if command == "backfill":
        write_otlp_files(tmp_path / "traces", 2, files=1, compress=False)
        args = ["backfill", str(tmp_path / "traces"), *scorer, "--batch-size", "2", "--json"]
    else:
        runs = tmp_path / "runs.jsonl"
        runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q?", "output": "a."}) + "\n" for i in (0, 1)))
        args = ["score", str(runs), *scorer, "--chunk", "2"]
    returncode, stdout, stderr, _ = _stopped_in_a_backoff(
        args, fake_llm, fake_llm_env, plain_calls=2, failing="GRADE", TRACESCORE_PRICES=PRICES
    )
    assert returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("scorer two-steps not scored (interrupted") == 2
    # Paid: the answered calls (CLAIMS); made: those and the failed ones (GRADE's 503s).
    answered, made = _asked(fake_llm, "CLAIMS"), len(fake_llm.requests)
    assert (answered, made) == (2, 4)
    paid = answered * CALL_USD
    assert f"  judge spend       {paid:.4f} USD   ({made:,} judge calls)" in stderr
    assert f"    scorer two-steps: {paid:.4f} USD" in stderr
    assert f"    model  openai/fake-judge: {paid:.4f} USD" in stderr
    if command == "backfill":
        spend = json.loads(stdout.strip().splitlines()[-1])["spend"]
        assert spend["judge_calls"] == made
        assert spend["total_usd"] == pytest.approx(paid)
        assert spend["by_scorer"] == {"two-steps": pytest.approx(paid)}
        assert spend["by_model"] == {"openai/fake-judge": pytest.approx(paid)}


# --- a first Ctrl-C in a dry run ----------------------------------------------------------------

DRY_TRACES = 40_000  # some 8 s of reading on a laptop; the Ctrl-C comes at the first progress


def _dry_run_stopped(args: list[str]) -> tuple[int, str, str]:
    """Run ``tracescore ARGS`` with stderr on a terminal (its progress bar drawn at once), send
    one SIGINT once the bar shows traces read; its exit code, stdout and what the terminal got."""
    import pty
    import select

    tracescore = str(Path(sys.executable).with_name("tracescore"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": "", "COLUMNS": "200"}
    primary, secondary = pty.openpty()
    job = subprocess.Popen([tracescore, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=secondary, text=True)
    os.close(secondary)
    seen = b""

    def read(until: float) -> bool:
        """Read the terminal until ``until`` (monotonic); False once the command closed it."""
        nonlocal seen
        while time.monotonic() < until:
            ready, _, _ = select.select([primary], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:
                    return False
                if not chunk:
                    return False
                seen += chunk
                return True
        return True

    try:
        deadline = time.monotonic() + 60
        progress = re.compile(rb"reading: +[1-9][\d,]* traces")
        while not progress.search(seen) and job.poll() is None and time.monotonic() < deadline:
            read(deadline)
        assert progress.search(seen), f"no progress shown: {seen.decode(errors='replace')[-2000:]}"
        assert job.poll() is None, "the dry run ended before the Ctrl-C: make the input larger"
        job.send_signal(signal.SIGINT)
        end = time.monotonic() + 60
        while read(end) and time.monotonic() < end:
            pass
        stdout, _ = job.communicate(timeout=60)
    finally:
        os.close(primary)
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, stdout, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def dry_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dry") / "traces"
    write_otlp_files(path, DRY_TRACES, files=1, compress=False)
    return path


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_first_ctrl_c_in_a_dry_run_prints_the_estimate_so_far(dry_input: Path, as_json: bool) -> None:
    """A dry run over a large input had no Ctrl-C summary: the first Ctrl-C ended it at once
    with "aborted" and nothing of what it had counted. Now it stops reading after
    the record in hand and prints what the full run prints, for the part read, marked partial
    (the share of the input read, the rest not read), and exits 130 as an interrupted backfill."""
    args = ["backfill", str(dry_input), *JUDGE_SCORERS[:2], "--scorer", "costly", "--dry-run"]
    returncode, stdout, terminal = _dry_run_stopped([*args, "--json"] if as_json else args)
    assert returncode == 130, terminal[-3000:]
    assert "Traceback" not in terminal, terminal[-3000:]
    assert "stopping after the current input record" in terminal
    if as_json:
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["status"] == "interrupted"
        assert 0 < summary["traces_read"] < DRY_TRACES
        assert 0 < summary["input_read"] < 1
        # The estimate is of the runs counted: one judge call each.
        assert summary["runs_to_score"] == summary["runs_read"] == summary["traces_read"]
        assert summary["estimate"]["judge_calls"] == summary["runs_to_score"]
        assert f"partial: stopped after reading {summary['traces_read']:,} traces" in terminal
    else:
        match = re.search(r"would score ([\d,]+) runs from ([\d,]+) traces", stdout)
        assert match is not None, stdout
        runs, traces = (int(g.replace(",", "")) for g in match.groups())
        assert 0 < runs == traces < DRY_TRACES
        assert f"partial: stopped after reading {traces:,} traces" in terminal
        assert "judge calls" in stdout


def _read_so_far(pid: int) -> int:
    """The bytes process ``pid`` has read (its ``rchar``)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(row.split()[1]) for row in io if row.startswith("rchar:"))


def _sparse_line_between_two_traces(path: Path, size: int) -> Path:
    """Trace 0, a line of ``size`` bytes (sparse: no disk used) that is skipped unread, trace 1."""
    from tests.backfill._late import whole

    with path.open("w") as traces:
        traces.write(whole(0))
        traces.write('{"resourceSpans": [')
        traces.seek(size)
        traces.write("]}\n" + whole(1))
    return path


def _stopped_in_the_skip(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """``tracescore ARGS`` SIGTERMed once it has read 1 GiB (in the skip); its exit code, stdout
    and stderr, which must come within 30 s of the signal."""
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    job = subprocess.Popen(
        [tracescore, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while job.poll() is None and _read_so_far(job.pid) < 2**30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job.poll() is None, "the job ended before its skip was seen under way"
        assert _read_so_far(job.pid) >= 2**30, "the skip was not seen under way"
        job.send_signal(signal.SIGTERM)
        stdout, stderr = job.communicate(timeout=30)  # (a skip of 1 TB alone takes minutes)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, stdout, stderr


def test_a_stop_while_an_over_long_line_is_skipped_ends_the_job_meanwhile(tmp_path: Path) -> None:
    """A line of 1 TB between two traces. Stops are looked at between input records, and the
    skip read the whole line first: a SIGTERM went unanswered for minutes. The skip now lets its
    caller look every 64 MiB: the job ends at exit 130 in a few seconds, the trace read before
    named as interrupted."""
    from tests.backfill._synth import trace_id

    path = _sparse_line_between_two_traces(tmp_path / "traces.jsonl", 2**40)
    args = ["backfill", str(path), "--scorers", "tests.backfill.scorers", "--json"]
    returncode, stdout, stderr = _stopped_in_the_skip(args, {"TRACESCORE_BROKER_URL": ""})
    assert returncode == 130, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["traces_read"], summary["traces_skipped"]) == (
        "interrupted",
        1,
        {"interrupted": 1},
    )
    assert f"trace {trace_id(0)}: not scored (interrupted)" in stderr
    assert summary["malformed_lines"] == 0  # (the line was not read through)


def test_a_redis_job_stopped_in_a_skip_resumes_before_the_line_and_counts_it_once(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """The same in Redis mode, a line of 4 GiB: the job stops in the skip (its checkpoint before
    the trace it still held), and the resume reads both traces once and the line as one
    malformed line."""
    path = _sparse_line_between_two_traces(tmp_path / "traces.jsonl", 4 * 2**30)
    env = {"TRACESCORE_BROKER_URL": private_redis.url(0)}
    args = ["backfill", str(path), "--scorers", "tests.backfill.scorers", "--no-wait", "--json"]
    returncode, stdout, stderr = _stopped_in_the_skip(args, env)
    assert returncode == 130, stderr[-3000:]
    stopped = json.loads(stdout.strip().splitlines()[-1])
    assert (stopped["status"], stopped["runs_enqueued"], stopped["malformed_lines"]) == ("interrupted", 0, 0)
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    resumed = subprocess.run(
        [tracescore, "backfill", "--resume", stopped["job_id"], "--no-wait", "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (done["traces_read"], done["runs_enqueued"], done["malformed_lines"]) == (2, 2, 1)
    assert done["malformed_where"] == [f"{path}:2"]
