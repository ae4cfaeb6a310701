"""Runs that hit the worker's limits, on real ``celery -A worker worker`` processes (DB 11).

A sync step that never returns, an async step that never returns, a step stuck in a C call: each
run becomes a ``timeout`` error record, the batch's other runs are scored, and the worker goes on
scoring later batches (the memory limit: ``test_memory.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.worker._batches import batch, mixed_batch, send
from tests.worker._workers import WorkerProcess, read_scores, wait_for

LIMITS = {
    "TRACESCORE_RUN_TIMEOUT_SECONDS": "2",
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "20",
    "TRACESCORE_TASK_TIME_LIMIT": "25",
    "TRACESCORE_VISIBILITY_TIMEOUT": "30",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


def _start(
    started: list[WorkerProcess], redis_url: str, tmp: Path, env: dict[str, str], **options: Any
) -> WorkerProcess:
    worker = WorkerProcess("limits", redis_url, tmp, scores_path=tmp / "scores.jsonl", env={**LIMITS, **env}, **options)
    started.append(worker)
    worker.wait_ready()
    return worker


def _check(worker: WorkerProcess, scores_path: Path, bad: str, error_type: str) -> list[dict[str, Any]]:
    """The bad run has one `error_type` record, the 3 neighbours and the 4 later runs are scored."""
    assert wait_for(lambda: len(read_scores(scores_path)) >= 8, 90), worker.text()[-4000:]
    scores = read_scores(scores_path)
    assert len(scores) == 8, scores
    assert len({s["score_id"] for s in scores}) == 8
    (failed,) = [s for s in scores if s["error_type"]]
    assert failed["scorer_id"] == bad
    assert failed["error_type"] == error_type
    assert not failed["retryable"]
    assert sorted(s["scorer_id"] for s in scores if not s["error_type"]) == ["length"] * 7
    assert all(s["score"] is not None for s in scores if not s["error_type"])
    return scores


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_sync_step_that_never_returns_is_interrupted(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path, pool: str
) -> None:
    """A sync step in an endless loop blocks the event loop: the watchdog interrupts it, the run
    is a `timeout` record, and the same process scores its neighbours and the next batch."""
    worker = _start(started, redis_url, tmp_path, {}, pool=pool, concurrency=2 if pool == "threads" else 1)
    send(redis_url, mixed_batch("spin", f"spin-{pool}"), batch(range(10, 14), ["length"], salt=f"after-{pool}"))
    scores = _check(worker, tmp_path / "scores.jsonl", "spin", "timeout")
    (failed,) = [s for s in scores if s["error_type"]]
    assert failed["failed_step"] == "generate_score"
    assert "loop_blocked_interrupting" in worker.text()
    assert worker.proc.poll() is None


def test_async_step_that_never_returns_times_out(started: list[WorkerProcess], redis_url: str, tmp_path: Path) -> None:
    """An async step awaiting forever is cancelled at the run timeout: a `timeout` record, the
    rest of the batch and the next batch scored, the worker alive."""
    worker = _start(started, redis_url, tmp_path, {}, pool="solo")
    send(redis_url, mixed_batch("stuck", "stuck"), batch(range(10, 14), ["length"], salt="after-stuck"))
    scores = _check(worker, tmp_path / "scores.jsonl", "stuck", "timeout")
    (failed,) = [s for s in scores if s["error_type"]]
    assert "TRACESCORE_RUN_TIMEOUT_SECONDS (2.0 s)" in failed["error_message"]
    assert worker.proc.poll() is None


def test_step_stuck_in_a_c_call_recycles_the_child_and_redelivers(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path
) -> None:
    """time.sleep(10**6) cannot be interrupted: the run's `timeout` record is stored, the prefork
    child exits and is replaced, the message is redelivered and its other runs scored once."""
    worker = _start(started, redis_url, tmp_path, {}, pool="prefork", concurrency=1)
    send(redis_url, mixed_batch("sleep_forever", "sleepy"), batch(range(10, 14), ["length"], salt="after-sleepy"))
    _check(worker, tmp_path / "scores.jsonl", "sleep_forever", "timeout")
    assert "worker_loop_wedged_exiting" in worker.text()
    assert "already_scored" in worker.text()  # the redelivery skipped the recorded run
    assert worker.proc.poll() is None


def test_run_timeout_defaults_below_the_soft_limit_and_must_stay_there() -> None:
    """The run timeout defaults to 3/4 of the soft limit; one at or above it is refused by name."""
    from worker._settings import SettingsError, load_settings

    assert load_settings(task_soft_time_limit=40, task_time_limit=50).run_timeout == 30
    with pytest.raises(SettingsError, match="TRACESCORE_RUN_TIMEOUT_SECONDS"):
        load_settings(run_timeout_seconds=240)
    with pytest.raises(SettingsError, match="TRACESCORE_MEMORY_LIMIT_MB"):
        load_settings(memory_limit_mb=64)


def test_backstop_ends_a_process_whose_loop_holds_the_gil(tmp_path: Path) -> None:
    """A step stuck in C code that never releases the GIL stops the watchdog thread too; the
    C-level backstop still ends the process (status 1, tracebacks on stderr) instead of leaving
    it wedged forever."""
    import subprocess
    import sys

    script = """
import asyncio
from worker._loop import LoopThread, LoopWatchdog
lt = LoopThread()
LoopWatchdog(lt, limit_s=0.5, grace_s=0.5, on_wedged=lambda task, s: None, backstop_s=2.0)
async def hold_the_gil():
    return sum(range(10**15))  # one C call: no bytecode boundary, the GIL never released
lt.run(hold_the_gil())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert b"Timeout (0:00:02)!" in done.stderr


def test_step_stuck_in_a_c_call_ends_a_solo_worker_whose_restart_finishes_the_batch(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path
) -> None:
    """Solo pool (no pool to replace a child): the stuck run's `timeout` record is stored, the
    worker exits with status 70, and once it is started again (as a supervisor would) the
    unacknowledged message comes back after the visibility timeout: its other runs are scored
    and the stuck run is not run again."""
    scores_path = tmp_path / "scores.jsonl"
    first = _start(started, redis_url, tmp_path, {}, pool="solo")
    send(redis_url, mixed_batch("sleep_forever", "solo-sleepy"))
    assert wait_for(lambda: first.proc.poll() is not None, 60), first.text()[-3000:]
    assert first.proc.returncode == 70
    (recorded,) = read_scores(scores_path)
    assert recorded["scorer_id"] == "sleep_forever"
    assert recorded["error_type"] == "timeout"

    second = WorkerProcess("limits-again", redis_url, tmp_path, scores_path=scores_path, env=LIMITS, pool="solo")
    started.append(second)
    second.wait_ready()
    send(redis_url, batch(range(10, 14), ["length"], salt="after-solo-sleepy"))
    _check(second, scores_path, "sleep_forever", "timeout")
    assert "already_scored" in second.text()


class _MovingLoop:
    """A loop thread that looks blocked but is in a different task each time it is asked (its
    step returns between the watchdog's reads): the race of review finding 6, made certain."""

    def __init__(self) -> None:
        import os

        self.pid = os.getpid()
        self.beat = 0.0
        self.reads = 0
        self.interrupts = 0
        self.tasks: list[object] = [object(), object()]

    def alive(self) -> bool:
        return True

    def blocked_for(self) -> float:
        return 100.0

    def current_task(self) -> object:
        self.reads += 1
        return self.tasks[self.reads % 2]

    def interrupt(self) -> bool:
        self.interrupts += 1
        return True

    def cancel_interrupt(self) -> None:
        pass


def test_watchdog_never_fires_into_a_loop_that_moved_on() -> None:
    """The watchdog re-reads the current task right before raising: when the blocked step has
    returned meanwhile (another task runs now), it does not fire its exception into that one."""
    from worker._loop import LoopWatchdog

    moving = _MovingLoop()
    wedged: list[object] = []
    watchdog = LoopWatchdog(
        moving,  # type: ignore[arg-type]
        limit_s=0.1,
        grace_s=0.1,
        on_wedged=lambda task, s: wedged.append(task),
        can_interrupt=lambda task: True,
    )
    try:
        assert wait_for(lambda: moving.reads >= 20, 10)
    finally:
        watchdog.stop()
    assert moving.interrupts == 0
    assert wedged == []


@contextmanager
def _watched_loop(name: str, **limits: Any) -> Iterator[tuple[Any, Any, list[object]]]:
    """A real loop thread under a ``LoopWatchdog`` (``limits``: its keyword arguments), and the
    list of the tasks it gave up on; both stopped at the end."""
    from worker._loop import LoopThread, LoopWatchdog

    lt = LoopThread(name=name)
    wedged: list[object] = []
    watchdog = LoopWatchdog(lt, on_wedged=lambda task, s: wedged.append(task), **limits)
    try:
        yield lt, watchdog, wedged
    finally:
        watchdog.stop()
        lt.stop()


def test_runs_blocking_one_after_another_each_get_their_own_limit() -> None:
    """A run blocked past the limit is interrupted; the next run's step can start before the
    loop's heartbeat turns (it is woken first). The watchdog counted that as one block since the
    first run began: it saw no turn within the grace period and declared the loop wedged, blaming
    the run that had ended (`tracescore score` then ended with LoopWedgedError, its work lost;
    a worker would have been replaced). Each run gets its own limit and its own interrupt."""
    import asyncio
    import time

    from worker._loop import LoopBlockedError

    outcomes: list[str] = []

    async def runs() -> None:
        gate = asyncio.Semaphore(1)

        async def blocking() -> None:
            async with gate:
                try:
                    time.sleep(1.2)  # noqa: ASYNC251 -- the blocking step under test: the interrupt lands when it returns
                    outcomes.append("returned")
                except LoopBlockedError:
                    outcomes.append("interrupted")

        await asyncio.gather(blocking(), blocking())

    with _watched_loop("test-two-blocking-runs", limit_s=0.5, grace_s=1.5) as (lt, watchdog, wedged):
        lt.run(runs(), timeout=30)
        assert wait_for(lambda: watchdog.interrupted == 2, 5)  # counted on the watchdog's thread
    assert outcomes == ["interrupted", "interrupted"]
    assert wedged == []


def test_a_loop_kept_blocked_by_short_steps_one_after_another_is_interrupted() -> None:
    """Each task blocking the loop gets its own limit, but the loop as a whole has a few: eight
    steps of 0.8 s in a row under a 1 s limit kept the heartbeat silent for 12 s with no action
    (the liveness probe would then replace the whole worker)."""
    import asyncio
    import time

    from worker._loop import LOOP_BLOCK_LIMITS, LoopBlockedError, for_the_loops_limit

    outcomes: list[str] = []

    async def steps() -> None:
        gate = asyncio.Semaphore(1)

        async def short() -> None:
            async with gate:
                try:
                    time.sleep(0.8)  # noqa: ASYNC251 -- a blocking step under the limit, on purpose
                    outcomes.append("returned")
                except LoopBlockedError:
                    # Fired for the loop's limit, not the step's own: its record says so.
                    outcomes.append("interrupted" if for_the_loops_limit(asyncio.current_task()) else "own limit?")

        await asyncio.gather(*(short() for _ in range(8)))

    with _watched_loop("test-short-steps", limit_s=1.0, grace_s=3.0) as (lt, watchdog, wedged):
        lt.run(steps(), timeout=60)
        assert wait_for(lambda: watchdog.interrupted >= 1, 5)
    assert "interrupted" in outcomes
    # The first steps, within the loop's limit, ran to their end.
    assert outcomes[: LOOP_BLOCK_LIMITS - 1] == ["returned"] * (LOOP_BLOCK_LIMITS - 1)
    assert wedged == []


def test_the_loops_limit_does_not_give_up_on_a_process_for_a_step_under_its_own() -> None:
    """Past the loop's limit the watchdog acts on whatever task is current; one that is not a
    run (it cannot take the exception) went straight to on_wedged, and a worker would have been
    replaced though no step came near the run limit. It gets the grace period first."""
    import asyncio
    import time

    runs: set[object] = set()

    async def steps() -> None:
        gate = asyncio.Lock()

        async def step(is_run: bool, seconds: float) -> None:
            if is_run:
                runs.add(asyncio.current_task())
            async with gate:
                time.sleep(seconds)  # noqa: ASYNC251 -- blocking steps under the limit, on purpose

        await asyncio.gather(*(step(True, 0.7) for _ in range(3)), *(step(False, 0.9) for _ in range(2)))

    limits: dict[str, Any] = {"limit_s": 1.0, "grace_s": 3.0, "can_interrupt": lambda task: task in runs}
    with _watched_loop("test-bookkeeping", **limits) as (lt, _, wedged):
        lt.run(steps(), timeout=60)
        assert wait_for(lambda: lt.blocked_for() == 0.0, 5)  # turning again, with nobody given up on
    assert wedged == []


def test_the_watchdogs_exception_in_a_run_it_did_not_target_is_not_a_timeout() -> None:
    """LoopBlockedError that lands in a run the watchdog did not fire at (the targeted step
    returned just before) is no timeout of that run: retryable, retried on a non-final attempt
    (it used to be a final `timeout` record)."""
    import asyncio

    from scorers import create_scorer
    from tests.worker._batches import batch
    from worker._loop import LoopBlockedError
    from worker._scoring import ScoringDeps, score_batch
    from worker.store import MemoryScoreStore

    def hit_by_mistake(run: Any) -> float:
        raise LoopBlockedError

    scorer = create_scorer("innocent", type="agent").generate_score(hit_by_mistake)
    store = MemoryScoreStore()
    deps = ScoringDeps(registry={"innocent": scorer}, store=store, run_timeout_s=30)
    report = asyncio.run(score_batch(batch(range(1), ["innocent"], salt="mistake"), deps, final_attempt=False))
    assert len(report.retry) == 1
    assert store.records == {}
    report = asyncio.run(score_batch(batch(range(1), ["innocent"], salt="mistake"), deps, final_attempt=True))
    (record,) = store.records.values()
    assert record.error_type != "timeout"
    assert record.retryable


def test_a_loop_stopped_mid_work_cancels_and_finishes_its_tasks_first() -> None:
    """Ctrl-C during `tracescore score` stopped the loop with its runs' tasks pending: each was
    printed as "Task was destroyed but it is pending!", and its cleanup as "Event loop is
    closed". The tasks are cancelled and run their cleanup before the loop closes."""
    import asyncio
    import concurrent.futures

    from worker._loop import LoopThread

    loop_thread = LoopThread(name="test-stop")
    cleaned: list[str] = []
    children: list[asyncio.Task[None]] = []

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("child")

    async def batch() -> None:
        children.append(asyncio.ensure_future(stuck()))
        await asyncio.gather(*children)

    waiting = asyncio.run_coroutine_threadsafe(batch(), loop_thread.loop)
    assert wait_for(lambda: bool(children), 10)
    waiting.cancel()  # what the interrupted caller does (LoopThread.run on KeyboardInterrupt)
    loop_thread.stop()
    assert loop_thread.loop.is_closed()
    assert children[0].cancelled()
    assert cleaned == ["child"]
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(0)
