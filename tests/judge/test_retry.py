"""Retries through the real SDKs: StreamErrorRetryProcessor rules, Retry-After, exhaustion."""

from __future__ import annotations

import contextlib
import email.utils
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from scorers import Judge, ScorerRunError
from scorers.judge import (
    JudgeAuthError,
    JudgeBadRequestError,
    JudgeConnectionError,
    JudgeContextLengthError,
    JudgeProviderError,
    JudgeRateLimitError,
    JudgeResponseError,
    JudgeServerError,
    JudgeTimeoutError,
    RetryMatcher,
    StreamErrorRetryProcessor,
    parse_retry_after_ms,
)
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import MODELS, full_scorer, run, score_scorer

OPENAI = "openai/gpt-4o-mini"


def judge(processor: StreamErrorRetryProcessor | None = None, **kw: object) -> Judge:
    processors = [processor] if processor is not None else None
    return Judge(OPENAI, error_processors=processors, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    "fault",
    [
        Reply.error(408, "timeout"),
        Reply.error(409, "conflict"),
        Reply.rate_limited(),
        Reply.error(500, "boom"),
        Reply.error(503, "unavailable"),
        Reply.overloaded(),
        Reply.drop(),
    ],
    ids=["408", "409", "429", "500", "503", "529", "connection"],
)
def test_retryable_errors_are_retried(fake_llm: FakeLLMServer, sleeps: list[float], model: str, fault: Reply) -> None:
    """408, 409, 429, 5xx, 529 overloaded and connection errors are retried."""
    fake_llm.script(fault)
    scorer = score_scorer(Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=2)]))
    result = run(scorer)
    assert result.score == 0.5
    assert fake_llm.count() == 2
    attempts = result.judge["generate_score"].attempts
    assert [a.status for a in attempts] == ["error", "ok"]


def test_timeout_is_retried(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A request that hangs past the judge's timeout is retried."""
    fake_llm.script(Reply.hang(10))
    result = run(score_scorer(judge(StreamErrorRetryProcessor(), timeout=0.3)))
    assert result.score == 0.5
    assert result.judge["generate_score"].attempts[0].error_type == "JudgeTimeoutError"
    assert fake_llm.count() == 2


@pytest.mark.parametrize(
    ("fault", "error_type"),
    [
        (Reply.error(401, "bad key"), JudgeAuthError),
        (Reply.error(403, "forbidden"), JudgeAuthError),
        (Reply.error(400, "bad request"), JudgeProviderError),
        (Reply.context_length(), JudgeContextLengthError),
    ],
    ids=["401", "403", "400", "context-length"],
)
@pytest.mark.parametrize("unknown", [False, True], ids=["plain", "retry_unknown"])
def test_auth_and_invalid_requests_are_not_retried(
    fake_llm: FakeLLMServer, sleeps: list[float], fault: Reply, error_type: type, unknown: bool
) -> None:
    """401/403/400/context length fail at once, even with retry_unknown_errors."""
    fake_llm.script(fault, fault, fault)
    proc = StreamErrorRetryProcessor(max_retries=3, retry_unknown_errors=unknown)
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(proc)))
    assert isinstance(info.value.cause, error_type)
    assert fake_llm.count() == 1
    assert sleeps == []


def test_matcher_can_retry_an_auth_error(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A matcher that matches a 401 makes it retryable, with the matcher's own budget and delay."""
    fake_llm.script(Reply.error(401, "token expired"), Reply.error(401, "token expired"), Reply.error(401, "x"))
    matcher = RetryMatcher(match=lambda e: "token expired" in str(e), max_retries=5, delay_ms=7)
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=0, matchers=[matcher]))))
    # two matched retries, then "x" does not match, and a 401 is never retried by default
    assert isinstance(info.value.cause, JudgeAuthError)
    assert fake_llm.count() == 3
    assert sleeps == [0.007, 0.007]


def test_first_matching_matcher_wins(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """The first matcher that matches decides; later matchers are not consulted."""
    fake_llm.script(Reply.error(500, "flaky"), Reply.error(500, "flaky"))
    seen: list[str] = []

    def first(err: JudgeProviderError) -> bool:
        seen.append("first")
        return True

    def second(err: JudgeProviderError) -> bool:
        seen.append("second")
        return True

    stop_first = RetryMatcher(match=first, max_retries=0)
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=5, matchers=[stop_first, second]))))
    assert isinstance(info.value.cause, JudgeServerError)
    assert seen == ["first"]
    assert fake_llm.count() == 1


def test_callable_matcher_with_processor_budget(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A plain callable matcher retries with the processor's max_retries and delay."""
    fake_llm.script(*[Reply.error(400, "transient gateway hiccup")] * 3)
    proc = StreamErrorRetryProcessor(max_retries=2, delay_ms=40, matchers=[lambda e: "hiccup" in str(e)])
    with pytest.raises(ScorerRunError):
        run(score_scorer(judge(proc)))
    assert fake_llm.count() == 3
    assert sleeps == [0.04, 0.04]


def test_unknown_errors_need_retry_unknown_errors(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """An unreadable response is retried only with retry_unknown_errors=True."""
    fake_llm.script(Reply.malformed_body())
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=3))))
    assert isinstance(info.value.cause, JudgeResponseError)
    assert fake_llm.count() == 1

    fake_llm.reset()
    fake_llm.script(Reply.malformed_body())
    result = run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=3, retry_unknown_errors=True))))
    assert result.score == 0.5
    assert fake_llm.count() == 2


def test_max_retries_exhausted_preserves_provider_error(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """After max_retries the last provider error (status, request id) is the ScorerRunError cause."""
    fake_llm.script(*[Reply.error(503, "down")] * 5)
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=2), max_processor_retries=2)))
    cause = info.value.cause
    assert isinstance(cause, JudgeServerError)
    assert cause.status_code == 503
    assert cause.request_id == fake_llm.requests[-1].request_id
    assert fake_llm.count() == 3  # the request and two retries
    execution = info.value.partial.judge["generate_score"]
    assert execution.status == "error"
    assert [a.status_code for a in execution.attempts] == [503, 503, 503]
    assert [a.request_id for a in execution.attempts] == [r.request_id for r in fake_llm.requests]
    assert "503" in (execution.error or "")


def test_max_processor_retries_caps_processor(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """max_processor_retries caps retries even when the processor allows more."""
    fake_llm.script(*[Reply.error(500, "down")] * 6)
    with pytest.raises(ScorerRunError):
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=5), max_processor_retries=1)))
    assert fake_llm.count() == 2


def test_default_cap_is_ten_with_error_processors(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """Error processors without max_processor_retries get a cap of 10 retries."""
    fake_llm.rule(Reply.error(500, "down"))
    with pytest.raises(ScorerRunError):
        run(score_scorer(judge(StreamErrorRetryProcessor(max_retries=50))))
    assert fake_llm.count() == 11


def test_no_error_processors_no_retry(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """Without error processors a retryable error fails at once."""
    fake_llm.script(Reply.rate_limited(retry_after="1"))
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge(max_processor_retries=3)))
    assert isinstance(info.value.cause, JudgeRateLimitError)
    assert fake_llm.count() == 1


@pytest.mark.parametrize(
    ("headers", "configured", "expected_s"),
    [
        ({"retry_after": "2"}, 0, 2.0),  # Retry-After seconds
        ({"retry_after_ms": "250", "retry_after": "9"}, 0, 0.25),  # retry-after-ms first
        ({"retry_after": "120"}, 0, 30.0),  # capped by max_retry_after_ms
        ({"retry_after": "0.01"}, 500, 0.5),  # configured delay is the floor
        ({"retry_after": "soon"}, 100, 0.1),  # malformed: ignored
        ({"retry_after_ms": "-5"}, 0, 0.0),  # negative: ignored
    ],
)
def test_retry_after_delay(
    fake_llm: FakeLLMServer, sleeps: list[float], headers: dict[str, str], configured: int, expected_s: float
) -> None:
    """delay = max(configured, min(Retry-After, max_retry_after_ms)); malformed values ignored."""
    fake_llm.script(Reply.rate_limited(**headers))
    result = run(score_scorer(judge(StreamErrorRetryProcessor(delay_ms=configured))))
    assert result.score == 0.5
    assert sleeps == ([pytest.approx(expected_s)] if expected_s > 0 else [])
    assert result.judge["generate_score"].attempts[0].retry_delay_ms == pytest.approx(expected_s * 1000)


def test_max_retry_after_ms_and_callable_delay(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """max_retry_after_ms caps Retry-After; delay_ms may be a callable of the retry count."""
    fake_llm.script(Reply.rate_limited(retry_after="5"), Reply.error(500, "x"), Reply.error(500, "y"))
    proc = StreamErrorRetryProcessor(max_retries=3, max_retry_after_ms=1_000, delay_ms=lambda n: 10 * 2**n)
    result = run(score_scorer(judge(proc)))
    assert result.score == 0.5
    assert sleeps == [pytest.approx(1.0), pytest.approx(0.02), pytest.approx(0.04)]


def test_retry_after_http_date() -> None:
    """retry-after may be an HTTP date; the delay is the time until then."""
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 3, usegmt=True)
    assert parse_retry_after_ms({"retry-after": date}, now=now) == pytest.approx(3000)
    assert parse_retry_after_ms({"Retry-After": "1.5"}) == 1500
    assert parse_retry_after_ms({"retry-after": "Mon, 99 Foo"}) is None
    assert parse_retry_after_ms({"retry-after-ms": "nan", "retry-after": "2"}) == 2000
    assert parse_retry_after_ms({"retry-after": email.utils.formatdate(time.time() - 60, usegmt=True)}) == 0


def test_retry_reruns_only_the_failing_step(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A retry in generate_reason re-sends only generate_reason's request."""
    fake_llm.rule(Reply.error(503, "down"), user_contains="Explain", times=1)
    result = run(full_scorer(judge(StreamErrorRetryProcessor())))
    steps = [r.user_text.split()[0] for r in fake_llm.requests]
    assert steps == ["Analyze:", "Verdict", "Explain", "Explain"]
    assert result.judge["generate_reason"].attempt_count == 2
    assert result.judge["generate_score"].attempt_count == 1


def test_generate_reason_failure_keeps_generate_score(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A final generate_reason failure does not re-run earlier steps; their results are kept."""
    fake_llm.rule(Reply.error(500, "down"), user_contains="Explain")
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(judge(StreamErrorRetryProcessor(max_retries=2), max_processor_retries=2)))
    err = info.value
    assert err.failed_step == "generate_reason"
    assert err.completed_steps == ("analyze", "generate_score")
    assert err.partial.score == 0.5
    assert fake_llm.count(model="gpt-4o-mini") == 5  # analyze, score, reason x3
    assert sum("Verdict" in r.user_text for r in fake_llm.requests) == 1


def test_step_error_processors_replace_the_scorers(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A step judge with error_processors=[] does not inherit the scorer's retry processor."""
    fake_llm.script(Reply.error(500, "down"))
    scorer = score_scorer(judge(StreamErrorRetryProcessor(max_retries=3)), step_judge=Judge(error_processors=[]))
    with pytest.raises(ScorerRunError):
        run(scorer)
    assert fake_llm.count() == 1


def test_connection_error_message_names_the_cause(fake_llm: FakeLLMServer) -> None:
    """A dropped connection becomes JudgeConnectionError with the transport's reason."""
    fake_llm.script(Reply.drop())
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge()))
    assert isinstance(info.value.cause, JudgeConnectionError)
    assert not isinstance(info.value.cause, JudgeTimeoutError)
    assert "disconnected" in str(info.value.cause).lower()


def test_error_class_alone_sets_the_retry_category() -> None:
    """Without a status code, a rate-limit/server/bad-request error is still categorised by its class."""
    fields = {"provider": "fake", "model_id": "fake/judge"}
    assert JudgeRateLimitError("slow down", **fields).category == "retryable"
    assert JudgeServerError("down", **fields).category == "retryable"
    assert JudgeBadRequestError("bad", **fields).category == "invalid_request"
    assert JudgeProviderError("odd", **fields).category == "unknown"


# --- matchers see the provider error's own fields (issue 14) ------------------------------------


class _ResetServer:
    """A TCP server that reads each request and answers with a reset (RST): the client's
    socket read fails with ECONNRESET, as when a proxy or provider drops the connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.accepted = 0
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_matcher_sees_econnreset_from_the_socket(sleeps: list[float]) -> None:
    """A connection reset reaches a Mastra-style matcher as error.code == "ECONNRESET"
    (the wrapper's own code is empty; the errno is deep in the SDK error's cause chain)."""
    server = _ResetServer()
    seen: list[tuple[str | None, int | None, str]] = []

    def reset(error: JudgeProviderError) -> bool:
        seen.append((error.code, error.status, type(error).__name__))  # type: ignore[attr-defined]
        return error.code == "ECONNRESET"

    try:
        judge = Judge(
            OPENAI,
            base_url=f"http://127.0.0.1:{server.port}/v1",
            api_key="sk-test",
            error_processors=[StreamErrorRetryProcessor(max_retries=2, matchers=[RetryMatcher(reset, delay_ms=5)])],
            max_processor_retries=2,
        )
        with pytest.raises(ScorerRunError) as info:
            run(score_scorer(judge))
    finally:
        server.close()
    assert seen == [("ECONNRESET", None, "JudgeConnectionError")] * 3
    assert sleeps == [0.005, 0.005]  # the matcher's delay, not the processor's (0): the matcher decided
    assert server.accepted == 3
    assert isinstance(info.value.cause, JudgeConnectionError)
    assert info.value.cause.code is None  # the original error is untouched


class _ProviderSdkError(Exception):
    """What a provider SDK (or a custom JudgeModel's client) raises: fields of its own."""

    def __init__(self, message: str, *, code: str, status: int, type: str) -> None:
        super().__init__(message)
        self.message, self.code, self.status, self.type = message, code, status, type


def test_matcher_sees_a_custom_models_error_fields(sleeps: list[float]) -> None:
    """A custom JudgeModel's exception is wrapped as an 'unknown' JudgeProviderError; the matcher
    still reads its code, status, type and message directly, and keeps working on retries."""
    from scorers.judge.testing import FakeJudgeModel

    error = _ProviderSdkError("upstream reset", code="ECONNRESET", status=502, type="api_error")
    model = FakeJudgeModel(error, error, '{"score": 0.5}')
    fields: list[tuple[object, ...]] = []

    def mastra_style(e: JudgeProviderError) -> bool:
        fields.append((e.code, e.status, e.type, e.message, type(e.provider_error)))  # type: ignore[attr-defined]
        return e.code == "ECONNRESET" and e.status == 502  # type: ignore[attr-defined]

    judge = Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=3, matchers=[mastra_style])])
    assert run(score_scorer(judge)).score == 0.5
    assert fields == [("ECONNRESET", 502, "api_error", "upstream reset", _ProviderSdkError)] * 2


@pytest.mark.parametrize("model", MODELS)
def test_matcher_sees_the_providers_message_status_and_type(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str
) -> None:
    """error.message is the provider's text (not tracescore's summary with the model id),
    error.status the HTTP status, error.type the provider's error type; str() still works."""
    fake_llm.script(Reply.error(400, "gateway hiccup", error_type="proxy_error"))

    def hiccup(e: JudgeProviderError) -> bool:
        return (
            e.message == "gateway hiccup"
            and e.status == 400  # type: ignore[attr-defined]
            and e.type == "proxy_error"  # type: ignore[attr-defined]
            and isinstance(e, JudgeBadRequestError)
            and "gateway hiccup" in str(e)
        )

    result = run(score_scorer(Judge(model, error_processors=[StreamErrorRetryProcessor(matchers=[hiccup])])))
    assert result.score == 0.5
    assert fake_llm.count() == 2


def test_timeout_reaches_a_matcher_as_etimedout(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A judge timeout has no errno; matchers see it as Node's ETIMEDOUT."""
    fake_llm.script(Reply.hang(10))
    codes: list[str | None] = []
    proc = StreamErrorRetryProcessor(matchers=[lambda e: codes.append(e.code) or e.code == "ETIMEDOUT"])
    result = run(score_scorer(judge(proc, timeout=0.3)))
    assert result.score == 0.5
    assert codes == ["ETIMEDOUT"]


@pytest.mark.parametrize("model", MODELS)
def test_an_answer_dripped_a_byte_at_a_time_times_out_at_the_judges_timeout(model: str) -> None:
    """The SDKs bound each read, not the exchange: a provider or proxy dripping its status line
    a byte every 0.2 s never times out there. The attempt is bounded at Judge(timeout=) plus
    half a second; it was 5 s more (7 s an attempt with timeout=2)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests._drip import drip

    stop = threading.Event()

    class Dripping(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            drip(self.wfile, stop)  # 7.6 s for the whole answer
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dripping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}" + ("/v1" if model.startswith("openai") else "")
    try:
        started = time.monotonic()
        with pytest.raises(ScorerRunError) as info:
            run(score_scorer(Judge(model, base_url=base, api_key="sk-test", timeout=1.0)))
        took = time.monotonic() - started
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert isinstance(info.value.cause, JudgeTimeoutError)
    assert took < 4.0, took  # one attempt (no retry processor): 1.5 s; 6 s before


def _asctime(epoch: float) -> str:
    """An HTTP-date in the asctime form (RFC 9110's third, GMT by definition): ``Sun Nov  6 08:49:37 1994``."""
    return time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(epoch))


@pytest.mark.parametrize(
    ("retry_after", "expected_s"),
    [
        (lambda: _asctime(time.time() + 20), 20.0),  # the asctime form: was ignored, a retry at once
        (lambda: email.utils.formatdate(time.time() + 3 * 86_400, usegmt=True), 30.0),  # days: capped
        (lambda: "259200", 30.0),  # days, in seconds: capped
        (lambda: _asctime(time.time() - 60), 0.0),  # past: no wait
    ],
)
def test_a_retry_after_date_in_any_http_form_is_honoured_and_capped(
    fake_llm: FakeLLMServer, sleeps: list[float], retry_after: Callable[[], str], expected_s: float
) -> None:
    """RFC 9110 has a recipient read all three HTTP-date forms. The asctime form (no zone: GMT by
    definition) was ignored as a date without a zone, so the retry went at once; any wait is
    still capped by max_retry_after_ms (30 s)."""
    fake_llm.script(Reply.rate_limited(retry_after=retry_after()))
    result = run(score_scorer(judge(StreamErrorRetryProcessor())))
    assert result.score == 0.5
    assert sleeps == ([pytest.approx(expected_s, abs=2)] if expected_s else [])
