"""The OTLP sink's acceptances that are not: an answer rejecting spans (OTLP's partial_success),
an acceptance whose body never came in full, and exporter headers no HTTP header can carry."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from structlog.testing import capture_logs

from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, Delivery, OtlpSink, Refused, Retry

TRACE = "0af7651916cd43dd8448eb211c80319c"
START, END = 1_764_000_000_000_000_000, 1_764_000_002_500_000_000


def _record(n: int, reason: str = "fine") -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
        score=0.5, reason=reason, span_start_ns=START, span_end_ns=END,
    )  # fmt: skip


def _reasons(body: bytes) -> dict[str, str]:
    """Each exported score's id and its explanation, from an OTLP request body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = {}
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                for event in span.events:
                    attrs = {a.key: a.value.string_value for a in event.attributes}
                    found[attrs["tracescore.score.id"]] = attrs.get("gen_ai.evaluation.explanation", "")
    return found


Answer = Callable[[BaseHTTPRequestHandler, bytes], None]


@contextmanager
def _endpoint(answer: Answer) -> Iterator[str]:
    """A local OTLP/HTTP endpoint answering each export with ``answer(handler, body)``; yields
    its /v1/traces URL."""

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                answer(self, body)
            except OSError:  # the client went away, as it should from a dripped answer
                self.close_connection = True

    with serving(Handler) as url:
        yield f"{url}/v1/traces"


def _send(handler: BaseHTTPRequestHandler, status: int, content_type: str, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _deliver(url: str, records: list[ScoreRecord], timeout_s: float = 5) -> list[Delivery]:
    sink = OtlpSink(endpoint=url, timeout_s=timeout_s)
    try:
        return sink.deliver(records)
    finally:
        sink.close()


def _partial(rejected: int, message: str) -> ExportTraceServiceResponse:
    reply = ExportTraceServiceResponse()
    reply.partial_success.rejected_spans = rejected
    reply.partial_success.error_message = message
    return reply


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_otlp_sink_an_acceptance_rejecting_every_span_is_a_refusal(encoding: str) -> None:
    """A 200 whose partial_success rejects every span sent stored none of them: each record is
    refused with the endpoint's message (scrubbed of the score's text), not delivered."""
    message = "3 spans rejected: timestamps outside the ingestion window; one said the agent cites Paris"
    reply = _partial(3, message)

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if encoding == "json":  # proto3 JSON: camelCase, int64 as a string
            said = {"partialSuccess": {"rejectedSpans": "3", "errorMessage": message}}
            _send(handler, 200, "application/json", json.dumps(said).encode())
        else:
            _send(handler, 200, "application/x-protobuf", reply.SerializeToString())

    with _endpoint(answer) as url:
        outcomes = _deliver(url, [_record(n, "the agent cites Paris") for n in range(3)])
    assert len(set(outcomes)) == 1, outcomes
    refused = outcomes[0]
    assert isinstance(refused, Refused), refused  # was Delivered
    assert refused.reason == "otlp_spans_rejected"
    assert refused.detail.startswith("3 spans rejected: timestamps outside the ingestion window")
    assert "cites Paris" not in refused.detail


def test_otlp_sink_an_acceptance_rejecting_some_spans_finds_which() -> None:
    """A 200 rejecting some spans: the batch is split and re-sent (an upsert) until the rejected
    records are found; only they are refused, and every other score reached the endpoint."""
    stored: Counter[str] = Counter()
    lock = threading.Lock()

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        sent = _reasons(body)
        bad = [i for i, reason in sent.items() if "POISON" in reason]
        with lock:
            stored.update(i for i in sent if i not in bad)
        reply = _partial(len(bad), f"{len(bad)} span(s) too old") if bad else ExportTraceServiceResponse()
        _send(handler, 200, "application/x-protobuf", reply.SerializeToString())

    records = [_record(n, "POISON, old" if n in (1, 5) else "fine") for n in range(7)]
    with _endpoint(answer) as url:
        outcomes = _deliver(url, records)
    kinds = ["Refused" if n in (1, 5) else "Delivered" for n in range(7)]
    assert [type(o).__name__ for o in outcomes] == kinds, outcomes
    assert outcomes[1] == outcomes[5] == Refused("otlp_spans_rejected", "1 span(s) too old")
    assert set(stored) == {r.score_id for n, r in enumerate(records) if n not in (1, 5)}


def test_otlp_sink_an_acceptance_without_rejections_is_delivered() -> None:
    """An empty answer, one with partial_success rejecting none (a warning), or JSON: delivered,
    as before. (A web page is not: tests/tracing/test_sinks_acknowledged.py.)"""
    bodies = iter(
        [
            ("application/x-protobuf", b""),
            ("application/x-protobuf", _partial(0, "deprecated attribute seen").SerializeToString()),
            ("application/json", b"{}"),
        ]
    )

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        _send(handler, 200, *next(bodies))

    with _endpoint(answer) as url:
        sink = OtlpSink(endpoint=url, timeout_s=5)
        try:
            assert [sink.deliver([_record(n)]) for n in range(3)] == [[Delivered()]] * 3
        finally:
            sink.close()


@pytest.mark.parametrize("how", ["cut", "dripped"])
def test_otlp_sink_an_acceptance_not_all_in_is_a_retry(how: str) -> None:
    """A 200 whose body was cut (the connection closed before its Content-Length) or dripped
    past four timeouts: the endpoint may not have stored it, so it is a Retry, as the HTTP sinks
    answer the same server; it was Delivered."""
    stop = threading.Event()

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/x-protobuf")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        handler.wfile.write(b"\x00" * 5)
        handler.wfile.flush()
        handler.close_connection = True
        if how == "dripped":  # a byte every 0.1 s: ~100 s, unless the client goes
            while not stop.wait(0.1):
                handler.wfile.write(b"\x00")
                handler.wfile.flush()

    try:
        with _endpoint(answer) as url:
            (outcome,) = _deliver(url, [_record(0)], timeout_s=0.5)
    finally:
        stop.set()
    assert isinstance(outcome, Retry), outcome
    expected = "the answer was not finished within 2 s" if how == "dripped" else "(RemoteProtocolError)"
    assert outcome.reason.startswith("OTLP endpoint"), outcome.reason
    assert outcome.reason.endswith(expected), outcome.reason


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20tok-0123456789%0Ax", "a control character"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k%C3%A9y-0123456789", "non-ASCII"),
        # Not percent-encoded: the exporter dropped these entries (no authorization sent at
        # all) with a warning quoting them, and the sink was built (README audit).
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-team=a,authorization=Bearer abc\x010123456789",
            "the entry for 'authorization', which the exporter cannot read",
        ),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer tok\n-0123456789", "the entry for 'authorization'"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer t\u00f6k-0123456789", "the entry for 'authorization'"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-a=1,0123456789", "an entry that is not name=value"),
    ],
)
def test_otlp_sink_exporter_headers_no_http_header_can_carry_stop_its_construction(
    variable: str, value: str, problem: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A header value with a line break inside or a non-ASCII character: every export failed in
    requests (a Retry named otlp_export_failed, the value in the exporter's error log) until the
    scores were dead-lettered. Now the sink is not built: the error names the variable and the
    header, never the value."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    monkeypatch.setenv(variable, value)
    with capture_logs() as logs, pytest.raises(ValueError, match=variable) as raised:
        OtlpSink(endpoint="http://127.0.0.1:9/v1/traces", timeout_s=1)
    said = str(raised.value)
    assert problem in said
    assert "0123456789" not in said
    assert "0123456789" not in caplog.text
    assert "0123456789" not in repr(logs)


def test_otlp_sink_a_stored_record_with_times_otlp_cannot_carry_does_not_fail_its_batch() -> None:
    """A record stored before the queue refused such times (a span time past fixed64, an enqueue
    time of 1e300): its carrier falls back to a time OTLP can carry, and the batch it shares is
    delivered (its encoding failed, and every record beside it was retried until dead-lettered)."""
    got: list[dict[str, str]] = []

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        got.append(_reasons(body))
        _send(handler, 200, "application/x-protobuf", b"")

    bad = [
        _record(0).model_copy(update={"span_start_ns": -1}),
        _record(1).model_copy(update={"span_start_ns": 2**64, "span_end_ns": 2**64 + 5, "enqueued_at": 1e300}),
        _record(2).model_copy(update={"span_start_ns": None, "enqueued_at": float("nan")}),
    ]
    records = [*bad, _record(3), _record(4)]
    with _endpoint(answer) as url:
        assert _deliver(url, records) == [Delivered()] * 5
    assert sorted(score_id for export in got for score_id in export) == sorted(r.score_id for r in records)


@pytest.mark.parametrize(
    "how", ["argument", "traces variable", "base variable", "base variable with a slash", "argument over variables"]
)
def test_otlp_sink_names_the_url_its_exporter_posts_to(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint a sink names (its retry lines, the backfill's summary) is where the OTLP/HTTP
    exporter really posts, however it was set, with the password masked and no query kept."""
    paths: list[str] = []

    def answer(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        paths.append(handler.path)
        _send(handler, 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString())

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with _endpoint(answer) as traces_url:
        base = traces_url.removesuffix("/v1/traces").replace("http://", "http://user:s3cret@")
        argument = None
        if how == "argument":
            argument = f"{base}/custom/path?api_key=t0ken"
        elif how == "traces variable":
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{base}/custom/path?api_key=t0ken")
        elif how == "base variable":
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{base}/prefix")
        elif how == "base variable with a slash":
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{base}/prefix/")
        else:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{base}/elsewhere")
            argument = f"{base}/custom/path?api_key=t0ken"
        sink = OtlpSink(endpoint=argument, timeout_s=5)
        try:
            assert all(isinstance(d, Delivered) for d in sink.deliver([_record(0)]))
        finally:
            sink.close()
    assert len(paths) == 1
    posted = paths[0].partition("?")[0]
    assert sink.endpoint is not None
    assert sink.endpoint.endswith(posted), (sink.endpoint, paths)
    assert "s3cret" not in sink.endpoint
    assert "t0ken" not in sink.endpoint
    assert traces_url.removeprefix("http://").removesuffix("/v1/traces") in sink.endpoint


@pytest.mark.parametrize("status", [401, 503])
def test_otlp_sink_an_endpoints_status_text_never_reaches_a_log(
    status: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The words after an answer's status code are the endpoint's own text, and one that quotes
    the request (its Authorization header, a score's explanation) went into the exporter's log
    line ("Failed to export spans batch code: 401, reason: <that text>") at ERROR, and at WARNING
    before each retry of a 503. The log says the code's standard phrase; the delivery is the
    refusal or retry it was."""
    marker = "MARKER-sk-live-9f8e7d6c5b4a"

    def echo(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(status, f"you sent {marker} and {handler.headers.get('Authorization')}")
        handler.send_header("Content-Length", "6")
        handler.send_header("Retry-After", "0")
        handler.end_headers()
        handler.wfile.write(b"denied")

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {marker}-header")
    with caplog.at_level(logging.INFO), _endpoint(echo) as url:
        sink = OtlpSink(endpoint=url, timeout_s=2)
        try:
            outcome = sink.deliver([_record(0, reason=f"the agent said {marker}")])
        finally:
            sink.close()
    assert isinstance(outcome[0], Refused if status == 401 else Retry), outcome
    # (httpx's own request lines are not a worker's: configure_logs holds its loggers at WARNING)
    said = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore")))
    assert f"code: {status}" in said or "Transient error" in said, said  # (the exporter did log)
    assert marker not in said, said
    assert marker not in repr(outcome)
