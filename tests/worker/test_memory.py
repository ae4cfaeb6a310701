"""TRACESCORE_MEMORY_LIMIT_MB on real ``celery -A worker worker`` processes (DB 11): the worker
watches its resident memory (RSS), not its address space.

An address-space cap (RLIMIT_AS) misfires on the threads pool: glibc reserves a 64 MiB malloc
arena per thread, so a cap fails allocations far below its size in real memory, and the
MemoryError lands wherever the next allocation happens to be.
"""

from __future__ import annotations

from pathlib import Path

from tests.worker._batches import batch, mixed_batch, send
from tests.worker._fault_workers import LIMITS, FaultWorker
from tests.worker._workers import WorkerProcess, read_scores, wait_for


def test_a_large_run_under_the_limit_is_scored_on_the_threads_pool(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path
) -> None:
    """8 threads, a 1024 MB limit, two runs holding 300 MB of real memory each: they are scored, as are their
    neighbours. (As an address-space cap the limit was mostly taken by the threads' arenas:
    the run failed as `memory` far below 1 GB of real memory.)"""
    worker = FaultWorker(
        "threads-mem",
        redis_url,
        tmp_path,
        env={**LIMITS, "TRACESCORE_MEMORY_LIMIT_MB": "1024"},
        pool="threads",
        concurrency=8,
    )
    started.append(worker)
    worker.wait_ready()
    big = batch(range(2), ["ballast"], salt="ballast")
    send(redis_url, big, batch(range(10, 16), ["length"], salt="beside-ballast"))
    scores_path = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores_path)) >= 8, 90), worker.text()[-4000:]
    scores = read_scores(scores_path)
    assert len({s["score_id"] for s in scores}) == 8
    assert [s for s in scores if s["error_type"]] == [], worker.text()[-3000:]
    assert sorted(s["score"] for s in scores if s["scorer_id"] == "ballast") == [1.0, 1.0]
    assert worker.proc.poll() is None


def test_a_run_past_the_limit_is_a_memory_record_and_its_process_is_replaced(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path
) -> None:
    """A step allocating without end: once the process's RSS passes the limit, the run is
    recorded as `memory`, the pool child exits and is replaced, the redelivered message scores
    its other runs once, and the worker goes on with the next batch."""
    worker = FaultWorker(
        "prefork-mem",
        redis_url,
        tmp_path,
        env={**LIMITS, "TRACESCORE_MEMORY_LIMIT_MB": "512"},
        pool="prefork",
        concurrency=1,
    )
    started.append(worker)
    worker.wait_ready()
    send(redis_url, mixed_batch("hog", "mem"), batch(range(10, 14), ["length"], salt="after-mem"))
    scores_path = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores_path)) >= 8, 90), worker.text()[-4000:]
    scores = read_scores(scores_path)
    assert len(scores) == 8, scores
    assert len({s["score_id"] for s in scores}) == 8
    (failed,) = [s for s in scores if s["error_type"]]
    assert failed["scorer_id"] == "hog"
    assert failed["error_type"] == "memory"
    assert "TRACESCORE_MEMORY_LIMIT_MB" in failed["error_message"]
    # logged after the record is written and flushed: it may trail the scores file
    assert wait_for(lambda: "worker_memory_limit_exiting" in worker.text(), 30), worker.text()[-3000:]
    (exiting,) = [line for line in worker.text().splitlines() if "worker_memory_limit_exiting" in line]
    # The allocating step was stopped before the record was stored, and the child exited by
    # itself. (Left allocating, it starved the recording thread of the GIL and grew to 7 GB
    # until Celery's hard time limit SIGKILLed it.)
    assert "loop_stopped=True" in exiting, exiting
    assert wait_for(lambda: "exited with 'exitcode 70'" in worker.text(), 10), worker.text()[-3000:]
    assert worker.proc.poll() is None


def test_a_threads_worker_past_the_limit_exits_and_its_restart_scores_the_rest_once(
    started: list[WorkerProcess], redis_url: str, tmp_path: Path
) -> None:
    """Threads pool: one event loop serves every thread, and no pool replaces the process. Past
    the limit the loop is stopped, the run's `memory` record stored and the worker exits with
    status 70; started again (as a supervisor would), the unacknowledged message comes back after
    the visibility timeout: its other runs are scored once, the allocating run is not run again."""
    env = {**LIMITS, "TRACESCORE_MEMORY_LIMIT_MB": "512"}
    first = FaultWorker("threads-mem-past", redis_url, tmp_path, env=env, pool="threads", concurrency=4)
    started.append(first)
    first.wait_ready()
    send(redis_url, mixed_batch("hog", "threads-mem"))
    assert wait_for(lambda: first.proc.poll() is not None, 60), first.text()[-3000:]
    assert first.proc.returncode == 70, first.text()[-3000:]
    assert "loop_stopped=True" in first.text(), first.text()[-3000:]

    second = FaultWorker("threads-mem-again", redis_url, tmp_path, env=env, pool="threads", concurrency=4)
    started.append(second)
    second.wait_ready()
    send(redis_url, batch(range(10, 14), ["length"], salt="after-threads-mem"))
    scores_path = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores_path)) >= 8, 90), second.text()[-4000:]
    scores = read_scores(scores_path)
    assert len(scores) == 8, scores
    assert len({s["score_id"] for s in scores}) == 8
    (failed,) = [s for s in scores if s["error_type"]]
    assert (failed["scorer_id"], failed["error_type"]) == ("hog", "memory")
    assert sorted(s["scorer_id"] for s in scores if not s["error_type"]) == ["length"] * 7
    assert "already_scored" in second.text()  # the redelivered hog run was skipped, not run again
    assert second.proc.poll() is None


def test_halting_the_loop_ends_a_step_that_swallows_every_exception_and_leaves_its_work_unfinished() -> None:
    """``LoopThread.halt`` (the memory limit's first move) ends the loop thread inside a step
    that catches every ``Exception``; the coroutine waiting on it is not completed, so the
    batch it belongs to is neither acknowledged nor failed: the broker redelivers it."""
    import asyncio
    import gc
    import threading

    from worker._loop import LoopThread

    started = threading.Event()

    async def stubborn() -> None:
        while True:
            try:
                started.set()
                sum(range(10_000))
            except Exception:
                continue

    lt = LoopThread()
    future = asyncio.run_coroutine_threadsafe(stubborn(), lt.loop)
    try:
        assert started.wait(10)
        assert lt.halt(10.0)
        assert not lt.alive()
        assert not future.done()
    finally:
        if not lt.halt(10.0):
            raise AssertionError("the loop thread is still running")
        lt.loop.close()
        # The halted task logs "exception never retrieved" when collected: here, not inside
        # some later compile (CPython 3.11.7 raises SystemError for a finalizer run there).
        del future
        gc.collect()
