"""One asyncio event loop per worker process, in a background thread, for ordinary Celery tasks.

Celery has no native ``async def`` tasks; a task hands its coroutine to this loop with
``run_coro`` and waits. All tasks of a process share the loop, so the judge clients, Redis
connections and semaphores on it are shared too. Fork safety: the loop belongs to the
process that created it; a forked child (prefork pool) gets a fresh one on first use.

A scorer step that never returns without awaiting (a sync step, or an async one stuck in a
CPU loop) blocks the loop, and with it every batch of the process. ``LoopWatchdog`` notices
(the loop's heartbeat stops), raises ``LoopBlockedError`` inside the blocking code, and when
that cannot end it (a C call that never returns, a step that swallows the error) hands over
to ``on_wedged``, which records what it can and ends the process so the pool replaces it and
the broker redelivers its unacknowledged messages. While the loop turns, the watchdog also
rewrites this process's heartbeat file (``worker._heartbeat``), which liveness probes read.

SIGTERM's grace period lives here too (``begin_shutdown``): a coroutine run with
``run_draining`` may finish within it; when it ends, the coroutine is cancelled (a scoring batch
then releases its unfinished claims) and its waiter gets ``GraceExpired``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import faulthandler
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

from worker import _heartbeat as probe_files
from worker._errors import LoopBlockedError, caused_by

__all__ = [
    "EXIT_ALLOWANCE_S",
    "WATCHDOG_GRACE_S",
    "GraceExpired",
    "LoopBlockedError",
    "LoopThread",
    "LoopWatchdog",
    "begin_shutdown",
    "call_from_signal_handler",
    "cleanup_deadline",
    "for_the_loops_limit",
    "get_loop_thread",
    "halt_loop",
    "halting",
    "install_drain_handler",
    "request_shutdown",
    "resident_bytes",
    "run_coro",
    "run_draining",
    "shutting_down",
    "start_signal_relay",
    "start_watchdog",
    "stop_loop",
    "was_targeted",
    "within_cleanup",
]

T = TypeVar("T")

log = structlog.get_logger("tracescore.worker.loop")

HEARTBEAT_S = 0.2
# After interrupting a blocked step, how long the watchdog waits for the loop to turn again
# before it gives up on the process.
WATCHDOG_GRACE_S = 3.0
# The loop counts as turning (for the heartbeat file) if it beat within this long.
LIVE_BEAT_S = 1.0
# Each task blocking the loop has the run limit from when the watchdog first saw it; the loop as
# a whole, this many limits (then whatever blocks it is interrupted).
LOOP_BLOCK_LIMITS = 3


class _LoopHalted(SystemExit):
    """Ends the loop thread (``LoopThread.halt``). A SystemExit, because asyncio lets only
    SystemExit and KeyboardInterrupt out of a task and out of ``run_forever``: any other
    exception would be stored in the running task and the loop would go on."""


class _LoopAbandoned(_LoopHalted):
    """Ends the loop for good, its tasks left as they stand (``LoopThread.abandon``)."""


def halting(exc: BaseException) -> bool:
    """Whether ``exc`` is ``LoopThread.halt`` ending the loop thread, or raised while handling
    it (a step that caught the halt and called ``sys.exit``): not a task's own exit."""
    return caused_by(exc, _LoopHalted) is not None


class LoopThread:
    """An event loop running forever in a daemon thread, with a heartbeat the watchdog reads."""

    def __init__(self, name: str = "tracescore-loop") -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.beat = time.monotonic()
        self._abandoned: set[asyncio.Task[Any]] = set()  # (``abandon``: what its thread holds)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._heartbeat)
        while True:
            try:
                self.loop.run_forever()
                return
            except SystemExit as exc:
                halt = caused_by(exc, _LoopHalted)
                if isinstance(halt, _LoopAbandoned):
                    # Held for good: garbage-collected, a task's coroutine would run its cleanup
                    # code (as a cancelled one does: store what finished, release claims).
                    self._abandoned = asyncio.all_tasks(self.loop)
                    threading.Event().wait()
                if halt is not None:
                    return
                # A task's own (a scorer step's is its run's StepExitError): asyncio has stored it
                # in the task, so its waiter gets it; the loop goes on serving everyone else.
                log.warning("loop_task_exited", code=exc.code if isinstance(exc.code, int) else None)
            except LoopBlockedError:
                # Delivered just after the blocking code returned, into the loop's own code:
                # the callback it hit is lost (maybe the heartbeat: start another), the loop
                # itself is fine; keep it running.
                log.warning("loop_interrupt_missed_its_step")
                self.loop.call_soon(self._heartbeat)

    def _heartbeat(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(HEARTBEAT_S, self._heartbeat)

    @property
    def thread_id(self) -> int | None:
        return self._thread.ident

    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def blocked_for(self) -> float:
        """Seconds the loop has been stuck in one callback (0 while it keeps turning)."""
        return max(0.0, time.monotonic() - self.beat - HEARTBEAT_S)

    def interrupt(self) -> bool:
        """Raise ``LoopBlockedError`` in the loop thread at its next Python instruction (a C call
        in progress is not interrupted). True if the exception was scheduled."""
        return self._thread.is_alive() and self._raise_in_thread(LoopBlockedError)

    def halt(self, timeout_s: float) -> bool:
        """Stop the loop thread for good at its next Python instruction, whatever runs there,
        and wait up to ``timeout_s`` for it to end. True if it ended. For a process about to
        exit: its pending work is left for the broker to redeliver."""
        if self._thread.is_alive() and self._raise_in_thread(_LoopHalted):
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def abandon(self) -> None:
        """Stop the loop for good at its next Python instruction (one stuck in a C call: once it
        returns), leaving its tasks as they stand: never resumed, cancelled nor finalized (their
        cleanup would go on storing and writing what the caller does again elsewhere). The thread
        then waits, holding them, until the process ends (a daemon, it does not keep it alive)."""
        self._raise_in_thread(_LoopAbandoned)

    def cancel_interrupt(self) -> None:
        self._raise_in_thread(None)

    def _raise_in_thread(self, exc_type: type[BaseException] | None) -> bool:
        """Schedule ``exc_type`` in the loop thread (None withdraws one scheduled); True if set."""
        ident = self._thread.ident
        if ident is None:
            return False
        exc = ctypes.py_object(exc_type) if exc_type is not None else None
        return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)) == 1

    def current_task(self) -> asyncio.Task[Any] | None:
        """The task the loop is running now (for the watchdog: the loop is stuck inside it)."""
        try:
            return asyncio.current_task(self.loop)
        except RuntimeError:
            return None

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

    def settle(self, timeout: float = 5.0) -> None:
        """Wait for what still runs on the loop to end by itself (a batch cancelled by a Ctrl-C
        still records the runs it finished), at most ``timeout``; then cancel the rest. The loop
        goes on running."""
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        ended = asyncio.run_coroutine_threadsafe(_end_the_rest(timeout / 2), self.loop)
        try:
            ended.result(timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            ended.cancel()  # a wedged loop: stop() deals with it

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop and let it finish (as ``asyncio.run`` does), then
        stop and close it. Closed with tasks pending (a Ctrl-C mid-batch), each printed "Task
        was destroyed but it is pending!" and their cleanup "Event loop is closed"."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            ended = asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self.loop)
            try:
                ended.result(timeout / 2)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                ended.cancel()  # a wedged loop: stop it anyway
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def _end_the_rest(wait_s: float) -> None:
    """Let every other task of the running loop end within ``wait_s``, then cancel those left."""
    this = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not this]
    if rest:
        _, left = await asyncio.wait(rest, timeout=wait_s)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    this = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not this]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


OnWedged = Callable[[asyncio.Task[Any] | None, float], None]

# The tasks a watchdog fired LoopBlockedError at (weak: a finished task drops out by itself),
# and of those, the ones fired at for the loop's limit rather than their own.
_targeted: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
_for_the_loop: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def was_targeted(task: asyncio.Task[Any] | None) -> bool:
    """True (once) when the watchdog fired its ``LoopBlockedError`` at ``task``."""
    if task is None or task not in _targeted:
        return False
    _targeted.discard(task)
    return True


def for_the_loops_limit(task: asyncio.Task[Any] | None) -> bool:
    """True (once) when the watchdog fired at ``task`` for the loop's limit (``LOOP_BLOCK_LIMITS``
    run limits without a turn), the task itself being under its own."""
    if task is None or task not in _for_the_loop:
        return False
    _for_the_loop.discard(task)
    return True


class LoopWatchdog:
    """Watches one ``LoopThread``: blocked longer than ``limit_s`` → interrupt the blocking code;
    still blocked ``grace_s`` later → ``on_wedged(task, blocked_s)`` (which should end the process).
    With ``rss_limit_bytes``, resident memory over it → ``on_memory(task, rss_mb)`` (likewise).

    ``can_interrupt(task)`` says whether the task the loop is stuck in may take the exception
    (a scorer run does: its error becomes the run's error record); otherwise the watchdog goes
    straight to ``on_wedged``. With ``backstop_s`` a C-level timer (``faulthandler``) ends the
    process if this thread itself cannot run for that long (a C call holding the GIL)."""

    def __init__(
        self,
        loop_thread: LoopThread,
        *,
        limit_s: float,
        on_wedged: OnWedged,
        can_interrupt: Callable[[asyncio.Task[Any] | None], bool] = lambda task: task is not None,
        grace_s: float = WATCHDOG_GRACE_S,
        backstop_s: float | None = None,
        rss_limit_bytes: int = 0,
        on_memory: OnWedged | None = None,
    ) -> None:
        self.loop_thread = loop_thread
        self.limit_s = limit_s
        self.grace_s = grace_s
        self._on_wedged = on_wedged
        self._rss_limit = rss_limit_bytes if on_memory is not None and resident_bytes() is not None else 0
        self._on_memory = on_memory
        self._can_interrupt = can_interrupt
        self._backstop_s = backstop_s
        self._armed_at = 0.0
        # The task the loop was last seen in, and since when: a loop blocked in one run after
        # another (the next run's step starting before the heartbeat could turn) gives each run
        # its own limit, and the wedge is never blamed on a run that has ended.
        self._task: asyncio.Task[Any] | None = None
        self._task_since = 0.0
        self.interrupted = 0  # blocked steps ended by the exception (for logs and tests)
        self._file_beat_at = 0.0
        self._stop = threading.Event()
        self._arm_backstop()  # now: the loop may take the GIL before this thread first runs
        self._thread = threading.Thread(target=self._watch, name="tracescore-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._backstop_s is not None:
            faulthandler.cancel_dump_traceback_later()
        probe_files.clear(probe_files.loop_file())

    def _beat_file(self, lt: LoopThread) -> None:
        now = time.monotonic()
        if lt.blocked_for() < LIVE_BEAT_S and now - self._file_beat_at >= LIVE_BEAT_S:
            probe_files.beat(probe_files.loop_file())
            self._file_beat_at = now

    def _arm_backstop(self) -> None:
        now = time.monotonic()
        if self._backstop_s is not None and now - self._armed_at >= 1.0:
            try:
                faulthandler.dump_traceback_later(self._backstop_s, exit=True)
            except (AttributeError, OSError, RuntimeError, ValueError):
                # stderr is not a real file (redirected to a logger): no backstop, the watchdog
                # itself must not die of it.
                log.warning("loop_backstop_unavailable", exc_info=True)
                self._backstop_s = None
            self._armed_at = now

    def _watch(self) -> None:
        interval = min(0.25, self.limit_s / 4)
        if self._rss_limit:
            # A step allocating in a loop can add a few hundred MB per 0.25 s.
            interval = min(interval, MEMORY_CHECK_S)
        while not self._stop.wait(interval):
            lt = self.loop_thread
            if not lt.alive() or lt.pid != os.getpid():
                return
            self._beat_file(lt)
            if self._rss_limit and self._on_memory is not None:
                rss = resident_bytes() or 0
                if rss > self._rss_limit:
                    # The loop is stuck in the allocating step (a sync one) or between steps:
                    # its current task, if any, is the run to blame.
                    self._on_memory(lt.current_task(), rss / 2**20)
                    return
            # A run's own limit; and the loop's, at a few times it, for a loop that never turns
            # because one short blocking step follows another (each under the limit).
            over_own = self._blocked_in_task(lt) >= self.limit_s
            loop_limit = LOOP_BLOCK_LIMITS * self.limit_s
            if not over_own and lt.blocked_for() < loop_limit:
                self._arm_backstop()
                continue
            beat = lt.beat
            task = lt.current_task()
            if lt.beat != beat or lt.current_task() is not task:
                # The step returned while we looked: the loop moved on, and an exception fired
                # now would land in whatever runs next.
                continue
            if self._can_interrupt(task) and self._interrupt(lt, task, beat, for_the_loop=not over_own):
                self.interrupted += 1
                continue
            if not over_own and lt.blocked_for() < loop_limit + self.grace_s:
                # Under its own limit and not a run (bookkeeping, a callback): the loop is given
                # the grace period before the process is given up on.
                continue
            if self._stop.is_set():
                return
            self._on_wedged(task, lt.blocked_for())
            return

    def _blocked_in_task(self, lt: LoopThread) -> float:
        """How long the loop has been blocked, counted from when its current task began to be
        seen if that is later (a task seen first, from the watchdog's reads)."""
        now = time.monotonic()
        task = lt.current_task()
        if task is not self._task:
            self._task, self._task_since = task, now
        return min(lt.blocked_for(), now - self._task_since)

    def _interrupt(
        self, lt: LoopThread, task: asyncio.Task[Any] | None, stuck_since: float, *, for_the_loop: bool = False
    ) -> bool:
        """True if the loop turned again within the grace period after the interrupt."""
        if task is not None:
            _targeted.add(task)
            if for_the_loop:
                _for_the_loop.add(task)
        if lt.beat != stuck_since or lt.current_task() is not task:  # moved on just now
            if task is not None:
                _targeted.discard(task)
            return True
        if not lt.interrupt():
            if task is not None:
                _targeted.discard(task)
            return False
        log.warning("loop_blocked_interrupting", blocked_s=round(self._blocked_in_task(lt), 1), limit_s=self.limit_s)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and not self._stop.is_set():
            # The loop turned, or the interrupted step ended and another task runs already.
            if lt.beat != stuck_since or lt.current_task() is not task:
                return True
            time.sleep(0.02)
        if lt.beat != stuck_since or lt.current_task() is not task:
            return True
        # Not delivered (a C call): withdraw it, or it would fire later in whatever runs then.
        lt.cancel_interrupt()
        if task is not None:
            _targeted.discard(task)
        return False


def resident_bytes() -> int | None:
    """This process's resident memory (RSS), from ``/proc/self/statm``; None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MEMORY_CHECK_S = 0.05

_lock = threading.Lock()
_current: LoopThread | None = None
_watchdog: LoopWatchdog | None = None


def get_loop_thread() -> LoopThread:
    """This process's loop thread, started on first use (again in a forked child)."""
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid():
            _current = LoopThread()
        return _current


def halt_loop(timeout_s: float) -> bool:
    """``LoopThread.halt`` on this process's loop thread, if it has one (True if none runs)."""
    current = _current
    if current is None or current.pid != os.getpid():
        return True
    return current.halt(timeout_s)


def start_watchdog(
    limit_s: float,
    on_wedged: OnWedged,
    *,
    can_interrupt: Callable[[asyncio.Task[Any] | None], bool] = lambda task: task is not None,
    grace_s: float = WATCHDOG_GRACE_S,
    rss_limit_bytes: int = 0,
    on_memory: OnWedged | None = None,
) -> LoopWatchdog:
    """Watch this process's loop (one watchdog per process; a second call replaces the first).

    The C-level backstop is armed only when nobody else uses ``faulthandler``'s timer (pytest
    and ``PYTHONFAULTHANDLER`` turn faulthandler on; their own timeouts must stay theirs)."""
    global _watchdog
    loop_thread = get_loop_thread()
    with _lock:
        if _watchdog is not None:
            _watchdog.stop()
        _watchdog = LoopWatchdog(
            loop_thread,
            limit_s=limit_s,
            on_wedged=on_wedged,
            can_interrupt=can_interrupt,
            grace_s=grace_s,
            # Well after the watchdog's own turn (and its recording of the run) would have come.
            backstop_s=None if faulthandler.is_enabled() else limit_s + grace_s + 60.0,
            rss_limit_bytes=rss_limit_bytes,
            on_memory=on_memory,
        )
        return _watchdog


def run_coro(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on this process's loop thread from synchronous code; see ``LoopThread.run``."""
    return get_loop_thread().run(coro, timeout)


def stop_loop() -> None:
    global _current, _watchdog
    with _lock:
        current, _current = _current, None
        watchdog, _watchdog = _watchdog, None
    if watchdog is not None:
        watchdog.stop()
    if current is not None and current.pid == os.getpid():
        current.stop()


# --- SIGTERM's grace period ---------------------------------------------------------------------

# After the grace period's cancel, how long a waiter gives the coroutine to clean up (release
# its claims) before it stops waiting anyway (never past the shutdown's cleanup deadline).
CLEANUP_S = 5.0
# The default of TRACESCORE_SHUTDOWN_CLEANUP_SECONDS (worker._settings), for callers without settings.
DEFAULT_CLEANUP_S = 10.0
# Past the cleanup deadline: Celery's own teardown (a prefork pool joining its children) and
# the interpreter's exit. The platform's kill timer must leave grace + cleanup + this.
EXIT_ALLOWANCE_S = 5.0
_WAIT_SLICE_S = 0.2


class GraceExpired(Exception):
    """The shutdown grace period ended while ``run_draining``'s coroutine ran: it was cancelled
    (its own cleanup ran, unless that took longer than ``CLEANUP_S``)."""


class _Drain:
    """This process's shutdown: when it began, whether its grace period ran out, and the
    coroutines (as loop tasks) to cancel when it does."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.RLock()
        # Set by a signal handler (a plain attribute: no lock there); the grace period itself
        # starts on the signal relay's thread.
        self.requested = False
        self.begun = threading.Event()
        self.begun_at = 0.0
        self.grace_s = 0.0
        self.cleanup_s = DEFAULT_CLEANUP_S
        self.expired = threading.Event()
        self.tasks: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = set()
        self.timer: threading.Timer | None = None

    def expire(self) -> None:
        with self.lock:
            self.expired.set()
            tasks = list(self.tasks)
        for loop, task in tasks:
            # RuntimeError: the loop is closed, nothing left to cancel there
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if tasks:
            log.warning("shutdown_grace_expired", cancelled=len(tasks))


_drain = _Drain()


def _process_drain() -> _Drain:
    # No lock: request_shutdown runs in a signal handler, which may interrupt this very thread
    # while it holds one (a deadlock); a fork is the only race and the child starts single-threaded.
    global _drain
    if _drain.pid != os.getpid():  # a forked child starts with no shutdown of its own
        _drain = _Drain()
    return _drain


def begin_shutdown(grace_s: float, cleanup_s: float = DEFAULT_CLEANUP_S) -> bool:
    """Start this process's grace period: coroutines under ``run_draining`` may finish within
    ``grace_s``; then they are cancelled, and everything on the way out shares ``cleanup_s``
    (``cleanup_deadline``). False if it had already begun (a second SIGTERM)."""
    drain = _process_drain()
    with drain.lock:
        if drain.begun.is_set():
            return False
        drain.begun_at = time.monotonic()
        drain.grace_s = max(0.0, grace_s)
        drain.cleanup_s = cleanup_s
        drain.begun.set()
        if grace_s <= 0:
            drain.timer = None
        else:
            drain.timer = threading.Timer(grace_s, drain.expire)
            drain.timer.daemon = True
            drain.timer.start()
    if grace_s <= 0:
        drain.expire()
    return True


def request_shutdown() -> None:
    """From a signal handler: this process takes no new work from now on (``shutting_down``);
    ``begin_shutdown`` follows on the signal relay's thread."""
    _process_drain().requested = True


class _SignalRelay:
    """Runs what a signal handler asked for on a thread of its own. A handler runs on the main
    thread between two bytecodes, maybe while that thread holds a lock (structlog's write lock
    mid-line, one inside ``threading``): logging or starting a timer there can wait for itself
    forever. The handler only appends to a deque and writes a byte to a pipe (neither locks)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        threading.Thread(target=self._run, name="tracescore-signal-relay", daemon=True).start()

    def call(self, fn: Callable[[], None]) -> None:
        self._calls.append(fn)
        with contextlib.suppress(OSError):  # a full pipe: a wake-up is pending already
            os.write(self.write_fd, b"\0")

    def _run(self) -> None:
        while True:
            try:
                os.read(self.read_fd, 512)
            except OSError:
                return
            while self._calls:
                fn = self._calls.popleft()
                try:
                    fn()
                except Exception:
                    log.warning("signal_relay_call_failed", exc_info=True)


_relay: _SignalRelay | None = None


def start_signal_relay() -> None:
    """Start this process's signal relay (a worker's main process as it starts, a prefork child
    as it initialises); never from a signal handler (it starts a thread)."""
    global _relay
    with _lock:
        if _relay is not None and _relay.pid == os.getpid():
            return
        if _relay is not None:  # the parent's, inherited by a fork: its thread is not here
            for fd in (_relay.read_fd, _relay.write_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        _relay = _SignalRelay()


def call_from_signal_handler(fn: Callable[[], None]) -> None:
    """Run ``fn`` on this process's signal relay thread (directly where none was started: a
    process that is not a worker)."""
    relay = _relay
    if relay is None or relay.pid != os.getpid():
        fn()
        return
    relay.call(fn)


def cleanup_deadline(cleanup_s: float | None = None) -> float:
    """The ``time.monotonic()`` by which this process's way out must be done: the cleanup time
    after its grace period ended (after now, if its work ended sooner or no shutdown began).
    Every step (cancelled runs' cleanup, the drainers' flush and stop, closing connections)
    waits only until this one deadline, so the steps cannot add up past the platform's margin."""
    drain = _process_drain()
    now = time.monotonic()
    if not drain.begun.is_set():
        return now + (DEFAULT_CLEANUP_S if cleanup_s is None else cleanup_s)
    return min(drain.begun_at + drain.grace_s, now) + (drain.cleanup_s if cleanup_s is None else cleanup_s)


def within_cleanup(wait_s: float) -> float:
    """``wait_s``, cut to what is left before the cleanup deadline once this process's shutdown
    began (0 past it): a wait with a bound of its own (marking a delivery ended, handing a
    message back) still ends by the one deadline. Each such bound alone ran past it: with Redis
    refusing connections, a worker's processes marked their deliveries ended for 2 s after the
    deadline (a prefork worker then left 0.4 s before the backstop's exit 71, or by it)."""
    drain = _process_drain()
    if not drain.begun.is_set():
        return wait_s
    return max(0.0, min(wait_s, cleanup_deadline() - time.monotonic()))


def install_drain_handler(signum: int, grace_s: float, cleanup_s: float = DEFAULT_CLEANUP_S) -> None:
    """Make ``signum`` start this process's grace period (a prefork child: its main process got
    SIGTERM). Called again before each task: billiard may reset handlers after its initializer."""
    if threading.current_thread() is not threading.main_thread():
        return
    start_signal_relay()
    current = signal.getsignal(signum)
    if getattr(current, "grace_s", None) != (grace_s, cleanup_s):

        def on_signal(signum: int, frame: object) -> None:
            request_shutdown()
            call_from_signal_handler(lambda: _begin_logged(grace_s, cleanup_s))

        on_signal.grace_s = (grace_s, cleanup_s)  # type: ignore[attr-defined]
        signal.signal(signum, on_signal)


def _begin_logged(grace_s: float, cleanup_s: float) -> None:
    if begin_shutdown(grace_s, cleanup_s):
        log.info("worker_process_draining", grace_s=grace_s, cleanup_s=cleanup_s)


def shutting_down() -> bool:
    """True once this process's shutdown was asked for (take no new work)."""
    drain = _process_drain()
    return drain.requested or drain.begun.is_set()


def run_draining(
    coro: Coroutine[Any, Any, T], timeout: float | None = None, *, on_wait: Callable[[], None] | None = None
) -> T:
    """``run_coro`` that the shutdown's grace period can end: at its end ``coro`` is cancelled
    where it stands, its ``except``/``finally`` blocks run on the loop, and this raises
    ``GraceExpired``. ``on_wait`` is called about every 0.2 s while this thread waits."""
    lt = get_loop_thread()
    drain = _process_drain()

    async def tracked() -> T:
        task = asyncio.current_task()
        assert task is not None
        entry = (lt.loop, task)
        with drain.lock:
            expired = drain.expired.is_set()
            drain.tasks.add(entry)
        try:
            if expired:
                coro.close()
                raise asyncio.CancelledError
            return await coro
        finally:
            with drain.lock:
                drain.tasks.discard(entry)

    future = asyncio.run_coroutine_threadsafe(tracked(), lt.loop)
    end = math.inf if timeout is None else time.monotonic() + timeout
    give_up_at = math.inf
    try:
        while not future.done():
            now = time.monotonic()
            if now >= end:
                future.cancel()
                raise TimeoutError(f"coroutine did not finish within {timeout} s; it was cancelled")
            if drain.expired.is_set() and give_up_at == math.inf:
                give_up_at = min(now + CLEANUP_S, cleanup_deadline())
            if now >= give_up_at:
                future.cancel()
                raise GraceExpired("the coroutine's cleanup did not finish before the shutdown's cleanup deadline")
            concurrent.futures.wait([future], timeout=min(_WAIT_SLICE_S, end - now, give_up_at - now))
            if on_wait is not None:
                on_wait()
        return future.result()
    except concurrent.futures.CancelledError:
        if drain.expired.is_set():
            raise GraceExpired("the shutdown grace period ended; the coroutine was cancelled") from None
        raise
    except BaseException:
        future.cancel()
        raise
