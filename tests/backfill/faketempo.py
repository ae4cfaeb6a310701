"""A small fake of Grafana Tempo's HTTP API, enough for TempoSource.

- ``GET /api/search?q=&start=&end=&limit=``: traces starting within [start, end] seconds
  (inclusive, as Tempo does), newest first, at most ``limit``; ``traceID`` without leading
  zeros (Tempo strips them).
- ``GET /api/traces/<id>``: ``Accept: application/protobuf`` gets the OTLP protobuf message;
  otherwise (or with ``json_only``) Tempo's JSON, ``{"batches": [...]}`` with base64 ids.

``fail_next`` answers that many requests with 503 first; ``requests`` records the paths;
``max_results`` caps a search's results whatever its limit (Tempo's ``max_result_limit``).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan


class FakeTempo:
    def __init__(self) -> None:
        self.traces: dict[str, list[ReadableSpan]] = {}
        self.requests: list[str] = []
        self.fail_next = 0
        self.max_results: int | None = None
        self.json_only = False
        self.required_headers: dict[str, str] = {}
        # Hostile answers: search entries listed besides the real ones, and a trace id's fetch
        # answered by a function writing raw bytes to the socket instead.
        self.extra_search_entries: list[Any] = []
        self.raw_answers: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def add(self, spans: Sequence[ReadableSpan]) -> None:
        for span in spans:
            self.traces.setdefault(f"{span.context.trace_id:032x}", []).append(span)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeTempo:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _start_ns(self, trace_id: str) -> int:
        return min(s.start_time or 0 for s in self.traces[trace_id])

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(handler.path)
        with self._lock:
            self.requests.append(handler.path)
            missing = {k: v for k, v in self.required_headers.items() if handler.headers.get(k) != v}
            if missing:
                self._send(handler, 401, f"missing headers {sorted(missing)}".encode(), "text/plain")
                return
            if self.fail_next > 0:
                self.fail_next -= 1
                self._send(handler, 503, b"ingester unavailable", "text/plain")
                return
        if url.path == "/api/search":
            params = dict(urllib.parse.parse_qsl(url.query))
            start, end, limit = int(params["start"]), int(params["end"]), int(params.get("limit", "20"))
            limit = min(limit, self.max_results or limit)
            found = [t for t in self.traces if start * 10**9 <= self._start_ns(t) <= end * 10**9 + 999_999_999]
            found.sort(key=self._start_ns, reverse=True)
            body = {
                "traces": [
                    {
                        "traceID": t.lstrip("0"),
                        "rootServiceName": "synth-agent",
                        "rootTraceName": "invoke_agent weather-agent",
                        "startTimeUnixNano": str(self._start_ns(t)),
                        "durationMs": 700,
                    }
                    for t in found[:limit]
                ]
                + self.extra_search_entries,
                "metrics": {"inspectedTraces": len(found)},
            }
            self._send(handler, 200, json.dumps(body).encode(), "application/json")
            return
        if url.path.startswith("/api/traces/"):
            trace_id = url.path.rsplit("/", 1)[1].rjust(32, "0")
            raw = self.raw_answers.get(trace_id)
            if raw is not None:
                raw(handler)
                return
            spans = self.traces.get(trace_id)
            if spans is None:
                self._send(handler, 404, b"trace not found", "text/plain")
                return
            message = encode_spans(spans)
            if handler.headers.get("Accept") == "application/protobuf" and not self.json_only:
                self._send(handler, 200, message.SerializeToString(), "application/protobuf")
            else:
                batches = MessageToDict(message)["resourceSpans"]
                self._send(handler, 200, json.dumps({"batches": batches}).encode(), "application/json")
            return
        self._send(handler, 404, b"404 page not found", "text/plain")

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
