"""Per-producer readers: what one span says about messages, tools, agent and model.

Each reader names the attribute it read, so a bad value becomes a ``TraceReadError`` that
points at the span and the attribute. Readers are tried from the most to the least specific
convention; the first that finds content wins (a span carrying both OTel GenAI and
OpenInference attributes describes the same messages twice).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tracing._errors import TraceReadError, json_error, shape_of
from tracing._messages import (
    MessageShapeError,
    Msg,
    TextPart,
    ToolCall,
    ToolResult,
    decode_json_text,
    parse_message,
    parse_messages,
    parse_system,
    str_or_none,
)
from tracing._run import ENVIRONMENT_ATTRIBUTE
from tracing._span import SpanView

__all__ = [
    "ENVIRONMENT_KEYS",
    "MAX_ENVIRONMENT_CHARS",
    "NO_ENVIRONMENT",
    "READ_ATTRIBUTES",
    "READ_ATTRIBUTE_PREFIXES",
    "READ_EVENTS",
    "SpanKind",
    "ToolSpan",
    "agent_name",
    "classify",
    "conversation_id",
    "environment_of",
    "is_read_attribute",
    "model_name",
    "read_input",
    "read_output",
    "read_system",
    "read_tool",
    "resource_environment",
    "span_kind",
]

SpanKind = Literal["agent", "llm", "tool", "other"]

# gen_ai.operation.name values (OTel GenAI semconv) by kind.
_GENAI_AGENT_OPS = {"invoke_agent"}
_GENAI_LLM_OPS = {"chat", "text_completion", "generate_content"}
_GENAI_TOOL_OPS = {"execute_tool"}
# openinference.span.kind values.
_OI_KINDS: dict[str, SpanKind] = {"AGENT": "agent", "LLM": "llm", "TOOL": "tool"}
# mastra.span.type values (Mastra AI tracing, both the ai-tracing and observability exporters).
_MASTRA_KINDS: dict[str, SpanKind] = {
    "agent_run": "agent",
    "model_generation": "llm",
    "llm_generation": "llm",
    "tool_call": "tool",
    "mcp_tool_call": "tool",
}
# traceloop.span.kind values (Traceloop's OpenLLMetry SDK: its @agent and @tool decorators; its
# @workflow and @task spans are neither). Its LLM spans follow the GenAI conventions.
_TRACELOOP_KINDS: dict[str, SpanKind] = {"agent": "agent", "tool": "tool"}
# llm.request.type values of OpenLLMetry's LLM spans before its instrumentations moved to the
# GenAI conventions (OpenAI 0.55, Anthropic 0.54), which set no gen_ai.operation.name; Anthropic's
# Messages calls say "completion" too.
_TRACELOOP_LLM_REQUESTS = frozenset({"chat", "completion"})
_OP_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_LEGACY_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_CHOICE_EVENT = "gen_ai.choice"

# A span's deployment environment, in Langfuse's order: its OpenTelemetry ingestion files a span
# under the first of these keys set, in the span's attributes and then its resource's, key by
# key. A score sent to Langfuse goes under the same environment, or a filter on it hides the
# score. Found where the resource is known (the exporter, the OTLP decoders), it travels as the
# record's ENVIRONMENT_ATTRIBUTE.
ENVIRONMENT_KEYS = ("langfuse.environment", "deployment.environment.name", "deployment.environment")
# Langfuse keeps 40 characters of an environment (after its "langfuse" prefix): the rest of a
# longer value is not carried into every record of the resource's spans.
MAX_ENVIRONMENT_CHARS = 256
# A resource's values of ENVIRONMENT_KEYS when it sets none (``resource_environment``).
NO_ENVIRONMENT: tuple[Any, ...] = (None,) * len(ENVIRONMENT_KEYS)


def resource_environment(get: Callable[[str], Any]) -> tuple[Any, ...]:
    """A resource's values of ``ENVIRONMENT_KEYS`` (``get``: its attribute of a key, or None),
    for ``environment_of``; ``NO_ENVIRONMENT`` itself when it sets none."""
    values = tuple(get(key) for key in ENVIRONMENT_KEYS)
    return values if any(v is not None for v in values) else NO_ENVIRONMENT


def _set(value: Any) -> bool:
    """Whether Langfuse (JavaScript) takes ``value`` as set: a list or a mapping is, even empty;
    NaN is not."""
    if isinstance(value, list | tuple | dict | bytes):
        return True
    return bool(value) and value == value


def environment_of(attributes: Mapping[str, Any], resource: Sequence[Any]) -> str | None:
    """A span's environment from its ``attributes`` and its resource's values of
    ``ENVIRONMENT_KEYS`` (``resource``, in that order): the first value set decides, as Langfuse
    reads it (one that is not text leaves the span in Langfuse's default: None)."""
    if resource is NO_ENVIRONMENT:  # the common case, on the exporter's hot path: three lookups
        first, second, third = ENVIRONMENT_KEYS
        if first not in attributes and second not in attributes and third not in attributes:
            return None
    for key, of_resource in zip(ENVIRONMENT_KEYS, resource, strict=True):
        for value in (attributes.get(key), of_resource):
            if _set(value):
                return value[:MAX_ENVIRONMENT_CHARS] if isinstance(value, str) else None
    return None


# Every span attribute the readers of this module look at: exact keys, then key families.
# The exporter ships only these to the worker (``is_read_attribute``), so a reader that starts
# reading another key must list it here too, or the worker would never see it
# (tests/tracing/test_span_record.py reads each producer's traces both ways and compares).
READ_ATTRIBUTES = frozenset(
    {
        # span kind
        "mastra.span.type",
        "openinference.span.kind",
        "gen_ai.operation.name",
        "traceloop.span.kind",
        "llm.request.type",
        # messages
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.prompt",
        "gen_ai.completion",
        "input",
        "output",
        "input.value",
        "output.value",
        *(f"mastra.{kind}.{side}" for kind in _MASTRA_KINDS for side in ("input", "output")),
        # tools
        "gen_ai.tool.name",
        "tool.name",
        "gen_ai.tool.call.id",
        "tool_call.id",
        "toolCallId",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.input",
        "tool.parameters",
        "gen_ai.tool.call.result",
        "gen_ai.tool.output",
        "traceloop.entity.name",
        "traceloop.entity.input",
        "traceloop.entity.output",
        # identity
        "gen_ai.agent.name",
        "agent.name",
        "gen_ai.agent.id",
        "agent.id",
        "gen_ai.conversation.id",
        "session.id",
        "threadId",
        "gen_ai.response.model",
        "gen_ai.request.model",
        "llm.model_name",
        "llm.response.model_name",
        # the loop guard (tracing._markers.ROLE_ATTRIBUTE): judge spans, read over records
        "tracescore.role",
        # where the trace ran (``environment_of``)
        *ENVIRONMENT_KEYS,
        ENVIRONMENT_ATTRIBUTE,
    }
)
READ_ATTRIBUTE_PREFIXES = (
    "llm.input_messages.",  # OpenInference lists
    "llm.output_messages.",
    "gen_ai.prompt.",  # OpenLLMetry's flat lists, before its GenAI messages
    "gen_ai.completion.",
)
# The span events the readers look at (every attribute of theirs is read: message payloads).
READ_EVENTS = frozenset({_OP_DETAILS_EVENT, *_LEGACY_MESSAGE_EVENTS, _CHOICE_EVENT})


def is_read_attribute(key: str) -> bool:
    """Whether some reader of this module may look at span attribute ``key``."""
    return key in READ_ATTRIBUTES or key.startswith(READ_ATTRIBUTE_PREFIXES)


def span_kind(span: SpanView) -> SpanKind:
    if not span.kind:
        span.kind = classify(span.name, span.attributes)
    return span.kind  # type: ignore[return-value]


def classify(name: str, attrs: Mapping[str, Any]) -> SpanKind:
    """A span's kind from its name and attributes alone (cheap: a few dict lookups)."""
    mastra = attrs.get("mastra.span.type")
    if isinstance(mastra, str):
        return _MASTRA_KINDS.get(mastra, "other")
    oi = attrs.get("openinference.span.kind")
    if isinstance(oi, str):
        return _OI_KINDS.get(oi.upper(), "other")
    op = attrs.get("gen_ai.operation.name")
    if isinstance(op, str):
        if op in _GENAI_AGENT_OPS:
            return "agent"
        if op in _GENAI_LLM_OPS:
            return "llm"
        if op in _GENAI_TOOL_OPS:
            return "tool"
        return "other"
    traceloop = attrs.get("traceloop.span.kind")
    if isinstance(traceloop, str):
        return _TRACELOOP_KINDS.get(traceloop, "other")
    request = attrs.get("llm.request.type")
    if isinstance(request, str):
        return "llm" if request in _TRACELOOP_LLM_REQUESTS else "other"
    if isinstance(name, str) and name.startswith("invoke_agent"):  # the SDK takes any name
        return "agent"
    return "other"


def _fail(span: SpanView, attribute: str, exc: MessageShapeError) -> TraceReadError:
    return TraceReadError(exc.reason, str(exc), span_name=span.name, span_id=span.span_id, attribute=attribute)


def _read_attr(
    span: SpanView, attrs: Mapping[str, Any], key: str, parse: Callable[[Any], list[Msg]]
) -> list[Msg] | None:
    value = attrs.get(key)
    if value is None or value == "":
        return None
    try:
        return parse(value)
    except MessageShapeError as exc:
        raise _fail(span, key, exc) from None


def _details_attrs(span: SpanView) -> list[Mapping[str, Any]]:
    return [e.attributes for e in span.events if e.name == _OP_DETAILS_EVENT]


# --- OpenInference flattened lists ------------------------------------------------------

# An index of up to 9 digits: a key with a longer one (no list is that long) is not read.
_OI_RE = re.compile(r"^(\d{1,9})\.message\.(.+)$")
_OI_TC_RE = re.compile(r"^tool_calls\.(\d{1,9})\.tool_call\.(.+)$")
_OI_CONTENTS_RE = re.compile(r"^contents\.(\d{1,9})\.message_content\.(.+)$")


def _by_index(
    items: Iterable[tuple[str, Any]], pattern: re.Pattern[str], prefix: str = ""
) -> dict[int, dict[str, Any]]:
    """The values of keys ``prefix`` + what ``pattern`` matches (its groups: an index, the rest),
    grouped by index: a flattened list's items, each as its own dict."""
    grouped: dict[int, dict[str, Any]] = {}
    plen = len(prefix)
    for key, value in items:
        if key.startswith(prefix) and (m := pattern.match(key[plen:])) is not None:
            grouped.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return grouped


def _message_at(span: SpanView, raw: dict[str, Any], where: str) -> Msg:
    """One message put together from flattened attributes (``where``: their common prefix); a
    bad one is a ``TraceReadError`` there, at its ``.role`` when that was what was wrong."""
    try:
        return parse_message(raw)
    except MessageShapeError as exc:
        raise _fail(span, where + (".role" if exc.reason == "unknown_role" else ""), exc) from None


def _oi_messages(span: SpanView, prefix: str) -> list[Msg] | None:
    grouped = _by_index(span.attributes.items(), _OI_RE, prefix)
    if not grouped:
        return None
    out: list[Msg] = []
    for index in sorted(grouped):
        fields = grouped[index]
        msg: dict[str, Any] = {"role": fields.get("role")}
        for sub, value in fields.items():
            if sub in ("content", "name", "tool_call_id"):
                msg[sub] = value
            elif sub == "function_call_name":
                msg.setdefault("function_call", {})["name"] = value
            elif sub == "function_call_arguments_json":
                msg.setdefault("function_call", {})["arguments"] = value
        tool_calls = _by_index(fields.items(), _OI_TC_RE)
        if tool_calls:
            msg["tool_calls"] = [
                {
                    "id": tc.get("id"),
                    "function": {"name": tc.get("function.name"), "arguments": tc.get("function.arguments")},
                }
                for _, tc in sorted(tool_calls.items())
            ]
        contents = _by_index(fields.items(), _OI_CONTENTS_RE)
        if contents and "content" not in msg:
            msg["content"] = [
                {"type": c.get("type", "text"), **{k: v for k, v in c.items() if k != "type"}}
                for _, c in sorted(contents.items())
            ]
        # Every problem was put on .message.role, its content's and tool calls' too.
        out.append(_message_at(span, msg, f"{prefix}{index}.message"))
    return out


# --- OpenLLMetry's flat lists (gen_ai.prompt.<i>.* / gen_ai.completion.<i>.*) ---------------

# What Traceloop's instrumentations wrote before the GenAI message attributes (OpenAI up to
# 0.54, Anthropic up to 0.53; read from their spans in runs against tests/fakellm): per message
# ``role``, ``content`` (text; a list of content blocks as its JSON), ``tool_call_id``, and
# ``tool_calls.<j>.{id,name,arguments}``; the legacy completions API's prompt as ``user``.
_FLAT_RE = re.compile(r"^(\d{1,9})\.(.+)$")
_FLAT_TC_RE = re.compile(r"^tool_calls\.(\d{1,9})\.(id|name|arguments)$")


def _content_blocks(content: Any) -> list[Any] | None:
    """A message's content list written as JSON text (OpenAI's multimodal parts, Anthropic's
    blocks), or None: text that only looks like JSON stays the text it was."""
    if not isinstance(content, str) or not content.startswith("[{"):
        return None
    try:
        blocks = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if isinstance(blocks, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in blocks):
        return blocks
    return None


def _flat_messages(span: SpanView, prefix: str, role: str) -> list[Msg] | None:
    grouped = _by_index(span.attributes.items(), _FLAT_RE, prefix)
    if not grouped:
        return None
    out: list[Msg] = []
    for index in sorted(grouped):
        fields = grouped[index]
        content = fields.get("content", fields.get("user"))
        blocks = _content_blocks(content)
        msg: dict[str, Any] = {"role": fields.get("role") or role, "content": content if blocks is None else blocks}
        if "tool_call_id" in fields:
            msg["tool_call_id"] = fields["tool_call_id"]
        calls = _by_index(fields.items(), _FLAT_TC_RE)
        # Anthropic's 0.49-0.53 wrote a tool_use block both in the content and as tool_calls.
        if calls and not any(b.get("type") == "tool_use" for b in blocks or ()):
            msg["tool_calls"] = [
                {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
                for _, c in sorted(calls.items())
            ]
        out.append(_message_at(span, msg, f"{prefix}{index}"))
    return out


# --- older GenAI per-message events -------------------------------------------------------


def _event_body(attrs: Mapping[str, Any], body: Any) -> dict[str, Any]:
    if isinstance(body, Mapping):
        return dict(body)
    content = attrs.get("gen_ai.event.content")
    if isinstance(content, str):
        loaded = json.loads(content)
        if isinstance(loaded, Mapping):
            return dict(loaded)
    out = {k: v for k, v in attrs.items() if not k.startswith("gen_ai.") and k != "event.name"}
    for key in ("tool_calls", "message"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


def _legacy_events(span: SpanView) -> tuple[list[Msg] | None, list[Msg] | None]:
    inputs: list[Msg] = []
    choices: list[tuple[int, Msg]] = []
    for event in span.events:
        role = _LEGACY_MESSAGE_EVENTS.get(event.name)
        if role is None and event.name != _CHOICE_EVENT:
            continue
        try:
            try:
                body = _event_body(event.attributes, event.body)
            except (ValueError, RecursionError) as exc:
                raise MessageShapeError("bad_json", f"event payload is not valid JSON ({json_error(exc)})") from None
            if role is not None:
                raw = {
                    "role": body.get("role") or role,
                    "content": body.get("content"),
                    "tool_calls": body.get("tool_calls"),
                    "tool_call_id": body.get("id") or body.get("tool_call_id"),
                }
                inputs.append(parse_message(raw))
            else:
                message = body.get("message") or {}
                if not isinstance(message, Mapping):
                    raise MessageShapeError(
                        "bad_message", f"gen_ai.choice 'message' is {shape_of(message)}, expected an object"
                    )
                raw = {
                    "role": message.get("role") or "assistant",
                    "content": message.get("content"),
                    "tool_calls": message.get("tool_calls"),
                }
                index = body.get("index", len(choices))
                choices.append((index if isinstance(index, int) else len(choices), parse_message(raw)))
        except MessageShapeError as exc:
            raise TraceReadError(
                exc.reason,
                str(exc),
                span_name=span.name,
                span_id=span.span_id,
                attribute=f"event {event.name}",
            ) from None
    # Only the first choice is the answer the application went on with.
    output = [sorted(choices, key=lambda c: c[0])[0][1]] if choices else None
    return (inputs or None), output


# --- input.value / output.value and Mastra's own input/output ------------------------------


def _value_messages(value: Any, role: str) -> list[Msg]:
    """``input.value`` / ``output.value`` / Mastra input-output: text or JSON (the span's values
    as shipped: bytes are text by now, see ``SpanView``)."""
    data = decode_json_text(value)
    if isinstance(data, str):
        return [Msg(role, [TextPart(data)])] if data else []
    if isinstance(data, Mapping):
        if isinstance(data.get("messages"), list | tuple):
            return parse_messages(data["messages"], default_role=role)
        choices = data.get("choices")  # an OpenAI chat completion (OpenInference output.value)
        if isinstance(choices, list | tuple) and choices and isinstance(choices[0], Mapping):
            return [parse_message(choices[0].get("message"), default_role=role)]
        if "role" in data:
            return [parse_message(data)]
        text = data.get("text")
        if isinstance(text, str):  # Mastra agent/model output: {text, toolCalls?, reasoning?}
            msg = Msg(role, [TextPart(text)] if text else [])
            tool_calls = data.get("toolCalls")
            for tc in tool_calls if isinstance(tool_calls, list | tuple) else []:
                if isinstance(tc, Mapping):
                    payload = tc.get("payload", tc)
                    if not isinstance(payload, Mapping):
                        payload = tc
                    msg.parts.append(
                        ToolCall(
                            str_or_none(payload.get("toolCallId")),
                            str(payload.get("toolName", "")),
                            decode_json_text(payload.get("args", payload.get("input"))),
                        )
                    )
            return [msg]
    if isinstance(data, list | tuple) and all(
        isinstance(m, str) or (isinstance(m, Mapping) and "role" in m) for m in data
    ):
        return parse_messages(data, default_role=role)
    # JSON that is no message shape: the literal text is what the span received or returned.
    return [Msg(role, [TextPart(value if isinstance(value, str) else json.dumps(value))])]


def _value(span: SpanView, keys: tuple[str, ...], role: str) -> list[Msg] | None:
    for key in keys:
        value = span.attr(key)
        if value is None or value == "":
            continue
        try:
            return _value_messages(value, role)
        except MessageShapeError as exc:
            raise _fail(span, key, exc) from None
    return None


def _mastra_keys(span: SpanView, side: str) -> tuple[str, ...]:
    kind = span.attr("mastra.span.type")
    if not isinstance(kind, str):
        return ()
    if side == "input":
        return (f"mastra.{kind}.input", "gen_ai.prompt", "input")
    return (f"mastra.{kind}.output", "gen_ai.completion", "output")


def read_input(span: SpanView) -> list[Msg] | None:
    """The messages the span received, or None when it recorded none."""
    for attrs in (span.attributes, *_details_attrs(span)):
        found = _read_attr(span, attrs, "gen_ai.input.messages", parse_messages)
        if found is not None:
            return found
    found = _oi_messages(span, "llm.input_messages.")
    if found is None and "llm.request.type" in span.attributes:  # OpenLLMetry's own mark: no scan else
        found = _flat_messages(span, "gen_ai.prompt.", "user")
    if found is not None:
        return found
    legacy, _ = _legacy_events(span)
    if legacy is not None:
        return legacy
    keys = (*_mastra_keys(span, "input"), "input.value")
    return _value(span, keys, "user")


def read_output(span: SpanView) -> list[Msg] | None:
    """The messages the span produced, or None when it recorded none."""
    for attrs in (span.attributes, *_details_attrs(span)):
        found = _read_attr(span, attrs, "gen_ai.output.messages", parse_messages)
        if found is not None:
            return found
    found = _oi_messages(span, "llm.output_messages.")
    if found is None and "llm.request.type" in span.attributes:
        # Only the first choice is the answer the application went on with.
        found = _flat_messages(span, "gen_ai.completion.", "assistant")
        found = found[:1] if found is not None else None
    if found is not None:
        return found
    _, legacy = _legacy_events(span)
    if legacy is not None:
        return legacy
    keys = (*_mastra_keys(span, "output"), "output.value")
    return _value(span, keys, "assistant")


def read_system(span: SpanView) -> list[Msg]:
    for attrs in (span.attributes, *_details_attrs(span)):
        found = _read_attr(span, attrs, "gen_ai.system_instructions", parse_system)
        if found is not None:
            return found
    return []


@dataclass(slots=True)
class ToolSpan:
    span: SpanView
    call_id: str | None
    name: str | None
    result: Any
    has_result: bool

    def as_result(self) -> ToolResult:
        return ToolResult(self.call_id, self.name, self.result)

    @property
    def args(self) -> Any:
        """The arguments as the tool span recorded them (read only when no model call has them)."""
        for key in ("gen_ai.tool.call.arguments", "gen_ai.tool.input", "input.value", "input", "tool.parameters"):
            if key in self.span.attributes:
                return decode_json_text(self.span.attributes[key])
        if "traceloop.entity.input" in self.span.attributes:  # {"args": [...], "kwargs": {...}}
            return decode_json_text(self.span.attributes["traceloop.entity.input"])
        return None


def read_tool(span: SpanView) -> ToolSpan:
    """A tool execution span: its call id, tool name and result (arguments: ``ToolSpan.args``)."""
    # traceloop.entity.name: the function of a Traceloop @tool span that carries no gen_ai.tool.name.
    name = span.str_attr("gen_ai.tool.name", "tool.name", "traceloop.entity.name")
    if name is None and span.name.startswith("execute_tool "):
        name = span.name[len("execute_tool ") :]
    call_id = span.str_attr("gen_ai.tool.call.id", "tool_call.id", "toolCallId")
    result: Any = None
    has_result = False
    for key in ("gen_ai.tool.call.result", "gen_ai.tool.output", "output.value", "output"):
        if key in span.attributes:
            result, has_result = decode_json_text(span.attributes[key]), True
            break
    else:
        if "traceloop.entity.output" in span.attributes:
            result, has_result = _json_or_text(span.attributes["traceloop.entity.output"]), True
    return ToolSpan(span, call_id, name, result, has_result)


def _json_or_text(value: Any) -> Any:
    # Traceloop writes a tool's return value as JSON, a string too ('"shipped"'): that string is
    # the result. Cut at OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT it is no JSON: kept as text.
    if isinstance(value, str) and value.startswith('"'):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return decode_json_text(value)


def agent_name(span: SpanView) -> str | None:
    name = span.str_attr("gen_ai.agent.name", "agent.name", "gen_ai.agent.id", "agent.id")
    if name is None and span.name.startswith("invoke_agent "):
        name = span.name[len("invoke_agent ") :]
    return name


def conversation_id(span: SpanView) -> str | None:
    return span.str_attr("gen_ai.conversation.id", "session.id", "threadId")


def model_name(span: SpanView) -> str | None:
    return span.str_attr("gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "llm.response.model_name")
