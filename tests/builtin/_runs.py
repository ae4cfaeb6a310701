"""Builders for agent-typed runs used by the builtin tests."""

from __future__ import annotations

from typing import Any


def call(name: str, result: Any = None, *, state: str = "result", call_id: str | None = None) -> dict[str, Any]:
    """One tool-invocation part."""
    return {
        "type": "tool-invocation",
        "toolInvocation": {
            "state": state,
            "toolCallId": call_id or f"call-{name}",
            "toolName": name,
            "args": {},
            "result": result,
        },
    }


def agent_output(*tool_calls: dict[str, Any], text: str = "") -> list[dict[str, Any]]:
    """An agent response: one assistant message with the tool calls, then one with the text."""
    messages: list[dict[str, Any]] = []
    if tool_calls:
        messages.append({"role": "assistant", "content": {"parts": list(tool_calls)}})
    if text:
        messages.append({"role": "assistant", "content": text})
    return messages
