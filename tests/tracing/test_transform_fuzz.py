"""trace_to_run on arbitrary attribute values: a run or a TraceReadError, never another exception."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tracing._spans import Recorder
from tracing import TraceReadError, trace_to_run

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_keys = st.sampled_from(
    [
        "role",
        "parts",
        "type",
        "content",
        "text",
        "id",
        "name",
        "arguments",
        "response",
        "tool_calls",
        "function",
        "toolCallId",
        "toolName",
        "input",
        "output",
        "messages",
        "tag",
        "value",
    ]
)
_json: Any = st.recursive(
    _scalars | st.sampled_from(["user", "assistant", "system", "tool", "text", "tool_call", "tool-call"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=20,
)

_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "content": st.text(max_size=8)}),
    st.fixed_dictionaries({"type": st.just("text"), "content": _scalars}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "content": _scalars}),
    st.fixed_dictionaries(
        {"type": st.just("tool_call"), "id": _scalars, "name": st.text(max_size=5), "arguments": _json}
    ),
    st.fixed_dictionaries({"type": st.just("tool_call_response"), "id": _scalars, "response": _json}),
    st.fixed_dictionaries({"type": st.text(max_size=6)}),
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "assistant", "system", "tool", "developer", "bot"]),
        "parts": st.lists(_part, max_size=3),
    }
)
_messages = st.lists(_message, min_size=1, max_size=4) | st.lists(_message, max_size=4) | _json


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=_messages, out=_messages, system=_json, as_text=st.booleans())
def test_any_message_payload_gives_run_or_named_error(inp: Any, out: Any, system: Any, as_text: bool) -> None:
    """Whatever the producer wrote, the outcome is a run or a TraceReadError with a reason."""
    rec = Recorder()
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(inp if as_text else [inp]),
        "gen_ai.output.messages": json.dumps(out),
        "gen_ai.system_instructions": json.dumps(system),
    }
    with rec.span("chat m", attrs):
        pass
    outcome: Any
    try:
        outcome = trace_to_run(rec.spans())
    except TraceReadError as exc:
        outcome = exc
    if isinstance(outcome, TraceReadError):
        assert outcome.reason
        assert outcome.span_name == "chat m"
    else:
        assert outcome.identity.span_name == "chat m"
