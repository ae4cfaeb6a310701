"""The judge's exception tree, grouped by who must handle the error.

    JudgeError (ScorerError)          anything the judge layer raises; ``.execution`` is the record
    ├── JudgeProviderError            the provider call failed (status, request id, retry-after)
    │   ├── JudgeConnectionError      no HTTP response: refused, reset, dropped
    │   │   └── JudgeTimeoutError     no answer within ``Judge.timeout``
    │   ├── JudgeStatusError          the provider answered 4xx/5xx
    │   │   ├── JudgeAuthError        401/403, or no credentials configured (never retried by default)
    │   │   ├── JudgeBadRequestError  other 4xx: the request itself is wrong (never retried by default)
    │   │   │   └── JudgeContextLengthError   the prompt does not fit the model's context
    │   │   ├── JudgeRateLimitError   429 (retryable; honours Retry-After)
    │   │   └── JudgeServerError      5xx, 529 overloaded (retryable)
    │   └── JudgeResponseError        a response came back but could not be read
    ├── JudgeOutputError              the answer did not parse or did not fit the output schema
    └── JudgeProcessorError           an input/output/error processor raised

Errors from the OpenAI and Anthropic SDKs are translated into this tree in exactly one place,
``scorers.judge._translate.translate_sdk_errors``; the SDK error stays available as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from scorers._errors import ScorerError

if TYPE_CHECKING:
    from scorers._result import JudgeExecution

__all__ = [
    "ErrorCategory",
    "JudgeAuthError",
    "JudgeBadRequestError",
    "JudgeConnectionError",
    "JudgeContextLengthError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeProcessorError",
    "JudgeProviderError",
    "JudgeRateLimitError",
    "JudgeResponseError",
    "JudgeServerError",
    "JudgeStatusError",
    "JudgeTimeoutError",
]

ErrorCategory = Literal["auth", "invalid_request", "retryable", "unknown"]
_RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class JudgeError(ScorerError):
    """Base of the judge's errors. ``execution`` is filled in when ``ask_judge`` gives up."""

    execution: JudgeExecution | None = None


class JudgeProviderError(JudgeError):
    """A provider request failed. Fields are None when the provider did not say.

    ``retry_after_ms`` is the server's Retry-After (``retry-after-ms`` first, then
    ``retry-after`` as seconds or an HTTP date), already parsed; malformed values are None.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        model_id: str,
        status_code: int | None = None,
        request_id: str | None = None,
        retry_after_ms: float | None = None,
        error_type: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.model_id = model_id
        self.status_code = status_code
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.error_type = error_type
        self.code = code
        self.headers = dict(headers or {})
        self.body = body

    @property
    def category(self) -> ErrorCategory:
        """How retry policies see this error (see ``StreamErrorRetryProcessor``)."""
        if isinstance(self, JudgeAuthError) or self.status_code in (401, 403):
            return "auth"
        # The class counts as much as the status: a custom JudgeModel may raise
        # JudgeRateLimitError("...") without a status_code and still mean "retry me".
        if (
            isinstance(self, JudgeConnectionError | JudgeRateLimitError | JudgeServerError)
            or self.status_code in _RETRYABLE_STATUS
        ):
            return "retryable"
        if "overloaded" in f"{self.error_type or ''} {self.message}".lower():
            return "retryable"
        if isinstance(self, JudgeBadRequestError) or (self.status_code is not None and 400 <= self.status_code < 500):
            return "invalid_request"
        return "unknown"

    def __str__(self) -> str:
        extra = [f"status {self.status_code}"] if self.status_code is not None else []
        if self.request_id:
            extra.append(f"request id {self.request_id}")
        return f"{self.message} ({', '.join(extra)})" if extra else self.message


class JudgeConnectionError(JudgeProviderError):
    """The request got no HTTP response (connection refused, reset or dropped)."""


class JudgeTimeoutError(JudgeConnectionError):
    """The provider did not answer within the judge's timeout."""


class JudgeStatusError(JudgeProviderError):
    """The provider answered with an HTTP error status."""


class JudgeAuthError(JudgeStatusError):
    """401/403, or no credentials at all: fix the API key or permissions."""


class JudgeBadRequestError(JudgeStatusError):
    """The provider rejected the request as invalid (4xx other than 408/409/429)."""


class JudgeContextLengthError(JudgeBadRequestError):
    """The prompt is longer than the model's context window."""


class JudgeRateLimitError(JudgeStatusError):
    """429: too many requests or tokens; ``retry_after_ms`` says how long to wait."""


class JudgeServerError(JudgeStatusError):
    """5xx or 529 (overloaded): the provider failed; usually transient."""


class JudgeResponseError(JudgeProviderError):
    """The provider answered, but the response could not be read (e.g. a truncated body)."""


class JudgeOutputError(JudgeError):
    """The judge's answer did not parse, or did not validate against the step's schema."""

    def __init__(self, message: str, *, model_id: str, step: str, raw_output: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id
        self.step = step
        self.raw_output = raw_output


class JudgeProcessorError(JudgeError):
    """A judge processor raised; the original exception is ``__cause__``."""
