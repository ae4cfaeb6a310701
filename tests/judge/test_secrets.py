"""Provider error bodies lose every credential before anything stores, logs or re-raises them.

The fake LLM server answers with error bodies that echo the request's key (as gateways and
providers do), through the real SDKs.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import structlog

from scorers import Judge, ScorerRunError
from scorers.judge import JudgeAuthError, JudgeProviderError
from scorers.judge._translate import scrub_secrets
from tests._redis import RedisServer
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import MODELS, run, score_scorer
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink

# Shaped like no known key format: only the literal-value scrub can catch it.
GATEWAY_KEY = "corp-gateway-7f3a9c1e5b2d4f60a8e1"
OTHER_KEY = "sk-proj-Zx81QmWc4nLpT7vYh2Ra"


def _everything_said(err: ScorerRunError, logs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> str:
    """Every text a store, a log, a dead letter or a span event could take from the failure."""
    cause = err.cause
    assert isinstance(cause, JudgeProviderError)
    assert cause.execution is not None
    parts = [
        str(err),
        repr(err),
        str(cause),
        repr(cause.args),
        repr(cause.body),
        repr(cause.headers),
        cause.message,
        cause.execution.model_dump_json(),
        "".join(traceback.format_exception(err)),  # includes the SDK's exception (__cause__)
        repr(logs),
        caplog.text,
    ]
    if err.partial is not None:
        parts.append(err.partial.model_dump_json())
    return "\n".join(parts)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("where", ["judge", "env"])
def test_error_body_echoing_the_key_is_scrubbed(
    fake_llm: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    model: str,
    where: str,
) -> None:
    """A 401 whose body quotes the configured key (from Judge(api_key=) or the environment),
    a bearer header and another sk- key: none of them survives in the error, its record,
    the SDK's exception in the traceback, or the logs; the message still says what failed."""
    env = "OPENAI_API_KEY" if model.startswith("openai") else "ANTHROPIC_API_KEY"
    if where == "env":
        monkeypatch.setenv(env, GATEWAY_KEY)
        judge = Judge(model=model)
    else:
        judge = Judge(model=model, api_key=GATEWAY_KEY)
    fake_llm.script(
        Reply.error(
            401,
            f"Incorrect API key provided: {GATEWAY_KEY}. Request had 'Authorization: Bearer {GATEWAY_KEY}' "
            f"and x-api-key: {GATEWAY_KEY}; the project key is {OTHER_KEY}.",
            error_type="invalid_request_error",
            code="invalid_api_key",
        )
    )
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs, pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge))
    # the key really reached the server, so the server really echoed it
    sent = fake_llm.requests[-1].headers
    assert GATEWAY_KEY in " ".join(str(v) for v in sent.values())
    assert isinstance(info.value.cause, JudgeAuthError)
    said = _everything_said(info.value, logs, caplog)
    assert GATEWAY_KEY not in said
    assert OTHER_KEY not in said
    assert "Incorrect API key provided: ***" in str(info.value.cause)
    assert "HTTP 401" in str(info.value.cause)


# A gateway key with the characters a JSON writer or a URL escapes ('/' and '+', as in base64).
SLASHED_KEY = "corp/gw+7f3a9c1e5b2d4f60a8e1"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("status", [401, 200])
def test_a_key_echoed_escaped_is_scrubbed(
    fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture, model: str, status: int
) -> None:
    """A gateway quoting the request it refused, as JSON inside its message ('/' written '\\/')
    and as a URL (percent-encoded): neither escaped form of the key survives, whether the body
    reads as an error (401) or not at all (a 200 that is no completion: described, not quoted)."""
    quoted = json.dumps({"headers": {"x-gw": SLASHED_KEY}}).replace("/", "\\/")
    said_by_gateway = f"upstream refused {quoted} from https://gw.internal/v1?k={quote(SLASHED_KEY, safe='')}"
    body = {"error": {"message": said_by_gateway}} if status == 401 else [said_by_gateway]
    fake_llm.script(Reply.raw(json.dumps(body), status=status))
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs, pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model=model, api_key=SLASHED_KEY)))
    said = _everything_said(info.value, logs, caplog)
    # An error's text is the provider's, quoted: the scrub had something to do. An answer that
    # cannot be read is no error's text: never quoted (it may be the agent's words).
    assert ("upstream refused" in said) == (status == 401)
    assert SLASHED_KEY.split("+")[1] not in said  # its tail, however the characters before were written
    assert "gw+" not in said
    assert "gw%2B" not in said


@pytest.mark.parametrize(
    "key",
    [
        SLASHED_KEY,
        'gw-"quoted"-key',
        "gw-\\back-slash",
        "gw\\\\\\three",
        "gw-clé-9f8e7d",
        "/pw-12345",
        "ab\\/\\/cd-1",
        "gw-\\-key",
    ],
)
def test_scrub_every_written_form_of_a_literal(key: str) -> None:
    """The configured key as JSON writes it (ASCII-only or not, '/' escaped or not, inside JSON
    inside JSON), as a URL does, and in a ``bytes`` repr: each is masked whole."""
    in_json = json.dumps(key)[1:-1]
    forms = {
        key,
        in_json,
        in_json.replace("/", "\\/"),
        json.dumps(in_json)[1:-1],  # a gateway's message quoting a JSON body
        json.dumps(json.dumps(in_json.replace("/", "\\/"))[1:-1])[1:-1],
        json.dumps(key, ensure_ascii=False)[1:-1],
        quote(key, safe=""),
        repr(key.encode())[2:-1],
    }
    for form in forms:
        assert scrub_secrets(f"echo: <{form}> end", key) == "echo: <***> end", form
    assert scrub_secrets(json.dumps({"detail": key}), key) == '{"detail": "***"}'
    # After a backslash of the text around it (a Windows path, say) too.
    assert scrub_secrets(f"C:\\dir\\{quote(key, safe='')}", key) == "C:\\dir\\***"
    # Its letters alone, or another text sharing its start, are left as they are.
    alike = f"{key[:-2]}!!"
    assert scrub_secrets(alike, key) == alike


@pytest.mark.parametrize("model", MODELS)
def test_a_key_with_its_files_newline_is_an_auth_error_never_retried(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, model: str
) -> None:
    """A key read from a mounted secret file keeps its newline: httpx refuses the header before
    anything is sent. That was a JudgeConnectionError, retryable, retried (and redelivered by
    the workers) though no retry can send it; it is an auth error naming the likely cause,
    raised before the HTTP stack sees the key: httpcore's own DEBUG log (on when a worker runs
    with ``--loglevel DEBUG``) printed the refused header whole, the key with it."""
    env = "OPENAI_API_KEY" if model.startswith("openai") else "ANTHROPIC_API_KEY"
    monkeypatch.setenv(env, GATEWAY_KEY + "\n")
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs, pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model=model)))
    assert isinstance(info.value.cause, JudgeAuthError)
    assert info.value.category == "auth"
    assert f"the API key from {env} ends with a line break" in str(info.value.cause)
    assert "trailing newline" in str(info.value.cause)
    assert fake_llm.count() == 0
    assert GATEWAY_KEY not in _everything_said(info.value, logs, caplog)


def test_another_header_setting_with_its_newline_is_named_and_not_retried(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is checked before sending; another setting the SDK sends as a header (here
    ``OPENAI_ORG_ID`` read from a file) is refused by httpx: an auth error naming such settings,
    nothing sent, not retried."""
    monkeypatch.setenv("OPENAI_ORG_ID", "org-from-a-file\n")
    # A key of its own: clients are leased by key and base URL, and the SDK reads the
    # variable when it builds one (an earlier test's client would not have it).
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model="openai/gpt-4o-mini", api_key="key-of-the-org-test")))
    assert isinstance(info.value.cause, JudgeAuthError)
    assert "a header value is not valid HTTP (a setting the SDK sends as a header" in str(info.value.cause)
    assert fake_llm.count() == 0


@pytest.mark.parametrize("model", MODELS)
def test_a_key_ending_in_a_space_is_named_before_anything_is_sent(
    fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture, model: str
) -> None:
    """A key pasted with a trailing space: h11 refuses the header, and httpcore's DEBUG log
    printed it whole, the key with it (the check let printable ASCII through)."""
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs, pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model=model, api_key=GATEWAY_KEY + " ")))
    assert isinstance(info.value.cause, JudgeAuthError)
    assert "the API key from api_key= starts or ends with a space" in str(info.value.cause)
    assert fake_llm.count() == 0
    assert GATEWAY_KEY not in _everything_said(info.value, logs, caplog)


@pytest.mark.parametrize("bad", ["\x00", "\t", "é", "\nX"])
def test_a_key_no_header_can_carry_is_named_before_anything_is_sent(
    fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    """A control character or a non-ASCII letter inside a key given as ``api_key=``: an auth
    error naming where the key came from, never the key, at any log level. (A non-ASCII key
    was a UnicodeEncodeError out of httpx: "a bug".)"""
    caplog.set_level(logging.DEBUG)
    key = GATEWAY_KEY[:8] + bad + GATEWAY_KEY[8:]
    with structlog.testing.capture_logs() as logs, pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model="openai/gpt-4o-mini", api_key=key)))
    assert isinstance(info.value.cause, JudgeAuthError)
    assert "the API key from api_key= holds a character an HTTP header cannot carry" in str(info.value.cause)
    assert fake_llm.count() == 0
    said = _everything_said(info.value, logs, caplog)
    assert GATEWAY_KEY[8:] not in said
    assert GATEWAY_KEY[:8] + bad not in said


def test_custom_model_error_is_scrubbed(fake_llm: FakeLLMServer) -> None:
    """A custom JudgeModel raising an error that quotes a bearer token: the wrapped
    JudgeProviderError's message holds no token."""

    class Leaky:
        model_id = "custom/leaky"
        provider = "custom"
        supports_native_structured_output = False

        async def generate(self, request: Any) -> Any:
            raise RuntimeError(f"upstream said 401 for 'Authorization: Bearer {OTHER_KEY}'")

    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge(model=Leaky())))
    cause = info.value.cause
    assert isinstance(cause, JudgeProviderError)
    assert OTHER_KEY not in str(cause)
    assert cause.execution is not None
    assert OTHER_KEY not in cause.execution.model_dump_json()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Incorrect API key provided: sk-abcdefgh12345678.", "Incorrect API key provided: sk-***."),
        ("key sk-ant-api03-AbCdEfGh-1234 is invalid", "key sk-*** is invalid"),
        ("Authorization: Bearer eyJhbGciOi.J9.x", "Authorization: ***"),
        ('{"authorization": "Basic dXNlcjpwYXNz"}', '{"authorization": "***"}'),
        ("sent bearer tok_live_123456 to the gateway", "sent bearer *** to the gateway"),
        ("GET /v1?api_key=ABC123DEF&x=1", "GET /v1?api_key=***&x=1"),
        ("x-api-key: mykey-123456", "x-api-key: ***"),
        ('{"api-key": "azure-0123456789"}', '{"api-key": "***"}'),
        ("no secret here: 401 Unauthorized", "no secret here: 401 Unauthorized"),
        # the URL's password only: the host says which server refused
        ("redis://token:pw-1234@cache.internal:6379/0", "redis://token:***@cache.internal:6379/0"),
        ("Error 111redis://:pw-1234@cache:6379", "Error 111redis://:***@cache:6379"),
    ],
)
def test_scrub_patterns(text: str, expected: str) -> None:
    """Each credential shape is masked; its label stays so the message still makes sense."""
    assert scrub_secrets(text) == expected


def test_scrub_literal_key_in_nested_body() -> None:
    """The configured key's literal value is masked anywhere in a nested error body."""
    body = {"error": {"message": f"bad key {GATEWAY_KEY}", "details": [GATEWAY_KEY, 3]}}
    assert scrub_secrets(body, GATEWAY_KEY) == {"error": {"message": "bad key ***", "details": ["***", 3]}}


def test_worker_stores_and_writes_no_key(
    fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_server: RedisServer, tmp_path: Path
) -> None:
    """End to end through a real worker process: a 401 echoing the key and a bearer token
    becomes an error record; neither the written record (what the OTLP writer turns into the
    span event), anything in Redis (records, dead letters, failure counters) nor the worker's
    log holds the key."""
    client = redis_server.client(12)
    client.flushdb()
    url = redis_server.url(12)
    fake_llm.rule(Reply.error(401, f"Incorrect API key provided: {GATEWAY_KEY} (Authorization: Bearer {GATEWAY_KEY})"))
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "secrets", url, tmp_path, scores_path=scores, env={**fake_llm_env, "OPENAI_API_KEY": GATEWAY_KEY}
    )
    try:
        worker.wait_ready()
        sink = CelerySink(url)
        sink.send(batch(range(2), ["judged"], salt="secrets"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
    finally:
        worker.stop()
    assert fake_llm.count() >= 2
    records = read_scores(scores)
    assert all(r["error_type"] == "JudgeAuthError" for r in records)
    assert all("Incorrect API key provided: ***" in r["error_message"] for r in records), records
    stored = [client.dump(key) or b"" for key in client.scan_iter()]
    assert stored  # the records are in the store
    assert not any(GATEWAY_KEY.encode() in value for value in stored)
    assert GATEWAY_KEY not in scores.read_text()
    assert GATEWAY_KEY not in worker.text()
    client.flushdb()
    client.close()
