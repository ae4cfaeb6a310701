"""The one place where OpenAI/Anthropic SDK (and httpx2) errors become ``JudgeProviderError``s."""

from __future__ import annotations

import email.utils
import json
import math
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from scorers.judge._errors import (
    JudgeAuthError,
    JudgeBadRequestError,
    JudgeConnectionError,
    JudgeContextLengthError,
    JudgeError,
    JudgeProviderError,
    JudgeRateLimitError,
    JudgeResponseError,
    JudgeServerError,
    JudgeStatusError,
    JudgeTimeoutError,
)

__all__ = ["parse_retry_after_ms", "translate_sdk_errors"]

_KEPT_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "request-id")
_CREDENTIAL_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def parse_retry_after_ms(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """``retry-after-ms`` (milliseconds) first, then ``retry-after`` (seconds or an HTTP date).

    Malformed, negative or non-finite values are ignored (None).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and ms >= 0:
            return ms
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds) * 1000
    if math.isfinite(seconds) and seconds >= 0:
        return seconds * 1000
    return None


@contextmanager
def translate_sdk_errors(provider: str, model_id: str) -> Iterator[None]:
    """Re-raise any SDK/transport error from the block as a ``JudgeProviderError``.

    Other exceptions (bugs) pass through unchanged. The SDKs are looked up in ``sys.modules``
    rather than imported: an SDK error can only exist once its SDK is loaded, and importing
    ``scorers`` stays free of the SDKs (and of the OpenTelemetry API anthropic pulls in).
    """
    try:
        yield
    except JudgeError:
        raise
    except Exception as exc:
        translated = _translate(exc, provider, model_id)
        if translated is None:
            raise
        raise translated from exc


def _translate(exc: Exception, provider: str, model_id: str) -> JudgeProviderError | None:
    oa: Any = sys.modules.get("openai")
    an: Any = sys.modules.get("anthropic")
    hx: Any = sys.modules.get("httpx2")

    def kind(*names: str) -> tuple[type[BaseException], ...]:
        found = [getattr(m, n) for m in (oa, an) if m is not None for n in names if hasattr(m, n)]
        return tuple(found)

    if isinstance(exc, kind("APIStatusError")):
        return _status_error(exc, provider, model_id)
    timeouts = kind("APITimeoutError") + ((hx.TimeoutException,) if hx is not None else ())
    if isinstance(exc, timeouts):
        return JudgeTimeoutError(
            f"{model_id}: the provider did not answer in time ({_root(exc)}); "
            "raise Judge(timeout=...) if the model is just slow",
            provider=provider,
            model_id=model_id,
        )
    connection = kind("APIConnectionError") + ((hx.TransportError,) if hx is not None else ())
    if isinstance(exc, connection):
        return JudgeConnectionError(
            f"{model_id}: connection to the provider failed: {_root(exc)}",
            provider=provider,
            model_id=model_id,
        )
    if isinstance(exc, kind("APIResponseValidationError")):
        return JudgeResponseError(
            f"{model_id}: the provider's response did not have the expected shape: {exc}",
            provider=provider,
            model_id=model_id,
            status_code=getattr(exc, "status_code", None),
        )
    if isinstance(exc, json.JSONDecodeError):
        return JudgeResponseError(
            f"{model_id}: the provider's response body is not valid JSON ({exc})",
            provider=provider,
            model_id=model_id,
        )
    # anthropic raises a bare TypeError when it finds no credentials at request time.
    if isinstance(exc, TypeError) and "authentication method" in str(exc):
        return _missing_credentials(provider, model_id, exc)
    if isinstance(exc, kind("CredentialsError")):
        return _missing_credentials(provider, model_id, exc)
    if isinstance(exc, kind("OpenAIError", "AnthropicError")):
        if "credential" in str(exc).lower() or "api_key" in str(exc):
            return _missing_credentials(provider, model_id, exc)
        return JudgeProviderError(f"{model_id}: {type(exc).__name__}: {exc}", provider=provider, model_id=model_id)
    return None


def _missing_credentials(provider: str, model_id: str, exc: BaseException) -> JudgeAuthError:
    env = _CREDENTIAL_ENV.get(provider, "the provider's API key variable")
    return JudgeAuthError(
        f"{model_id}: no API key for {provider}: set {env} or pass Judge(api_key=...) ({exc})",
        provider=provider,
        model_id=model_id,
    )


def _status_error(exc: Any, provider: str, model_id: str) -> JudgeStatusError:
    status = exc.status_code
    headers = {k: v for k, v in exc.response.headers.items() if k.lower() in _KEPT_HEADERS}
    error_type, code, detail = _error_fields(exc.body)
    message = detail or getattr(exc, "message", None) or str(exc)
    cls: type[JudgeStatusError]
    if status in (401, 403):
        cls = JudgeAuthError
    elif status == 429:
        cls = JudgeRateLimitError
    elif status >= 500:
        cls = JudgeServerError
    elif status == 400 and _is_context_length(code, error_type, message):
        cls = JudgeContextLengthError
    elif status in (408, 409):
        cls = JudgeStatusError
    else:
        cls = JudgeBadRequestError
    return cls(
        f"{model_id}: {provider} returned HTTP {status}: {message}",
        provider=provider,
        model_id=model_id,
        status_code=status,
        request_id=exc.request_id,
        retry_after_ms=parse_retry_after_ms(headers),
        error_type=error_type,
        code=code,
        headers=headers,
        body=exc.body,
    )


def _error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from an OpenAI or Anthropic error body."""
    if not isinstance(body, Mapping):
        return None, None, None
    err = body.get("error", body)
    if not isinstance(err, Mapping):
        return None, None, str(err)

    def text(key: str) -> str | None:
        value = err.get(key)
        return str(value) if value is not None else None

    return text("type"), text("code"), text("message")


def _is_context_length(code: str | None, error_type: str | None, message: str) -> bool:
    text = f"{code or ''} {error_type or ''} {message}".lower()
    return "context_length" in text or "context length" in text or "prompt is too long" in text


def _root(exc: BaseException) -> str:
    """The innermost cause's message: 'Connection error.' alone hides the real reason."""
    inner: BaseException = exc
    while inner.__cause__ is not None and inner.__cause__ is not inner:
        inner = inner.__cause__
    if inner is exc:
        return str(exc) or type(exc).__name__
    return f"{exc} ({type(inner).__name__}: {inner})"
