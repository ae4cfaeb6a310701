"""``OtlpSink`` over whatever ``opentelemetry-exporter-otlp-proto-http`` is importable: the
answers a drainer must read alike on every exporter the project allows. Run in-process on the
installed (newest) exporter and, by tests/tracing/test_capture_sdk.py, in a subprocess on the
oldest, which posts through its session differently (``verify``, ``cert`` and redirects per
request, where the newest sets them on the session).

``python -m tests.tracing._otlp_sink_check`` prints the exporter's version and each answer's
outcome as JSON.
"""

from __future__ import annotations

import importlib.metadata
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests._drip import drip
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivery, OtlpSink, Refused, Retry


def _accept(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _refuse(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    body = b"missing header x-mlflow-experiment-id"
    handler.send_response(400)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _redirect(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    handler.send_response(308)
    handler.send_header("Location", "/elsewhere/v1/traces")
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _drip_headers(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    """An acceptance dripped over 7.6 s: past the sink's 2 s deadline."""
    drip(handler.wfile, stop)
    handler.close_connection = True


ANSWERS: dict[str, Callable[[BaseHTTPRequestHandler, threading.Event], None]] = {
    "accepted": _accept,
    "refused": _refuse,
    "redirected": _redirect,
    "dripped_headers": _drip_headers,
}


def _shown(outcome: Delivery) -> dict[str, Any]:
    shown: dict[str, Any] = {"outcome": type(outcome).__name__}
    if isinstance(outcome, Refused | Retry):
        shown["reason"] = outcome.reason
    if isinstance(outcome, Refused):
        shown["detail"] = outcome.detail
    return shown


def check() -> dict[str, Any]:
    """Each answer of ``ANSWERS``, in order, to one score; then one more acceptance (the sink
    still delivers after them)."""
    order = [*ANSWERS, "accepted"]
    paths: list[str] = []
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            paths.append(self.path)
            ANSWERS[order[len(paths) - 1]](self, stop)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    record = ScoreRecord(score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s")
    sink = OtlpSink(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1/traces", timeout_s=0.5)
    try:
        outcomes = [_shown(sink.deliver([record])[0]) for _ in order]
    finally:
        stop.set()
        sink.close()
        server.shutdown()
        server.server_close()
    return {
        "exporter": importlib.metadata.version("opentelemetry-exporter-otlp-proto-http"),
        "outcomes": dict(zip(order[:-1], outcomes, strict=False)) | {"accepted_after": outcomes[-1]},
        "paths": paths,
    }


if __name__ == "__main__":
    print(json.dumps(check()))
