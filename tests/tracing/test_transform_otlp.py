"""trace_to_run on spans decoded from OTLP JSON (what a backfill or a receiver reads)."""

from __future__ import annotations

import json

from tests.tracing._spans import genai_messages
from tracing import trace_to_run
from tracing.otlp import decode_otlp_json

TRACE = "0af7651916cd43dd8448eb211c80319c"
INPUT = genai_messages(("system", "Be brief."), ("user", "2+2?"))
OUTPUT = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}])


def _attr(key: str, value: str) -> dict[str, object]:
    return {"key": key, "value": {"stringValue": value}}


def test_otlp_json_agent_trace() -> None:
    """An OTLP JSON document decodes into spans that read like the SDK's own."""
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "shop")]},
                "scopeSpans": [
                    {
                        "scope": {"name": "shop.agent"},
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": "b7ad6b7169203331",
                                "name": "invoke_agent a",
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "9000",
                                "attributes": [
                                    _attr("gen_ai.operation.name", "invoke_agent"),
                                    _attr("gen_ai.agent.name", "a"),
                                ],
                            },
                            {
                                "traceId": TRACE,
                                "spanId": "b7ad6b7169203332",
                                "parentSpanId": "b7ad6b7169203331",
                                "name": "chat m",
                                "startTimeUnixNano": "2000",
                                "endTimeUnixNano": "8000",
                                "attributes": [
                                    _attr("gen_ai.operation.name", "chat"),
                                    _attr("gen_ai.input.messages", INPUT),
                                    _attr("gen_ai.output.messages", OUTPUT),
                                ],
                            },
                        ],
                    }
                ],
            }
        ]
    }
    run = trace_to_run(decode_otlp_json(doc))
    assert run.identity.trace_id == TRACE
    assert run.identity.span_id == "b7ad6b7169203331"
    assert (run.identity.agent_name, run.identity.service_name) == ("a", "shop")
    assert (run.identity.start_time_ns, run.identity.end_time_ns) == (1000, 9000)
    assert run.input.input_messages[0].text == "2+2?"
    assert run.input.system_messages[0].text == "Be brief."
    assert run.output.text == "4"
