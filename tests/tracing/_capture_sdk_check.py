"""ReadableSpan → SpanRecord on whatever opentelemetry-sdk is importable: the fast path (private
fields) and the public API must give the same records. Run in-process on the installed (newest)
SDK and, by tests/tracing/test_capture_sdk.py, in a subprocess on the oldest allowed one.

``python -m tests.tracing._capture_sdk_check`` prints the SDK version, whether the fast path is
on, and the records (without ids and times, which differ per run) as JSON.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

import tracing._sdk as sdk
from tracing._records import span_record
from tracing._rules import ScoringRule
from tracing._run import SpanRecord
from tracing.capture._buffer import BufferLimits, TraceBuffer
from tracing.capture._tally import Tally


def make_spans() -> list[ReadableSpan]:
    """An agent trace the SDK itself built: attributes, events, kinds, an error status."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-app"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my.app")
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}])
    with (
        tracer.start_as_current_span(
            "invoke_agent a",
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": "invoke_agent", "http.route": "/x"},
        ),
        tracer.start_as_current_span(
            "chat m", attributes={"gen_ai.operation.name": "chat", "gen_ai.input.messages": messages}
        ) as chat,
    ):
        chat.add_event("gen_ai.user.message", {"content": "Hi?"})
        chat.add_event("exception", {"exception.message": "not read"})
        chat.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def _plain(record: SpanRecord) -> dict[str, Any]:
    out = dataclasses.asdict(record)
    for key in ("trace_id", "span_id", "parent_span_id", "start_time_ns", "end_time_ns"):
        out[key] = out[key] is not None
    out["events"] = [{"name": e["name"], "attributes": e["attributes"]} for e in out["events"]]
    return out


def check() -> dict[str, Any]:
    """Asserts fast path == public API (records, and what the buffer files); returns a summary."""
    spans = make_spans()
    fast_on = sdk.FAST_PATH
    fast = [span_record(s) for s in spans]
    filed_fast = _filed(spans)
    sdk.FAST_PATH = False
    try:
        public = [span_record(s) for s in spans]
        filed_public = _filed(spans)
    finally:
        sdk.FAST_PATH = fast_on
    assert fast == public, (fast, public)
    assert filed_fast == filed_public, (filed_fast, filed_public)
    assert [r.span_id for r in filed_fast] == [r.span_id for r in fast]
    return {
        "sdk": importlib.metadata.version("opentelemetry-sdk"),
        "fast_path": fast_on,
        "records": [_plain(r) for r in fast],
    }


def _filed(spans: list[ReadableSpan]) -> list[SpanRecord]:
    buffer = TraceBuffer([ScoringRule(["s"])], BufferLimits(grace_s=0), Tally())
    for span in spans:
        buffer.add(span, 0.0)
    (trace,) = buffer.poll(0.0).traces
    return trace.spans


if __name__ == "__main__":
    print(json.dumps(check()))
