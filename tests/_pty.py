"""Run the command line with a terminal (a pty) for stderr, as a user's shell gives it: the tests
of what a progress bar draws, which a pipe never shows."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Terminal", "on_a_terminal"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Terminal:
    text: str  # what the terminal received (stderr, and stdout too when it shared it)
    stdout: str  # stdout when it was a pipe ("" when it shared the terminal)
    returncode: int


def on_a_terminal(args: list[str], *, stdout_too: bool = False, timeout_s: float = 60) -> Terminal:
    """``tracescore ARGS`` with stderr on a pty 200 columns wide (and stdout too if
    ``stdout_too``, else a pipe), read until the command ends."""
    primary, secondary = pty.openpty()
    command = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", *args]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    stdout = secondary if stdout_too else subprocess.PIPE
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=secondary) as process:
        os.close(secondary)
        seen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other end closed: the command ended
                break
            if not chunk:
                break
            seen += chunk
        piped = process.stdout.read().decode() if process.stdout is not None else ""
        returncode = process.wait(timeout=timeout_s)
    os.close(primary)
    return Terminal(seen.decode(errors="replace"), piped, returncode)
