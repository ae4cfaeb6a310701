"""A scorer's step that calls ``sys.exit`` (a library's command-line error path does). On the
worker's loop thread it ended only that thread, and whoever waited for the run waited for
good: a worker's batch, ``score`` and an embedded backfill hung. It is the run's failure now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.backfill._synth import write_otlp_files
from tests.worker._batches import OUTPUT, output_messages, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.sample_scorers import POISON_MARKER
from tracing import CelerySink
from tracing.queue import ScoreBatch

ROOT = Path(__file__).resolve().parents[2]
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))
N = 4
EXITING = 1


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_records_the_run_as_failed_and_scores_the_rest(redis_url: str, tmp_path: Path, pool: str) -> None:
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("exits", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=1)
    try:
        worker.wait_ready()
        raw = payload(range(N), ["exits"], salt=f"exits-{pool}", batch_id="exiting-batch")
        raw["requests"][EXITING]["spans"][0]["attributes"][OUTPUT] = output_messages(f"exit here: {POISON_MARKER}")
        sent = ScoreBatch.model_validate(raw)
        (exiting_span,) = sent.requests[EXITING].target_span_ids
        sink = CelerySink(redis_url)
        sink.send(sent)
        sink.close()

        assert wait_for(lambda: len(read_scores(scores)) >= N, 60), worker.text()[-3000:]
        by_span = {s["span_id"]: s for s in read_scores(scores)}
        assert len(by_span) == N
        failed = by_span.pop(exiting_span)
        assert failed["error_type"] == "SystemExit"
        assert "scorer 'exits' called sys.exit(2) in step generate_score" in failed["error_message"]
        assert failed["failed_step"] == "generate_score"
        assert all(s["error_type"] is None and s["score"] is not None for s in by_span.values())
        assert worker.proc.poll() is None
        client = redis.Redis.from_url(redis_url)
        try:
            assert wait_for(lambda: client.hlen("unacked") == 0 and client.llen("tracescore") == 0, 30)
            assert client.llen("tracescore:dlq") == 0
        finally:
            client.close()
    finally:
        worker.stop()


def _tracescore(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_BROKER_URL": ""}
    return subprocess.run(
        [TRACESCORE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_score_records_the_run_as_failed_and_scores_the_rest(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    lines = [{"run_id": f"r{i}", "input": "q", "output": POISON_MARKER if i == EXITING else "a b c"} for i in range(N)]
    runs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "scores.jsonl"
    done = _tracescore(
        ["score", str(runs), "--scorers", "tests.worker.sample_scorers", "--scorer", "exits", "--out", str(out)],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["run_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(records) == [f"r{i}" for i in range(N)]
    assert records.pop(f"r{EXITING}")["error_type"] == "SystemExit"
    assert all(r.get("error_type") is None and r["score"] is not None for r in records.values())
    assert "called sys.exit(2) in step generate_score" in done.stderr


def test_an_embedded_backfill_records_the_runs_as_failed_and_finishes(tmp_path: Path) -> None:
    """Every run of this scorer exits: each is a failure, and the job still ends with its summary."""
    write_otlp_files(tmp_path / "traces", 20, files=1)
    (tmp_path / "always_exits.py").write_text(
        "import sys\nfrom scorers import create_scorer\n"
        "exits = create_scorer('exits').generate_score(lambda: sys.exit(3))\n"
    )
    done = subprocess.run(
        [TRACESCORE, "backfill", str(tmp_path / "traces"), "--scorers", "always_exits", "--json"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}", "TRACESCORE_BROKER_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished", done.stderr[-3000:]
    assert summary["failed"] == summary["by_scorer"]["exits"]["runs"] > 0
    assert "called sys.exit(3) in step generate_score" in done.stderr


def test_a_loop_thread_outlives_a_task_that_exits() -> None:
    """Outside a scorer's run (code of any other task on the loop): its waiter gets the
    SystemExit, and the loop goes on serving the next coroutine."""
    from worker._loop import LoopThread

    async def exits() -> None:
        sys.exit(5)

    async def answers() -> int:
        return 42

    lt = LoopThread("test-exit")
    try:
        with pytest.raises(SystemExit) as raised:
            lt.run(exits(), timeout=10)
        assert raised.value.code == 5
        assert lt.alive()
        assert lt.run(answers(), timeout=10) == 42
    finally:
        lt.stop()


def test_a_step_that_catches_the_loops_halt_and_exits_still_ends_the_loop() -> None:
    """``LoopThread.halt`` (the memory cap's exit) raises a SystemExit into the loop thread. A
    step catching it and calling ``sys.exit`` of its own made it a StepExitError, and the loop
    went on."""
    import asyncio
    import threading
    import time

    from scorers import create_scorer
    from worker._loop import LoopThread
    from worker._scoring import run_limited

    spinning = threading.Event()

    def stubborn() -> float:
        try:
            spinning.set()
            while True:
                time.sleep(0.001)
        except SystemExit:
            sys.exit(1)

    scorer = create_scorer("stubborn").generate_score(lambda: stubborn())
    lt = LoopThread("test-halt")
    try:
        tasks: list[asyncio.Task[object]] = []
        lt.loop.call_soon_threadsafe(
            lambda: tasks.append(lt.loop.create_task(run_limited(scorer, None, input="q", output="a")))
        )
        assert spinning.wait(10)
        assert lt.halt(10)
        # (the step's exit, raised while handling the halt: the task's, as asyncio keeps it)
        assert isinstance(tasks[0].exception(), SystemExit)
    finally:
        lt.stop()


def test_an_abandoned_loop_runs_nothing_more_once_its_blocking_call_returns() -> None:
    """``LoopThread.abandon`` (an embedded scorer replacing a loop stuck in C): once the call
    returns, neither the loop's other tasks nor their cleanup run (a cancelled or collected
    run's cleanup stores what it finished), and the tasks stay held, never collected."""
    import asyncio
    import gc
    import threading

    from tests.worker._workers import wait_for
    from worker._loop import LoopThread

    blocked, release = threading.Event(), threading.Event()
    ticks: list[int] = []
    cleaned: list[bool] = []

    async def stuck_in_c() -> None:
        await asyncio.sleep(0.05)
        blocked.set()
        release.wait()  # (the point: the loop blocked until the test says)

    async def neighbour() -> None:
        try:
            while True:
                await asyncio.sleep(0.01)
                ticks.append(1)
        finally:
            cleaned.append(True)

    lt = LoopThread("test-abandon")
    for coro in (stuck_in_c, neighbour):
        asyncio.run_coroutine_threadsafe(coro(), lt.loop)
    assert blocked.wait(10)
    lt.abandon()
    seen = len(ticks)
    release.set()
    assert wait_for(lambda: not lt.loop.is_running(), 10, interval=0.02)
    gc.collect()
    assert (len(ticks), cleaned) == (seen, [])
    assert lt._thread.is_alive()  # parked, holding the tasks (a daemon: gone with the process)


def test_the_failure_names_the_step_and_keeps_what_the_run_did() -> None:
    """The record named no step ("in a step") and dropped what the steps before had done and
    spent; and the error lost both on its way between processes (pickled)."""
    import asyncio
    import pickle

    from scorers import create_scorer
    from worker._errors import StepExitError
    from worker._scoring import run_limited

    scorer = create_scorer("exits-late").preprocess(lambda run: {"n": 1}).generate_score(lambda: sys.exit(4))
    with pytest.raises(StepExitError) as raised:
        asyncio.run(run_limited(scorer, None, input="q", output="a"))
    error = raised.value
    assert error.failed_step == "generate_score"
    assert "called sys.exit(4) in step generate_score" in str(error)
    assert error.partial is not None
    assert error.partial.completed_steps == ["preprocess"]
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.failed_step, again.partial) == (str(error), "generate_score", error.partial)


@pytest.mark.parametrize("where", ["async step", "nested scorer", "instance raised twice"])
def test_the_step_is_the_runs_own_however_the_exit_comes(where: str) -> None:
    """An async step's exit reached the caller without passing the scorer's flow (no step); an
    inner scorer's (checks.all_of) named the inner step and kept the inner result; an exit raised
    again kept its first run's step and spend (review)."""
    import asyncio

    from scorers import create_scorer
    from scorers.builtin import checks
    from worker._errors import StepExitError
    from worker._scoring import run_limited

    async def exits_async() -> float:
        sys.exit(6)

    reused = SystemExit(7)

    def raise_reused() -> float:
        raise reused

    async def raise_reused_async() -> float:
        raise reused

    if where == "async step":
        scorer = create_scorer("late").preprocess(lambda run: {"n": 1}).generate_score(exits_async)
        expected = ("generate_score", "late", ["preprocess"])
    elif where == "nested scorer":
        inner = create_scorer("inner").generate_score(exits_async)
        scorer = checks.all_of(inner, id="outer")
        expected = ("preprocess", "outer", [])
    else:
        with pytest.raises(StepExitError):
            asyncio.run(run_limited(create_scorer("first").analyze(raise_reused).generate_score(lambda: 1.0), None,
                                    input="q", output="a"))  # fmt: skip
        scorer = create_scorer("second").generate_score(raise_reused_async)
        expected = ("generate_score", "second", [])
    with pytest.raises(StepExitError) as raised:
        asyncio.run(run_limited(scorer, None, input="q", output="a"))
    error = raised.value
    assert error.partial is not None
    assert (error.failed_step, error.partial.scorer_id, error.partial.completed_steps) == expected
    assert f"in step {expected[0]}" in str(error)
