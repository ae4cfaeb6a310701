"""Every command that talks to Redis, on a Redis that stopped answering (SIGSTOP: a hung host, a
long fork), exits 1 saying it cannot reach it, within a deadline, its password masked: a cron
job or a readiness probe never waits forever (README, Workers: the commands that talk to Redis).
`sinks list|retry` have their own test (test_cli.py); these are the others."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests._redis import RedisServer
from tests.worker._workers import ROOT, TRACESCORE
from worker._heartbeat import READY_FILE

# Each command asks with a short timeout and few retries: 13 s measured for the slowest
# (`scores`, `dlq`: 2 s of reconnecting plus a command's 10 s slack); a hang is far past this.
DEADLINE_S = 30.0


def test_redis_commands_on_a_paused_redis_exit_1_in_time(private_redis: RedisServer, tmp_path: Path) -> None:
    (tmp_path / READY_FILE).touch()  # the probe's own file says ready: only Redis can fail it
    url = private_redis.url(0)
    commands = {
        "status": ["status", "--json"],
        "scores": ["scores", "--trace", "ab" * 16, "--json"],
        "dlq list": ["dlq", "list", "--json"],
        "dlq retry": ["dlq", "retry", "--all", "--json"],
        "dlq drop": ["dlq", "drop", "--all", "--yes", "--json"],
        "probe ready": ["probe", "ready", "--dir", str(tmp_path)],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")}
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, argv in commands.items():  # all at once: the deadline is each one's
            procs[name] = subprocess.Popen(
                [TRACESCORE, *argv, "--broker", url], cwd=ROOT, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        done: dict[str, tuple[int | None, str, str]] = {}
        for name, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=max(0.1, started + DEADLINE_S - time.monotonic()))
                done[name] = (proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                done[name] = (None, "", f"still running after {DEADLINE_S} s")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        private_redis.proc.send_signal(signal.SIGCONT)
    hung = {name: err for name, (code, _, err) in done.items() if code is None}
    assert not hung, hung
    for name, (code, out, err) in done.items():
        assert code == 1, (name, code, err)
        assert out == "", (name, out)  # nothing a script would take for an answer
        assert "cannot reach the" in err, (name, err)
        # It said "failed after reconnecting for up to 2 s (TimeoutError: )" after 12.6 s: the
        # call's deadline, which has no text of its own, is named with its length.
        assert "TimeoutError: )" not in err, (name, err)
        assert private_redis.password not in out + err, name
