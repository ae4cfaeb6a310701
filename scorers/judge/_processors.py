"""Judge processors: input (before the call), output (after it), error (decide retries).

Each kind is an object with the method below, or a plain callable with the same arguments;
sync or async (an awaitable result is awaited). They run in list order.

- Input processor — ``process_input(messages, info) -> list[JudgeMessage]``: gets the judge's
  messages (the system message first, then the user prompt) once per judge call, before any
  attempt, and returns the messages to send (e.g. redaction). Schema instructions are added
  after input processors.
- Output processor — ``process_output(response, info) -> JudgeResponse``: gets each
  successful :class:`JudgeResponse` before it is parsed and validated, and returns the one to
  use (e.g. ``dataclasses.replace(response, text=clean(response.text))``). For native
  structured output ``response.parsed`` may already hold the value (Anthropic tool input); it
  wins over ``text``, so change it too, or set it to None to have ``text`` parsed.
- Error processor — ``process_error(error, context) -> RetryDecision | None``: gets the
  :class:`JudgeProviderError` of a failed request and an :class:`ErrorContext`; returns
  ``RetryDecision(retry=True, delay_ms=...)`` to retry, ``RetryDecision(retry=False)`` to stop,
  or None for "no opinion" (the next processor is asked). The first decision wins; with no
  decision the error is final. ``Judge.max_processor_retries`` caps the retries of one judge
  call (10 when error processors are set and the cap is not).
"""

from __future__ import annotations

import errno
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

from scorers._errors import ScorerConfigError
from scorers.judge._errors import JudgeProviderError, JudgeStatusError, JudgeTimeoutError
from scorers.judge._model import JudgeMessage, JudgeResponse

__all__ = [
    "DelayMs",
    "ErrorContext",
    "ErrorProcessor",
    "InputProcessor",
    "JudgeCallInfo",
    "OutputProcessor",
    "RetryDecision",
    "RetryMatcher",
    "StreamErrorRetryProcessor",
    "matcher_view",
]

DelayMs: TypeAlias = float | Callable[[int], float]


@dataclass(frozen=True, slots=True)
class JudgeCallInfo:
    """Which judge call a processor is working on."""

    scorer_id: str
    step: str
    model_id: str
    provider: str


@dataclass(frozen=True, slots=True)
class ErrorContext:
    """``retry_count``: retries already made for this judge call (0 at the first failure)."""

    call: JudgeCallInfo
    retry_count: int
    max_processor_retries: int


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_ms: float = 0.0
    reason: str = ""


@runtime_checkable
class InputProcessor(Protocol):
    def process_input(
        self, messages: list[JudgeMessage], info: JudgeCallInfo
    ) -> list[JudgeMessage] | Awaitable[list[JudgeMessage]]: ...


@runtime_checkable
class OutputProcessor(Protocol):
    def process_output(
        self, response: JudgeResponse, info: JudgeCallInfo
    ) -> JudgeResponse | Awaitable[JudgeResponse]: ...


@runtime_checkable
class ErrorProcessor(Protocol):
    def process_error(
        self, error: JudgeProviderError, context: ErrorContext
    ) -> RetryDecision | Awaitable[RetryDecision | None] | None: ...


@dataclass(frozen=True)
class RetryMatcher:
    """A matcher with its own budget: ``match(error) -> bool``; ``max_retries`` and
    ``delay_ms`` (if set) replace the processor's for errors it matches."""

    match: Callable[[JudgeProviderError], bool]
    max_retries: int | None = None
    delay_ms: DelayMs | None = None


Matcher: TypeAlias = Callable[[JudgeProviderError], bool] | RetryMatcher | Any


class StreamErrorRetryProcessor:
    """Retry failed judge requests, with Mastra's ``StreamErrorRetryProcessor`` semantics.

    A failed request is retried (up to ``max_retries`` times per judge call) when:

    1. a matcher matches it — matchers are callables ``error -> bool`` or objects with a
       ``match(error)`` method and optional ``max_retries`` / ``delay_ms`` of their own; the
       first matching matcher decides (even for auth or invalid-request errors); or
    2. the provider error's ``category`` is ``retryable``: HTTP 408, 409, 425, 429, 5xx (incl.
       529), connection errors, timeouts, or an "overloaded" error (one status table,
       which the worker's redelivery of a failed run reads too); or
    3. ``retry_unknown_errors=True`` and the error is neither retryable nor an HTTP error
       (e.g. an unreadable response, or an exception from a custom ``JudgeModel``).

    Authentication/permission errors (401/403) and invalid requests (400, context length
    exceeded, other 4xx) are never retried unless a matcher asks for it.

    The delay before a retry is ``max(configured, min(retry_after, max_retry_after_ms))`` where
    ``configured`` is ``delay_ms`` (a number, or a callable of the retry count: 0 before the
    first retry) and ``retry_after`` the provider's ``retry-after-ms`` / ``retry-after``.

    Set ``max_retries`` and ``Judge(max_processor_retries=...)`` to the same value: the cap is
    10 when error processors are set without it.

    A matcher sees the provider's own error fields directly, as Mastra's matchers do (see
    :func:`matcher_view`): ``error.code`` (``"ECONNRESET"``, ``"rate_limit_exceeded"``),
    ``error.status``, ``error.type`` (``"overloaded_error"``) and ``error.message`` (the
    provider's text, not tracescore's summary), e.g. ``matchers=[lambda e: e.code ==
    "ECONNRESET"]``. It is still the same ``JudgeProviderError`` class, so ``isinstance``,
    ``status_code``, ``category`` and ``retry_after_ms`` work too.
    """

    def __init__(
        self,
        max_retries: int = 1,
        max_retry_after_ms: float = 30_000,
        delay_ms: DelayMs = 0,
        matchers: Sequence[Matcher] = (),
        retry_unknown_errors: bool = False,
    ) -> None:
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ScorerConfigError(f"StreamErrorRetryProcessor: max_retries must be an int >= 0, got {max_retries!r}")
        if not _non_negative(max_retry_after_ms):
            raise ScorerConfigError(
                f"StreamErrorRetryProcessor: max_retry_after_ms must be a number >= 0, got {max_retry_after_ms!r}"
            )
        if not (callable(delay_ms) or _non_negative(delay_ms)):
            raise ScorerConfigError(
                "StreamErrorRetryProcessor: delay_ms must be a number >= 0 or a callable "
                f"(retry_count) -> ms, got {delay_ms!r}"
            )
        for m in matchers:
            if not (callable(m) or callable(getattr(m, "match", None))):
                raise ScorerConfigError(
                    f"StreamErrorRetryProcessor: matcher {m!r} must be a callable (error) -> bool "
                    "or have a match(error) method"
                )
        self.max_retries = max_retries
        self.max_retry_after_ms = float(max_retry_after_ms)
        self.delay_ms = delay_ms
        self.matchers = tuple(matchers)
        self.retry_unknown_errors = retry_unknown_errors

    def __repr__(self) -> str:
        return (
            f"StreamErrorRetryProcessor(max_retries={self.max_retries}, "
            f"max_retry_after_ms={self.max_retry_after_ms:g}, matchers={len(self.matchers)}, "
            f"retry_unknown_errors={self.retry_unknown_errors})"
        )

    def process_error(self, error: JudgeProviderError, context: ErrorContext) -> RetryDecision:
        count = context.retry_count
        for matcher in self.matchers:
            if _matches(matcher, error):
                limit = getattr(matcher, "max_retries", None)
                limit = self.max_retries if limit is None else limit
                delay = getattr(matcher, "delay_ms", None)
                if count >= limit:
                    return RetryDecision(False, reason=f"matcher retries exhausted ({limit})")
                return RetryDecision(True, self._delay(error, count, delay), reason="matcher")
        category = error.category
        if category == "auth":
            return RetryDecision(False, reason="authentication/permission errors are not retried")
        if category == "invalid_request":
            return RetryDecision(False, reason="invalid requests are not retried")
        if category == "unknown" and not self.retry_unknown_errors:
            return RetryDecision(False, reason="unknown error and retry_unknown_errors is off")
        if category == "unknown" and error.status_code is not None and not 200 <= error.status_code < 300:
            # An HTTP status no table names (a 3xx: the base URL points elsewhere) answers the
            # same request the same way: sent again, it is only paid again.
            return RetryDecision(False, reason=f"HTTP {error.status_code} is not retried")
        if count >= self.max_retries:
            return RetryDecision(False, reason=f"retries exhausted ({self.max_retries})")
        return RetryDecision(True, self._delay(error, count, None), reason=category)

    def _delay(self, error: JudgeProviderError, count: int, override: DelayMs | None) -> float:
        setting = self.delay_ms if override is None else override
        configured = float(setting(count)) if callable(setting) else float(setting)
        if not math.isfinite(configured) or configured < 0:
            configured = 0.0
        if error.retry_after_ms is None:
            return configured
        return max(configured, min(error.retry_after_ms, self.max_retry_after_ms))


def _matches(matcher: Matcher, error: JudgeProviderError) -> bool:
    view = matcher_view(error)
    method = getattr(matcher, "match", None)
    if callable(method):
        return bool(method(view))
    return bool(matcher(view))  # type: ignore[operator]  # checked callable in __init__


def matcher_view(error: JudgeProviderError) -> JudgeProviderError:
    """What a retry matcher sees: a copy of ``error`` (same class) carrying the provider's own
    fields, which the translation into tracescore's error tree otherwise leaves on
    ``__cause__`` (the SDK's or a custom ``JudgeModel``'s exception):

    - ``code``: the provider's error code, else the OS error name of a failed connection
      (``ECONNRESET``, ``ECONNREFUSED``, ...; ``ETIMEDOUT`` for a timeout), else None;
    - ``status`` (and ``status_code``): the HTTP status, or None without a response;
    - ``type``: the provider's error type (``rate_limit_error``, ``overloaded_error``);
    - ``message``: the provider's own message (the error body's, else the exception's text);
    - ``provider_error``: the provider's exception itself (None if there is none).

    The original error is left untouched: records, logs and ``ScorerRunError.cause`` keep it.
    """
    cause = error.__cause__
    view = type(error).__new__(type(error))
    view.__dict__.update(error.__dict__)
    view.args = error.args
    view.__cause__ = cause
    view.code = error.code or _text(getattr(cause, "code", None)) or _errno_name(error)
    view.status_code = error.status_code if error.status_code is not None else _status(cause)
    view.status = view.status_code  # type: ignore[attr-defined]  # Mastra's name, on the copy only
    view.type = error.error_type or _text(getattr(cause, "type", None))  # type: ignore[attr-defined]
    view.error_type = view.type  # type: ignore[attr-defined]
    view.message = _provider_message(error, cause)
    view.provider_error = cause  # type: ignore[attr-defined]
    return view


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _status(cause: BaseException | None) -> int | None:
    for name in ("status_code", "status"):
        value = getattr(cause, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and everything below it (explicit causes first, then implicit contexts)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not s for s in seen) and len(seen) < 32:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _errno_name(error: JudgeProviderError) -> str | None:
    if isinstance(error, JudgeStatusError):
        return None  # an HTTP answer came back: no socket error to name
    for exc in _chain(error):
        if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno in errno.errorcode:
            return errno.errorcode[exc.errno]
    return "ETIMEDOUT" if isinstance(error, JudgeTimeoutError) else None


def _provider_message(error: JudgeProviderError, cause: BaseException | None) -> str:
    body = error.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and _text(inner.get("message")):
            return str(inner["message"])
    if cause is None:
        return error.message
    if error.status_code is None:
        # No HTTP answer: the innermost exception says what happened ("Connection reset by
        # peer"), where the SDK's own text is a generic "Connection error.".
        innermost = _chain(cause)[-1]
        return str(innermost) or str(cause) or type(innermost).__name__
    return _text(getattr(cause, "message", None)) or str(cause) or error.message


def _non_negative(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
