"""The fake server in a process of its own, for the benchmarks: a judge whose CPU is not theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["start_process"]

_ROOT = Path(__file__).resolve().parents[2]


def start_process(latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    """``python -m tests.fakellm`` on a free loopback port, answering after ``latency_ms``,
    recording nothing (a flood would grow its memory); its process and base URL. The caller
    stops it (by this pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakellm", "--port", "0", "--latency-ms", str(latency_ms), "--no-record"],
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("fakellm listening on "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the fake judge did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1]
