"""Run part of a test in a child forked from the test's process, and read back what it saw."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any


def in_forked_child(work: Callable[[], dict[str, Any]], timeout_s: float = 30.0) -> tuple[dict[str, Any], int | None]:
    """``work()`` in a forked child; returns its report (JSON-able; {} when it raised or hung) and
    the child's exit code (None: it hung past ``timeout_s`` and was killed, which a test about a
    hang asserts against). The child leaves by ``os._exit``: never through pytest's own exit."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + timeout_s
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    code: int | None = os.waitstatus_to_exitcode(done[1]) if done[0] else None
    if code is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        return json.loads(pipe.read() or b"{}"), code
