"""A small OTLP/HTTP trace receiver on a free loopback port (the tests' collector).

It decodes each ``POST /v1/traces`` body with ``opentelemetry-proto`` and keeps the spans, so a
test can count scores by id at the receiver. ``status`` (settable) makes it answer an error
instead (503: down for now, 400: a refusal), with ``answer`` as the body; ``hang`` (an Event,
set to release) holds each request unanswered, as a stuck backend does; ``stop()`` closes the
port (an endpoint not listening).
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests._redis import free_port


class OtlpReceiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.status = 200
        self.answer = b""
        self.headers: dict[str, str] = {}  # sent with every answer
        self.spans: list[Span] = []
        self.requests = 0
        self.answered = 0  # requests whose answer was decided (a held one counts once released)
        self.hang = threading.Event()
        self.hang.set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests += 1
                receiver.hang.wait(60)
                with receiver._lock:
                    status, answer = receiver.status, receiver.answer
                    receiver.answered += 1
                    if status == 200:
                        request = ExportTraceServiceRequest()
                        request.ParseFromString(body)
                        for resource in request.resource_spans:
                            for scope in resource.scope_spans:
                                receiver.spans.extend(scope.spans)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(answer)))
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.hang.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def score_ids(self) -> Counter[str]:
        """How often each score id arrived (one per evaluation event)."""
        with self._lock:
            return Counter(
                attr.value.string_value
                for span in self.spans
                for event in span.events
                for attr in event.attributes
                if attr.key == "tracescore.score.id"
            )
