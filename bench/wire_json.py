"""The queue's JSON (tracing/queue/_json.py) beside what it replaced, on the same data in one run.

- encode: ``request_json`` (orjson) beside pydantic's ``model_dump_json`` of the same request
  (``_pydantic_json``, its fallback), one request per trace: the exporter's agent traces
  (bench/exporter.py's app: 6 spans, 6.4 KB) and backfill's synthetic traces;
- parse: the guard's ``parse_json`` beside ``json.loads`` of one task message body of each.

CPU per trace, least and median of interleaved rounds, and the median of each round's ratio.

    .venv/bin/python bench/wire_json.py [--rounds 21]

Writes bench/results/wire_json.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

from bench.exporter import RecordingExporter, emit  # noqa: E402
from bench.stages import _lines  # noqa: E402
from tests.backfill._synth import write_otlp_files  # noqa: E402
from tracing._records import span_record  # noqa: E402
from tracing.otlp import decode_otlp_records_line  # noqa: E402
from tracing.queue import ScoreBatch, ScoreRequest, parse_json, request_json, spans_request, task_message  # noqa: E402
from tracing.queue._contract import _pydantic_json  # noqa: E402
from tracing.read import loop_guard, plan_runs  # noqa: E402
from tracing.sources._assemble import TraceAssembler  # noqa: E402
from tracing.sources._base import Position  # noqa: E402


def _exporter_requests(n: int) -> list[ScoreRequest]:
    recorder = RecordingExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-app"}))
    provider.add_span_processor(SimpleSpanProcessor(recorder))
    emit(provider, n)
    provider.shutdown()
    spans = recorder.spans
    out = []
    for i in range(0, len(spans), 6):
        records = [span_record(s) for s in spans[i : i + 6]]
        out.append(spans_request(records, [records[-1].span_id], ["helpfulness"], time.time()))
    return out


def _backfill_requests(n: int) -> list[ScoreRequest]:
    with tempfile.TemporaryDirectory(prefix="tracescore-bench-") as tmp:
        paths = write_otlp_files(Path(tmp), n, files=1, traces_per_line=20)
        assembler = TraceAssembler()
        traces = []
        for i, line in enumerate(_lines(paths)):
            traces.extend(assembler.add(decode_otlp_records_line(line), Position(0, i)))
        traces.extend(assembler.finish())
    out = []
    for trace in traces:
        judge_ids = loop_guard(trace.spans)
        if judge_ids is None:  # tracescore's own traffic: not scored (none in these traces)
            continue
        plans = plan_runs(trace.spans, exclude_under=judge_ids)
        targets = [t.span_id for t, _ in plans]
        out.append(spans_request(trace.spans, targets, ["a", "b"], time.time(), source="backfill"))
    return out


def _cpu(fn: Callable[[], Any]) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def _paired(old: list[float], new: list[float]) -> float:
    return round(statistics.median(b / a for a, b in zip(old, new, strict=True)), 3)


def _compare(name: str, requests: list[ScoreRequest], rounds: int) -> dict[str, Any]:
    assert all(request_json(r) == _pydantic_json(r) for r in requests), "request_json differs from pydantic's text"
    body = task_message(ScoreBatch.model_construct(batch_id="bench", requests=requests), "bench").body
    assert json.dumps(parse_json(body)) == json.dumps(json.loads(body))
    n = len(requests)
    variants: dict[str, Callable[[], Any]] = {
        "encode_pydantic": lambda: [_pydantic_json(r) for r in requests],
        "encode_orjson": lambda: [request_json(r) for r in requests],
        "parse_json_loads": lambda: json.loads(body),
        "parse_orjson": lambda: parse_json(body),
    }
    us: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            us[key].append(_cpu(fn) / n * 1e6)
    result: dict[str, Any] = {
        "traces": n,
        "body_bytes_per_trace": round(len(body) / n),
        "us_per_trace": {k: {"min": round(min(v), 2), "median": round(statistics.median(v), 2)} for k, v in us.items()},
        # Each round's new / old: load that drifts between rounds cancels out.
        "encode_ratio": _paired(us["encode_pydantic"], us["encode_orjson"]),
        "parse_ratio": _paired(us["parse_json_loads"], us["parse_orjson"]),
    }
    med = result["us_per_trace"]
    print(
        f"{name:9}: encode {med['encode_orjson']['median']:6.2f} us/trace beside pydantic's "
        f"{med['encode_pydantic']['median']:6.2f} (ratio {result['encode_ratio']}); parse "
        f"{med['parse_orjson']['median']:6.2f} beside json.loads {med['parse_json_loads']['median']:6.2f} "
        f"(ratio {result['parse_ratio']}); {result['body_bytes_per_trace']:,} body bytes a trace"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--traces", type=int, default=500)
    args = parser.parse_args()
    out = {
        "rounds": args.rounds,
        "exporter": _compare("exporter", _exporter_requests(args.traces), args.rounds),
        "backfill": _compare("backfill", _backfill_requests(args.traces), args.rounds),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} (shared with other work while measured)",
    }
    path = ROOT / "bench" / "results" / "wire_json.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
