"""The ``JudgeModel`` protocol: what any judge backend implements.

A model gets one :class:`JudgeRequest` (system text, messages, optional JSON schema, and
whether to use the provider's native structured output) and returns a
:class:`JudgeResponse`. Retries, validation, fallbacks and records are the judge layer's job,
not the model's: ``generate`` makes exactly one provider request and raises on failure —
ideally a :class:`~scorers.judge.JudgeProviderError` subclass carrying status code, request
id and Retry-After (other exceptions count as "unknown" errors for retry policies). A model
that got an answer it cannot use, but that says what it used, sets ``usage`` on the
:class:`~scorers.judge.JudgeResponseError` it raises: the call is counted as paid.

Built in: ``"openai/<model>"`` and ``"anthropic/<model>"`` (see ``_providers``). Plug in
anything else (Azure, Bedrock, vLLM, Ollama, a test double such as
``scorers.judge.testing.FakeJudgeModel``) with an object like::

    class MyModel:
        model_id = "vllm/qwen2.5-7b"        # shown in records and errors, keys rate limits
        provider = "vllm"
        supports_native_structured_output = False   # optional; False means "auto" injects inline

        async def generate(self, request: JudgeRequest) -> JudgeResponse: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from scorers._result import JudgeUsage

__all__ = ["JudgeMessage", "JudgeModel", "JudgeRequest", "JudgeResponse", "StructuredMode"]

StructuredMode = Literal["native", "text"]


@dataclass(frozen=True, slots=True)
class JudgeMessage:
    """One chat message. ``role`` is "system", "user" or "assistant"."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class JudgeRequest:
    """One request to a judge model.

    - ``system``: the system message (preamble, judge instructions, maybe schema instructions).
    - ``messages``: the conversation after the system message (usually one user message).
    - ``output_schema``: the JSON schema the answer must fit, or None for free text.
    - ``mode``: ``"native"`` asks the model to enforce ``output_schema`` itself (OpenAI
      ``response_format`` json_schema strict, Anthropic a forced tool call); ``"text"`` means
      plain text generation (any schema instructions are already in the prompt).
    - ``schema_name``: a short identifier for the schema (tool / response-format name).
    """

    system: str
    messages: tuple[JudgeMessage, ...]
    output_schema: dict[str, Any] | None = None
    mode: StructuredMode = "text"
    schema_name: str = "answer"
    max_tokens: int = 1024
    temperature: float | None = None
    timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class JudgeResponse:
    """What the model answered.

    ``text`` is the raw answer text (for native structured output, the JSON text);
    ``parsed`` is the structured value when the provider returned one directly (Anthropic
    tool input), else None and the judge parses ``text``. ``model`` is the model name the
    provider reported; ``request_id`` the provider's request id.
    """

    text: str
    parsed: Any = None
    usage: JudgeUsage = field(default_factory=JudgeUsage)
    model: str | None = None
    request_id: str | None = None
    finish_reason: str | None = None


@runtime_checkable
class JudgeModel(Protocol):
    """A model the judge can call. Optional attribute: ``supports_native_structured_output``."""

    model_id: str
    provider: str

    async def generate(self, request: JudgeRequest) -> JudgeResponse:
        """Make exactly one provider request; raise on failure."""
        ...
