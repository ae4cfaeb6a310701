"""An app stopped by SIGTERM (a container's stop, Kubernetes' pod deletion): what the README's
"Capturing traces from your app" says about it holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_APP = """
import json, signal, sys, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tracing import CallbackSink, ScoringRule, ScoringSpanExporter

def record(batch):
    with open(sys.argv[1], "a") as out:
        for request in batch.requests:
            out.write(json.dumps(request.trace_id) + "\\n")

if sys.argv[3] == "exit-on-sigterm":  # the README's line
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(record))))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("app")
for _ in range(3):
    with tracer.start_as_current_span("invoke_agent shop", attributes={"gen_ai.operation.name": "invoke_agent"}):
        pass
open(sys.argv[2], "w").close()  # served its runs; now idle, as a server between requests
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize(("handler", "sent"), [("exit-on-sigterm", 3), ("python-default", 0)])
def test_an_app_stopped_by_sigterm_sends_its_buffered_runs_only_when_sigterm_exits_python(
    handler: str, sent: int, tmp_path: Path
) -> None:
    """Python's default SIGTERM ends the process without its exit hooks, so neither the SDK's
    processor nor the exporter hands over what it holds: the runs of the last seconds (the
    processor's schedule delay plus the exporter's grace) are lost, uncounted. With SIGTERM
    turned into ``sys.exit``, as the README says, the provider's exit hook sends them."""
    script, out, served = tmp_path / "app.py", tmp_path / "sent.jsonl", tmp_path / "served"
    script.write_text(_APP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    app = subprocess.Popen(
        [sys.executable, str(script), str(out), str(served), handler],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not served.exists() and app.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert served.exists(), app.communicate(timeout=10)[1][-3000:] if app.poll() is not None else "no start"
        app.send_signal(signal.SIGTERM)
        _, stderr = app.communicate(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == (0 if handler == "exit-on-sigterm" else -signal.SIGTERM), stderr[-3000:]
    trace_ids = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert len(trace_ids) == len(set(trace_ids)) == sent
