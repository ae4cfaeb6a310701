"""The LLM judge: configuration, model adapters, processors, retries and fencing.

Public names (see each module's docstring): ``Judge``; the ``JudgeModel`` protocol with
``JudgeRequest`` / ``JudgeResponse`` / ``JudgeMessage``; the built-in ``OpenAIJudgeModel`` /
``AnthropicJudgeModel``; processors (``StreamErrorRetryProcessor``, ``RetryMatcher``,
``RetryDecision``, ``ErrorContext``, ``JudgeCallInfo``); ``fence`` and
``JUDGE_SYSTEM_PREAMBLE``; the ``JudgeError`` tree; the price table (``DEFAULT_PRICES``,
``PRICES_TAKEN``, ``ModelPrice``, ``price_usage``); host hooks (``JudgeHooks``,
``set_judge_hooks``); and ``ask_judge``, which the scorer pipeline calls. A test double lives
in ``scorers.judge.testing`` (``FakeJudgeModel``).
"""

from scorers.judge._ask import MAX_PAUSE_S, JudgeAnswer, ask_judge
from scorers.judge._clients import aclose_clients
from scorers.judge._config import JUDGE_DEFAULTS, JsonPromptInjection, Judge
from scorers.judge._errors import (
    ErrorCategory,
    JudgeAuthError,
    JudgeBadRequestError,
    JudgeConnectionError,
    JudgeContextLengthError,
    JudgeError,
    JudgeOutputError,
    JudgeProcessorError,
    JudgeProviderError,
    JudgeRateLimitError,
    JudgeResponseError,
    JudgeServerError,
    JudgeStatusError,
    JudgeTimeoutError,
)
from scorers.judge._fence import JUDGE_SYSTEM_PREAMBLE, fence
from scorers.judge._hooks import (
    JudgeCallRefused,
    JudgeGuard,
    JudgeHooks,
    JudgeLimiter,
    get_judge_hooks,
    set_judge_hooks,
)
from scorers.judge._model import JudgeMessage, JudgeModel, JudgeRequest, JudgeResponse, StructuredMode
from scorers.judge._prices import (
    DEFAULT_PRICES,
    PRICES_TAKEN,
    ModelPrice,
    find_price,
    price_executions,
    price_usage,
)
from scorers.judge._processors import (
    DelayMs,
    ErrorContext,
    ErrorProcessor,
    InputProcessor,
    JudgeCallInfo,
    OutputProcessor,
    RetryDecision,
    RetryMatcher,
    StreamErrorRetryProcessor,
)
from scorers.judge._providers import AnthropicJudgeModel, OpenAIJudgeModel, resolve_model
from scorers.judge._translate import parse_retry_after_ms, translate_sdk_errors

__all__ = [
    "DEFAULT_PRICES",
    "JUDGE_DEFAULTS",
    "JUDGE_SYSTEM_PREAMBLE",
    "MAX_PAUSE_S",
    "PRICES_TAKEN",
    "AnthropicJudgeModel",
    "DelayMs",
    "ErrorCategory",
    "ErrorContext",
    "ErrorProcessor",
    "InputProcessor",
    "JsonPromptInjection",
    "Judge",
    "JudgeAnswer",
    "JudgeAuthError",
    "JudgeBadRequestError",
    "JudgeCallInfo",
    "JudgeCallRefused",
    "JudgeConnectionError",
    "JudgeContextLengthError",
    "JudgeError",
    "JudgeGuard",
    "JudgeHooks",
    "JudgeLimiter",
    "JudgeMessage",
    "JudgeModel",
    "JudgeOutputError",
    "JudgeProcessorError",
    "JudgeProviderError",
    "JudgeRateLimitError",
    "JudgeRequest",
    "JudgeResponse",
    "JudgeResponseError",
    "JudgeServerError",
    "JudgeStatusError",
    "JudgeTimeoutError",
    "ModelPrice",
    "OpenAIJudgeModel",
    "OutputProcessor",
    "RetryDecision",
    "RetryMatcher",
    "StreamErrorRetryProcessor",
    "StructuredMode",
    "aclose_clients",
    "ask_judge",
    "fence",
    "find_price",
    "get_judge_hooks",
    "parse_retry_after_ms",
    "price_executions",
    "price_usage",
    "resolve_model",
    "set_judge_hooks",
    "translate_sdk_errors",
]
