"""Agent-typed runs: Mastra's stored-message shape, rendered as pydantic models.

A message is ``{role, content: {parts: [...]}}``. Parts are text, tool-invocation
(``state``/``tool_call_id``/``tool_name``/``args``/``result``, and ``is_error``/``error_text``
for a call that failed), reasoning, file, step-start, source, and any ``data-*`` part; tool calls
may also come in ``content.tool_invocations``, Mastra's older field, read first when present.
Field names are snake_case; Mastra's camelCase names are accepted too, so a run exported by
Mastra validates unchanged. Wherever text is meant a plain string is accepted: a message's
``content``, a part, or a whole message (a bare string in ``input_messages`` is a user message,
in the output an assistant message).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    Tag,
    TypeAdapter,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema

__all__ = [
    "DataPart",
    "FilePart",
    "Message",
    "MessageContent",
    "Part",
    "ReasoningPart",
    "Role",
    "ScorerRunInputForAgent",
    "ScorerRunOutputForAgent",
    "SourcePart",
    "StepStartPart",
    "TextPart",
    "ToolCallInfo",
    "ToolCalls",
    "ToolInvocation",
    "ToolInvocationPart",
    "extract_tool_calls",
    "get_assistant_message",
    "get_combined_system_prompt",
    "get_reasoning",
    "get_user_message",
]

Role = Literal["user", "assistant", "system", "tool"]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=False, frozen=False)


class TextPart(_Model):
    type: Literal["text"] = "text"
    text: str


# A tool invocation's states that carry its result: the AI SDK's v4 "result" and v5
# "output-available". Any other state is an unfinished call, or "output-error": a call that threw.
_RESULT_STATES = frozenset({"result", "output-available"})


class ToolInvocation(_Model):
    # Mastra stores the AI SDK's states, v4 (partial-call, call, result) and v5 (input-streaming,
    # input-available, output-available, output-error): any string is taken as it is.
    state: str = "call"
    tool_call_id: str
    tool_name: str
    args: Any = None
    result: Any = None
    step: int | None = None
    # A call that failed: state "output-error" with errorText, or isError set by the executor.
    is_error: bool | None = None
    error_text: str | None = None

    @property
    def has_result(self) -> bool:
        return self.state in _RESULT_STATES


class ToolInvocationPart(_Model):
    type: Literal["tool-invocation"] = "tool-invocation"
    tool_invocation: ToolInvocation


class ReasoningPart(_Model):
    type: Literal["reasoning"] = "reasoning"
    reasoning: str = ""
    details: list[dict[str, Any]] = Field(default_factory=list)


class FilePart(_Model):
    type: Literal["file"] = "file"
    mime_type: str
    data: str


class SourcePart(_Model):
    type: Literal["source"] = "source"
    source: dict[str, Any]


class StepStartPart(_Model):
    type: Literal["step-start"] = "step-start"


class DataPart(_Model):
    """A custom ``data-<name>`` part: any payload under ``data``."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(pattern=r"^data-.+")
    data: Any = None


_PART_TAGS = {"text", "tool-invocation", "reasoning", "file", "source", "step-start"}


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(kind, str) and kind.startswith("data-"):
        return "data"
    return kind if kind in _PART_TAGS else "unknown"


Part: TypeAlias = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ToolInvocationPart, Tag("tool-invocation")]
    | Annotated[ReasoningPart, Tag("reasoning")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[SourcePart, Tag("source")]
    | Annotated[StepStartPart, Tag("step-start")]
    | Annotated[DataPart, Tag("data")],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_part",
        custom_error_message=(
            "unknown message part type; expected text, tool-invocation, reasoning, file, source, step-start or data-*"
        ),
    ),
]


class MessageContent(_Model):
    format: int = 2
    parts: list[Part] = Field(default_factory=list)
    content: str | None = None
    # Mastra's older field beside the parts (its own test messages use it; its scorers read it
    # first, the parts when it is absent).
    tool_invocations: list[ToolInvocation] | None = None

    @model_validator(mode="before")
    @classmethod
    def _coerce(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"parts": [{"type": "text", "text": value}]}
        if isinstance(value, dict) and isinstance(value.get("parts"), list):
            parts = [{"type": "text", "text": p} if isinstance(p, str) else p for p in value["parts"]]
            return {**value, "parts": parts}
        if isinstance(value, dict) and "parts" not in value and isinstance(value.get("content"), str):
            return {**value, "parts": [{"type": "text", "text": value["content"]}]}
        return value

    @property
    def text(self) -> str:
        texts = [p.text for p in self.parts if isinstance(p, TextPart)]
        if texts:
            return "\n".join(texts)
        return self.content or ""


class Message(_Model):
    """One stored message; ``.text`` is its text parts joined by newlines."""

    id: str | None = None
    role: Role
    content: MessageContent = Field(default_factory=MessageContent)
    created_at: str | None = None

    @property
    def text(self) -> str:
        return self.content.text

    @property
    def parts(self) -> list[Part]:
        return self.content.parts

    @property
    def tool_invocations(self) -> list[ToolInvocation]:
        """The message's tool calls: ``content.toolInvocations`` when it has any (as Mastra's
        scorers read them), else its tool-invocation parts."""
        if self.content.tool_invocations:
            return list(self.content.tool_invocations)
        return [p.tool_invocation for p in self.content.parts if isinstance(p, ToolInvocationPart)]


def _as_message(value: Any, role: Role) -> Any:
    return {"role": role, "content": value} if isinstance(value, str) else value


class ScorerRunInputForAgent(_Model):
    """What the agent saw: this turn's input, the remembered history and its instructions."""

    input_messages: list[Message] = Field(default_factory=list)
    remembered_messages: list[Message] = Field(default_factory=list)
    system_messages: list[Message] = Field(default_factory=list)
    tagged_system_messages: dict[str, list[Message]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _coerce(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"input_messages": [{"role": "user", "content": value}]}
        if isinstance(value, list):
            return {"input_messages": [_as_message(m, "user") for m in value]}
        if not isinstance(value, dict):
            return value
        out = dict(value)
        for key, alias, role in (
            ("input_messages", "inputMessages", "user"),
            ("remembered_messages", "rememberedMessages", "user"),
            ("system_messages", "systemMessages", "system"),
        ):
            for name in (key, alias):
                if isinstance(out.get(name), list):
                    out[name] = [_as_message(m, role) for m in out[name]]  # type: ignore[arg-type]
        for name in ("tagged_system_messages", "taggedSystemMessages"):
            tagged = out.get(name)
            if isinstance(tagged, dict):
                out[name] = {
                    tag: [_as_message(m, "system") for m in msgs] if isinstance(msgs, list) else msgs
                    for tag, msgs in tagged.items()
                }
        return out


_MESSAGES = TypeAdapter(list[Message])


class ScorerRunOutputForAgent(list[Message]):
    """The agent's response messages: a list, indexable like Mastra's ``run.output[0]``."""

    @classmethod
    def validate(cls, value: Any) -> ScorerRunOutputForAgent:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            value = [{"role": "assistant", "content": value}]
        elif isinstance(value, list):
            value = [_as_message(m, "assistant") for m in value]
        return cls(_MESSAGES.validate_python(value))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: _MESSAGES.dump_python(list(v), mode="json")
            ),
        )

    @property
    def text(self) -> str:
        return "\n".join(m.text for m in self if m.role == "assistant" and m.text)


# --- helpers (Mastra's scorer utils) -----------------------------------------------------


def get_user_message(run_input: ScorerRunInputForAgent | None) -> str | None:
    """Text of the first user message of this turn, or None."""
    if run_input is None:
        return None
    return next((m.text for m in run_input.input_messages if m.role == "user"), None)


def get_assistant_message(run_output: Sequence[Message] | None) -> str | None:
    """Text of the first assistant message of the response, or None."""
    if not run_output:
        return None
    return next((m.text for m in run_output if m.role == "assistant"), None)


def get_reasoning(run_output: Sequence[Message] | None) -> str | None:
    """Reasoning text of the response's assistant messages, or None when there is none."""
    texts = [
        p.reasoning
        for m in run_output or ()
        if m.role == "assistant"
        for p in m.parts
        if isinstance(p, ReasoningPart) and p.reasoning
    ]
    return "\n".join(texts) if texts else None


def get_combined_system_prompt(run_input: ScorerRunInputForAgent | None) -> str:
    """All system instructions, plain then tagged, joined by blank lines."""
    if run_input is None:
        return ""
    messages: Iterable[Message] = [
        *run_input.system_messages,
        *(m for msgs in run_input.tagged_system_messages.values() for m in msgs),
    ]
    return "\n\n".join(m.text for m in messages if m.text)


class ToolCallInfo(BaseModel):
    tool_name: str
    tool_call_id: str
    message_index: int
    invocation_index: int
    args: Any = None
    result: Any = None
    state: str = "call"

    @property
    def has_result(self) -> bool:
        return self.state in _RESULT_STATES


class ToolCalls(BaseModel):
    tools: list[str]
    tool_call_infos: list[ToolCallInfo]


def extract_tool_calls(run_output: Sequence[Message] | None) -> ToolCalls:
    """Every tool invocation of the response, in call order."""
    infos: list[ToolCallInfo] = []
    for mi, message in enumerate(run_output or ()):
        for ii, inv in enumerate(message.tool_invocations):
            infos.append(
                ToolCallInfo(
                    tool_name=inv.tool_name,
                    tool_call_id=inv.tool_call_id,
                    message_index=mi,
                    invocation_index=ii,
                    args=inv.args,
                    result=inv.result,
                    state=inv.state,
                )
            )
    return ToolCalls(tools=[i.tool_name for i in infos], tool_call_infos=infos)
