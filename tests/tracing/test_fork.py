"""What objects of ours do in a process forked from the one that built them (tracing._fork)."""

from __future__ import annotations

import os
from pathlib import Path

from tracing._fork import after_fork_in_child


class _Resets:
    def __init__(self, fd: int, mark: bytes, fail: bool = False) -> None:
        self.fd, self.mark, self.fail = fd, mark, fail
        after_fork_in_child(self.after_fork)

    def after_fork(self) -> None:
        if self.fail:
            raise RuntimeError("can't start new thread")
        os.write(self.fd, self.mark)


def test_one_failing_reset_does_not_keep_the_others_from_theirs() -> None:
    """One hook serves every registered object: an exporter whose reset raised (no thread could
    start) kept the publishers after it from forgetting the parent's connection and lock."""
    read_end, write_end = os.pipe()
    objects = [_Resets(write_end, b"a"), _Resets(write_end, b"", fail=True), _Resets(write_end, b"b")]
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # the resets ran at the fork, in this child
    os.waitpid(pid, 0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        assert pipe.read() == b"ab"
    assert len(objects) == 3  # alive (held weakly by the registry) until here


_APP = """
import json, os, sys
import multiprocessing
import billiard
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tracing import CallbackSink, ScoringRule, ScoringSpanExporter

def record(batch):
    with open(sys.argv[1], "a") as out:
        for request in batch.requests:
            out.write(json.dumps([os.getpid(), request.trace_id]) + "\\n")

exporter = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(record))
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(exporter))  # 5 s delay: a child ends first
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("app")

def agent_runs(n):
    for _ in range(n):
        with tracer.start_as_current_span("invoke_agent shop", attributes={"gen_ai.operation.name": "invoke_agent"}):
            pass

if __name__ == "__main__":
    child = billiard.get_context("fork").Process(target=agent_runs, args=(2,))  # Celery's prefork pool
    child.start()
    child.join()
    children = [multiprocessing.get_context("fork").Process(target=agent_runs, args=(2,)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(agent_runs, [1, 1, 1, 1])
        pool.close()
        pool.join()
    agent_runs(1)
"""


def test_multiprocessing_and_billiard_children_send_their_traces_at_exit(tmp_path: Path) -> None:
    """Children of multiprocessing and billiard (Celery's prefork pool) leave by os._exit: no
    atexit, so no provider shutdown, and every trace still in the span processor or the exporter
    (all of a short task's) was lost without a count. Their exit runs multiprocessing's
    finalizers: the exporter's hands on what the global provider holds and sends it."""
    import json
    import subprocess
    import sys

    script, out = tmp_path / "app.py", tmp_path / "sent.jsonl"
    script.write_text(_APP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    sent = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({trace_id for _, trace_id in sent}) == len(sent) == 2 + 2 * 2 + 4 + 1  # each once
    assert len({pid for pid, _ in sent}) >= 5  # the app, the billiard child, two children, the pool
