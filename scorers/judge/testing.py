"""Test doubles for the judge: test your scorers without HTTP or API keys.

    from scorers.judge.testing import FakeJudgeModel

    model = FakeJudgeModel({"score": 0.8}, "Because it is concise.")
    scorer = create_scorer("quality", judge=Judge(model=model, instructions="..."))...
    result = scorer.run_sync(input=..., output=...)
    assert model.requests[0].system.endswith("...")

Replies are used in order; each is a ``dict``/``list`` (a structured answer), a ``str`` (raw
text), a :class:`JudgeResponse`, an exception (raised, e.g. a ``JudgeRateLimitError`` to test
retries), or a callable ``(request) -> any of those``. When the replies run out, the model
answers automatically: a schema-valid instance for structured requests, else ``default_text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from scorers._result import JudgeUsage
from scorers.judge._errors import JudgeProviderError, JudgeRateLimitError, JudgeServerError
from scorers.judge._model import JudgeRequest, JudgeResponse

__all__ = ["FakeJudgeModel", "example_for_schema", "rate_limited", "server_error"]


class FakeJudgeModel:
    """An in-process, scripted :class:`~scorers.judge.JudgeModel`. ``requests`` records calls."""

    def __init__(
        self,
        *replies: Any,
        model_id: str = "fake/judge",
        provider: str = "fake",
        supports_native_structured_output: bool = True,
        default_text: str = "The fake judge's reason.",
    ) -> None:
        self.replies: list[Any] = list(replies)
        self.model_id = model_id
        self.provider = provider
        self.supports_native_structured_output = supports_native_structured_output
        self.default_text = default_text
        self.requests: list[JudgeRequest] = []

    def __repr__(self) -> str:
        return f"FakeJudgeModel({self.model_id!r}, pending={len(self.replies)})"

    def add(self, *replies: Any) -> None:
        """Queue more replies."""
        self.replies.extend(replies)

    async def generate(self, request: JudgeRequest) -> JudgeResponse:
        self.requests.append(request)
        reply = self.replies.pop(0) if self.replies else None
        if callable(reply) and not isinstance(reply, type):
            reply = reply(request)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, JudgeResponse):
            return reply
        n = self._n()
        if reply is None:
            schema = request.output_schema or _injected_schema(request)
            reply = example_for_schema(schema) if schema is not None else self.default_text
        if isinstance(reply, str):
            return JudgeResponse(text=reply, usage=_usage(request, reply), model=self.model_id, request_id=n)
        text = json.dumps(reply)
        parsed = reply if request.mode == "native" else None
        return JudgeResponse(text=text, parsed=parsed, usage=_usage(request, text), model=self.model_id, request_id=n)

    def _n(self) -> str:
        return f"fake-req-{len(self.requests)}"


def rate_limited(retry_after_ms: float | None = None, model_id: str = "fake/judge") -> JudgeRateLimitError:
    """A 429 as a provider would raise it (for FakeJudgeModel replies)."""
    return JudgeRateLimitError(
        f"{model_id}: fake 429",
        provider="fake",
        model_id=model_id,
        status_code=429,
        request_id="fake-429",
        retry_after_ms=retry_after_ms,
    )


def server_error(status: int = 500, model_id: str = "fake/judge") -> JudgeProviderError:
    """A 5xx as a provider would raise it (for FakeJudgeModel replies)."""
    return JudgeServerError(
        f"{model_id}: fake {status}",
        provider="fake",
        model_id=model_id,
        status_code=status,
        request_id=f"fake-{status}",
    )


_FENCED_JSON = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)


def _injected_schema(request: JudgeRequest) -> dict[str, Any] | None:
    """The schema a prompt-injected request carries (the last ```json block that is one)."""
    text = "\n".join([request.system, *(m.content for m in request.messages)])
    for block in reversed(_FENCED_JSON.findall(text)):
        try:
            data = json.loads(block)
        except ValueError:
            continue
        if isinstance(data, dict) and ("properties" in data or "type" in data):
            return data
    return None


def _usage(request: JudgeRequest, answer: str) -> JudgeUsage:
    prompt = len(request.system) + sum(len(m.content) for m in request.messages)
    return JudgeUsage(input_tokens=max(1, prompt // 4), output_tokens=max(1, len(answer) // 4))


def example_for_schema(schema: Any, defs: dict[str, Any] | None = None) -> Any:
    """A deterministic value valid for a JSON schema (numbers mid-range of min/max)."""
    if not isinstance(schema, dict):
        return None
    defs = {**(defs or {}), **schema.get("$defs", {})}
    if "$ref" in schema:
        return example_for_schema(defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {}), defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return example_for_schema(options[0], defs)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    makers: dict[str, Callable[[], Any]] = {
        "object": lambda: {k: example_for_schema(v, defs) for k, v in schema.get("properties", {}).items()},
        "array": lambda: [example_for_schema(schema.get("items", {}), defs)] * max(1, schema.get("minItems", 1)),
        "number": lambda: _number(schema, integer=False),
        "integer": lambda: _number(schema, integer=True),
        "boolean": lambda: True,
        "null": lambda: None,
    }
    return makers.get(kind, lambda: "example" + "x" * max(0, schema.get("minLength", 0) - 7))()


def _number(schema: dict[str, Any], *, integer: bool) -> float | int:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        value = (float(low) + float(high)) / 2
    elif low is not None:
        value = float(low) + 1
    elif high is not None:
        value = float(high) - 1
    else:
        value = 0.5 if not integer else 1
    return int(value) if integer else value
