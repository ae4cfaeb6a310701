"""Building the judge's request for each way of asking for structured output."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

from scorers._errors import ScorerConfigError
from scorers.judge._config import Judge
from scorers.judge._fence import JUDGE_SYSTEM_PREAMBLE
from scorers.judge._model import JudgeMessage, JudgeModel, JudgeRequest
from scorers.judge._schema import OutputSpec

__all__ = [
    "WRAP_KEY",
    "Mode",
    "base_messages",
    "build_request",
    "initial_mode",
    "output_spec",
    "schema_instructions",
    "wrap_schema",
]

# How one attempt asks for the answer: native structured output, the schema in the system
# message, the schema appended to the user message, or free text.
Mode: TypeAlias = Literal["native", "system", "inline", "none"]

WRAP_KEY = "value"
_spec_cache: dict[int, tuple[Any, OutputSpec]] = {}


def output_spec(schema: type[Any] | Mapping[str, Any]) -> OutputSpec:
    """``OutputSpec.of(schema)``, cached by identity (steps pass the same schema every run)."""
    hit = _spec_cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    spec = OutputSpec.of(schema)
    if len(_spec_cache) > 1024:
        _spec_cache.clear()
    _spec_cache[id(schema)] = (schema, spec)
    return spec


def initial_mode(judge: Judge, model: JudgeModel, spec: OutputSpec | None, where: str) -> Mode:
    if spec is None:
        return "none"
    native_ok = bool(getattr(model, "supports_native_structured_output", False))
    setting = judge.json_prompt_injection
    if setting == "auto":
        return "native" if native_ok else "inline"
    if setting is True or setting == "system":
        return "system"
    if setting == "inline":
        return "inline"
    if not native_ok:
        raise ScorerConfigError(
            f"{where}: json_prompt_injection=False asks for native structured output, which "
            f"{model.model_id} does not support; use 'auto', 'system' or 'inline'"
        )
    return "native"


def base_messages(judge: Judge, prompt: str) -> list[JudgeMessage]:
    """The system message (preamble + instructions) and the user prompt."""
    system = JUDGE_SYSTEM_PREAMBLE
    if judge.instructions:
        system = f"{system}\n\n{judge.instructions}"
    return [JudgeMessage("system", system), JudgeMessage("user", prompt)]


def schema_instructions(spec: OutputSpec) -> str:
    shape = "a JSON object" if spec.is_object else "JSON"
    return (
        f"Answer with only {shape} that matches this JSON schema, with no other text:\n"
        f"```json\n{json.dumps(spec.json_schema, separators=(',', ':'))}\n```"
    )


def build_request(judge: Judge, messages: list[JudgeMessage], spec: OutputSpec | None, mode: Mode) -> JudgeRequest:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    schema: dict[str, Any] | None = None
    if spec is not None and mode == "system":
        system = f"{system}\n\n{schema_instructions(spec)}"
    elif spec is not None and mode == "inline":
        users = [i for i, m in enumerate(rest) if m.role == "user"]
        if users:
            last = users[-1]
            rest[last] = JudgeMessage("user", f"{rest[last].content}\n\n{schema_instructions(spec)}")
        else:
            rest.append(JudgeMessage("user", schema_instructions(spec)))
    elif spec is not None and mode == "native":
        schema = spec.json_schema if spec.is_object else wrap_schema(spec.json_schema)
    return JudgeRequest(
        system=system,
        messages=tuple(rest),
        output_schema=schema,
        mode="native" if mode == "native" else "text",
        schema_name=spec.name if spec is not None else "answer",
        max_tokens=judge.max_tokens,
        temperature=judge.temperature,
        timeout_s=float(judge.timeout),
    )


def wrap_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Native output must be an object: a non-object schema goes under ``{"value": ...}``."""
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {WRAP_KEY: inner},
        "required": [WRAP_KEY],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        wrapped["$defs"] = schema["$defs"]
    return wrapped
