"""An instrumented agent app, as a user runs one: its traces go to a dashboard and to tracescore.

``python -m tests.integration._agent_app OTLP_TRACES_URL BROKER_URL PROJECT TURNS`` runs TURNS
agent turns on the real ``openai`` SDK against the fake LLM server (``OPENAI_BASE_URL``), traced
by the real OpenTelemetry OpenAI instrumentation. One TracerProvider, two span processors: an
OTLP/HTTP exporter to the dashboard (Phoenix's ``/v1/traces``, project PROJECT) and
``ScoringSpanExporter`` handing each finished agent trace to the workers over BROKER_URL. Prints
one JSON line: ``agents`` (``trace_id``, ``span_id`` of each turn's agent span) and the
exporter's ``stats()``. Its own process because the instrumentation patches ``openai`` globally.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "span_only"

import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tracing import CelerySink, ScoringRule, ScoringSpanExporter

SCORERS = ["answer-length", "judged-helpfulness", "needs-ground-truth", "always-fails"]
QUESTIONS = ["Where is order 42?", "Can I return shoes after 40 days?", "Do you ship to Norway?"]


def main() -> None:
    otlp_url, broker_url, project, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    provider = TracerProvider(
        resource=Resource.create({"service.name": "shop-support", "openinference.project.name": project})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_url)))
    exporter = ScoringSpanExporter([ScoringRule(SCORERS)], CelerySink(broker_url), grace_s=0)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    OpenAIInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]

    client = openai.OpenAI()
    tracer = provider.get_tracer("shop.agent")
    agents = []
    for turn in range(turns):
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "support",
            "gen_ai.conversation.id": f"conv-{turn}",
        }
        with tracer.start_as_current_span("invoke_agent support", attributes=attributes) as span:
            messages = [
                {"role": "system", "content": "You are the support agent of a shop."},
                {"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]},
            ]
            client.chat.completions.create(model="gpt-4o-mini", messages=messages)  # type: ignore[arg-type]
            context = span.get_span_context()
            agents.append({"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"})
    provider.shutdown()  # flushes both processors: the dashboard's spans and the scoring requests
    print(json.dumps({"agents": agents, "exporter": exporter.stats()}))


if __name__ == "__main__":
    main()
