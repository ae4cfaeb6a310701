"""The files ``tracescore probe`` reads to tell a wedged worker from a busy one (``TRACESCORE_PROBE_DIR``).

One directory per worker (a pod's ``/tmp``). Each is rewritten while the part it stands for
makes progress, so its age is how long that part has been stuck:

- ``loop-<pid>``: written by the loop watchdog of each scoring process (the threads pool's one,
  each prefork child) while that process's event loop keeps turning. A loop busy with many runs
  still turns between their awaits; a step that blocks it stops the file.
- ``consumer``: written once a second by a timer on the Celery consumer's own event loop (and,
  in the solo pool, by the task waiting on a beating loop: the consumer runs the task itself).
  While the consumer reconnects to a lost broker its event loop does not run (Celery restarts
  the consumer); a thread then beats for it, marking the file ``reconnecting``: liveness asks
  whether the process is wedged, and a worker waiting for its broker is not (a broker outage
  must not restart every pod at once). Readiness (no ``ready`` file, a failed ping) tells that
  the broker is away.
- ``ready``: present while the consumer is connected and consuming; removed when it stops and on
  SIGTERM (the worker takes no more messages).

Each file holds the writer's pid and its start time (``worker._process.start_time``): a file
left by an earlier run (a container restarted with the same emptyDir ``/tmp``, where the
worker is PID 1 again) is not taken for the process now holding that pid. A worker also clears
the directory's files when it starts (``reset``).

Writing is best effort: a full or read-only disk must never break scoring (the probe then
reports the stale file, which is the truth about what it can see).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from worker._process import alive, start_time

__all__ = [
    "CONSUMER_FILE",
    "LOOP_PREFIX",
    "READY_FILE",
    "beat",
    "beat_from_task",
    "clear",
    "consumer_reconnecting",
    "consumer_started",
    "consumer_stopped",
    "liveness_problems",
    "loop_file",
    "probe_dir",
    "reset",
    "set_probe_dir",
]

CONSUMER_FILE = "consumer"
READY_FILE = "ready"
LOOP_PREFIX = "loop-"
RECONNECTING = "reconnecting"
_RECONNECT_BEAT_S = 1.0

_dir: Path | None = None
_consumer_pid = 0
_reconnect_beat: tuple[threading.Event, threading.Thread] | None = None


def set_probe_dir(path: str | None) -> None:
    """Where this process (and the children it forks) write their files; None: nowhere."""
    global _dir
    _dir = Path(path) if path else None
    if _dir is not None:
        try:
            _dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            _dir = None


def probe_dir() -> Path | None:
    return _dir


def consumer_started() -> None:
    """Called in the process (and on the thread) that runs the Celery consumer."""
    global _consumer_pid
    _end_reconnect_beat()
    _consumer_pid = os.getpid()
    beat(CONSUMER_FILE)
    beat(READY_FILE)


def consumer_stopped(*, reconnecting: bool) -> None:
    """The consumer stopped consuming: not ready. ``reconnecting``: Celery restarts it after a
    lost broker connection, so the consumer heartbeat is kept beating (marked) until it is back."""
    global _reconnect_beat
    clear(READY_FILE)
    if not reconnecting:
        _end_reconnect_beat()
        return
    if _reconnect_beat is not None or _dir is None:
        return
    stop = threading.Event()

    def run() -> None:
        while True:
            beat(CONSUMER_FILE, RECONNECTING)
            if stop.wait(_RECONNECT_BEAT_S):
                return

    thread = threading.Thread(target=run, name="tracescore-probe-reconnecting", daemon=True)
    _reconnect_beat = (stop, thread)
    thread.start()


def _end_reconnect_beat() -> None:
    global _reconnect_beat
    if _reconnect_beat is None:
        return
    (stop, thread), _reconnect_beat = _reconnect_beat, None
    stop.set()
    if thread is not threading.current_thread():
        thread.join(2.0)  # so its last "reconnecting" beat does not land after a normal one


def beat_from_task() -> None:
    """A task waiting on its loop: in the solo pool it runs on the consumer's own thread, which
    therefore is not stuck but waiting on a loop that turns (its own heartbeat says so)."""
    if os.getpid() == _consumer_pid and threading.current_thread() is threading.main_thread():
        beat(CONSUMER_FILE)


def loop_file() -> str:
    return f"{LOOP_PREFIX}{os.getpid()}"


def reset() -> None:
    """Remove what an earlier run of the worker left here (a node starting, before it forks)."""
    if _dir is None:
        return
    with contextlib.suppress(OSError):
        for path in _dir.iterdir():
            if path.name in (CONSUMER_FILE, READY_FILE) or path.name.startswith((LOOP_PREFIX, ".")):
                with contextlib.suppress(OSError):
                    path.unlink()


def _stamp() -> str:
    pid = os.getpid()
    started = start_time(pid)
    return f"{pid} {started}" if started is not None else str(pid)


def beat(name: str, note: str = "") -> None:
    """(Re)write ``name`` with this process's pid and start time (and ``note``); its modification
    time is the beat."""
    if _dir is None:
        return
    path = _dir / name
    try:
        tmp = path.with_name(f".{name}.{os.getpid()}")
        tmp.write_text(f"{_stamp()} {note}".rstrip(), encoding="ascii")
        os.replace(tmp, path)
    except OSError:
        pass


def clear(name: str) -> None:
    if _dir is None:
        return
    with contextlib.suppress(OSError):
        (_dir / name).unlink(missing_ok=True)


def _writer_running(path: Path, pid: int) -> bool:
    """True if the process that wrote ``path`` still runs (not merely some process with its pid)."""
    if not alive(pid):
        return False
    try:
        words = path.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return True  # unreadable now (being replaced): judge it by its age
    if len(words) < 2 or not words[1].isdigit():
        return True  # written without a start time (no /proc): the pid is all there is
    return start_time(pid) == int(words[1])


def _age(path: Path, now: float) -> float | None:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return None


def consumer_reconnecting(directory: Path) -> bool:
    """True if the consumer's last beat says it is reconnecting to the broker."""
    try:
        return RECONNECTING in (directory / CONSUMER_FILE).read_text(encoding="ascii").split()[2:]
    except (OSError, UnicodeDecodeError):
        return False


def liveness_problems(directory: Path, max_age_s: float) -> list[str]:
    """What says the worker writing ``directory`` is wedged (empty: it is live)."""
    now = time.time()
    problems: list[str] = []
    age = _age(directory / CONSUMER_FILE, now)
    if age is None:
        problems.append(f"no consumer heartbeat in {directory} (the worker has not started consuming)")
    elif age > max_age_s:
        if consumer_reconnecting(directory):
            problems.append(
                f"the worker process has not run for {age:.0f} s while its consumer reconnects to the broker "
                f"(limit {max_age_s:g} s)"
            )
        else:
            problems.append(f"the consumer's event loop has not turned for {age:.0f} s (limit {max_age_s:g} s)")
    for path in sorted(directory.glob(f"{LOOP_PREFIX}*")):
        pid_text = path.name.removeprefix(LOOP_PREFIX)
        if not pid_text.isdigit() or not _writer_running(path, int(pid_text)):
            continue  # a replaced prefork child's file, or an earlier run's whose pid is reused
        age = _age(path, now)
        if age is not None and age > max_age_s:
            problems.append(
                f"the scoring event loop of process {pid_text} has been blocked for {age:.0f} s (limit {max_age_s:g} s)"
            )
    return problems
