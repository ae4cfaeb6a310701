"""Synthetic agent traces as OTLP/JSON Lines, fast enough for 100,000 traces (tests, bench).

Each trace follows the GenAI conventions: an ``invoke_agent`` root, a ``chat`` span with
``gen_ai.input.messages`` / ``gen_ai.output.messages`` and an ``execute_tool`` span. As with a
real exporter, children are written before their root, several traces share a line, and the
last trace of each file has its root in the next file (a trace split across files).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, TextIO

CITIES = ["Paris", "Berlin", "Tokyo", "Lisbon", "Oslo", "Cairo", "Lima", "Toronto"]
BASE_NS = 1_790_000_000_000_000_000  # 2026-09-21


def trace_id(i: int) -> str:
    """Spread over the id space (so sampling by sha256 sees varied ids), never zero."""
    return f"{(i + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % 2**128 or 1:032x}"


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def trace_spans(
    i: int, *, start_ns: int = BASE_NS, step_ns: int = 1_000_000_000
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(children, root) of trace ``i`` as OTLP/JSON span objects; trace ``i`` starts at
    ``start_ns + i * step_ns``."""
    tid = trace_id(i)
    root_id, chat_id, tool_id = f"{i * 3 + 1:016x}", f"{i * 3 + 2:016x}", f"{i * 3 + 3:016x}"
    begin = start_ns + i * step_ns
    city = CITIES[i % len(CITIES)]
    question = f"What's the weather in {city} today?"
    answer = f"It is {10 + i % 20}°C and sunny in {city} today." if i % 5 else "I am not sure, sorry."
    inputs = json.dumps(
        [
            {"role": "system", "parts": [{"type": "text", "content": "Be concise."}]},
            {"role": "user", "parts": [{"type": "text", "content": question}]},
        ]
    )
    outputs = json.dumps(
        [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]
    )
    chat = {
        "traceId": tid,
        "spanId": chat_id,
        "parentSpanId": root_id,
        "name": "chat gpt-4o-mini",
        "kind": 3,
        "startTimeUnixNano": str(begin + 1000),
        "endTimeUnixNano": str(begin + 400_000_000),
        "attributes": [
            _attr("gen_ai.operation.name", "chat"),
            _attr("gen_ai.request.model", "gpt-4o-mini"),
            _attr("gen_ai.provider.name", "openai"),
            _attr("gen_ai.input.messages", inputs),
            _attr("gen_ai.output.messages", outputs),
            _attr("gen_ai.usage.input_tokens", 20),
        ],
        "status": {},
    }
    tool = {
        "traceId": tid,
        "spanId": tool_id,
        "parentSpanId": root_id,
        "name": "execute_tool get_weather",
        "kind": 1,
        "startTimeUnixNano": str(begin + 500_000_000),
        "endTimeUnixNano": str(begin + 600_000_000),
        "attributes": [
            _attr("gen_ai.operation.name", "execute_tool"),
            _attr("gen_ai.tool.name", "get_weather"),
            _attr("gen_ai.tool.call.id", f"call_{i}"),
            _attr("gen_ai.tool.call.arguments", json.dumps({"city": city})),
            _attr("gen_ai.tool.call.result", json.dumps({"temp_c": 10 + i % 20})),
        ],
        "status": {},
    }
    root = {
        "traceId": tid,
        "spanId": root_id,
        "name": "invoke_agent weather-agent",
        "kind": 1,
        "startTimeUnixNano": str(begin),
        "endTimeUnixNano": str(begin + 700_000_000),
        "attributes": [
            _attr("gen_ai.operation.name", "invoke_agent"),
            _attr("gen_ai.agent.name", "weather-agent"),
            _attr("gen_ai.conversation.id", f"conv-{i}"),
        ],
        "status": {},
    }
    return [chat, tool], root


def _line(spans: list[dict[str, Any]]) -> str:
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "synth-agent")]},
                "scopeSpans": [{"scope": {"name": "synth", "version": "1"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"


def write_otlp_files(
    directory: Path,
    n_traces: int,
    *,
    files: int = 3,
    traces_per_line: int = 5,
    compress: bool = True,
    start_ns: int = BASE_NS,
    step_ns: int = 1_000_000_000,
) -> list[Path]:
    """Write ``n_traces`` traces over ``files`` files; returns the paths (sorted)."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-n_traces // files)
    paths: list[Path] = []
    carried: list[dict[str, Any]] = []  # a root span held over into the next file
    for f in range(files):
        path = directory / f"part-{f:03d}.jsonl{'.gz' if compress else ''}"
        paths.append(path)
        opened: TextIO = gzip.open(path, "wt", encoding="utf-8") if compress else path.open("w", encoding="utf-8")  # noqa: SIM115
        with opened as handle:
            pending: list[dict[str, Any]] = list(carried)
            carried = []
            first, last = f * per_file, min(n_traces, (f + 1) * per_file)
            for i in range(first, last):
                children, root = trace_spans(i, start_ns=start_ns, step_ns=step_ns)
                pending.extend(children)
                if i == last - 1 and f < files - 1:
                    carried.append(root)  # this trace's root lands in the next file
                else:
                    pending.append(root)
                if (i - first + 1) % traces_per_line == 0:
                    handle.write(_line(pending))
                    pending = []
            if pending:
                handle.write(_line(pending))
    return paths
