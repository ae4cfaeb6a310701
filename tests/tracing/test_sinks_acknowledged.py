"""A 2xx is a delivery only when its body is the backend's own acknowledgement: a page, an empty
or garbled body, or JSON of another shape (a proxy, a web app at a wrong path, a half-restarted
server) says nothing was stored, and the score must stay owed, not be marked delivered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, Delivery, LangfuseSink, MlflowSink, OtlpSink, PhoenixSink, Retry, ScoreSink

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_SECRET_REASON = "the agent told customer 4711 their card number"

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
    assert "4711" not in outcome.reason


def test_an_otlp_endpoint_answering_a_web_page_is_a_retry() -> None:
    """A 2xx web page is no OTLP receiver's answer (an empty body and a protobuf or JSON
    ExportTraceServiceResponse are): it was Delivered."""
    outcome = _one_delivery("otlp", 200, *_NOT_ACKS["web_page"])
    assert isinstance(outcome, Retry), outcome
    assert "HTTP 200" in outcome.reason
    assert "4711" not in outcome.reason


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
def test_the_backends_own_acknowledgement_is_a_delivery(kind: str) -> None:
    """(The check above must not refuse what the real server answers.)"""
    assert _one_delivery(kind, 200, "application/json", _ACK[kind]) == Delivered()
