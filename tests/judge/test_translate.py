"""SDK errors are translated into the judge's exception tree in one place; none escapes."""

from __future__ import annotations

import asyncio

import anthropic
import httpx2
import openai
import pytest

from scorers._errors import category_for_status
from scorers.judge import (
    AnthropicJudgeModel,
    JudgeAuthError,
    JudgeBadRequestError,
    JudgeConnectionError,
    JudgeContextLengthError,
    JudgeMessage,
    JudgeProviderError,
    JudgeRateLimitError,
    JudgeRequest,
    JudgeResponseError,
    JudgeServerError,
    JudgeStatusError,
    JudgeTimeoutError,
    OpenAIJudgeModel,
    aclose_clients,
    translate_sdk_errors,
)
from tests.fakellm import FakeLLMServer, Reply

REQUEST = JudgeRequest(system="judge", messages=(JudgeMessage("user", "hi"),), timeout_s=0.5)
FAULTS = [
    (Reply.error(400, "bad"), JudgeBadRequestError),
    (Reply.context_length(), JudgeContextLengthError),
    (Reply.error(401, "key"), JudgeAuthError),
    (Reply.error(403, "perm"), JudgeAuthError),
    (Reply.error(404, "no model"), JudgeBadRequestError),
    (Reply.error(408, "slow"), JudgeStatusError),
    (Reply.error(409, "conflict"), JudgeStatusError),
    (Reply.error(425, "too early"), JudgeStatusError),
    (Reply.error(422, "unprocessable"), JudgeBadRequestError),
    (Reply.rate_limited(retry_after="3"), JudgeRateLimitError),
    (Reply.error(500, "boom"), JudgeServerError),
    (Reply.error(502, "gateway"), JudgeServerError),
    (Reply.overloaded(), JudgeServerError),
    (Reply.drop(), JudgeConnectionError),
    (Reply.hang(5), JudgeTimeoutError),
    (Reply.malformed_body(), JudgeResponseError),
]


def _generate(model: OpenAIJudgeModel | AnthropicJudgeModel) -> BaseException:
    async def main() -> BaseException:
        try:
            await model.generate(REQUEST)
        except BaseException as exc:
            return exc
        finally:
            await aclose_clients()
        raise AssertionError("generate() did not fail")

    return asyncio.run(main())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize(("fault", "expected"), FAULTS, ids=[f[1].__name__ + str(i) for i, f in enumerate(FAULTS)])
def test_no_sdk_error_escapes(
    fake_llm: FakeLLMServer, provider: str, fault: Reply, expected: type[JudgeProviderError]
) -> None:
    """Every fault reaches the caller as a JudgeProviderError, the SDK error as __cause__."""
    fake_llm.script(fault)
    model = OpenAIJudgeModel("m") if provider == "openai" else AnthropicJudgeModel("m")
    exc = _generate(model)
    assert type(exc) is expected
    assert isinstance(exc, JudgeProviderError)
    assert exc.provider == provider
    assert exc.model_id == f"{provider}/m"
    if fault.kind == "error":
        assert exc.status_code == fault.status
        assert exc.category == category_for_status(fault.status)
        assert exc.request_id == fake_llm.requests[0].request_id
    assert isinstance(exc.__cause__, openai.OpenAIError | anthropic.AnthropicError | ValueError)


def test_rate_limit_keeps_retry_after(fake_llm: FakeLLMServer) -> None:
    """The parsed Retry-After and the raw header stay on the translated 429."""
    fake_llm.script(Reply.rate_limited(retry_after="3", retry_after_ms="1500"))
    exc = _generate(OpenAIJudgeModel("m"))
    assert isinstance(exc, JudgeRateLimitError)
    assert exc.retry_after_ms == 1500
    assert exc.headers["retry-after"] == "3"
    assert exc.category == "retryable"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_missing_api_key_fails_at_call_time(monkeypatch: pytest.MonkeyPatch, provider: str) -> None:
    """Without an API key the call (not the import) fails with a JudgeAuthError naming the variable."""
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_ADMIN_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", "/nonexistent-tracescore")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    model = OpenAIJudgeModel("m") if provider == "openai" else AnthropicJudgeModel("m")
    exc = _generate(model)
    assert isinstance(exc, JudgeAuthError)
    assert f"{provider.upper()}_API_KEY" in str(exc)
    # The hint itself was masked as a credential ("pass Judge(api_key=*** (Missing ...").
    assert "give the key as Judge's api_key argument (" in str(exc)


def test_synthetic_sdk_errors_are_translated() -> None:
    """Connection/timeout errors of both SDKs and raw httpx2 transport errors are translated."""
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    errors: list[BaseException] = [
        openai.APIConnectionError(request=request),
        openai.APITimeoutError(request=request),
        anthropic.APIConnectionError(request=request),
        anthropic.APITimeoutError(request=request),
        httpx2.ConnectError("refused", request=request),
        httpx2.ReadTimeout("slow", request=request),
        openai.OpenAIError("something odd"),
        anthropic.AnthropicError("something odd"),
    ]
    for error in errors:
        with pytest.raises(JudgeProviderError) as info, translate_sdk_errors("openai", "openai/m"):
            raise error
        assert info.value.__cause__ is error


def test_unrelated_errors_are_not_swallowed() -> None:
    """A bug (e.g. a KeyError) inside the block is not disguised as a provider error."""
    with pytest.raises(KeyError), translate_sdk_errors("openai", "openai/m"):
        raise KeyError("bug")


def test_importing_scorers_loads_no_sdk() -> None:
    """`import scorers` loads neither the provider SDKs nor OpenTelemetry (they load on first call)."""
    import subprocess
    import sys

    code = "import sys, scorers; print(sorted(m for m in ('openai', 'anthropic', 'opentelemetry') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("status", range(400, 600))
def test_status_class_follows_the_category_table(status: int) -> None:
    """Every 4xx/5xx becomes the class its category says: retryable statuses are never a
    JudgeBadRequestError, auth is JudgeAuthError, other 4xx are JudgeBadRequestError."""
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    response = httpx2.Response(status, request=request, json={"error": {"message": "m"}})
    error = openai.APIStatusError("m", response=response, body={"error": {"message": "m"}})
    with pytest.raises(JudgeStatusError) as info, translate_sdk_errors("openai", "openai/m"):
        raise error
    category = category_for_status(status)
    assert info.value.category == category
    expected = {"auth": JudgeAuthError, "invalid_request": JudgeBadRequestError}.get(category)
    if expected is not None:
        assert isinstance(info.value, expected)
    else:
        assert not isinstance(info.value, JudgeBadRequestError | JudgeAuthError)
