"""The judge's exception tree, grouped by who must handle the error.

    JudgeError (ScorerError)          anything the judge layer raises; ``.execution`` is the record
    ├── JudgeProviderError            the provider call failed (status, request id, retry-after)
    │   │                             category: by status (``category_for_status``), else class
    │   ├── JudgeConnectionError      no HTTP response: refused, reset, dropped        retryable
    │   │   └── JudgeTimeoutError     no answer within ``Judge.timeout``               retryable
    │   ├── JudgeStatusError          the provider answered 4xx/5xx (408/409/425 here) by status
    │   │   ├── JudgeAuthError        401/403, no credentials, a key HTTP refuses      auth
    │   │   ├── JudgeBadRequestError  other 4xx: the request itself is wrong           invalid_request
    │   │   │   └── JudgeContextLengthError   the prompt does not fit the model's context
    │   │   ├── JudgeRateLimitError   429 (honours Retry-After)                        retryable
    │   │   └── JudgeServerError      5xx, 529 overloaded                              retryable
    │   └── JudgeResponseError        a response came back but could not be read       unknown
    │                                 (``.usage``: what it reported using, paid as an answer)
    ├── JudgeOutputError              the answer did not parse or fit the schema       invalid_output
    ├── JudgeProcessorError           an input/output/error processor raised           internal
    └── JudgeCallRefused (_hooks)     the host refused the call: budget, call cap      retryable

A provider error without a status or class that says more is ``unknown`` (a custom
``JudgeModel``'s own exception), unless its text says "overloaded" (``retryable``).
Errors from the OpenAI and Anthropic SDKs are translated into this tree in exactly one place,
``scorers.judge._translate.translate_sdk_errors``; the SDK error stays available as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from scorers._errors import ErrorCategory, ScorerError, category_for_status

if TYPE_CHECKING:
    from scorers._result import JudgeExecution, JudgeUsage

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


class JudgeError(ScorerError):
    """Base of the judge's errors. ``execution`` is filled in when ``ask_judge`` gives up."""

    execution: JudgeExecution | None = None


class JudgeProviderError(JudgeError):
    """A provider request failed. Fields are None when the provider did not say.

    ``retry_after_ms`` is the server's Retry-After (``retry-after-ms`` first, then
    ``retry-after`` as seconds or an HTTP date), already parsed; malformed values are None.
    ``usage`` is set when the provider answered and reported what the call used although its
    answer could not be used: the call is paid for, and counted as an answered one (its
    tokens in the records and the spend, no failed call against a run's cap).
    """

    _category: ClassVar[ErrorCategory] = "unknown"
    usage: JudgeUsage | None = None

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
        by_status = category_for_status(self.status_code) if self.status_code is not None else None
        # The class counts as much as the status: a custom JudgeModel may raise
        # JudgeRateLimitError("...") without a status_code and still mean "retry me".
        if self._category == "auth" or by_status == "auth":
            return "auth"
        if self._category == "retryable" or by_status == "retryable":
            return "retryable"
        if "overloaded" in f"{self.error_type or ''} {self.message}".lower():
            return "retryable"
        if self._category == "invalid_request" or by_status == "invalid_request":
            return "invalid_request"
        return "unknown"

    def __str__(self) -> str:
        extra = [f"status {self.status_code}"] if self.status_code is not None else []
        if self.request_id:
            extra.append(f"request id {self.request_id}")
        return f"{self.message} ({', '.join(extra)})" if extra else self.message


class JudgeConnectionError(JudgeProviderError):
    """The request got no HTTP response (connection refused, reset or dropped)."""

    _category: ClassVar[ErrorCategory] = "retryable"


class JudgeTimeoutError(JudgeConnectionError):
    """The provider did not answer within the judge's timeout."""


class JudgeStatusError(JudgeProviderError):
    """The provider answered with an HTTP error status (or a 200 whose body is that error)."""


class JudgeAuthError(JudgeStatusError):
    """401/403, or no credentials at all: fix the API key or permissions."""

    _category: ClassVar[ErrorCategory] = "auth"


class JudgeBadRequestError(JudgeStatusError):
    """The provider rejected the request as invalid (4xx other than 401/403/408/409/425/429)."""

    _category: ClassVar[ErrorCategory] = "invalid_request"


class JudgeContextLengthError(JudgeBadRequestError):
    """The prompt is longer than the model's context window."""


class JudgeRateLimitError(JudgeStatusError):
    """429: too many requests or tokens; ``retry_after_ms`` says how long to wait."""

    _category: ClassVar[ErrorCategory] = "retryable"


class JudgeServerError(JudgeStatusError):
    """5xx or 529 (overloaded): the provider failed; usually transient."""

    _category: ClassVar[ErrorCategory] = "retryable"


class JudgeResponseError(JudgeProviderError):
    """The provider answered, but the response could not be read (e.g. a truncated body)."""


class JudgeOutputError(JudgeError):
    """The judge's answer did not parse, or did not validate against the step's schema."""

    _category: ClassVar[ErrorCategory] = "invalid_output"

    def __init__(self, message: str, *, model_id: str, step: str, raw_output: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id
        self.step = step
        self.raw_output = raw_output


class JudgeProcessorError(JudgeError):
    """A judge processor raised; the original exception is ``__cause__``."""
