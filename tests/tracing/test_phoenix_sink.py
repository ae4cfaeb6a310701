"""PhoenixSink against a local fake HTTP server: request shape and the outcome of every answer.

The real Phoenix server is in tests/integration/test_phoenix.py; here each answer Phoenix can
give (and some it gives only when something is wrong) is scripted.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests._redis import free_port
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, PhoenixSink, Refused, Retry

API_KEY = "px-secret-key-123"
Answer = tuple[int, dict[str, str], str]


@dataclass
class Seen:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakePhoenix:
    """Answers each POST with ``answer(body)``; records every request."""

    # (as Phoenix answers sync=true: one inserted annotation's id per annotation)
    answer: Callable[[dict[str, Any]], Answer] = lambda body: (
        200, {}, json.dumps({"data": [{"id": str(i)} for i, _ in enumerate(body["data"])]}),
    )  # fmt: skip
    seen: list[Seen] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def fake() -> Iterator[FakePhoenix]:
    state = FakePhoenix()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.seen.append(Seen(parts.path, parse_qs(parts.query), dict(self.headers.items()), body))
            status, headers, text = state.answer(body)
            payload = text.encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def record(span_id: str = "00f067aa0ba902b7", scorer_id: str = "relevancy", **fields: Any) -> ScoreRecord:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    return ScoreRecord(
        score_id=score_id_for(trace_id, span_id, scorer_id, "1"),
        trace_id=trace_id,
        span_id=span_id,
        scorer_id=scorer_id,
        **{"score": 0.5, "reason": "half of it", **fields},
    )


def test_request_shape_and_mapping(fake: FakePhoenix) -> None:
    """One synchronous POST per batch; LLM/CODE by judge; error and not-scorable rows; upsert identifier."""
    judged = record(scorer_id="faithfulness", scorer_name="Faithfulness", label="good", judge_models=["gpt-4o"])
    code = record(span_id="00f067aa0ba902b8", scorer_id="length", job_id="bf-1", source="backfill")
    failed = record(
        scorer_id="broken", score=None, reason=None, error_type="JudgeTimeout", error_message="no answer in 30s",
        failed_step="analyze",
    )  # fmt: skip
    skipped = record(scorer_id="needs-gt", score=None, reason=None, not_scorable="generate_score: no ground truth")
    sink = PhoenixSink(fake.url + "/", api_key=API_KEY)
    try:
        assert sink.name == "phoenix"
        assert sink.deliver([judged, code, failed, skipped]) == [Delivered()] * 4
    finally:
        sink.close()

    [seen] = fake.seen
    assert seen.path == "/v1/span_annotations"
    assert seen.query == {"sync": ["true"]}
    assert seen.headers["Authorization"] == f"Bearer {API_KEY}"
    a, b, c, d = seen.body["data"]
    assert a == {
        "span_id": "00f067aa0ba902b7",
        "name": "Faithfulness",
        "annotator_kind": "LLM",
        "result": {"label": "good", "score": 0.5, "explanation": "half of it"},
        "metadata": {
            "scorer_id": "faithfulness", "scorer_version": "1", "score_id": judged.score_id, "source": "live",
            "judge_models": ["gpt-4o"],
        },
        "identifier": f"tracescore:{judged.score_id}",
    }  # fmt: skip
    assert b["name"] == "length"
    assert b["annotator_kind"] == "CODE"
    assert b["metadata"]["job_id"] == "bf-1"
    assert b["metadata"]["source"] == "backfill"
    assert c["result"] == {"label": "error", "score": None, "explanation": "JudgeTimeout: no answer in 30s"}
    assert c["metadata"]["error_type"] == "JudgeTimeout"
    assert c["metadata"]["failed_step"] == "analyze"
    assert d["result"] == {"label": "not scorable", "score": None, "explanation": "generate_score: no ground truth"}


def test_no_api_key_no_auth_header(fake: FakePhoenix) -> None:
    """Without a key, no Authorization header is sent."""
    sink = PhoenixSink(fake.url)
    assert sink.deliver([record()]) == [Delivered()]
    sink.close()
    assert "Authorization" not in fake.seen[0].headers


def test_missing_spans_are_retried_and_the_rest_resent(fake: FakePhoenix) -> None:
    """Phoenix's 404 for spans it has not ingested: those records Retry, the others go in a second request."""
    missing = "00000000000000aa"

    def answer(body: dict[str, Any]) -> Answer:
        ids = {a["span_id"] for a in body["data"]}
        if missing in ids:
            return 404, {"Content-Type": "text/plain"}, f"Spans with IDs {missing} do not exist."
        return 200, {}, json.dumps({"data": [{"id": "x"}] * len(body["data"])})

    fake.answer = answer
    records = [record(), record(span_id=missing), record(scorer_id="other"), record(span_id=missing, scorer_id="b")]
    sink = PhoenixSink(fake.url)
    outcomes = sink.deliver(records)
    sink.close()
    assert outcomes[0] == outcomes[2] == Delivered()
    for outcome in (outcomes[1], outcomes[3]):
        assert isinstance(outcome, Retry)
        assert "not in Phoenix yet" in outcome.reason
        assert outcome.after_s > 0
    assert [len(s.body["data"]) for s in fake.seen] == [4, 2]


def test_unknown_404_is_refused_not_waited_for(fake: FakePhoenix) -> None:
    """A 404 that is not the missing-spans answer (wrong URL, old Phoenix) is Refused and names the setting."""
    fake.answer = lambda body: (404, {"Content-Type": "application/json"}, '{"detail":"Not Found"}')
    sink = PhoenixSink(fake.url)
    [outcome] = sink.deliver([record()])
    sink.close()
    assert outcome == Refused(
        "Phoenix has no span annotations API at this URL (HTTP 404): check TRACESCORE_PHOENIX_URL", "Not Found"
    )


@pytest.mark.parametrize(
    ("status", "headers", "after_s"),
    [
        (503, {"Retry-After": "7"}, 7.0),
        (429, {}, 0.0),
        (507, {}, 0.0),
        (408, {}, 0.0),
        (500, {"Retry-After": "x"}, 0.0),
    ],
)
def test_transient_statuses_retry(fake: FakePhoenix, status: int, headers: dict[str, str], after_s: float) -> None:
    """408/429/5xx (Phoenix's 507 too) are Retry for every record, Retry-After honoured."""
    fake.answer = lambda body: (status, headers, "busy")
    sink = PhoenixSink(fake.url)
    outcomes = sink.deliver([record(), record(scorer_id="b")])
    sink.close()
    assert outcomes == [Retry(f"Phoenix answered HTTP {status}", after_s=after_s)] * 2


def test_a_refused_batch_is_split_so_only_the_bad_record_is_refused(fake: FakePhoenix) -> None:
    """422 for a batch: re-sent one by one; only the record Phoenix objects to is Refused, and
    the detail keeps the field path and message but not the quoted input (the score's reason)."""

    def answer(body: dict[str, Any]) -> Answer:
        bad = [i for i, a in enumerate(body["data"]) if a["result"]["explanation"] == "SECRET-REASON"]
        if not bad:
            return 200, {}, json.dumps({"data": [{"id": "x"}] * len(body["data"])})
        detail = [{"type": "x", "loc": ["body", "data", bad[0], "result"], "msg": "too long", "input": "SECRET-REASON"}]
        return 422, {"Content-Type": "application/json"}, json.dumps({"detail": detail})

    fake.answer = answer
    sink = PhoenixSink(fake.url)
    outcomes = sink.deliver([record(), record(scorer_id="b", reason="SECRET-REASON"), record(scorer_id="c")])
    sink.close()
    assert outcomes[0] == outcomes[2] == Delivered()
    assert outcomes[1] == Refused("Phoenix refused the annotation (HTTP 422)", "body.data.0.result: too long")
    assert [len(s.body["data"]) for s in fake.seen] == [3, 1, 1, 1]


def _failing_with(poison: str) -> Callable[[dict[str, Any]], Answer]:
    """Phoenix answering a batch as it does when its database cannot take one annotation of it
    (one transaction: HTTP 500, nothing stored): here any whose explanation is ``poison``."""

    def answer(body: dict[str, Any]) -> Answer:
        if any(a["result"]["explanation"] == poison for a in body["data"]):
            return 500, {"Content-Type": "text/plain"}, "Internal Server Error"
        return 200, {}, json.dumps({"data": [{"id": "x"}] * len(body["data"])})

    return answer


def test_a_batch_phoenix_answers_500_is_halved_so_one_record_fails_alone(fake: FakePhoenix) -> None:
    """One record Phoenix's database cannot take made its whole batch a 500: every neighbour was
    a Retry with it, each a dead letter once SINK_MAX_ATTEMPTS ran out. Now the halves go apart
    until the record is found: only it is a Retry, in a few requests."""
    fake.answer = _failing_with("POISON")
    records = [record(scorer_id=f"s{n}", reason="POISON" if n == 4 else "fine") for n in range(7)]
    sink = PhoenixSink(fake.url)
    try:
        outcomes = sink.deliver(records)
    finally:
        sink.close()
    assert outcomes == [Retry("Phoenix answered HTTP 500") if n == 4 else Delivered() for n in range(7)]
    assert len(fake.seen) <= 7  # 1 + 2 per halving (7 → 4 → 2 → 1)


def test_a_500_for_every_half_is_a_retry_for_the_batch_in_three_requests(fake: FakePhoenix) -> None:
    """Phoenix failing everything (its database down) costs three requests a batch, not one per
    record."""
    fake.answer = lambda body: (500, {"Content-Type": "text/plain"}, "Internal Server Error")
    sink = PhoenixSink(fake.url)
    try:
        outcomes = sink.deliver([record(scorer_id=f"s{n}") for n in range(100)])
    finally:
        sink.close()
    assert outcomes == [Retry("Phoenix answered HTTP 500")] * 100
    assert [len(s.body["data"]) for s in fake.seen] == [100, 50, 50]


def test_auth_refusal_names_the_setting_and_hides_the_key(fake: FakePhoenix) -> None:
    """401 refuses the whole batch in one request; an answer that echoes the API key has it masked."""
    fake.answer = lambda body: (401, {}, f"invalid token Bearer {API_KEY}")
    sink = PhoenixSink(fake.url, api_key=API_KEY)
    outcome, other = sink.deliver([record(), record(scorer_id="b")])
    sink.close()
    assert isinstance(outcome, Refused)
    assert "TRACESCORE_PHOENIX_API_KEY" in outcome.reason
    assert API_KEY not in outcome.detail
    assert outcome.detail == "invalid token Bearer ***"
    assert other == outcome
    assert len(fake.seen) == 1  # the same for every record: not re-sent one by one


def test_long_answers_are_cut(fake: FakePhoenix) -> None:
    """A refusal's detail is cut short (an HTML error page is not a dead letter's reason)."""
    fake.answer = lambda body: (400, {"Content-Type": "text/html"}, "<p>" + "x" * 5000)
    sink = PhoenixSink(fake.url)
    [outcome] = sink.deliver([record()])
    sink.close()
    assert isinstance(outcome, Refused)
    assert len(outcome.detail) == 300


@pytest.mark.parametrize(
    ("answer", "reason", "detail"),
    [
        ((307, {"Location": "https://phoenix/"}, ""), "Phoenix answered a redirect (HTTP 307)", ""),
        ((400, {}, '{"message": "bad span"}'), "Phoenix refused the annotation (HTTP 400)", "bad span"),
        ((400, {}, "[" * 100_000), "Phoenix refused the annotation (HTTP 400)", "[" * 300),
        (
            (400, {}, '{"other": "SECRET-REASON"}'),
            "Phoenix refused the annotation (HTTP 400)",
            "an answer of JSON type dict",
        ),
    ],
)
def test_other_answers_are_refused_with_what_phoenix_said(
    fake: FakePhoenix, answer: Answer, reason: str, detail: str
) -> None:
    """Redirects name the setting; a proxy's JSON message is kept; JSON too deep to parse is text;
    JSON of unknown shape is described, not quoted."""
    fake.answer = lambda body: answer
    sink = PhoenixSink(fake.url)
    [outcome] = sink.deliver([record()])
    sink.close()
    assert isinstance(outcome, Refused)
    assert outcome.reason.startswith(reason)
    assert outcome.detail == detail


def test_an_undecodable_answer_is_retry(fake: FakePhoenix) -> None:
    """A body whose Content-Encoding does not decode is Retry, not an exception."""
    fake.answer = lambda body: (200, {"Content-Encoding": "gzip"}, "not gzip at all")
    sink = PhoenixSink(fake.url)
    assert sink.deliver([record()]) == [Retry("Phoenix's answer could not be decoded (DecodingError)")]
    sink.close()


def test_unreachable_and_slow_are_retry(fake: FakePhoenix) -> None:
    """Connection refused and a server slower than timeout_s are Retry naming which, never raising."""
    closed = PhoenixSink(f"http://127.0.0.1:{free_port()}")
    assert closed.deliver([record()]) == [Retry("Phoenix unreachable (ConnectError)")]
    closed.close()

    def slow(body: dict[str, Any]) -> Answer:
        time.sleep(1.0)
        return 200, {}, "{}"

    fake.answer = slow
    sink = PhoenixSink(fake.url, timeout_s=0.2)
    [outcome] = sink.deliver([record()])
    sink.close()
    assert outcome == Retry("Phoenix did not answer in time (ReadTimeout)")


def test_records_phoenix_cannot_take_are_refused_without_a_request(fake: FakePhoenix) -> None:
    """A span id that is not 16 hex digits, the reserved name 'note', a non-finite score: Refused locally."""
    records = [
        record(span_id="not-a-span-id"),
        record(scorer_id="note"),
        record(score=math.nan),
        record(span_id="00F067AA0BA902B9"),  # upper case is still a span id: sent in lower case
    ]
    sink = PhoenixSink(fake.url)
    outcomes = sink.deliver(records)
    sink.close()
    assert [type(o) for o in outcomes] == [Refused, Refused, Refused, Delivered]
    assert "16 hex digits" in outcomes[0].reason  # type: ignore[union-attr]
    assert "'note'" in outcomes[1].reason  # type: ignore[union-attr]
    assert "finite" in outcomes[2].reason  # type: ignore[union-attr]
    [seen] = fake.seen
    assert [a["span_id"] for a in seen.body["data"]] == ["00f067aa0ba902b9"]


def test_large_deliveries_are_batched(fake: FakePhoenix) -> None:
    """250 records go in requests of at most 100, outcomes in order."""
    records = [record(scorer_id=f"s{i}") for i in range(250)]
    sink = PhoenixSink(fake.url)
    assert sink.deliver(records) == [Delivered()] * 250
    assert sink.deliver([]) == []
    sink.close()
    assert [len(s.body["data"]) for s in fake.seen] == [100, 100, 50]


@pytest.mark.parametrize("url", ["phoenix:6006", "ftp://host/", "http://"])
def test_bad_url_raises_at_construction(url: str) -> None:
    """A URL that cannot be Phoenix's fails at once, naming the setting."""
    with pytest.raises(ValueError, match="TRACESCORE_PHOENIX_URL"):
        PhoenixSink(url)


def test_url_credentials_are_not_in_the_error() -> None:
    """The constructor's error redacts a password in the URL."""
    with pytest.raises(ValueError) as raised:
        PhoenixSink("ftp://user:hunter2@host/")
    assert "hunter2" not in str(raised.value)


def test_bad_timeout_raises() -> None:
    with pytest.raises(ValueError, match="timeout"):
        PhoenixSink("http://127.0.0.1:1", timeout_s=0)


def test_a_lone_surrogate_in_a_records_text_is_sent_as_replacement_character(fake: FakePhoenix) -> None:
    """A lone surrogate (json.loads of an agent's cut emoji) is U+FFFD in the record itself, and
    the sink's body encoding replaces one too (a record made without validation): both delivered."""
    built = record(reason="cut \ud83d")
    assert built.reason == "cut \ufffd"
    unvalidated = record(span_id="00f067aa0ba902b8").model_copy(update={"reason": "raw \udc00"})
    sink = PhoenixSink(fake.url)
    try:
        assert sink.deliver([built, unvalidated]) == [Delivered(), Delivered()]
    finally:
        sink.close()
    [seen] = fake.seen
    assert [a["result"]["explanation"] for a in seen.body["data"]] == ["cut \ufffd", "raw \ufffd"]
