"""The score sinks: OTLP carrier spans (inside the scored span, sent synchronously, a refusal
named), JSONL, console, and the outcome each one answers per record."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests._drip import drip
from tests._http import QuietHandler, serving
from tests._otlp_receiver import OtlpReceiver
from tests._redis import free_port
from tests._work import Spy, counted_lines
from tracing import ScoreRecord, score_id_for
from tracing.sinks import (
    ConsoleSink,
    Delivered,
    Delivery,
    JsonlSink,
    MemorySink,
    OtlpSink,
    Refused,
    Retry,
    ScoreSink,
    ScoreWriter,
)

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
START, END = 1_764_000_000_000_000_000, 1_764_000_002_500_000_000  # a 2.5 s scored span


def _rec(scorer: str, **kw: object) -> ScoreRecord:
    fields: dict[str, object] = {"span_start_ns": START, "span_end_ns": END, "scored_at": END / 1e9 + 3600}
    fields.update(kw)
    return ScoreRecord(
        score_id=score_id_for(TRACE, SPAN, scorer, "2"),
        trace_id=TRACE,
        span_id=SPAN,
        span_name="invoke_agent",
        scorer_id=scorer,
        scorer_version="2",
        **fields,  # type: ignore[arg-type]
    )


def test_every_sink_satisfies_the_contract(tmp_path: Path) -> None:
    """OTLP, JSONL, console and memory sinks are ScoreSinks; the local ones are ScoreWriters too."""
    sinks = [
        OtlpSink(InMemorySpanExporter()),
        JsonlSink(tmp_path / "s.jsonl"),
        ConsoleSink(io.StringIO()),
        MemorySink(),
    ]
    for sink in sinks:
        assert isinstance(sink, ScoreSink)
    assert all(isinstance(s, ScoreWriter) for s in sinks[1:])
    assert [s.name for s in sinks] == ["otlp", "jsonl", "console", "memory"]
    for sink in sinks:
        sink.close()


def test_otlp_sink_makes_one_child_carrier_span_per_score_inside_the_scored_span() -> None:
    """Two scores of one span → two carrier spans (TraceQL metrics count spans: one per score
    makes a count of evaluation events a count of scores), each a child of the scored span and
    linked to it, lying inside it (the event at its end); the real scoring time is an attribute."""
    exporter = InMemorySpanExporter()
    sink = OtlpSink(exporter)
    outcomes = sink.deliver(
        [
            _rec(
                "relevancy",
                score=0.8,
                label="relevant",
                reason="on topic",
                judge_models=["openai/gpt-4o-mini"],
                input_tokens=120,
                output_tokens=8,
                cached_input_tokens=100,
                cost_usd=0.0004,
            ),
            _rec("toxicity", error_type="JudgeAuthError", error_message="no key"),
        ]
    )
    assert outcomes == [Delivered(), Delivered()]
    carriers = exporter.get_finished_spans()  # sent by deliver itself: no flush needed
    assert len(carriers) == 2
    assert len({span.context.span_id for span in carriers}) == 2
    for span in carriers:
        assert span.kind is SpanKind.INTERNAL
        assert span.context.trace_id == int(TRACE, 16)
        assert span.parent is not None
        assert span.parent.span_id == int(SPAN, 16)
        assert span.parent.is_remote
        assert [link.context.span_id for link in span.links] == [int(SPAN, 16)]
        assert span.attributes["tracescore.role"] == "score_writer"
        assert START <= span.start_time <= span.end_time <= END
        assert len(span.events) == 1
    ok, bad = (span.events[0] for span in carriers)
    assert ok.timestamp == bad.timestamp == END
    assert ok.name == bad.name == "gen_ai.evaluation.result"
    assert ok.attributes["gen_ai.evaluation.name"] == "relevancy"
    assert ok.attributes["gen_ai.evaluation.score.value"] == 0.8
    assert ok.attributes["gen_ai.evaluation.score.label"] == "relevant"
    assert ok.attributes["gen_ai.evaluation.explanation"] == "on topic"
    assert ok.attributes["tracescore.score.id"] == score_id_for(TRACE, SPAN, "relevancy", "2")
    assert ok.attributes["tracescore.scored_at"] == END / 1e9 + 3600
    assert ok.attributes["gen_ai.usage.input_tokens"] == 120
    assert ok.attributes["gen_ai.usage.cache_read.input_tokens"] == 100
    assert ok.attributes["tracescore.judge.cost_usd"] == 0.0004
    assert ok.attributes["tracescore.judge.model"] == "openai/gpt-4o-mini"
    assert "error.type" not in ok.attributes
    assert bad.attributes["error.type"] == "JudgeAuthError"
    assert "gen_ai.evaluation.score.value" not in bad.attributes
    assert "tracescore.judge.cost_usd" not in bad.attributes


def test_otlp_sink_resend_is_the_same_carrier_span() -> None:
    """The carrier's span id comes from its score's id: a re-send repeats it, another score does not."""
    exporter = InMemorySpanExporter()
    sink = OtlpSink(exporter)
    sink.deliver([_rec("a", score=1.0)])
    sink.deliver([_rec("a", score=1.0)])
    sink.deliver([_rec("b", score=1.0)])
    first, again, other = (s.context.span_id for s in exporter.get_finished_spans())
    assert first == again != other


def test_otlp_sink_without_span_times_falls_back_to_a_zero_length_carrier_at_enqueue_time() -> None:
    """An older record (no span times): a zero-length carrier when its run was queued."""
    exporter = InMemorySpanExporter()
    OtlpSink(exporter).deliver([_rec("a", score=1.0, span_start_ns=None, span_end_ns=None, enqueued_at=1000.5)])
    (span,) = exporter.get_finished_spans()
    assert span.start_time == span.end_time == 1000_500_000_000


class _Failing(InMemorySpanExporter):
    def export(self, spans):  # type: ignore[no-untyped-def]
        return SpanExportResult.FAILURE


def test_otlp_sink_custom_exporter_failure_is_a_retry() -> None:
    """A custom exporter's FAILURE tells no status: each record is a Retry."""
    assert OtlpSink(_Failing()).deliver([_rec("a", score=1.0)]) == [Retry("otlp_export_failed")]


def test_otlp_sink_over_http_delivers_refuses_and_retries() -> None:
    """Against a real OTLP/HTTP receiver: 200 → Delivered (the receiver decodes the event); 400 →
    Refused with the status and the receiver's answer; 503 and a closed port → Retry."""
    receiver = OtlpReceiver().start()
    try:
        sink = OtlpSink(endpoint=receiver.endpoint, timeout_s=2)
        assert sink.deliver([_rec("a", score=1.0)]) == [Delivered()]
        assert receiver.score_ids() == {score_id_for(TRACE, SPAN, "a", "2"): 1}
        receiver.status, receiver.answer = 400, b"missing header x-mlflow-experiment-id"
        (refused,) = sink.deliver([_rec("b", score=1.0)])
        assert refused == Refused("otlp_http_400", "missing header x-mlflow-experiment-id")
        receiver.status = 503
        (retry,) = sink.deliver([_rec("c", score=1.0)])
        assert isinstance(retry, Retry)
        assert retry.reason == "otlp_http_503"
        sink.close()
    finally:
        receiver.stop()
    closed = OtlpSink(endpoint=f"http://127.0.0.1:{free_port()}/v1/traces", timeout_s=1)
    (down,) = closed.deliver([_rec("d", score=1.0)])
    assert down == Retry("OTLP endpoint unreachable (ConnectError)")  # named as the HTTP sinks name it
    closed.close()


def test_jsonl_sink_appends_records(tmp_path: Path) -> None:
    """Each record is one JSON line that reads back as the same ScoreRecord."""
    path = tmp_path / "scores" / "out.jsonl"
    sink = JsonlSink(path)
    records = [_rec("a", score=1.0), _rec("b", score=0.0)]
    assert sink.deliver(records) == [Delivered(), Delivered()]
    sink.close()
    assert [ScoreRecord.model_validate(json.loads(line)) for line in path.read_text().splitlines()] == records


def test_console_sink_prints_one_line_per_score() -> None:
    """Console lines name the trace, scorer, and score or error."""
    out = io.StringIO()
    ConsoleSink(out).deliver([_rec("a", score=0.25, label="low"), _rec("b", error_type="X", error_message="m")])
    first, second = out.getvalue().splitlines()
    assert "scorer=a 0.250 (low)" in first
    assert TRACE in first
    assert "error X: m" in second


def test_scored_records_carry_the_span_times_and_their_carriers_are_never_scored() -> None:
    """score_batch records the target span's times; the OTLP sink's carriers lie inside those
    spans; fed back to the capture exporter, none is scored (loop guard)."""
    from tests.worker._batches import batch
    from tests.worker.sample_scorers import length
    from tracing import CallbackSink, ScoringRule, ScoringSpanExporter
    from worker._registry import Registry
    from worker._scoring import ScoringDeps, score_batch
    from worker.store import MemoryScoreStore

    msg = batch(range(3), ["length"], salt="otlp")
    for request in msg.requests:
        for span in request.spans:
            span.start_time_ns, span.end_time_ns = START, END
    store, memory = MemoryScoreStore(), MemorySink()
    assert (
        asyncio.run(score_batch(msg, ScoringDeps(registry=Registry([length]), store=store, writer=memory))).scored == 3
    )
    assert {(r.span_start_ns, r.span_end_ns) for r in memory.records} == {(START, END)}
    exporter = InMemorySpanExporter()
    OtlpSink(exporter).deliver(memory.records)
    spans = exporter.get_finished_spans()
    assert sorted(format(s.parent.span_id, "016x") for s in spans if s.parent) == sorted(
        t for r in msg.requests for t in r.target_span_ids
    )
    assert all(START <= s.start_time <= s.end_time <= END for s in spans)

    sent: list[object] = []
    capture = ScoringSpanExporter([ScoringRule(["length"])], CallbackSink(sent.append), grace_s=0.0)
    capture.export(spans)
    assert capture.force_flush(5000)
    assert sent == []
    assert capture.stats()["skipped"].get("loop_guard") == 3
    capture.shutdown()


def test_otlp_refusal_detail_hides_header_tokens_and_score_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint that echoes the request in its 400: the dead letter's detail has neither the
    exporter's header token nor the score's reason."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20tok-123456789")
    receiver = OtlpReceiver().start()
    try:
        receiver.status = 400
        receiver.answer = b"bad request: authorization=Bearer tok-123456789 explanation=the answer cites Paris"
        sink = OtlpSink(endpoint=receiver.endpoint, timeout_s=2)
        (refused,) = sink.deliver([_rec("a", score=1.0, reason="the answer cites Paris")])
        sink.close()
    finally:
        receiver.stop()
    assert isinstance(refused, Refused)
    assert "tok-123456789" not in refused.detail
    assert "cites Paris" not in refused.detail
    assert refused.detail.startswith("bad request:")


def test_otlp_sink_splits_a_batch_refused_for_its_content() -> None:
    """An endpoint refusing a request for what one record holds (400) or its size (413): the
    batch is split and re-sent, so only that record is refused (a 413 of one names its size)
    and every other score arrives once."""
    import threading
    from collections import Counter
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    arrived: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, answer = 200, b""
            if len(body) > 6000:
                status, answer = 413, b"<html>413 Request Entity Too Large</html>"
            elif b"POISON" in body:
                status, answer = 400, b"attribute value rejected"
            else:
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            for event in span.events:
                                for attr in event.attributes:
                                    if attr.key == "tracescore.score.id":
                                        arrived[attr.value.string_value] += 1
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def rec(n: int, reason: str) -> ScoreRecord:
        span = f"{n + 1:016x}"
        return ScoreRecord(
            score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
            score=0.5, reason=reason, span_start_ns=START, span_end_ns=END,
        )  # fmt: skip

    records = [rec(n, "fine") for n in range(6)]
    records[2] = rec(2, "POISON in the agent's answer")
    records[4] = rec(4, "x" * 8000)
    sink = OtlpSink(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces", timeout_s=5)
    try:
        outcomes = sink.deliver(records)
    finally:
        sink.close()
        server.shutdown()
        server.server_close()
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["Delivered", "Delivered", "Refused", "Delivered", "Refused", "Delivered"]
    poison, big = outcomes[2], outcomes[4]
    assert isinstance(poison, Refused)
    assert isinstance(big, Refused)
    assert (poison.reason, poison.detail) == ("otlp_http_400", "attribute value rejected")
    assert big.reason == "otlp_http_413"
    assert "bytes, over the endpoint's size limit" in big.detail
    assert arrived == Counter({r.score_id: 1 for i, r in enumerate(records) if i not in (2, 4)})


@contextmanager
def _answering(status: int, headers: dict[str, str], body: bytes) -> Iterator[str]:
    """A local HTTP server answering every POST and PATCH with this answer; yields its URL."""

    class Handler(QuietHandler):
        def _serve(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = _serve

    with serving(Handler) as url:
        yield url


def _http_sink(kind: str, url: str, timeout_s: float = 10.0) -> ScoreSink:
    """The ``kind`` sink (phoenix, mlflow, langfuse, otlp) writing to the server at ``url``."""
    from tracing.sinks import LangfuseSink, MlflowSink, PhoenixSink

    if kind == "phoenix":
        return PhoenixSink(url, timeout_s=timeout_s)
    if kind == "mlflow":
        return MlflowSink(url, timeout_s=timeout_s)
    if kind == "langfuse":
        return LangfuseSink(url, "pk-lf-1", "sk-lf-1", timeout_s=timeout_s)
    return OtlpSink(endpoint=f"{url}/v1/traces", timeout_s=timeout_s)


_HOSTILE: dict[str, tuple[int, dict[str, str], bytes]] = {
    # Nested past what json.loads goes (RecursionError), as a refusal.
    "nested": (400, {"Content-Type": "application/json"}, b"[" * 100_000),
    # An answer whose Content-Encoding cannot be undone (httpx.DecodingError).
    "bad_gzip": (400, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"not gzip at all"),
    # A validation error quoting the request (FastAPI's `input`, a zod issue's `received`).
    "quotes_input": (
        422,
        {"Content-Type": "application/json"},
        json.dumps(
            {
                "message": "Invalid request data",
                "detail": [{"loc": ["body", "data", 0], "msg": "bad value", "input": {"explanation": "ok SECRET"}}],
            }
        ).encode(),
    ),
    # A charset Python cannot decode with: httpx's .text raised TypeError out of deliver.
    "odd_charset": (400, {"Content-Type": "application/json; charset=rot13"}, b'{"message": "no"}'),
    # "<" without ">": the markup pattern scanned the rest of the body from every "<" (quadratic;
    # 1 MB held the GIL for minutes).
    "markup_bomb": (400, {"Content-Type": "text/html"}, b"<" * 1_000_000),
    # An error_code that is no code: MLflow put it in the refusal's reason, unscrubbed and uncut.
    "code_echo": (
        400,
        {"Content-Type": "application/json"},
        json.dumps({"error_code": "header was Bearer SECRET; rationale was ok SECRET", "message": "m"}).encode(),
    ),
}


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
@pytest.mark.parametrize("answer", sorted(_HOSTILE))
def test_http_sinks_read_hostile_answers_alike(kind: str, answer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The three HTTP sinks read refusals through one parser: a nested answer is a refusal (no
    RecursionError), an undecodable one a Retry (no DecodingError out of deliver), and a quoted
    request's text (the score's, even short) is never in the detail. The markup pattern is given
    a page of the answer at most (the bomb's 1 MB took minutes of CPU a refusal)."""
    from tracing.sinks import _http

    tags = Spy(_http._TAGS)
    monkeypatch.setattr(_http, "_TAGS", tags)
    status, headers, body = _HOSTILE[answer]
    span = "00f067aa0ba902b7"
    record = ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
        score=0.5, reason="ok SECRET",
    )  # fmt: skip
    with _answering(status, headers, body) as url:
        sink = _http_sink(kind, url)
        try:
            (outcome,) = sink.deliver([record])
        finally:
            sink.close()
    # A wedge guard, counted instead of timed: what the pattern scans is a page, once (below).
    assert all(size <= _http._PAGE_CHARS for _, size in tags.calls), tags.calls
    assert tags.calls or answer != "markup_bomb"
    if answer == "bad_gzip":
        assert isinstance(outcome, Retry)
        assert "could not be decoded (DecodingError)" in outcome.reason
        return
    assert isinstance(outcome, Refused)
    assert "SECRET" not in outcome.detail
    assert "SECRET" not in outcome.reason
    assert "ok " not in outcome.detail
    if answer == "quotes_input":
        assert outcome.detail == "Invalid request data: body.data.0: bad value"


def test_the_markup_pattern_scans_a_page_once() -> None:
    """A tag holds no "<", so the markup pattern's scan from a "<" ends at the next one: a page of
    "<" and no ">" is read once, where "<[^>]*>" read the rest of it from every "<" (quadratic)."""
    from tracing.sinks._http import _TAGS

    assert [m.span() for m in _TAGS.finditer("<<a<b>x>")] == [(3, 6)]
    assert _TAGS.sub(" ", "<" * 5 + "<p>hi</p>") == "<<<<< hi "


_ECHOED = 'The agent said "Paris is the capital"\n  & cited <source 3>; customer id 4711-ABCD.'


def _echoes() -> dict[str, tuple[str, bytes]]:
    """A backend's refusals quoting the score's reason changed on the way: (content type, body)."""
    import html

    r = _ECHOED
    return {
        "cut": ("text/plain", f"value too long: '{r[:40]}...'".encode()),
        "html": ("text/html", f"<p>rejected: {html.escape(r)}</p>".encode()),
        "json_in_text": ("text/plain", f"bad field explanation={json.dumps(r)}".encode()),
        "repr": ("text/plain", f"ValueError({r!r})".encode()),
        "json_message_cut": ("application/json", json.dumps({"message": f"Invalid value {r[:30]}"}).encode()),
    }


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse", "otlp"])
@pytest.mark.parametrize("echo", sorted(_echoes()))
def test_a_refusal_echoing_the_score_text_cut_or_escaped_shows_none_of_it(kind: str, echo: str) -> None:
    """Only an exact echo of a score text was masked: a backend quoting the judge's reason cut
    short, HTML- or JSON-escaped, or as a Python repr put the agent's words in the dead letter
    (and the logs). Now no stretch of 16 characters of it is left; the backend's own words are."""
    import html

    content_type, body = _echoes()[echo]
    span = "00f067aa0ba902b7"
    record = ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
        score=0.5, reason=_ECHOED,
    )  # fmt: skip
    with _answering(400, {"Content-Type": content_type}, body) as url:
        sink = _http_sink(kind, url, timeout_s=5)
        try:
            (outcome,) = sink.deliver([record])
        finally:
            sink.close()
    assert isinstance(outcome, Refused), outcome
    for form in {_ECHOED, html.escape(_ECHOED), json.dumps(_ECHOED)[1:-1], repr(_ECHOED)[1:-1]}:
        for flat in (form, " ".join(form.split())):
            for i in range(len(flat) - 15):
                assert flat[i : i + 16] not in outcome.detail, (flat[i : i + 16], outcome.detail)
    said = {"cut": "value too long:", "html": "rejected:", "json_in_text": "bad field explanation="}
    assert outcome.detail.startswith(said.get(echo, "ValueError(" if echo == "repr" else "Invalid value"))
    assert "***" in outcome.detail


def test_a_refusal_keeps_the_backends_own_words() -> None:
    """The echo mask matches stretches of the score texts, not the backend's message around them;
    a text under 16 characters is still masked where echoed whole."""
    from tracing.sinks._http import refusal_detail

    assert refusal_detail("project 'default' does not exist", [], [_ECHOED]) == "project 'default' does not exist"
    assert refusal_detail("label was mostly-good here", [], ["mostly-good"]) == "label was *** here"


def test_the_echo_mask_of_a_repetitive_page_and_text_is_cheap() -> None:
    """A page of one repeated character against a score text of the same: each stretch of the
    text marked every place it occurs in the page, once per repeat (5,000 × 16,000 marks a
    text: about 9 s of CPU a refusal, holding the drainer). A wedge guard, counted, not timed:
    the mask runs a few dozen lines at most a character it reads (tests/_work.py)."""
    from tracing.sinks._http import _PAGE_CHARS, refusal_detail

    page, texts = "a" * 20_000, ["a" * 5_000] * 3
    read = min(len(page), _PAGE_CHARS) + sum(map(len, texts))  # the page is cut, the texts are not
    with counted_lines(budget=30 * read):
        detail = refusal_detail(page, [], texts)
    assert detail == "***"


def test_otlp_sink_a_refusal_of_every_record_alike_is_not_split_to_the_end() -> None:
    """A 422 that both halves of a batch get alike (a missing header: no one record's doing)
    refuses the whole batch after three requests, not one request per record."""
    receiver = OtlpReceiver().start()
    receiver.status, receiver.answer = 422, b"Missing required header x-mlflow-experiment-id"
    spans = [f"{n + 1:016x}" for n in range(8)]
    records = [
        ScoreRecord(score_id=score_id_for(TRACE, s, "s", "1"), trace_id=TRACE, span_id=s, scorer_id="s", score=0.5)
        for s in spans
    ]
    sink = OtlpSink(endpoint=receiver.endpoint, timeout_s=5)
    try:
        outcomes = sink.deliver(records)
    finally:
        sink.close()
        receiver.stop()
    assert outcomes == [Refused("otlp_http_422", "Missing required header x-mlflow-experiment-id")] * 8
    assert receiver.requests == 3


def test_mlflow_a_proxys_413_for_one_record_refuses_that_record_only() -> None:
    """A 4xx page with no MLflow error code (an nginx 413 for one large rationale) was taken
    for 'no MLflow API at this URL' and refused every record after it, unsent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tracing.sinks import MlflowSink

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(size)
            too_large = (413, b"<html>413 Request Entity Too Large</html>")
            status, body = too_large if size > 8192 else (200, b'{"assessment":{}}')
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sink = MlflowSink(f"http://127.0.0.1:{server.server_address[1]}")
    spans = [f"{n + 1:016x}" for n in range(6)]
    records = [
        ScoreRecord(
            score_id=score_id_for(TRACE, s, "s", "1"), trace_id=TRACE, span_id=s, scorer_id="s", score=0.5,
            reason="x" * 20_000 if n == 0 else "short",
        )
        for n, s in enumerate(spans)
    ]  # fmt: skip
    try:
        outcomes = sink.deliver(records)
    finally:
        sink.close()
        server.shutdown()
        server.server_close()
    assert isinstance(outcomes[0], Refused)
    assert "HTTP 413" in outcomes[0].reason
    assert outcomes[1:] == [Delivered()] * 5


def _one_record() -> ScoreRecord:
    return ScoreRecord(
        score_id=score_id_for(TRACE, "1" * 16, "s", "1"), trace_id=TRACE, span_id="1" * 16, scorer_id="s"
    )


def _otlp_outcome(receiver: OtlpReceiver, timeout_s: float) -> Delivery:
    """One record delivered by an OtlpSink to ``receiver`` (started); the receiver is stopped."""
    sink = OtlpSink(endpoint=receiver.endpoint, timeout_s=timeout_s)
    try:
        (outcome,) = sink.deliver([_one_record()])
    finally:
        sink.close()
        receiver.stop()
    return outcome


def test_otlp_sink_a_redirect_is_not_delivered() -> None:
    """The OTLP exporter calls any 3xx SUCCESS and follows none: the scores were counted
    delivered and never stored anywhere."""
    receiver = OtlpReceiver().start()
    receiver.status, receiver.answer = 308, b""
    outcome = _otlp_outcome(receiver, timeout_s=5)
    assert isinstance(outcome, Refused)
    assert outcome.reason == "otlp_http_308"
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in outcome.detail


@pytest.mark.parametrize("answer", ["dripped", "dripped_headers", "gzip_bomb", "huge"])
def test_otlp_sink_reads_an_answer_within_its_deadline_and_size(answer: str) -> None:
    """requests reads a whole answer, bounding each read, not the whole: an endpoint dripping a
    refusal, or the status line and headers of an acceptance, held the drainer (and its lease)
    as long as it liked, and a large or decompressing one took the memory. The refusal is named
    from what came within four timeouts and 256 KB; an acceptance not all in by then is not
    taken for one (a Retry: the endpoint may not have stored it); the next export, to a
    well-behaved answer, is delivered."""
    import gzip
    import threading
    import tracemalloc
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stop = threading.Event()
    refuse = threading.Event()
    refuse.set()
    bomb = gzip.compress(b"refused: " + b"x" * 300_000_000) if answer == "gzip_bomb" else b""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not refuse.is_set():
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            refuse.clear()
            if answer == "dripped_headers":  # 7.6 s: past the 2 s deadline
                drip(self.wfile, stop)
                self.close_connection = True
                return
            self.send_response(400)
            try:
                if answer == "dripped":
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"refused: ")
                    for _ in range(991):  # ~200 s at this pace, unless the client goes
                        if stop.wait(0.2):
                            return
                        self.wfile.write(b".")
                        self.wfile.flush()
                elif answer == "gzip_bomb":
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(bomb)))
                    self.end_headers()
                    self.wfile.write(bomb)
                else:
                    self.send_header("Content-Length", str(300 * 2**20))
                    self.end_headers()
                    self.wfile.write(b"refused: ")
                    for _ in range(300):
                        self.wfile.write(b"x" * 2**20)
            except OSError:  # the client stopped reading, as it should
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sink = OtlpSink(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1/traces", timeout_s=0.5)
    record = _one_record()
    outcomes: list[Any] = []
    worker = threading.Thread(target=lambda: outcomes.extend(sink.deliver([record]) + sink.deliver([record])))
    tracemalloc.start()  # every allocation, the body's decompression included (bytes objects)
    try:
        worker.start()
        worker.join(60)  # the old code read a dripped answer for ~200 s
        assert not worker.is_alive(), "deliver still reading the answer"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        stop.set()
        worker.join(30)
        sink.close()
        server.shutdown()
        server.server_close()
    assert peak < 32 * 2**20, f"{peak:,} bytes allocated reading a refusal"  # the old code: over 300 MB
    refused, delivered = outcomes
    assert delivered == Delivered()
    if answer == "dripped_headers":  # the old code waited the 7.6 s out: Delivered
        assert refused == Retry("OTLP endpoint: the answer was not finished within 2 s")
        return
    assert isinstance(refused, Refused)
    assert refused.reason == "otlp_http_400"
    assert refused.detail.startswith("refused: ")


@pytest.mark.parametrize(
    ("status", "header", "after_s"), [(429, "120", 120.0), (503, "100000", 600.0), (503, "soon", 0.0)]
)
def test_otlp_sink_passes_a_retry_after_past_the_exporters_timeout_on(status: int, header: str, after_s: float) -> None:
    """The exporter waits out a Retry-After only within its own timeout; a longer one was lost,
    and the drainer retried on its own schedule (sooner than the endpoint asked)."""
    receiver = OtlpReceiver().start()
    receiver.status, receiver.headers = status, {"Retry-After": header}
    assert _otlp_outcome(receiver, timeout_s=1) == Retry(f"otlp_http_{status}", after_s=after_s)


@pytest.mark.parametrize("kind", ["phoenix", "mlflow", "langfuse"])
@pytest.mark.parametrize("answer", ["dripped", "dripped_headers", "huge", "gzip_bomb", "gzip_trailer", "brotli"])
def test_http_sinks_bound_an_answer_in_time_and_size(kind: str, answer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx bounds each read, not the whole answer: one dripped a byte at a time, its body or
    its status line and headers, held the drainer (and its lease) as long as the server liked,
    and a huge one took the memory. Past four timeouts from the request's start, or past
    MAX_ANSWER_BYTES decompressed (a 16 MiB gzip answer was 16 GiB), the answer is a Retry; so
    is one in an encoding httpx would decode unbounded (br, zstd), and one going on past the end
    of its gzip data (zlib kept every byte after it, uncounted: read until the deadline)."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tracing.sinks import _http

    monkeypatch.setattr(_http, "MAX_ANSWER_BYTES", 4096)
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if answer == "dripped_headers":  # 7.6 s: past the 2 s deadline
                drip(self.wfile, stop)
                return
            body = b" " * (40 if answer == "dripped" else 50_000)
            self.send_response(200)
            if answer == "gzip_bomb":
                body = gzip.compress(body)  # 100 bytes, under the cap as sent
                self.send_header("Content-Encoding", "gzip")
            elif answer == "gzip_trailer":  # a small answer, then bytes that are no part of it
                body = gzip.compress(b"{}") + b"\0" * 50_000
                self.send_header("Content-Encoding", "gzip")
            elif answer == "brotli":
                self.send_header("Content-Encoding", "br")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if answer != "dripped":
                self.wfile.write(body)
                return
            for byte in range(len(body)):  # a byte every 0.2 s: 8 s in all, past the 2 s deadline
                if stop.wait(0.2):
                    return
                self.wfile.write(body[byte : byte + 1])
                self.wfile.flush()

        do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    sink = _http_sink(kind, url, timeout_s=0.5)
    span = "00f067aa0ba902b7"
    record = ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s", score=0.5
    )
    try:
        (outcome,) = sink.deliver([record])
    finally:
        stop.set()
        sink.close()
        server.shutdown()
        server.server_close()
    assert isinstance(outcome, Retry), outcome
    expected = {
        "dripped": "the answer was not finished within 2 s",
        "dripped_headers": "the answer was not finished within 2 s",
        "brotli": "answer could not be decoded (DecodingError)",
        "gzip_trailer": "answer could not be decoded (DecodingError)",
    }.get(answer, "the answer is over 4,096 bytes")
    assert outcome.reason.endswith(expected), outcome.reason


@pytest.mark.parametrize("kind", ["phoenix", "langfuse"])
def test_a_delivery_ends_within_one_exchanges_bound_however_many_it_makes(kind: str) -> None:
    """A backend refusing each request for its content, slowly (0.3 s an answer): Phoenix then
    sends the batch's records one request each, Langfuse sends one a record, and each exchange
    had the whole bound (four timeouts, 2 s here), so a delivery of 40 records took 41 (Phoenix)
    or 10 rounds of answers: a drainer held its lease, a command its last wait, that long. Every
    exchange of a delivery now ends within the bound from the delivery's start; the records it
    did not reach are a Retry naming it, sent at the drainer's next turn."""
    import threading
    import time as clock

    requests = 0
    lock = threading.Lock()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            nonlocal requests
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                requests += 1
            clock.sleep(0.3)
            body = b'{"message": "invalid"}'
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    records = [
        ScoreRecord(
            score_id=score_id_for(TRACE, f"{n + 1:016x}", "s", "1"), trace_id=TRACE, span_id=f"{n + 1:016x}",
            scorer_id="s", score=0.5,
        )
        for n in range(40)
    ]  # fmt: skip
    with serving(Handler) as url:
        sink = _http_sink(kind, url, timeout_s=0.5)
        try:
            outcomes = sink.deliver(records)
        finally:
            sink.close()
    # (the answers come 0.3 s apart, 4 at a time for Langfuse: what fits in 2 s, not 41 or 40)
    assert requests <= (8 if kind == "phoenix" else 32), requests
    assert len(outcomes) == 40
    cut = [o for o in outcomes if isinstance(o, Retry)]
    assert cut, outcomes
    assert all(o.reason.endswith("the delivery was not finished within 2 s") for o in cut), cut
    assert all(isinstance(o, Refused) for o in outcomes if not isinstance(o, Retry)), outcomes


@pytest.mark.parametrize(("kind", "status"), [("phoenix", 200), ("mlflow", 200), ("langfuse", 400)])
def test_http_sinks_read_no_large_answer_as_json(kind: str, status: int) -> None:
    """An answer under the size bound but made of tiny JSON containers ("[{},{},...]", 8 MiB)
    was parsed whole, for an acknowledgement or a refusal's message: some 28 times its size in
    objects (230 MB here; the sinks that send four requests at once parsed four). No
    acknowledgement or error is that long: it is read as text, and the delivery is the Retry or
    the refusal it was."""
    import threading
    import tracemalloc

    body = b"[" + b",".join([b"{}"] * (8 * 2**20 // 3)) + b"]"

    class Handler(QuietHandler):
        def _serve(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = _serve

    span = "00f067aa0ba902b7"
    record = ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s", score=0.5
    )
    with serving(Handler) as url:
        sink = _http_sink(kind, url, timeout_s=5)
        outcomes: list[Any] = []
        worker = threading.Thread(target=lambda: outcomes.extend(sink.deliver([record])))
        tracemalloc.start()
        try:
            worker.start()
            worker.join(60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            sink.close()
    assert not worker.is_alive()
    assert peak < 64 * 2**20, f"{peak:,} bytes allocated reading an answer of {len(body):,}"
    (outcome,) = outcomes
    if status == 200:
        assert isinstance(outcome, Retry), outcome
        assert f"a body of {len(body):,} characters" in outcome.reason, outcome.reason
    else:
        assert isinstance(outcome, Refused), outcome


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "raw-deflate", "identity", ""])
def test_http_sinks_read_a_compressed_answer_as_sent(encoding: str) -> None:
    """The sinks' client decodes gzip and deflate itself (bounded); an answer reads the same as
    httpx would have read it."""
    import gzip
    import threading
    import zlib
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tracing.sinks._http import http_client

    answer = {"message": "é" * 1000, "n": list(range(500))}
    plain = json.dumps(answer).encode()
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    compress = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress}
    body = raw.compress(plain) + raw.flush() if encoding == "raw-deflate" else compress.get(encoding, bytes)(plain)
    encoding = encoding.removeprefix("raw-")  # what the server says: deflate, sent without zlib's header
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Accept-Encoding"))
            self.send_response(200)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client, _ = http_client(url, what="test URL", setting="TEST", timeout_s=5)
    try:
        response = client.get(url)
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    assert response.json() == answer
    assert seen == ["gzip, deflate"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "identity", "br"])
def test_otlp_sink_reads_a_compressed_refusal_as_sent(encoding: str) -> None:
    """The OTLP sink decodes a refusal's body as the HTTP sinks do (one decoder: gzip, deflate
    with or without zlib's header); one in an encoding not asked for reads as no detail."""
    import gzip
    import zlib

    said = b"missing header x-mlflow-experiment-id"
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    body = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "raw-deflate": lambda plain: raw.compress(plain) + raw.flush(),
    }.get(encoding, bytes)(said)
    with _answering(400, {"Content-Encoding": encoding.removeprefix("raw-")}, body) as url:
        sink = OtlpSink(endpoint=f"{url}/v1/traces", timeout_s=5)
        try:
            (outcome,) = sink.deliver([_one_record()])
        finally:
            sink.close()
    detail = "" if encoding == "br" else said.decode()
    assert outcome == Refused("otlp_http_400", detail)
