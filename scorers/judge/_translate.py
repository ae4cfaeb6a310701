"""The one place where OpenAI/Anthropic SDK (and httpx2) errors become ``JudgeProviderError``s.

It is also where provider error text is scrubbed of credentials, once, before anything can
store, log, dead-letter or write it back: a gateway or provider that echoes the request's key
in its error body (``Incorrect API key provided: sk-...``) must not leak it into score
records. The SDK's own exception (kept as ``__cause__`` and shown in tracebacks) is scrubbed
in place too.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import json
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from scorers._errors import category_for_status
from scorers._secrets import scrub_secrets
from scorers.judge._body import ERROR_BODY_BYTES, AnswerTooLarge
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

# scrub_secrets is re-exported: the judge modules take it from here (it lives in scorers._secrets,
# shared with tracing and worker).
__all__ = ["error_in_answer", "kept_request_id", "parse_retry_after_ms", "scrub_secrets", "translate_sdk_errors"]

E = TypeVar("E", bound=BaseException)

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
        if when.tzinfo is None:  # the asctime form (or "-0000"): an HTTP-date is GMT by definition
            when = when.replace(tzinfo=datetime.UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds) * 1000
    if math.isfinite(seconds) and seconds >= 0:
        return seconds * 1000
    return None


@contextlib.contextmanager
def translate_sdk_errors(provider: str, model_id: str, *, api_key: str | None = None) -> Iterator[None]:
    """Re-raise any SDK/transport error from the block as a ``JudgeProviderError``, with
    ``api_key`` and anything shaped like a credential scrubbed from it and from the SDK error.

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
        _scrub_exception_chain(exc, api_key)
        raise _scrubbed(translated, api_key) from exc


# Longer than any provider's request id (OpenAI's "req_" and 32 hex digits, Anthropic's ~30).
_MAX_REQUEST_ID = 128


def kept_request_id(value: object, api_key: str | None) -> str | None:
    """A provider's request id as kept: up to 128 visible ASCII characters without spaces, the key
    masked (a header: what a gateway echoes); anything else is no id (a proxy's header of 50 KB, or
    of words, went whole into every attempt's record and the error's message): None."""
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_REQUEST_ID:
        return None
    if not (value.isascii() and value.isprintable()) or " " in value:
        return None
    return scrub_secrets(value, api_key)


# How much of a provider's error text its message keeps (the body, up to 64 KiB, stays in ``.body``):
# an HTML error page or a gateway's long message was the message whole, in every attempt's record.
_MESSAGE_CHARS = 1_000


def _scrubbed(err: JudgeProviderError, api_key: str | None) -> JudgeProviderError:
    message = scrub_secrets(err.message, api_key)  # before it is cut: a cut key is no key to mask
    if len(message) > _MESSAGE_CHARS:
        message = f"{message[:_MESSAGE_CHARS]}... ({len(message):,} characters)"
    err.message = message
    err.request_id = kept_request_id(err.request_id, api_key)
    err.args = (message,)  # (what super().__init__ was given, the message)
    err.body = scrub_secrets(err.body, api_key)
    err.headers = scrub_secrets(err.headers, api_key)
    return err


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (or contexts), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _cause(exc: BaseException, kind: type[E]) -> E | None:
    """The first of ``exc`` and its causes that is a ``kind`` (an SDK wraps what its transport raised)."""
    return next((e for e in _chain(exc) if isinstance(e, kind)), None)


def _scrub_exception_chain(exc: BaseException, api_key: str | None) -> None:
    """Mask credentials in the SDK's exception and its causes, in place: they stay reachable
    as ``__cause__`` and a logged traceback prints them."""
    for current in _chain(exc):
        current.args = scrub_secrets(current.args, api_key)
        for attr in ("message", "body"):
            value = getattr(current, attr, None)
            if isinstance(value, str | Mapping | list):
                # a read-only property is left alone: args above already covers str()
                with contextlib.suppress(AttributeError):
                    setattr(current, attr, scrub_secrets(value, api_key))


def _translate(exc: Exception, provider: str, model_id: str) -> JudgeProviderError | None:
    oa: Any = sys.modules.get("openai")
    an: Any = sys.modules.get("anthropic")
    hx: Any = sys.modules.get("httpx2")

    def kind(*names: str) -> tuple[type[BaseException], ...]:
        found = [getattr(m, n) for m in (oa, an) if m is not None for n in names if hasattr(m, n)]
        return tuple(found)

    if isinstance(exc, kind("APIStatusError") + ((hx.HTTPStatusError,) if hx is not None else ())):
        return _status_error(exc, provider, model_id)
    timeouts = kind("APITimeoutError") + ((hx.TimeoutException,) if hx is not None else ())
    if isinstance(exc, timeouts):
        return JudgeTimeoutError(
            f"{model_id}: the provider did not answer in time ({_root(exc)}); "
            "raise Judge(timeout=...) if the model is just slow",
            provider=provider,
            model_id=model_id,
        )
    too_large = _cause(exc, AnswerTooLarge)
    if too_large is not None:
        # Not retried: the same request would get the same answer, paid again.
        return JudgeResponseError(
            f"{model_id}: the provider's response body is over {too_large.cap:,} bytes, more than"
            " max_tokens allows: not read further",
            provider=provider,
            model_id=model_id,
        )
    decoding = _cause(exc, hx.DecodingError) if hx is not None else None
    if decoding is not None:  # (not a connection error, though the SDK wraps it as one: not retried)
        return JudgeResponseError(
            f"{model_id}: the provider's response body could not be decoded ({decoding})",
            provider=provider,
            model_id=model_id,
        )
    # httpx2's RequestError: the transport failures, and too many redirects (a proxy loop).
    connection = kind("APIConnectionError") + ((hx.RequestError,) if hx is not None else ())
    if isinstance(exc, connection) and _illegal_header(exc):
        # Never sent: no retry fixes it. The built-in models check the key before (_providers);
        # what is left is another setting the SDK sends as a header, read with its newline.
        return JudgeAuthError(
            f"{model_id}: the request could not be sent: a header value is not valid HTTP "
            "(a setting the SDK sends as a header, e.g. OPENAI_ORG_ID or OPENAI_PROJECT_ID, "
            "read from a file with its trailing newline?)",
            provider=provider,
            model_id=model_id,
        )
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
    if isinstance(exc, kind("OpenAIError", "AnthropicError") + ((hx.HTTPError,) if hx is not None else ())):
        if "credential" in str(exc).lower() or "api_key" in str(exc):
            return _missing_credentials(provider, model_id, exc)
        return JudgeProviderError(f"{model_id}: {type(exc).__name__}: {exc}", provider=provider, model_id=model_id)
    return None


def _missing_credentials(provider: str, model_id: str, exc: BaseException) -> JudgeAuthError:
    env = _CREDENTIAL_ENV.get(provider, "the provider's API key variable")
    return JudgeAuthError(
        f"{model_id}: no API key for {provider}: set {env} or give the key as Judge's api_key argument ({exc})",
        provider=provider,
        model_id=model_id,
    )


def _status_error(exc: Any, provider: str, model_id: str) -> JudgeStatusError:
    # An SDK's APIStatusError, or httpx2's HTTPStatusError (no status_code/body/request_id).
    status = int(getattr(exc, "status_code", None) or exc.response.status_code)
    headers = {k: v for k, v in exc.response.headers.items() if k.lower() in _KEPT_HEADERS}
    body = getattr(exc, "body", None)
    error_type, code, detail = _error_fields(body)
    message = detail or getattr(exc, "message", None) or str(exc)
    if 300 <= status < 400:
        # The clients follow no redirect: it would send the prompt (the agent's content) there.
        target = urlsplit(exc.response.headers.get("location", "")).hostname or "elsewhere"
        message = (
            f"a redirect to {target}, not followed (it would send the prompt there): set the base URL"
            f" ({provider.upper()}_BASE_URL or Judge(base_url=)) to where the API answers"
        )
    cls = _status_class(status, code, error_type, message)
    return cls(
        f"{model_id}: {provider} returned HTTP {status}: {message}",
        provider=provider,
        model_id=model_id,
        status_code=status,
        request_id=getattr(exc, "request_id", None) or headers.get("x-request-id") or headers.get("request-id"),
        retry_after_ms=parse_retry_after_ms(headers),
        error_type=error_type,
        code=code,
        headers=headers,
        body=body,
    )


def _status_class(status: int, code: str | None, error_type: str | None, message: str) -> type[JudgeStatusError]:
    """The class follows the category (one table, ``category_for_status``); within a category
    the status picks the most precise class."""
    category = category_for_status(status)
    if category == "auth":
        return JudgeAuthError
    if status == 429:
        return JudgeRateLimitError
    if category == "retryable" and status >= 500:
        return JudgeServerError
    if category == "invalid_request":
        context_length = status == 400 and _is_context_length(code, error_type, message)
        return JudgeContextLengthError if context_length else JudgeBadRequestError
    return JudgeStatusError  # retryable 408/409/425, or an odd status


# The HTTP status each provider sends with an error of this type (Anthropic's documented table;
# OpenAI's types and codes where they name one).
_STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "api_error": 500,
    "server_error": 500,
    "overloaded_error": 529,
}


def error_in_answer(
    error: Any,
    provider: str,
    model_id: str,
    *,
    request_id: str | None,
    api_key: str | None,
    headers: Mapping[str, str] | None = None,
) -> JudgeProviderError | None:
    """The error a 200 answer carries instead of an answer (``error``: its body's ``error``
    field, or its choice's; a gateway or proxy passing its upstream's failure on as a success),
    else None.

    It is the error the status it stands for would be (a numeric ``code``, as OpenRouter sends,
    else the error's type), so an upstream 429 or 529 is retried and a 400 is not; with no
    status to read, a ``JudgeResponseError`` naming it. It was read as an empty answer (a
    fallback call paid, then "the answer is empty", never retried) or, from Anthropic, as a
    message that could not be read. Its type and code are kept only as names (``_name``); the
    usage beside it is the caller's to read (``.usage``, set by the model that read the body).

    The answer's ``headers`` are read as an error status's are: a Retry-After (or
    ``retry-after-ms``) on the 200 is the wait its upstream asked for, so an upstream 429 pauses
    the model as an HTTP 429 does, and a retry waits it (it was dropped: no pause, every caller
    went on into the same limit). The error's ``metadata`` is not read for one: OpenRouter
    documents the header (on 429 and 503), and for a provider's error only ``provider_name`` and
    ``raw`` there.
    """
    if not error:
        return None
    error_type, code, detail = _error_fields({"error": error})
    text = (detail or "no message")[:ERROR_BODY_BYTES]  # (the body of a 200 is not cut)
    status = int(code) if code and len(code) == 3 and code.isascii() and code.isdigit() else None
    if status is None or not 400 <= status < 600:
        status = _STATUS_OF_TYPE.get(code or "") or _STATUS_OF_TYPE.get(error_type or "")
    kind = f" ({error_type or code})" if error_type or code else ""
    said = f"{model_id}: {provider} answered HTTP 200 with an error{kind}"
    cls: type[JudgeProviderError] = JudgeResponseError
    if status is not None:
        cls, said = _status_class(status, code, error_type, text), f"{said}, as HTTP {status} would be"
    kept = {k: v for k, v in (headers or {}).items() if k.lower() in _KEPT_HEADERS}
    err = cls(
        f"{said}: {text}",
        provider=provider,
        model_id=model_id,
        status_code=status,
        request_id=request_id,
        retry_after_ms=parse_retry_after_ms(kept),
        error_type=error_type,
        code=code,
        headers=kept,
        body={"error": {"type": error_type, "code": code, "message": text}},
    )
    return _scrubbed(err, api_key)


def _error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from an OpenAI or Anthropic error body."""
    if not isinstance(body, Mapping):
        return None, None, None
    err = body.get("error", body)
    if not isinstance(err, Mapping):
        return None, None, str(err)

    message = err.get("message")
    return _name(err.get("type")), _name(err.get("code")), None if message is None else str(message)


# What a provider's error type or code looks like ("rate_limit_error", "context_length_exceeded",
# 429): kept and named in the message only so. A gateway's "type" of words (the agent's, echoed)
# or an object went whole into the error's text.
_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def _name(value: Any) -> str | None:
    """An error's type or code as kept: a short name or a whole number, else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and _NAME.fullmatch(value) else None


def _is_context_length(code: str | None, error_type: str | None, message: str) -> bool:
    text = f"{code or ''} {error_type or ''} {message}".lower()
    return "context_length" in text or "context length" in text or "prompt is too long" in text


def _illegal_header(exc: BaseException) -> bool:
    """Whether the request failed before leaving the machine on a header value HTTP forbids
    (h11's LocalProtocolError: a newline, a NUL), wherever it sits in the cause chain."""
    inner: BaseException | None = exc
    seen = 0
    while inner is not None and seen < 16:
        if type(inner).__name__ == "LocalProtocolError" and "Illegal header value" in str(inner):
            return True
        inner, seen = inner.__cause__ or inner.__context__, seen + 1
    return False


def _root(exc: BaseException) -> str:
    """The innermost cause's message: 'Connection error.' alone hides the real reason."""
    inner: BaseException = exc
    while inner.__cause__ is not None and inner.__cause__ is not inner:
        inner = inner.__cause__
    if inner is exc:
        return str(exc) or type(exc).__name__
    return f"{exc} ({type(inner).__name__}: {inner})"
