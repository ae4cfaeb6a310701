"""What the fake server answers: scripted replies, rules, and the recorded requests."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["RecordedRequest", "Reply", "Rule"]

ReplyKind = Literal["auto", "text", "json", "refusal", "error", "hang", "drop", "malformed_body", "raw"]


@dataclass(frozen=True)
class Reply:
    """One answer of the fake server. Build them with the class methods.

    ``latency_ms`` (if set) replaces the server's default latency for this reply.
    """

    kind: ReplyKind = "auto"
    content: str | None = None
    data: Any = None
    status: int = 200
    error_type: str | None = None
    error_code: str | None = None
    message: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    latency_ms: float | None = None
    hang_s: float = 30.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    # The answer's finish reason (OpenAI finish_reason, Anthropic stop_reason), e.g. "length" /
    # "max_tokens" for an answer cut at the token limit; None: what a whole answer has.
    # Any JSON value: a hostile provider's may be a number or an object.
    finish: Any = None
    # How a raw reply's content becomes its bytes: "latin-1" for a body given as bytes (each
    # byte one character), so a reply stays JSON for the control endpoint.
    encoding: str = "utf-8"

    @classmethod
    def auto(cls, **kw: Any) -> Reply:
        """Schema-valid JSON for a structured request, else a short text answer."""
        return cls(kind="auto", **kw)

    @classmethod
    def text(cls, content: str, **kw: Any) -> Reply:
        """Raw assistant text. Anthropic gets a text block even when a tool call was forced."""
        return cls(kind="text", content=content, **kw)

    @classmethod
    def json(cls, data: Any, **kw: Any) -> Reply:
        """Structured answer: OpenAI message content; Anthropic tool input if a tool was forced."""
        return cls(kind="json", data=data, **kw)

    @classmethod
    def refusal(cls, content: str = "I can't help with that.", **kw: Any) -> Reply:
        """The model declines: OpenAI's ``message.refusal`` (no content), Anthropic's
        ``stop_reason: "refusal"`` (no content blocks)."""
        return cls(kind="refusal", content=content, **kw)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "fake error",
        *,
        error_type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> Reply:
        """An HTTP error in the provider's error body format (headers e.g. retry-after)."""
        return cls(
            kind="error",
            status=status,
            message=message,
            error_type=error_type,
            error_code=code,
            headers=dict(headers or {}),
            **kw,
        )

    @classmethod
    def rate_limited(cls, *, retry_after: str | None = None, retry_after_ms: str | None = None, **kw: Any) -> Reply:
        """429 with ``retry-after`` (seconds or HTTP date) and/or ``retry-after-ms``."""
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["retry-after"] = retry_after
        if retry_after_ms is not None:
            headers["retry-after-ms"] = retry_after_ms
        return cls.error(429, "Rate limit reached", error_type="rate_limit_error", headers=headers, **kw)

    @classmethod
    def context_length(cls, **kw: Any) -> Reply:
        """400: the prompt is longer than the model's context window."""
        return cls.error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 200000 tokens.",
            error_type="invalid_request_error",
            code="context_length_exceeded",
            **kw,
        )

    @classmethod
    def overloaded(cls, **kw: Any) -> Reply:
        """Anthropic's 529 overloaded_error."""
        return cls.error(529, "Overloaded", error_type="overloaded_error", **kw)

    @classmethod
    def hang(cls, seconds: float = 30.0, **kw: Any) -> Reply:
        """Accept the request and never answer (the connection closes after ``seconds``)."""
        return cls(kind="hang", hang_s=seconds, **kw)

    @classmethod
    def drop(cls, **kw: Any) -> Reply:
        """Close the connection without a response (a connection error for the client)."""
        return cls(kind="drop", **kw)

    @classmethod
    def malformed_body(cls, **kw: Any) -> Reply:
        """HTTP 200 whose body is truncated JSON."""
        return cls(kind="malformed_body", **kw)

    @classmethod
    def raw(cls, body: str | bytes, *, status: int = 200, **kw: Any) -> Reply:
        """Exactly ``body`` (text as UTF-8, bytes as they are) with ``status``, whatever either
        provider would send: a hostile or broken provider's answer (an HTML page, a body of
        another shape, gzip bytes under any header, another charset). Its content type is JSON
        unless ``headers`` say otherwise."""
        if isinstance(body, bytes):
            return cls(kind="raw", content=body.decode("latin-1"), encoding="latin-1", status=status, **kw)
        return cls(kind="raw", content=body, status=status, **kw)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reply:
        return cls(**data)


Matcher = Callable[["RecordedRequest"], bool]


@dataclass
class Rule:
    """Answer ``reply`` to requests that match every given condition.

    ``times`` limits how often the rule fires (None: forever). In a script queue a rule
    with ``times=None`` is consumed once.
    """

    reply: Reply
    provider: str | None = None
    model: str | None = None
    system_contains: str | None = None
    user_contains: str | None = None
    match: Matcher | None = None
    times: int | None = None

    def matches(self, req: RecordedRequest) -> bool:
        if self.provider is not None and req.provider != self.provider:
            return False
        if self.model is not None and req.model != self.model:
            return False
        if self.system_contains is not None and self.system_contains not in req.system:
            return False
        if self.user_contains is not None and self.user_contains not in req.user_text:
            return False
        return self.match is None or self.match(req)


@dataclass
class RecordedRequest:
    """A request the server saw, with the reply it chose."""

    provider: Literal["openai", "anthropic"]
    path: str
    model: str
    body: dict[str, Any]
    headers: dict[str, str]
    received_at: float
    system: str = ""
    user_text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    schema: dict[str, Any] | None = None
    structured: Literal["openai_json_schema", "openai_json_object", "anthropic_tool"] | None = None
    tool_name: str | None = None
    reply: Reply | None = None
    request_id: str = ""

    @classmethod
    def parse(cls, path: str, body: dict[str, Any], headers: dict[str, str], now: float) -> RecordedRequest:
        provider: Literal["openai", "anthropic"] = "anthropic" if path.rstrip("/").endswith("/messages") else "openai"
        messages = list(body.get("messages") or [])
        req = cls(
            provider=provider,
            path=path,
            model=str(body.get("model", "")),
            body=body,
            headers=headers,
            received_at=now,
            messages=messages,
        )
        systems: list[str] = []
        if provider == "anthropic":
            systems.append(_text(body.get("system")))
            tools = body.get("tools") or []
            choice = body.get("tool_choice") or {}
            if choice.get("type") == "tool":
                tool = next((t for t in tools if t.get("name") == choice.get("name")), None)
                if tool is not None:
                    req.structured, req.tool_name = "anthropic_tool", tool["name"]
                    req.schema = tool.get("input_schema")
        else:
            fmt = body.get("response_format") or {}
            if fmt.get("type") == "json_schema":
                req.structured = "openai_json_schema"
                req.schema = (fmt.get("json_schema") or {}).get("schema")
            elif fmt.get("type") == "json_object":
                req.structured = "openai_json_object"
        users: list[str] = []
        for m in messages:
            role = m.get("role")
            if role in ("system", "developer"):
                systems.append(_text(m.get("content")))
            elif role == "user":
                users.append(_text(m.get("content")))
        req.system = "\n".join(s for s in systems if s)
        req.user_text = "\n".join(users)
        if req.schema is None:
            req.schema = _injected_schema(req.system + "\n" + req.user_text)
        return req

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return _text(users[-1].get("content")) if users else ""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


_FENCED_JSON = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)


def _injected_schema(text: str) -> dict[str, Any] | None:
    """The last ```json block that looks like a JSON schema (prompt-injected structured output)."""
    for block in reversed(_FENCED_JSON.findall(text)):
        try:
            data = json.loads(block)
        except ValueError:
            continue
        if isinstance(data, dict) and ("properties" in data or "type" in data):
            return data
    return None
