"""The scorer exception tree, grouped by who must handle the error.

    ScorerError                  anything tracescore's scoring raises           category
    ├── ScorerConfigError        the scorer is built wrong (the author fixes)   config
    ├── RunInputError            the run does not fit the scorer's type         invalid_input
    ├── ScorerRunError           a step failed; carries the partial result      its cause's
    └── JudgeError               the judge layer (tree in ``scorers.judge._errors``)

Every error of every tracescore package has a ``category``: what kind of failure it is, so a
retry policy (the judge's ``StreamErrorRetryProcessor``, the worker's redelivery) decides by
reading one attribute. Categories are decided here only: HTTP statuses by
:func:`category_for_status`, anything else (a step's own exception, a builtin error) by
:func:`category_of`. ``ScorerRunError.cause`` is the original exception (a judge error keeps its
provider status and request id there) and ``ScorerRunError.category`` is the cause's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, get_args

if TYPE_CHECKING:
    from scorers._result import ScoreResult, StepName

__all__ = [
    "CATEGORIES",
    "ErrorCategory",
    "RunInputError",
    "ScorerConfigError",
    "ScorerError",
    "ScorerRunError",
    "category_for_status",
    "category_of",
]

ErrorCategory = Literal[
    "retryable",  # try again later: 408/409/425/429/5xx, connection dropped, provider timeout, overloaded
    "auth",  # 401/403 or no credentials: fix the key or permissions
    "invalid_request",  # another 4xx: the request itself is wrong
    "invalid_output",  # the judge answered, but not in the expected shape
    "invalid_input",  # the run, trace or message is wrong: the producer must change
    "timeout",  # a run past its own deadline (final: it would time out again)
    "memory",  # a run out of memory (final)
    "config",  # the scorer, settings, registry or source is set up wrong
    "internal",  # a bug: an exception nobody classified
    "unknown",  # a provider failure without a status nobody classified (see retry_unknown_errors)
]
CATEGORIES: frozenset[ErrorCategory] = frozenset(get_args(ErrorCategory))

# 408 Request Timeout, 409 Conflict (a concurrent request), 425 Too Early (RFC 8470: replay
# later) and 429 Too Many Requests say "the same request may succeed later"; so does any 5xx
# (529 is Anthropic's "overloaded").
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))


def category_for_status(status: int) -> ErrorCategory:
    """The category of an HTTP (or provider) error status: the one table every retry uses."""
    if status in (401, 403):
        return "auth"
    if status in _RETRYABLE_STATUS:
        return "retryable"
    if 400 <= status < 500:
        return "invalid_request"
    return "unknown"


def category_of(exc: BaseException) -> ErrorCategory:
    """The category of any exception: tracescore's own say theirs; a foreign one (a step's own
    HTTP client, a builtin) is classified by its ``status_code``, else by its type."""
    category = getattr(exc, "category", None)
    if category in CATEGORIES:
        return category  # type: ignore[no-any-return]  # checked against the Literal's values
    if getattr(exc, "retryable", None) is True:  # a library's own "retry me" flag
        return "retryable"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        by_status = category_for_status(status)
        if by_status != "unknown":
            return by_status
    if isinstance(exc, TimeoutError | ConnectionError) or _is_network_error(type(exc)):
        return "retryable"
    if isinstance(exc, MemoryError):
        return "memory"
    return "internal"


# A step's own client library (redis-py, requests, httpx, aiohttp, ...) has connection and timeout
# errors that are not the builtin ones; scorers/ cannot import those libraries, so they are known
# by the names in their class hierarchy.
_NETWORK_ERROR_NAMES = frozenset(
    {"ConnectionError", "ConnectError", "TimeoutError", "Timeout", "ConnectTimeout", "ReadTimeout",
     "PoolTimeout", "ServerDisconnectedError", "ClientConnectionError", "RemoteProtocolError"}
)  # fmt: skip


def _is_network_error(cls: type[BaseException]) -> bool:
    return any(base.__name__ in _NETWORK_ERROR_NAMES for base in cls.__mro__)


class ScorerError(Exception):
    """Base of every error raised by the scoring pipeline."""

    _category: ClassVar[ErrorCategory] = "internal"

    @property
    def category(self) -> ErrorCategory:
        """What kind of failure this is (see ``ErrorCategory``); retry policies read only this."""
        return self._category


class ScorerConfigError(ScorerError, ValueError):
    """The scorer definition is invalid (raised when it is built or first run)."""

    _category: ClassVar[ErrorCategory] = "config"


class RunInputError(ScorerError, ValueError):
    """The run does not fit the scorer's declared input/output type."""

    _category: ClassVar[ErrorCategory] = "invalid_input"


class ScorerRunError(ScorerError):
    """A step failed. ``partial`` holds what the completed steps produced. ``failed_step`` is
    None when no step failed but the ``on_step`` callback after the last completed one did."""

    def __init__(
        self,
        message: str,
        *,
        scorer_id: str,
        failed_step: StepName | Literal["prepare_run"] | None,
        completed_steps: tuple[StepName, ...],
        partial: ScoreResult,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.scorer_id = scorer_id
        self.failed_step = failed_step
        self.completed_steps = completed_steps
        self.partial = partial
        self.cause = cause

    @property
    def category(self) -> ErrorCategory:
        """The failed step's error's category (a judge's 429 stays ``retryable`` through the run)."""
        return category_of(self.cause) if self.cause is not None else "internal"

    @property
    def error_type(self) -> str:
        """The class name of the underlying error, as used for OTel ``error.type``."""
        return type(self.cause).__name__ if self.cause is not None else type(self).__name__
