"""SIGTERM's handlers do nothing that takes a lock: a signal handler runs on the main thread
between two bytecodes, maybe while that thread holds structlog's write lock (a non-reentrant
``threading.Lock``) in the middle of a log line; a handler logging there would wait for itself
forever. Each case runs in a fresh interpreter (a shutdown, once begun, is for the life of its
process) that holds the write lock while the signal arrives."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PRELUDE = """
import os, signal, sys, threading, time
import structlog
from structlog._output import _get_lock_for_file
from worker import _app, _loop, _task

def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True

write_lock = _get_lock_for_file(sys.stderr)  # where the logs go

def relay_done():
    # whatever the handler handed to the signal relay has run (its calls run in order)
    done = threading.Event()
    _loop.call_from_signal_handler(done.set)
    return done.wait(10)
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    script = _PRELUDE + textwrap.dedent(body)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process hung (deadlocked in its signal handler): {exc.stdout!r}") from None


def test_the_workers_sigterm_handler_logs_from_a_thread_not_inside_the_handler() -> None:
    """Celery's SIGTERM handler sends worker_shutting_down; ours starts the grace period and
    logs worker_draining. With the main thread holding the log's write lock it returns at once
    (the shutdown is already under way: no new work), and the line is written once the lock is free."""
    result = _run("""
        class Settings:
            shutdown_grace_seconds = 30.0
            shutdown_cleanup_seconds = 10.0

        class App:
            settings = Settings()

        class Controller:
            app = App()
            pool = None

        _app._controller = Controller()
        _loop.start_signal_relay()  # as the worker does when it starts
        signal.signal(signal.SIGTERM, lambda *_: _app._begin_grace_period(sig="SIGTERM", how="Warm"))
        with write_lock:  # the main thread is writing a log line when SIGTERM lands
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs at one of these bytecodes
                pass
            assert _loop.shutting_down()
            print("handler returned", file=sys.stderr, flush=True)
        assert wait_for(lambda: _loop._process_drain().begun.is_set())
        assert relay_done()  # the begun flag is set in the handler; the log line comes after, on the relay
        sys.stderr.flush()
    """)
    assert result.returncode == 0, result.stderr
    assert "handler returned" in result.stderr
    assert "worker_draining" in result.stderr
    assert "grace_s=30.0" in result.stderr


def test_a_prefork_childs_drain_handler_starts_the_grace_period_from_a_thread() -> None:
    """A prefork child's drain signal (its parent got SIGTERM) with no grace (a cold shutdown)
    cancels the running coroutine; its shutdown_grace_expired line is written from a thread."""
    result = _run("""
        import asyncio, threading

        _loop.install_drain_handler(_task.DRAIN_SIGNAL, 0.0)
        started = threading.Event()
        outcome = []

        async def scoring():
            started.set()
            await asyncio.sleep(60)

        def run():
            try:
                _loop.run_draining(scoring())
            except _loop.GraceExpired:
                outcome.append("cancelled")

        thread = threading.Thread(target=run)
        thread.start()
        assert started.wait(10)
        with write_lock:
            os.kill(os.getpid(), _task.DRAIN_SIGNAL)
            for _ in range(1000):
                pass
            assert _loop.shutting_down()
            print("handler returned", file=sys.stderr, flush=True)
        thread.join(10)
        assert outcome == ["cancelled"], outcome
        assert relay_done()
        sys.stderr.flush()
    """)
    assert result.returncode == 0, result.stderr
    assert "handler returned" in result.stderr
    assert "shutdown_grace_expired" in result.stderr
