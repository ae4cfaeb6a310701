"""A tiny support agent on the real ``openai`` SDK, traced by a real instrumentation.

``python -m tests.tracing._instrumented_app MODE`` (MODE: ``otel-latest``, ``otel-legacy``,
``openinference``) runs one agent turn against the fake LLM server (``OPENAI_BASE_URL``),
then prints one JSON line: the run ``trace_to_run`` read, what ``ScoringSpanExporter``
sent, and the raw span names. Each mode runs in its own process because the
instrumentations patch ``openai`` globally and read their settings once.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MODE = sys.argv[1]
if MODE == "otel-latest":
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "span_only"
elif MODE == "otel-legacy":
    os.environ.pop("OTEL_SEMCONV_STABILITY_OPT_IN", None)
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"

import openai  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from tracing import CallbackSink, ScoreBatch, ScoringRule, ScoringSpanExporter, trace_to_run  # noqa: E402

SYSTEM = "You are the support agent of a shop."
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Hi, I'm Ann."},
    {"role": "assistant", "content": "Hello Ann! How can I help?"},
    {"role": "user", "content": "Where is order 42?"},
]
TOOL_CALL = {"id": "call_42", "type": "function", "function": {"name": "order_status", "arguments": '{"order": 42}'}}


def main() -> None:
    spans_mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-support"}))
    provider.add_span_processor(SimpleSpanProcessor(spans_mem))
    sent: list[ScoreBatch] = []
    exporter = ScoringSpanExporter([ScoringRule(["helpfulness"])], CallbackSink(sent.append), grace_s=0)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    logs_mem = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs_mem))

    if MODE == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor as OIInstrumentor

        OIInstrumentor().instrument(tracer_provider=provider)
        agent_attrs: dict[str, Any] = {
            "openinference.span.kind": "AGENT",
            "agent.name": "support",
            "session.id": "conv-1",
            "input.value": "Where is order 42?",
        }
        tool_attrs: dict[str, Any] = {
            "openinference.span.kind": "TOOL",
            "tool.name": "order_status",
            "tool_call.id": "call_42",
            "input.value": '{"order": 42}',
            "output.value": "shipped",
        }
    else:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logger_provider)
        agent_attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "support",
            "gen_ai.conversation.id": "conv-1",
        }
        tool_attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "order_status",
            "gen_ai.tool.call.id": "call_42",
            "gen_ai.tool.call.arguments": '{"order": 42}',
            "gen_ai.tool.call.result": "shipped",
        }

    client = openai.OpenAI()
    tracer = provider.get_tracer("shop.agent")
    with tracer.start_as_current_span("invoke_agent support", attributes=agent_attrs):
        first = client.chat.completions.create(model="gpt-4o-mini", messages=HISTORY)
        with tracer.start_as_current_span("execute_tool order_status", attributes=tool_attrs):
            pass
        followup = [
            *HISTORY,
            {"role": "assistant", "content": first.choices[0].message.content, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_42", "content": "shipped"},
        ]
        client.chat.completions.create(model="gpt-4o-mini", messages=followup)
    exporter.force_flush(10_000)

    spans = list(spans_mem.get_finished_spans())
    logs = list(logs_mem.get_finished_logs())
    run = trace_to_run(spans, log_records=logs)
    print(
        json.dumps(
            {
                "spans": [
                    {"name": s.name, "scope": s.instrumentation_scope.name if s.instrumentation_scope else ""}
                    for s in spans
                ],
                "log_events": len(logs),
                "run": run.model_dump(mode="json"),
                "sent": [b.model_dump(mode="json") for b in sent],
                "stats": exporter.stats(),
            }
        )
    )
    exporter.shutdown(5000)


if __name__ == "__main__":
    main()
