"""SIGTERM with a sink that never answers (an OTLP endpoint that takes connections and is
silent): after the grace period the whole way out (cancelled runs' cleanup, the drainers'
last deliveries, closing connections; in every prefork child and then the main process)
shares one deadline, TRACESCORE_SHUTDOWN_CLEANUP_SECONDS, so the worker exits inside the
margin the platform gives it. The scores the hung sink did not get stay pending in the outbox."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink
from worker._loop import EXIT_ALLOWANCE_S
from worker.cli import cli

GRACE_S = 2.0
CLEANUP_S = 2.0


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint on a free loopback port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(100)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize(("pool", "concurrency"), [("threads", 2), ("prefork", 2)])
def test_a_hung_sink_does_not_hold_the_exit_past_the_cleanup_time(
    redis_url: str, tmp_path: Path, silent_endpoint: str, pool: str, concurrency: int
) -> None:
    calls = tmp_path / "calls.txt"
    scores = tmp_path / "scores.jsonl"
    env = {
        "TRACESCORE_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "TRACESCORE_SHUTDOWN_CLEANUP_SECONDS": str(CLEANUP_S),
        "TSTEST_CALLS_FILE": str(calls),
        "TSTEST_PACE_S": "0.5",
        "TRACESCORE_SINKS": "jsonl,otlp",
        "TRACESCORE_WRITER_PATH": str(scores),
        "OTEL_EXPORTER_OTLP_ENDPOINT": silent_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "TRACESCORE_OTLP_METRICS": "false",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "60",  # hung for real: no request timeout ends it sooner
    }
    worker = WorkerProcess(
        "hung-sink", redis_url, tmp_path, scores_path=scores, pool=pool, concurrency=concurrency,
        scorers="tests.worker.shutdown_scorers", env=env,
    )  # fmt: skip
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        for b in range(concurrency):
            sink.send(batch(range(1, 40), ["paced"], salt=f"hung-{pool}-{b}", batch_id=f"hung-{pool}-{b}"))
        sink.close()
        # Some scores stored (and sent to the silent endpoint), more runs still going.
        assert wait_for(lambda: calls.exists() and calls.read_text().count("done ") >= 3, 60), worker.text()[-3000:]
        assert wait_for(lambda: len(read_scores(scores)) >= 1, 30), worker.text()[-3000:]
        sent_at = time.monotonic()
        os.kill(worker.proc.pid, signal.SIGTERM)
        limit = GRACE_S + CLEANUP_S + EXIT_ALLOWANCE_S
        try:
            worker.proc.wait(limit + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {limit + 30} s of SIGTERM:\n{worker.text()[-3000:]}")
        took = time.monotonic() - sent_at
        text = worker.text()
        assert took <= limit, f"exit {took:.1f} s after SIGTERM, limit {limit} s:\n{text[-3000:]}"
        assert worker.proc.returncode == 0, text[-3000:]
        assert "shutdown_cleanup_cut_short" in text, text[-3000:]
        listed = CliRunner().invoke(cli, ["sinks", "list", "otlp", "--broker", redis_url, "--json"])
        assert listed.exit_code == 0, listed.output
        otlp = json.loads(listed.stdout)["otlp"]
        # Nothing lost: what the silent endpoint never acknowledged waits in the outbox.
        assert otlp["delivered"] == 0
        assert otlp["pending"] >= 1
        assert otlp["failed"] == 0
    finally:
        worker.stop()
