"""MlflowSink's reading of answers a plain ``mlflow server`` does not give on demand (429/503
from a proxy, 401 from an auth front, a hung server, a create losing a race): a scripted local
HTTP server answers each request in turn and records what the sink sent."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, MlflowSink, Refused, Retry

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TOKEN = "mlflow-token-do-not-echo-42"
NOT_FOUND = {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Assessment with ID 'a-x' not found"}
UPDATED = {"assessment": {"assessment_id": "a-x"}}


@dataclass
class Answer:
    status: int
    body: dict[str, Any] | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    hang_s: float = 0.0
    wait: threading.Barrier | None = None


@dataclass
class Scripted:
    """Answers requests with ``answers`` in order; ``seen`` is (method, path, auth header, body)."""

    answers: list[Answer] = field(default_factory=list)
    seen: list[tuple[str, str, str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def scripted() -> Iterator[tuple[Scripted, str]]:
    script = Scripted()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            script.seen.append(
                (self.command, self.path, self.headers.get("Authorization", ""), json.loads(raw or b"{}"))
            )
            answer = script.answers.pop(0)
            if answer.hang_s:
                script.release.wait(answer.hang_s)
            if answer.wait is not None:
                answer.wait.wait()
            body = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
            try:
                self.send_response(answer.status)
                for key, value in {"Content-Type": "application/json", **answer.headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body.encode())))
                self.end_headers()
                self.wfile.write(body.encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # a hung answer's client gave up (its timeout): nobody to answer

        do_PATCH = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield script, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        script.release.set()
        server.shutdown()
        server.server_close()


def record(scorer_id: str = "relevancy", **fields: Any) -> ScoreRecord:
    return ScoreRecord(
        score_id=score_id_for(TRACE, SPAN, scorer_id, "1"),
        trace_id=TRACE,
        span_id=SPAN,
        scorer_id=scorer_id,
        **{"score": 0.5, "reason": "the answer quotes order 4711", **fields},
    )


def test_an_update_sends_the_token_and_the_whole_assessment(scripted: tuple[Scripted, str]) -> None:
    """PATCH to the deterministic id with Bearer auth, every mutable field in the mask."""
    script, url = scripted
    script.answers = [Answer(200, UPDATED)]
    r = record(judge_models=["openai/gpt-4o-mini"], label="good", job_id="bf-1")
    with_sink = MlflowSink(url + "/", token=TOKEN)
    try:
        assert with_sink.deliver([r]) == [Delivered()]
    finally:
        with_sink.close()
    [(method, path, auth, body)] = script.seen
    assert (method, auth) == ("PATCH", f"Bearer {TOKEN}")
    assert path == f"/api/3.0/mlflow/traces/tr-{TRACE}/assessments/a-{r.score_id[:32]}"
    assert body["update_mask"] == "assessmentName,feedback,rationale,metadata"
    a = body["assessment"]
    assert (a["assessment_name"], a["span_id"], a["source"]) == (
        "relevancy",
        SPAN,
        {"source_type": "LLM_JUDGE", "source_id": "relevancy"},
    )
    assert (a["feedback"], a["rationale"]) == ({"value": 0.5}, r.reason)
    assert a["metadata"] == {
        "score_id": r.score_id,
        "scorer_version": "1",
        "label": "good",
        "source": "live",
        "job_id": "bf-1",
        "judge_models": "openai/gpt-4o-mini",
    }


def test_a_create_that_loses_a_race_is_retried_then_updates(scripted: tuple[Scripted, str]) -> None:
    """PATCH 404 → POST answered 500 (another worker created the same id first): Retry; the next
    attempt's PATCH finds it: Delivered."""
    script, url = scripted
    duplicate = {"error_code": "INTERNAL_ERROR", "message": "Failed to create assessment ... constraint violation."}
    script.answers = [Answer(404, NOT_FOUND), Answer(500, duplicate), Answer(200, UPDATED)]
    sink = MlflowSink(url)
    try:
        assert sink.deliver([record()]) == [Retry("MLflow answered HTTP 500")]
        assert sink.deliver([record()]) == [Delivered()]
    finally:
        sink.close()
    assert [m for m, *_ in script.seen] == ["PATCH", "POST", "PATCH"]


@pytest.mark.parametrize(
    ("answer", "retry"),
    [
        (Answer(429, {}, {"Retry-After": "12"}), Retry("MLflow answered HTTP 429", after_s=12.0)),
        (Answer(503, "<html>busy</html>"), Retry("MLflow answered HTTP 503")),
    ],
)
def test_429_and_503_hold_back_the_rest_of_the_batch_unsent(
    scripted: tuple[Scripted, str], answer: Answer, retry: Retry
) -> None:
    """A 429 or 503 is a Retry with the server's Retry-After as the hint, for the rest of the
    batch too, without a request each: they were each sent into the window (792 requests in a
    10 s 429 window, in the sink audit)."""
    script, url = scripted
    script.answers = [answer]
    sink = MlflowSink(url, parallel=1)
    try:
        outcomes = sink.deliver([record(str(i)) for i in range(5)])
    finally:
        sink.close()
    assert outcomes == [retry] * 5
    assert len(script.seen) == 1


def test_401_is_refused_naming_the_token_setting_without_echoing_it(scripted: tuple[Scripted, str]) -> None:
    """401: the whole batch Refused after one request, naming the setting, the token masked."""
    script, url = scripted
    script.answers = [Answer(401, {"error_code": "UNAUTHENTICATED", "message": f"bad token {TOKEN}"})]
    sink = MlflowSink(url, token=TOKEN, parallel=1)
    try:
        outcomes = sink.deliver([record("a"), record("b"), record("c")])
    finally:
        sink.close()
    refused = Refused(
        "MLflow refused the credentials (HTTP 401): check TRACESCORE_MLFLOW_TOKEN",
        detail="UNAUTHENTICATED: bad token ***",
    )
    assert outcomes == [refused] * 3
    assert len(script.seen) == 1, "the token is wrong for every record: one request is enough"


def test_a_400_keeps_mlflows_message_without_the_scores_text(scripted: tuple[Scripted, str]) -> None:
    """A 400 with MLflow's error code: Refused with its message, the score's reason masked."""
    script, url = scripted
    r = record()
    message = f"Invalid rationale '{r.reason}'"
    script.answers = [Answer(400, {"error_code": "INVALID_PARAMETER_VALUE", "message": message})]
    sink = MlflowSink(url)
    try:
        [outcome] = sink.deliver([r])
    finally:
        sink.close()
    assert outcome == Refused(
        "MLflow refused the assessment (HTTP 400 INVALID_PARAMETER_VALUE)",
        detail="INVALID_PARAMETER_VALUE: Invalid rationale '***'",
    )


def test_a_hung_server_costs_one_round_of_timeouts_per_batch(scripted: tuple[Scripted, str]) -> None:
    """The first requests (``parallel`` at once) time out: every record of the batch is Retry,
    the rest without a request."""
    script, url = scripted
    script.answers = [Answer(200, UPDATED, hang_s=10.0), Answer(200, UPDATED, hang_s=10.0)]
    sink = MlflowSink(url, timeout_s=0.5, parallel=2)
    try:
        outcomes = sink.deliver([record(str(i)) for i in range(5)])
    finally:
        sink.close()
    assert outcomes == [Retry("MLflow did not answer in time (ReadTimeout)")] * 5
    assert len(script.seen) == 2


def test_records_are_sent_parallel_at_a_time(scripted: tuple[Scripted, str]) -> None:
    """``parallel=3``: three requests are in flight together (each answer waits for the third)."""
    script, url = scripted
    barrier = threading.Barrier(3, timeout=5)
    script.answers = [Answer(200, UPDATED, wait=barrier) for _ in range(6)]
    sink = MlflowSink(url, parallel=3)
    try:
        assert sink.deliver([record(str(i)) for i in range(6)]) == [Delivered()] * 6
    finally:
        sink.close()
    assert len(script.seen) == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tracking_uri": "mlflow:5000"}, "MLflow tracking URI must be http(s)://"),
        ({"tracking_uri": "ftp://u:secret-pw@h:5000"}, "got 'ftp://u:***@h:5000'"),
        ({"tracking_uri": "http://h:5000", "timeout_s": 0}, "positive number of seconds"),
        ({"tracking_uri": "http://h:5000", "trace_wait_s": float("nan")}, "trace_wait_s"),
    ],
)
def test_bad_arguments_fail_at_once(kwargs: dict[str, Any], message: str) -> None:
    """A bad URL, timeout or wait raises at construction, the URL's password masked."""
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        MlflowSink(**kwargs)
    assert "secret-pw" not in str(raised.value)


def test_every_metadata_key_an_assessment_may_hold_is_one_a_replacement_clears(
    scripted: tuple[Scripted, str],
) -> None:
    """An update whose answer shows one of our keys the record lacks (MLflow merges metadata) is
    made anew: the keys checked are every key the sink writes, and no other (MLflow's own stay)."""
    from tracing.sinks._mlflow import _METADATA_KEYS

    script, url = scripted
    full = record(
        label="good",
        job_id="bf-1",
        run_id="r-1",
        judge_models=["m"],
        failed_step="analyze",
        not_scorable="x",
        environment="production",
    )
    script.answers = [Answer(200, {"assessment": {"metadata": {"mlflow.own": "1"}}})]
    sink = MlflowSink(url)
    try:
        assert sink.deliver([full]) == [Delivered()]
    finally:
        sink.close()
    [(method, _, _, body)] = script.seen
    assert method == "PATCH"  # a key of MLflow's own is no reason to make it anew
    assert set(body["assessment"]["metadata"]) == _METADATA_KEYS


def test_a_delete_the_server_refuses_keeps_the_update_and_refuses_nothing(scripted: tuple[Scripted, str]) -> None:
    """The update of a replaced record showed stale fields and the DELETE to make it anew was
    refused (a proxy allowing no DELETE): every other record of the batch was refused unsent as
    "no MLflow tracking API at this URL" and dead-lettered, though the update had landed (review).
    Now the update stands (Delivered, its stale fields logged) and the batch goes on."""
    script, url = scripted
    stale = {"assessment": {"source": {"source_type": "CODE"}, "metadata": {"failed_step": "analyze"}}}
    script.answers = [Answer(200, stale), Answer(405, "<html>no</html>"), Answer(200, UPDATED)]
    sink = MlflowSink(url, parallel=1)
    try:
        outcomes = sink.deliver([record("a", judge_models=["m"]), record("b")])
    finally:
        sink.close()
    assert outcomes == [Delivered(), Delivered()]
    assert [method for method, *_ in script.seen] == ["PATCH", "DELETE", "PATCH"]
