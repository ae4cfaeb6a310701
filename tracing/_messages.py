"""Chat messages as producers write them → one neutral shape → Mastra stored messages.

Producers disagree on the message shape; each shape is recognised by its keys, never guessed:

- OTel GenAI (``gen_ai.input.messages``): ``{role, parts: [{type: text|tool_call|
  tool_call_response|reasoning|..., ...}]}``
- OpenAI chat: ``{role, content: str | [{type: text, text}], tool_calls: [{id, function:
  {name, arguments}}], tool_call_id}``
- AI SDK / Mastra model messages: ``{role, content: [{type: text|tool-call|tool-result|
  reasoning, ...}]}``
- Mastra stored messages: ``{role, content: {format: 2, parts: [...]}}``

A part type nobody defines here is kept as a ``data-<type>`` part, not dropped.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tracing._errors import MessageShapeError, json_error, shape_of

__all__ = [
    "MessageShapeError",
    "Msg",
    "OtherPart",
    "ReasoningPart",
    "StepBreak",
    "TextPart",
    "ToolCall",
    "ToolResult",
    "attach_results",
    "decode_json_text",
    "parse_message",
    "parse_messages",
    "parse_system",
    "render_messages",
    "str_or_none",
]

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "tool": "tool",
    "function": "tool",
}


@dataclass(slots=True)
class TextPart:
    text: str


@dataclass(slots=True)
class ReasoningPart:
    text: str


@dataclass(slots=True)
class ToolCall:
    id: str | None
    name: str
    args: Any = None
    result: Any = None
    has_result: bool = False


@dataclass(slots=True)
class ToolResult:
    id: str | None
    name: str | None
    result: Any
    attached: bool = False


@dataclass(slots=True)
class OtherPart:
    type: str
    data: Any


@dataclass(slots=True)
class StepBreak:
    """Marks the start of an agent step inside a merged assistant message."""

    step: int = 0


NeutralPart = TextPart | ReasoningPart | ToolCall | ToolResult | OtherPart | StepBreak


@dataclass(slots=True)
class Msg:
    role: str
    parts: list[NeutralPart] = field(default_factory=list)
    tag: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))


# A tool call's arguments or result nesting deeper than this are kept as JSON text: a run
# holding them read fine, but pydantic-core serializes 255 levels at most, so its record, its
# checkpoint or a dry run's estimate of it failed (the dry run ended on it).
MAX_DECODED_DEPTH = 64


def decode_json_text(value: Any) -> Any:
    """A JSON object/array held in a string, decoded; anything else unchanged.

    Only ``{...}`` / ``[...]`` are decoded, so a tool result ``"true"`` stays the text it was.
    A value nesting deeper than ``MAX_DECODED_DEPTH`` stays (or becomes) JSON text.
    """
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
            try:
                decoded = json.loads(stripped)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser: text
                return value
            if stripped.count("[") + stripped.count("{") <= MAX_DECODED_DEPTH:
                return decoded  # no deeper than its brackets: a C-speed count spares the walk
            return value if _deeper_than(decoded, MAX_DECODED_DEPTH) else decoded
    elif isinstance(value, dict | list) and _deeper_than(value, MAX_DECODED_DEPTH):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError):
            return f"(a value nested deeper than {MAX_DECODED_DEPTH} levels)"
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
        ]
        if not level:
            return False
    return any(isinstance(node, dict | list) for node in level)


def _role(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in _ROLES:
        raise MessageShapeError(
            "unknown_role",
            f"message role is {shape_of(value)}, expected one of {sorted(_ROLES)}",
        )
    return _ROLES[value.lower()]


def _first(d: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in d and d[key] is not None:
            return d[key]
    return None


def str_or_none(value: Any) -> str | None:
    """``value`` when it is a non-empty string (an id, a name), else None."""
    return value if isinstance(value, str) and value else None


def _part(raw: Any) -> NeutralPart | None:
    """One content part of any known shape (GenAI, OpenAI, AI SDK, Mastra, Anthropic)."""
    if isinstance(raw, str):
        return TextPart(raw)
    if not isinstance(raw, dict):
        raise MessageShapeError("bad_message", f"part is {shape_of(raw)}, expected a string or an object")
    kind = raw.get("type")
    if kind == "text":  # the common case first
        text = raw.get("content")
        if isinstance(text, str):
            return TextPart(text)
    if kind in ("text", "input_text", "output_text"):
        text = _first(raw, "content", "text")
        if not isinstance(text, str):
            raise MessageShapeError(
                "bad_message", f"{kind} part has no string 'content' or 'text' (it is {shape_of(text)})"
            )
        return TextPart(text)
    if kind in ("reasoning", "thinking"):
        text = _first(raw, "content", "text", "reasoning", "thinking")
        return ReasoningPart(text if isinstance(text, str) else json.dumps(text))
    if kind in ("tool_call", "tool-call", "function_call", "tool_use"):
        name = _first(raw, "name", "toolName")
        if not isinstance(name, str):
            raise MessageShapeError(
                "bad_message", f"{kind} part has no string 'name' or 'toolName' (it is {shape_of(name)})"
            )
        args = _first(raw, "arguments", "input", "args")
        return ToolCall(str_or_none(_first(raw, "id", "toolCallId", "call_id")), name, decode_json_text(args))
    if kind in ("tool_call_response", "tool-result", "tool_result", "function_call_output"):
        result = _first(raw, "response", "result", "output", "content")
        if isinstance(result, dict) and "value" in result and "type" in result:
            result = result["value"]  # AI SDK v5 tool output: {type: "json"|"text", value}
        return ToolResult(
            str_or_none(_first(raw, "id", "toolCallId", "tool_use_id", "call_id")),
            str_or_none(_first(raw, "name", "toolName")),
            decode_json_text(result),
        )
    if kind == "tool-invocation" and isinstance(raw.get("toolInvocation"), dict):
        inv = raw["toolInvocation"]
        call = ToolCall(
            str_or_none(inv.get("toolCallId")), str(inv.get("toolName", "")), decode_json_text(inv.get("args"))
        )
        if inv.get("state") == "result":
            call.result, call.has_result = decode_json_text(inv.get("result")), True
        return call
    if kind == "step-start":
        return None
    if isinstance(kind, str) and kind:
        return OtherPart(kind, dict(raw))
    raise MessageShapeError("bad_message", f"part's 'type' is {shape_of(kind)}, expected a non-empty string")


def _openai_tool_calls(raw: Any) -> list[NeutralPart]:
    if not isinstance(raw, list | tuple):
        raise MessageShapeError("bad_message", f"'tool_calls' is {shape_of(raw)}, expected a list")
    calls: list[NeutralPart] = []
    for index, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            got = shape_of(fn.get("name")) if isinstance(fn, dict) else f"'function' is {shape_of(fn)}"
            raise MessageShapeError("bad_message", f"tool_calls[{index}] has no string 'function.name' ({got})")
        calls.append(ToolCall(str_or_none(tc.get("id")), fn["name"], decode_json_text(fn.get("arguments"))))
    return calls


def _parts(raw: Iterable[Any], field: str) -> list[NeutralPart]:
    parts: list[NeutralPart] = []
    for index, item in enumerate(raw):
        try:
            part = _part(item)
        except MessageShapeError as exc:
            raise exc.at(f"{field}[{index}]") from None
        if part is not None:
            parts.append(part)
    return parts


def parse_message(raw: Any, default_role: str | None = None) -> Msg:
    """One message of any known shape. A bare string is a ``default_role`` message."""
    if isinstance(raw, str) and default_role is not None:
        return Msg(default_role, [TextPart(raw)])
    if not isinstance(raw, dict):
        raise MessageShapeError("bad_message", f"message is {shape_of(raw)}, expected an object")
    role = _role(raw.get("role", default_role))
    parts: list[NeutralPart] = []
    raw_parts = raw.get("parts")
    if type(raw_parts) is list or isinstance(raw_parts, tuple):  # OTel GenAI
        parts = _parts(raw_parts, "parts")
    else:
        content = raw.get("content")
        if isinstance(content, dict) and isinstance(content.get("parts"), list | tuple):  # Mastra
            parts = _parts(content["parts"], "content.parts")
        elif isinstance(content, str):
            if role == "tool":
                tool_id = str_or_none(_first(raw, "tool_call_id", "id", "toolCallId"))
                parts = [ToolResult(tool_id, str_or_none(raw.get("name")), decode_json_text(content))]
            elif content:
                parts = [TextPart(content)]
        elif isinstance(content, list | tuple):
            if role == "tool" and all(isinstance(p, dict) and p.get("type") in ("text", "input_text") for p in content):
                text = "".join(str(p.get("text", "")) for p in content)
                tool_id = str_or_none(_first(raw, "tool_call_id", "id", "toolCallId"))
                parts = [ToolResult(tool_id, str_or_none(raw.get("name")), decode_json_text(text))]
            else:
                parts = _parts(content, "content")
        elif content is not None:
            raise MessageShapeError(
                "bad_message", f"message 'content' is {shape_of(content)}, expected text or a list of parts"
            )
        if raw.get("tool_calls"):
            parts.extend(_openai_tool_calls(raw["tool_calls"]))
        fc = raw.get("function_call")
        if isinstance(fc, dict) and isinstance(fc.get("name"), str):
            parts.append(ToolCall(None, fc["name"], decode_json_text(fc.get("arguments"))))
    if role == "user" and parts and all(isinstance(p, ToolResult) for p in parts):
        role = "tool"  # Anthropic's shape: tool results go back in a user turn, not the user's words
    tag = raw.get("tag")
    if not isinstance(tag, str):
        meta = raw.get("metadata")
        tag = meta.get("tag") if isinstance(meta, dict) else None
    return Msg(role, parts, tag if isinstance(tag, str) and tag else None)


def _load(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise MessageShapeError("bad_json", f"not valid JSON ({json_error(exc)}) in {shape_of(value)}") from None
    return value


def parse_messages(value: Any, default_role: str | None = None) -> list[Msg]:
    """A message list: JSON text, a list of message objects (or of JSON texts), or
    ``{"messages": [...]}``."""
    data = _load(value)
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if isinstance(data, dict) and "role" in data:
        data = [data]
    if not isinstance(data, list | tuple):
        raise MessageShapeError("bad_message", f"expected a list of messages, got {type(data).__name__}")
    out: list[Msg] = []
    for index, item in enumerate(data):
        try:
            if isinstance(item, str) and default_role is None:
                item = _load(item)
            out.append(parse_message(item, default_role))
        except MessageShapeError as exc:
            raise exc.at(f"messages[{index}]") from None
    return out


def parse_system(value: Any) -> list[Msg]:
    """System instructions: GenAI parts (JSON or structured), messages, or plain text."""
    if isinstance(value, str):
        try:
            data: Any = json.loads(value)
        except (ValueError, RecursionError):
            return [Msg("system", [TextPart(value)])] if value else []
        if isinstance(data, str):
            return [Msg("system", [TextPart(data)])]
    else:
        data = value
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list | tuple):
        raise MessageShapeError(
            "bad_message", f"system instructions are {shape_of(data)}, expected text, an object or a list"
        )
    out: list[Msg] = []
    loose: list[NeutralPart] = []
    for item in data:
        if isinstance(item, dict) and "role" in item:
            out.append(parse_message(item))
        else:
            part = _part(_load(item) if isinstance(item, str) and item[:1] == "{" else item)
            if part is not None:
                loose.append(part)
    if loose:
        out.insert(0, Msg("system", loose))
    return out


def _call_id(call: ToolCall, index: int) -> str:
    # A producer that records no call id (old Mastra tool spans): a stable, visible stand-in.
    return call.id if call.id else f"{call.name}-{index}"


def attach_results(messages: Iterable[Msg], results: Iterable[ToolResult]) -> list[ToolResult]:
    """Fill tool calls with their results (by call id, else by tool name in call order).

    Returns the results that matched no call.
    """
    calls = [p for m in messages for p in m.parts if isinstance(p, ToolCall)]
    by_id = {c.id: c for c in calls if c.id}
    # By name, the calls still waiting for a result, in call order: linear in calls and results
    # (a scan of every call per result took minutes on a trace of 100,000 unnamed calls).
    waiting: dict[str, collections.deque[ToolCall]] = {}
    for c in calls:
        if not c.has_result:
            waiting.setdefault(c.name, collections.deque()).append(c)
    left: list[ToolResult] = []
    for res in results:
        call = by_id.get(res.id) if res.id else None
        if call is None and res.id is None and res.name:
            queue = waiting.get(res.name)
            while queue and queue[0].has_result:  # answered meanwhile (by id, or just below)
                queue.popleft()
            call = queue[0] if queue else None
        if call is None or call.has_result:
            left.append(res)
            continue
        call.result, call.has_result = res.result, True
        res.attached = True
    return left


def render_messages(messages: Iterable[Msg], *, steps: bool = False) -> list[dict[str, Any]]:
    """Neutral messages → Mastra stored-message dicts (``scorers.agent.Message`` input)."""
    out: list[dict[str, Any]] = []
    counter = 0
    for msg in messages:
        parts: list[dict[str, Any]] = []
        for part in msg.parts:
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": part.text})
            elif isinstance(part, ReasoningPart):
                parts.append({"type": "reasoning", "reasoning": part.text, "details": []})
            elif isinstance(part, ToolCall | ToolResult):
                counter += 1
                if isinstance(part, ToolCall):
                    inv = {
                        "state": "result" if part.has_result else "call",
                        "toolCallId": _call_id(part, counter),
                        "toolName": part.name,
                        "args": part.args,
                        "result": part.result,
                    }
                else:
                    inv = {
                        "state": "result",
                        "toolCallId": part.id or f"{part.name or 'tool'}-{counter}",
                        "toolName": part.name or "",
                        "result": part.result,
                    }
                parts.append({"type": "tool-invocation", "toolInvocation": inv})
            elif isinstance(part, StepBreak):
                if steps:
                    parts.append({"type": "step-start"})
            else:
                parts.append({"type": f"data-{part.type}", "data": part.data})
        out.append({"role": msg.role, "content": {"format": 2, "parts": parts}})
    return out
