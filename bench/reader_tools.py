"""CPU to read one agent run whose tool spans no recorded model call asked for, by trace size.

An agent span with N LLM steps and N tool spans that match no tool call (the LLM output was
captured without its tool calls): each such tool is placed in the step it ran in. Beside it, the
baseline: the same trace with each tool span matched by its call id (no placement). Placing each
tool by a scan of every step made the first quadratic: on 2026-12-05 the code before (31abeb6)
took 1.99 s at 15,999 spans, 2.11x the matched trace; by bisection, 1.36 s at 31,999, 0.65x.

    .venv/bin/python bench/reader_tools.py [--sizes 2000,8000,32000]

Writes bench/results/reader_tools.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracing import SpanRecord, trace_to_run

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _trace(steps: int, *, matched: bool) -> list[SpanRecord]:
    def record(n: int, name: str, attrs: dict[str, object], parent: str | None, start: int) -> SpanRecord:
        return SpanRecord(TRACE, f"{n:016x}", name, parent, "INTERNAL", start, start + 10, "UNSET", attrs, ())

    question = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q"}]}])
    spans = [record(1, "invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}, None, 1)]
    agent = spans[0].span_id
    for i in range(steps):
        parts: list[dict[str, object]] = [{"type": "text", "content": "x"}]
        if matched:
            parts.append({"type": "tool_call", "id": f"c{i}", "name": f"t{i}", "arguments": "{}"})
        answer = json.dumps([{"role": "assistant", "parts": parts}])
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": question, "gen_ai.output.messages": answer}
        spans.append(record(2 + i, "chat", attrs, agent, 10**12 + 2 * i))
    for i in range(steps):
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": f"t{i}"}
        if matched:
            attrs["gen_ai.tool.call.id"] = f"c{i}"
        spans.append(record(2 + steps + i, f"execute_tool t{i}", attrs, agent, 10**12 + 2 * i + 1))
    return spans


def _cpu(spans: list[SpanRecord]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        trace_to_run(spans)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--sizes", default="2000,8000,32000", help="spans a trace, comma-separated")
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        steps = max(1, (size - 1) // 2)
        unmatched, matched = _cpu(_trace(steps, matched=False)), _cpu(_trace(steps, matched=True))
        rows.append(
            {
                "spans": 2 * steps + 1,
                "unmatched_tools_cpu_s": round(unmatched, 4),
                "matched_tools_cpu_s": round(matched, 4),
                "ratio": round(unmatched / matched, 2) if matched else None,
            }
        )
        print(
            f"{2 * steps + 1:>7,} spans: {unmatched:7.3f} s CPU with unmatched tool spans, "
            f"{matched:7.3f} s matched by call id ({rows[-1]['ratio']}x), best of 3"
        )
    out = Path(__file__).resolve().parent / "results" / "reader_tools.json"
    out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
