"""What the whole-exchange deadline costs an HTTP request: ``DeadlineTransport`` (the sinks' and
the Tempo source's, tracing/_transport.py) beside httpx's own ``HTTPTransport``, in one run; and
the OTLP sink's export of one score's carrier span through its session (requests over
``DeadlineTransport``) beside the same exporter with requests' own session (urllib3).

A local keep-alive HTTP/1.1 server answers each POST of a score-sized JSON body (about 300
bytes, as the Phoenix and Langfuse sinks send one request per score) with a 40-byte JSON answer.
One client per transport, built as ``tracing.sinks._http.http_client`` builds it; the CPU of the
calling thread (``time.thread_time``) per request, least and median of interleaved rounds, and
the median of each round's ratio. The server runs in this process on its own thread, so only
the client's CPU is counted; the wall time per request (loopback, both sides on this machine)
is shown beside it.

    .venv/bin/python bench/http_transport.py [--requests 2000] [--rounds 9]

Writes bench/results/http_transport.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: E402

from tracing import ScoreRecord, score_id_for  # noqa: E402
from tracing._transport import DeadlineTransport  # noqa: E402
from tracing.sinks._http import _bound_answer  # noqa: E402
from tracing.sinks._otlp import _WatchedSession, carrier_spans  # noqa: E402

_ANSWER = json.dumps({"id": "QW5ub3RhdGlvbjox", "status": "ok"}).encode()
_BODY = json.dumps(
    {
        "data": [
            {
                "span_id": "00f067aa0ba902b7",
                "name": "helpfulness",
                "annotator_kind": "LLM",
                "result": {"score": 0.8, "label": "helpful", "explanation": "answers the question asked, briefly"},
                "metadata": {"scorer": "helpfulness", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
                "identifier": "tracescore:7d0c3f6a2b1e4c59",
            }
        ]
    }
).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the headers and the body are two writes: no 40 ms ACK wait

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(_ANSWER)))
        self.end_headers()
        self.wfile.write(_ANSWER)

    def log_message(self, *args: object) -> None:
        return None


def _client(transport: httpx.BaseTransport) -> httpx.Client:
    return httpx.Client(
        headers={"Accept": "application/json", "Accept-Encoding": "gzip, deflate"},
        timeout=10.0,
        follow_redirects=False,
        event_hooks={"response": [_bound_answer]},
        transport=transport,
        trust_env=False,
    )


def _post(client: httpx.Client, url: str) -> None:
    answer = client.post(url, content=_BODY, headers={"Content-Type": "application/json"})
    if answer.status_code != 200 or answer.content != _ANSWER:
        raise SystemExit(f"unexpected answer {answer.status_code}")


_RESOURCE = Resource.create({"service.name": "tracescore-worker"})  # the sink's, made once


def _export(exporter: OTLPSpanExporter) -> None:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    record = ScoreRecord(
        score_id=score_id_for(trace, span, "helpfulness", "1"),
        trace_id=trace,
        span_id=span,
        scorer_id="helpfulness",
        score=0.8,
        reason="answers the question asked, briefly",
    )
    if exporter.export(carrier_spans([record], _RESOURCE)) is not SpanExportResult.SUCCESS:
        raise SystemExit("an OTLP export failed")


def _round(send: Callable[[], None], n: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per request."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        send()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    return cpu / n * 1e6, wall / n * 1e6


def _compare(senders: dict[str, Callable[[], None]], ours: str, baseline: str, n: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of each sender (the order flips each round): least and median CPU,
    median wall time per request, and the median of each round's ratio ours / baseline."""
    for send in senders.values():  # warm: connection open, code paths loaded
        _round(send, 200)
    cpu: dict[str, list[float]] = {name: [] for name in senders}
    wall: dict[str, list[float]] = {name: [] for name in senders}
    ratios: list[float] = []
    for r in range(rounds):
        got: dict[str, float] = {}
        for name in list(senders) if r % 2 == 0 else list(reversed(senders)):
            c, w = _round(senders[name], n)
            cpu[name].append(c)
            wall[name].append(w)
            got[name] = c
        ratios.append(got[ours] / got[baseline])
    result: dict[str, Any] = {
        name: {
            "cpu_us_per_request_least": round(min(cpu[name]), 2),
            "cpu_us_per_request_median": round(statistics.median(cpu[name]), 2),
            "wall_us_per_request_median": round(statistics.median(wall[name]), 2),
        }
        for name in senders
    }
    added = result[ours]["cpu_us_per_request_median"] - result[baseline]["cpu_us_per_request_median"]
    result["added_cpu_us_per_request_median"] = round(added, 2)
    result["ratio_median_of_rounds"] = round(statistics.median(ratios), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/span_annotations"
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    clients = {
        "httpx_transport": _client(httpx.HTTPTransport(limits=limits)),
        "deadline_transport": _client(DeadlineTransport(40.0, limits=limits)),
    }
    senders: dict[str, Callable[[], None]] = {name: partial(_post, client, url) for name, client in clients.items()}
    result: dict[str, Any] = {
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        **_compare(senders, "deadline_transport", "httpx_transport", args.requests, args.rounds),
    }
    otlp_url = url.replace("/v1/span_annotations", "/v1/traces")
    exporters = {
        "requests_session": OTLPSpanExporter(endpoint=otlp_url, timeout=10, session=requests.Session()),
        "otlp_sink_session": OTLPSpanExporter(endpoint=otlp_url, timeout=10, session=_WatchedSession()),
    }
    result["otlp_export"] = _compare(
        {name: partial(_export, exporter) for name, exporter in exporters.items()},
        "otlp_sink_session",
        "requests_session",
        args.requests,
        args.rounds,
    )
    for client in clients.values():
        client.close()
    for exporter in exporters.values():
        exporter.shutdown()  # type: ignore[no-untyped-call]
    server.shutdown()
    server.server_close()
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "http_transport.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
