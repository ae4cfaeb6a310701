"""A worker's log at its INFO level never shows a sink's or a judge's URL password (log audit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, wait_for
from tracing import CelerySink

PASSWORD = "phx-url-pw-0123456789"


@pytest.fixture
def answering() -> Iterator[tuple[str, list[str]]]:
    """A loopback server answering every request 200 ``{}``; the paths it saw."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://phoenix:{PASSWORD}@127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_sink_urls_password_stays_out_of_the_workers_log(
    answering: tuple[str, list[str]], redis_url: str, tmp_path: Path
) -> None:
    """httpx logs each request at INFO with its URL, user-info included, and a worker logs at
    INFO: the Phoenix URL's password was printed once a request (so was a judge base URL's)."""
    url, seen = answering
    worker = WorkerProcess(
        "creds",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={"TRACESCORE_SINKS": "phoenix", "TRACESCORE_PHOENIX_URL": url},
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["length"], salt="creds"))
        sink.close()
        assert wait_for(lambda: bool(seen), 60), worker.text()[-3000:]
    finally:
        worker.stop()
    said = worker.text()
    assert "/v1/span_annotations" in seen[0]
    assert PASSWORD not in said, [line for line in said.splitlines() if PASSWORD in line][:3]
