"""One asyncio event loop per worker process, in a background thread, for ordinary Celery tasks.

Celery has no native ``async def`` tasks; a task hands its coroutine to this loop with
``run_coro`` and waits. All tasks of a process share the loop, so the judge clients, Redis
connections and semaphores on it are shared too. Fork safety: the loop belongs to the
process that created it; a forked child (prefork pool) gets a fresh one on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "get_loop_thread", "run_coro", "stop_loop"]

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str = "tracescore-loop") -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it. On timeout (``TimeoutError``) or when the
        waiting thread is interrupted (e.g. Celery's soft time limit), the coroutine is cancelled."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"coroutine did not finish within {timeout} s; it was cancelled") from None
        except BaseException:
            future.cancel()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


_lock = threading.Lock()
_current: LoopThread | None = None


def get_loop_thread() -> LoopThread:
    """This process's loop thread, started on first use (again in a forked child)."""
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid():
            _current = LoopThread()
        return _current


def run_coro(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on this process's loop thread from synchronous code; see ``LoopThread.run``."""
    return get_loop_thread().run(coro, timeout)


def stop_loop() -> None:
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None and current.pid == os.getpid():
        current.stop()
