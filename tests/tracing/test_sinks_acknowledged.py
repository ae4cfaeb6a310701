"""A 2xx is a delivery only when its body is the backend's own acknowledgement: a page, an empty
or garbled body, or JSON of another shape (a proxy, a web app at a wrong path, a half-restarted
server) says nothing was stored, and the score must stay owed, not be marked delivered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, Delivery, LangfuseSink, MlflowSink, OtlpSink, PhoenixSink, Retry, ScoreSink

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_SECRET_REASON = "the agent told customer QZXJ their card number"

# What each backend answers a write it stored (checked against the real servers in
# tests/integration): Phoenix's synchronous annotation ids, MLflow's assessment, Langfuse's id.
_ACK: dict[str, bytes] = {
    "phoenix": b'{"data":[{"id":"U3BhbkFubm90YXRpb246MQ=="}]}',
    "mlflow": b'{"assessment":{"assessment_id":"a-1"}}',
    "langfuse": b'{"id":"x"}',
}

# 2xx answers that are not the backend's acknowledgement: (content type, body).
_NOT_ACKS: dict[str, tuple[str, bytes]] = {
    "web_page": ("text/html; charset=utf-8", b"<!doctype html><html><body>Sign in</body></html>"),
    "empty": ("application/json", b""),
    "garbage": ("application/octet-stream", b"\x00\x9f\x13garbage"),
    "other_json": ("application/json", b'{"status":"ok"}'),
    "json_list": ("application/json", b"[]"),
}


def _record(n: int = 0) -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
        score=0.5, reason=_SECRET_REASON,
    )  # fmt: skip


@contextmanager
def _answering(answers: list[tuple[int, str, bytes]]) -> Iterator[str]:
    """A server answering each POST, PATCH and DELETE with the next of ``answers`` (the last one
    for good once they run out); yields its URL."""
    queue = list(answers)

    class Handler(QuietHandler):
        def _serve(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, content_type, body = queue.pop(0) if len(queue) > 1 else queue[0]
            self.send_response(status)
            if content_type:  # ("": none sent, as a bare server's empty 200)
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = do_DELETE = _serve

    with serving(Handler) as url:
        yield url


def _sink(kind: str, url: str) -> ScoreSink:
    if kind == "phoenix":
        return PhoenixSink(url, timeout_s=5)
    if kind == "mlflow":
        return MlflowSink(url, timeout_s=5)
    if kind == "langfuse":
        return LangfuseSink(url, "pk-lf-1", "sk-lf-1", timeout_s=5)
    return OtlpSink(endpoint=f"{url}/v1/traces", timeout_s=5)


def _one_delivery(kind: str, status: int, content_type: str, body: bytes) -> Delivery:
    """The outcome of one record delivered by a ``kind`` sink to a server answering so."""
    with _answering([(status, content_type, body)]) as url:
        sink = _sink(kind, url)
        try:
            (outcome,) = sink.deliver([_record()])
        finally:
            sink.close()
    return outcome


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
@pytest.mark.parametrize("answer", sorted(_NOT_ACKS))
def test_a_2xx_without_the_backends_acknowledgement_is_a_retry_naming_it(kind: str, answer: str) -> None:
    """Each was Delivered: the score left the outbox for good while the backend (or whatever
    answered in its place) stored nothing we know of."""
    outcome = _one_delivery(kind, 200, *_NOT_ACKS[answer])
    assert isinstance(outcome, Retry), outcome
    assert "HTTP 200" in outcome.reason
    assert "acknowledg" in outcome.reason
    assert "QZXJ" not in outcome.reason


# 2xx answers no OTLP receiver gives (OTLP/HTTP: "The response body MUST be the appropriate
# serialized Protobuf message", ExportTraceServiceResponse, in the request's Content-Type).
_OTLP_NOT_ACKS: dict[str, tuple[str, bytes]] = {
    "web_page": _NOT_ACKS["web_page"],
    "plain_ok": ("text/plain; charset=utf-8", b"OK"),  # a proxy's or a health page's "OK"
    "plain_text": ("text/plain", b"404 page not found, but 200"),
    "garbage": _NOT_ACKS["garbage"],
    "protobuf_not_parsing": ("application/x-protobuf", b"OK"),
    "json_list": _NOT_ACKS["json_list"],
    "json_string": ("application/json", b'"ok"'),
}

_WARNING = ExportTraceServiceResponse()
_WARNING.partial_success.error_message = "deprecated attribute seen"  # rejects none: a warning

# What real OTLP receivers answer an export they stored (read from their sources): the
# OpenTelemetry Collector's otlpreceiver (so Tempo's and Jaeger's distributors) writes the
# ExportTraceServiceResponse in the request's encoding, which for a full success is zero bytes of
# protobuf; Phoenix's and MLflow's /v1/traces answer the same (application/x-protobuf, b"");
# Langfuse's /api/public/otel/v1/traces answers JSON ({}) even to a protobuf export.
_OTLP_ACKS: dict[str, tuple[int, str, bytes]] = {
    "collector_empty_protobuf": (200, "application/x-protobuf", b""),
    "protobuf_warning": (200, "application/x-protobuf", _WARNING.SerializeToString()),
    "langfuse_json": (200, "application/json; charset=utf-8", b"{}"),
    "json_unknown_fields": (200, "application/json", b'{"accepted":true}'),
    "bare_empty_200": (200, "", b""),
    "no_content_204": (204, "", b""),
}


@pytest.mark.parametrize("answer", sorted(_OTLP_NOT_ACKS))
def test_an_otlp_endpoint_answering_no_export_response_is_a_retry(answer: str) -> None:
    """A 2xx that is not an ExportTraceServiceResponse (a page, a proxy's "OK", bytes protobuf
    cannot read) comes from something else at that URL: each but the page was Delivered."""
    outcome = _one_delivery("otlp", 200, *_OTLP_NOT_ACKS[answer])
    assert isinstance(outcome, Retry), outcome
    assert "HTTP 200" in outcome.reason
    assert "acknowledg" in outcome.reason
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in outcome.reason
    assert "QZXJ" not in outcome.reason


@pytest.mark.parametrize("answer", sorted(_OTLP_ACKS))
def test_what_real_otlp_receivers_answer_is_a_delivery(answer: str) -> None:
    """(The check above must not refuse a real receiver; the real Phoenix's answer:
    tests/integration/test_phoenix.py.)"""
    assert _one_delivery("otlp", *_OTLP_ACKS[answer]) == Delivered()


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
def test_the_backends_own_acknowledgement_is_a_delivery(kind: str) -> None:
    """(The check above must not refuse what the real server answers.)"""
    assert _one_delivery(kind, 200, "application/json", _ACK[kind]) == Delivered()
