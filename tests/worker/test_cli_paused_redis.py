"""Every command that talks to Redis, on a Redis that stopped answering (SIGSTOP: a hung host, a
long fork), exits 1 saying it cannot reach it, within a deadline, its password masked: a cron
job or a readiness probe never waits forever, and a person is told within seconds (README,
Workers: the commands that talk to Redis). The paused Redis is the broker and store in one, or
the score store alone behind a broker that answers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.worker._workers import ROOT, TRACESCORE
from worker._heartbeat import READY_FILE

# Each call of a command gives up within about 3 s (CLI_PATIENCE: 1 s of reconnecting, a read's
# 2 s); `status` makes two such calls on a paused store. Measured: 2.6-4.8 s each, alone; 12.6 s
# for `scores` and `dlq` (a worker's 2 s + 10 s), 13.9 s for `status` on a paused store before.
# A command starts with the others at once, on a machine that may be half as fast.
DEADLINE_S = 9.0


@pytest.mark.parametrize("paused", ["broker and store", "store"])
def test_redis_commands_on_a_paused_redis_exit_1_in_time(
    paused: str, private_redis: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / READY_FILE).touch()  # the probe's own file says ready: only Redis can fail it
    url = private_redis.url(0)
    commands = {
        "status": ["status", "--json"],
        "scores": ["scores", "--trace", "ab" * 16, "--json"],
        "dlq list": ["dlq", "list", "--json"],
        "dlq retry": ["dlq", "retry", "--all", "--json"],
        "dlq drop": ["dlq", "drop", "--all", "--yes", "--json"],
        "sinks list": ["sinks", "list", "--json"],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")}
    if paused == "store":
        broker = redis_url
        env["TRACESCORE_REDIS_URL"] = url
    else:
        broker = url
        commands["probe ready"] = ["probe", "ready", "--dir", str(tmp_path)]  # (it asks the broker)
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    procs: dict[str, tuple[subprocess.Popen[str], float]] = {}
    done: dict[str, tuple[int | None, str, str, float]] = {}
    try:
        for name, argv in commands.items():  # all at once: the deadline is each one's
            procs[name] = (
                subprocess.Popen(
                    [TRACESCORE, *argv, "--broker", broker], cwd=ROOT, env=env, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                ),
                time.monotonic(),
            )  # fmt: skip
        for name, (proc, started) in procs.items():
            try:
                out, err = proc.communicate(timeout=max(0.1, started + DEADLINE_S - time.monotonic()))
                done[name] = (proc.returncode, out, err, time.monotonic() - started)
            except subprocess.TimeoutExpired:
                done[name] = (None, "", f"still running after {DEADLINE_S} s", DEADLINE_S)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        private_redis.proc.send_signal(signal.SIGCONT)
    slow = {name: (round(took, 1), err[-300:]) for name, (code, _, err, took) in done.items() if code is None}
    assert not slow, slow
    for name, (code, out, err, _) in done.items():
        assert code == 1, (name, code, err)
        assert out == "", (name, out)  # nothing a script would take for an answer
        what = "the broker" if name in ("status", "probe ready") and paused != "store" else "the score store"
        assert f"cannot reach {what}" in err, (name, err)
        # It said "failed after reconnecting for up to 2 s (TimeoutError: )" after 12.6 s: the
        # call's deadline, which has no text of its own, is named with its length.
        assert "TimeoutError: )" not in err, (name, err)
        assert private_redis.password not in out + err, name
