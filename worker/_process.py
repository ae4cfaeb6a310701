"""Questions about other processes of this host, asked by pid (heartbeat files, claims, metrics files).

A pid alone names a process only while it lives: a restarted container is PID 1 again, and
pids wrap. ``start_time`` tells a reused pid from the one that wrote a file.
"""

from __future__ import annotations

import os

__all__ = ["alive", "start_time"]


def alive(pid: int) -> bool:
    """True if a process with ``pid`` exists on this host (any user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22);
    None if it does not exist or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # Field 2 (the command name) is in parentheses and may hold spaces or ')': split after the last.
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # fields[0] is field 3
    except (IndexError, ValueError):
        return None
