"""One scrubber, every call site: each secret shape is masked wherever an error can quote it.

The call sites are the real ones: a broker/store error (``tracing.redact``, what the worker and
its CLI wrap every Redis error in), a provider's error body (a real SDK against the fake LLM
server), a score sink's refusal (Phoenix and OTLP, against a local HTTP server) and a Tempo
error (``TempoSource`` against the same server). Each shape carries its own secret value; none
may survive, and ordinary text (trace ids, model names, prose about passwords and tokens) must
come through unchanged.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from scorers import Judge, ScorerRunError
from scorers.judge import JudgeProviderError
from tests._otlp_receiver import OtlpReceiver
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import run, score_scorer
from tests.tracing.test_phoenix_sink import record
from tracing import OtlpSink, TempoSource, redact
from tracing.sinks import PhoenixSink, Refused
from tracing.sources import SourceError

# (name, text quoting the secret, the secret, whether it is given to the call site as a literal)
SHAPES: list[tuple[str, str, str, bool]] = [
    ("url-password-only", "redis://:Ur1PwOnly9x@10.0.0.5:6379/0", "Ur1PwOnly9x", False),
    ("url-user-password", "https://bob:Ur1UserPw7k@tempo.internal:3200/api", "Ur1UserPw7k", False),
    ("url-userinfo-alone", "redis://Ur1Alone5q@10.0.0.5/0", "Ur1Alone5q", False),
    # a password with a raw space, as redis-py and kombu take it: all of it goes, not its first word
    ("url-password-with-a-space", "redis://:first Spc8Pw2x@10.0.0.5:6379/0", "Spc8Pw2x", False),
    # glued to the text before it, as an error message may print it: no scheme to tell apart
    ("url-glued-to-a-digit", "Error 111redis://:GluedPw6t@10.0.0.5:6379", "GluedPw6t", False),
    # a user named like a label: the password goes, the host stays (next test)
    ("url-user-named-token", "redis://token:TokUser9x@cache.internal:6379/0", "TokUser9x", False),
    ("query-password", "redis://10.0.0.5/0?password=QryPw3z&db=1", "QryPw3z", False),
    ("query-sentinel-password", "sentinel://h:26379?sentinel_password=SntPw4m", "SntPw4m", False),
    ("authorization-header", "Authorization: Basic QXV0aEJhc2ljOXg=", "QXV0aEJhc2ljOXg=", False),
    ("bearer-token", "sent bearer BrrTok.8xYz_w upstream", "BrrTok.8xYz_w", False),
    ("api-key-header", "x-api-key: ApiKeyHdr6n", "ApiKeyHdr6n", False),
    ("json-password-field", 'got {"password": "JsonPw2r"} back', "JsonPw2r", False),
    # a passphrase: masked to the closing quote, not to its first space
    ("quoted-passphrase", "got {'password': 'Pass phrase Wd9 kept'} back", "phrase Wd9 kept", False),
    ("token-assignment", "TRACESCORE_MLFLOW_TOKEN=EnvTok5w is wrong", "EnvTok5w", False),
    ("openai-key", "key sk-proj-OpnKey8Qw2Er4Ty is invalid", "OpnKey8Qw2Er4Ty", False),
    ("google-key", "key AIzaSyGglKey0123456789abcdefghijklmno rejected", "GglKey0123456789abcdefghijklmno", False),
    ("configured-literal", "gateway does not know Lit-7f3a9c1e", "Lit-7f3a9c1e", True),
]
# Said by each site too; none of it may be masked.
ORDINARY = (
    "trace 4bf92f3577b34da6a3ce929d0e0e4736 span 00f067aa0ba902b7 model gpt-4o-mini or "
    "claude-3-5-haiku-latest; password reset required; invalid token; max_tokens=512"
)


class Answers:
    """A local HTTP server answering every request with ``status`` and ``body``."""

    def __init__(self) -> None:
        self.status = 401
        self.body = ""
        state = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                payload = state.body.encode()
                self.send_response(state.status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def answers() -> Iterator[Answers]:
    server = Answers()
    try:
        yield server
    finally:
        server.close()


Site = Callable[[str, str | None], str]


def broker_error(text: str, literal: str | None) -> str:
    return redact(f"Error 111 connecting to redis://10.0.0.5:6379/0: {text}", literal)


def provider_error(fake_llm: FakeLLMServer, text: str, literal: str | None) -> str:
    """Everything the failed run shows: the error, its body, the SDK's exception in the traceback."""
    fake_llm.script(Reply.error(401, f"refused: {text}", error_type="invalid_request_error"))
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model="openai/gpt-4o-mini", api_key=literal or "test-key-0000")))
    cause = info.value.cause
    assert isinstance(cause, JudgeProviderError)
    assert cause.execution is not None
    parts = [str(cause), repr(cause.body), cause.execution.model_dump_json(), *traceback.format_exception(info.value)]
    return "\n".join(parts)


def phoenix_refusal(answers: Answers, text: str, literal: str | None) -> str:
    answers.status, answers.body = 401, f"refused: {text}"
    sink = PhoenixSink(answers.url, api_key=literal)
    try:
        (outcome,) = sink.deliver([record()])
    finally:
        sink.close()
    assert isinstance(outcome, Refused), outcome
    return f"{outcome.reason} {outcome.detail}"


def otlp_refusal(answers: Answers, monkeypatch: pytest.MonkeyPatch, text: str, literal: str | None) -> str:
    if literal:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"x-scorer-token={literal}")
    receiver = OtlpReceiver().start()
    try:
        receiver.status, receiver.answer = 400, f"refused: {text}".encode()
        sink = OtlpSink(endpoint=receiver.endpoint, timeout_s=10)
        (outcome,) = sink.deliver([record()])
        sink.close()
    finally:
        receiver.stop()
    assert isinstance(outcome, Refused), outcome
    return f"{outcome.reason} {outcome.detail}"


def tempo_error(answers: Answers, text: str, literal: str | None) -> str:
    answers.status, answers.body = 400, f"refused: {text}"
    headers = {"X-Scope-Token": literal} if literal else None
    source = TempoSource(answers.url, since_ns=1, until_ns=10**9, retries=0, timeout_s=10, headers=headers)
    with pytest.raises(SourceError) as info:
        list(source.read())
    return str(info.value)


SITES = ["broker", "provider", "phoenix", "otlp", "tempo"]


def said_at(
    site: str,
    text: str,
    literal: str | None,
    fake_llm: FakeLLMServer,
    answers: Answers,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    if site == "broker":
        return broker_error(text, literal)
    if site == "provider":
        return provider_error(fake_llm, text, literal)
    if site == "phoenix":
        return phoenix_refusal(answers, text, literal)
    if site == "otlp":
        return otlp_refusal(answers, monkeypatch, text, literal)
    return tempo_error(answers, text, literal)


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize(("shape", "text", "secret", "configured"), SHAPES, ids=[s[0] for s in SHAPES])
def test_every_shape_is_masked_at_every_site(
    site: str,
    shape: str,
    text: str,
    secret: str,
    configured: bool,
    fake_llm: FakeLLMServer,
    answers: Answers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = said_at(site, text, secret if configured else None, fake_llm, answers, monkeypatch)
    assert "refused" in said or site == "broker", said  # the site really quoted the answer
    assert secret not in said, said
    assert "***" in said, said


@pytest.mark.parametrize("site", SITES)
def test_ordinary_text_is_not_masked(
    site: str, fake_llm: FakeLLMServer, answers: Answers, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = said_at(site, ORDINARY, "a-configured-secret-value", fake_llm, answers, monkeypatch)
    assert ORDINARY in said, said
    assert "***" not in said, said
