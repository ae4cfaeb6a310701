"""Build real SDK spans by hand: a tracer whose finished spans are collected in memory."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, Tracer

# Every Recorder a test made: tests/tracing/conftest.py reads their traces a second time from
# shipped span records after each test (the exporter's default path must read the same).
CREATED: list[Recorder] = []


class Recorder:
    """A tracer provider of its own (never the global one) and the spans it finished."""

    def __init__(
        self, service: str = "shop-app", scope: str = "my.app", resource: Mapping[str, Any] | None = None
    ) -> None:
        CREATED.append(self)
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service, **(resource or {})}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer: Tracer = self.provider.get_tracer(scope)

    @contextmanager
    def span(self, name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[Span]:
        with self.tracer.start_as_current_span(name, attributes=_flat(attrs or {})) as span:
            yield span

    def spans(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())


def _flat(attrs: Mapping[str, Any]) -> dict[str, Any]:
    # OTel attributes hold only primitives and lists of them: structured values go as JSON.
    return {k: v if isinstance(v, str | int | float | bool) else json.dumps(v) for k, v in attrs.items()}


def genai_messages(*pairs: tuple[str, str]) -> str:
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": t}]} for r, t in pairs])


def chat_attributes(question: str, answer: str) -> dict[str, str]:
    """A GenAI chat span's attributes: the user's ``question`` in, the assistant's ``answer`` out."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": genai_messages(("user", question)),
        "gen_ai.output.messages": genai_messages(("assistant", answer)),
    }


def agent_trace(rec: Recorder, question: str = "Hi?", answer: str = "Hello.", *, tool: bool = False) -> str:
    """One agent trace (agent → chat [→ tool]); returns its trace id (hex)."""
    with rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}) as root:
        with rec.span(
            "chat m",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": genai_messages(("user", question)),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {"type": "text", "content": answer},
                                *([{"type": "tool_call", "id": "c1", "name": "t", "arguments": {}}] if tool else []),
                            ],
                        }
                    ]
                ),
            },
        ):
            pass
        if tool:
            with rec.span(
                "execute_tool t",
                {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.result": "ok"},
            ):
                pass
    return format(root.get_span_context().trace_id, "032x")


# The three runs of ``three_agent_trace``: (agent name, question), in start order.
THREE_AGENTS = (("planner", "plan it?"), ("researcher", "find it?"), ("writer", "write it?"))


def three_agent_trace(rec: Recorder) -> str:
    """One trace of three agent runs under a workflow span (not an agent): planner, researcher
    (which calls a sub-agent, part of its run) and writer, each asking its own question.
    Returns the trace id (hex)."""
    with rec.span("workflow", {"http.route": "/task"}) as root:
        for name, question in THREE_AGENTS:
            attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            with rec.span(f"invoke_agent {name}", attrs):
                with rec.span(
                    "chat m",
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.input.messages": genai_messages(("user", question)),
                        "gen_ai.output.messages": genai_messages(("assistant", f"{name} answers " * 3)),
                    },
                ):
                    pass
                if name == "researcher":
                    agent_trace(rec, question="sub-question?")  # a sub-agent: the researcher's run
    return format(root.get_span_context().trace_id, "032x")
