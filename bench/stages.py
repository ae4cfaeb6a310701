"""Where a backfilled trace's CPU goes, stage by stage, beside a plain parse of the same input.

    .venv/bin/python bench/stages.py [--traces 20000]

bench/backfill.py measures the whole pipeline (backfill + Celery workers + Redis) against a
plain gunzip + ``json.loads`` of the same OTLP lines (issue 11's goal: at most 10x). This one
runs the stages that pipeline cannot skip, in one process with no queue, no Celery and no
Redis, on the same synthetic traces, each timed on its own (CPU, best of three, with the cyclic-GC
settings a worker runs with, one message's objects alive at a time):

- backfill: decode the OTLP lines into span records, assemble traces, loop guard + plan the
  runs, build each trace's request and encode it as it travels (``request_json``);
- worker: decode a message body (the guard with ``parse_json``, Celery's child with kombu's
  ``json.loads``), the guard's depth walk, validate the ``ScoreBatch``, read every run
  (``trace_to_run``), run the scorers (bench/backfill_scorers.py, the same function-only
  scorers), build and encode each score record.

Their sum is the floor of this design in CPython: what is left of the pipeline's figure above
it is the queue (kombu, Celery's prefork hop, Redis round trips, the exactly-once scripts).
Writes bench/results/stages.json.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.backfill_scorers import SCORERS  # noqa: E402
from tests.backfill._synth import write_otlp_files  # noqa: E402
from tracing import ScoreRecord, score_id_for, trace_to_run  # noqa: E402
from tracing.otlp import decode_otlp_records_line  # noqa: E402
from tracing.queue import ScoreBatch, ScoreRequest, parse_json, request_json, spans_request  # noqa: E402
from tracing.read import loop_guard, plan_runs  # noqa: E402
from tracing.sources._assemble import AssembledTrace, TraceAssembler  # noqa: E402
from tracing.sources._base import Position  # noqa: E402
from worker._gc import freeze_startup_objects  # noqa: E402
from worker._guard import MAX_JSON_DEPTH, _too_deep  # noqa: E402

BATCH_RUNS = 500  # runs per message, as bench/backfill.py's --batch-size


def _cpu(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Least CPU seconds of ``repeat`` calls of ``fn`` (the least disturbed on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def _each(fn: Callable[[Any], Any], items: list[Any]) -> None:
    """``fn`` over ``items``, dropping each result: a worker holds one message at a time."""
    for item in items:
        fn(item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=20_000)
    args = parser.parse_args()
    # The cyclic-GC settings a worker runs with (worker/_gc.py); a backfill job uses the same.
    freeze_startup_objects()
    with tempfile.TemporaryDirectory(prefix="tracescore-stages-") as tmp:
        paths = write_otlp_files(Path(tmp) / "traces", args.traces, files=2, traces_per_line=20)
        _measure(paths, args.traces)


def _lines(paths: list[Path]) -> Iterator[bytes]:
    """The input lines as a backfill reads them: streamed from the gzip files."""
    for path in paths:
        with gzip.open(path, "rb") as f:
            yield from f


def _measure(paths: list[Path], n: int) -> None:
    lines = list(_lines(paths))

    def gunzip_and_parse() -> None:
        # As bench/backfill.py's baseline: what any reader of these files pays.
        for line in _lines(paths):
            json.loads(line)

    def gunzip_and_decode() -> None:
        for line in _lines(paths):
            decode_otlp_records_line(line)

    decoded = [decode_otlp_records_line(line) for line in lines]

    def assemble() -> list[AssembledTrace]:
        assembler = TraceAssembler()
        traces: list[AssembledTrace] = []
        for i, spans in enumerate(decoded):
            traces.extend(assembler.add(list(spans), Position(0, i)))
        traces.extend(assembler.finish())
        return traces

    traces = assemble()
    assert len(traces) == n, f"assembled {len(traces)} traces of {n}"
    scorer_ids = [s.id for s in SCORERS]

    def plan_and_encode() -> list[str]:
        now = time.time()
        out = []
        for trace in traces:
            records = trace.spans
            judge_ids = loop_guard(records)
            assert judge_ids is not None
            plans = plan_runs(records, exclude_under=judge_ids)
            request = spans_request(records, [t.span_id for t, _ in plans], scorer_ids, now, source="backfill")
            out.append(request_json(request))
        return out

    encoded = plan_and_encode()
    bodies = [
        f'[[{{"batch_id":"b{i}","requests":[{",".join(encoded[i : i + BATCH_RUNS])}]}}],{{}},{{}}]'.encode()
        for i in range(0, len(encoded), BATCH_RUNS)
    ]
    parsed = [json.loads(body) for body in bodies]
    batches = [ScoreBatch.model_validate(body[0][0]) for body in parsed]
    requests: list[ScoreRequest] = [r for b in batches for r in b.requests]

    def read_runs(keep: list[Any] | None = None) -> None:
        # Timed without keeping every run alive: a worker holds one message's runs at a time.
        for request in requests:
            for span_id, spans in request.run_spans().items():
                run = trace_to_run(spans, span_id)
                if keep is not None:
                    keep.append((request, span_id, run))

    runs: list[Any] = []
    read_runs(runs)

    def score() -> list[Any]:
        results = []
        for request, span_id, run in runs:
            for scorer in SCORERS:
                result = scorer.run_sync(input=run.input, output=run.output, run_id=f"{request.trace_id}:{span_id}")
                results.append((request, span_id, scorer, result))
        return results

    results = score()

    def records() -> None:
        for request, span_id, scorer, result in results:
            ScoreRecord(
                score_id=score_id_for(request.trace_id, span_id, scorer.id, scorer.version),
                trace_id=request.trace_id,
                span_id=span_id,
                span_name="invoke_agent",
                scorer_id=scorer.id,
                scorer_name=scorer.name,
                scorer_version=scorer.version,
                score=result.score,
                reason=result.reason,
                run_id=result.run_id,
                job_id=request.job_id,
                source=request.source,
                enqueued_at=request.enqueued_at,
                scored_at=time.time(),
            ).model_dump_json()

    stages: dict[str, float] = {
        "plain_gunzip_json_loads": _cpu(gunzip_and_parse),
        "backfill_decode_records": _cpu(gunzip_and_decode),
        "backfill_assemble": _cpu(assemble),
        "backfill_plan_and_encode": _cpu(plan_and_encode),
        "worker_body_parse_guard": _cpu(lambda: _each(parse_json, bodies)),
        "worker_body_json_loads_celery": _cpu(lambda: _each(json.loads, bodies)),
        "worker_guard_depth_walk": _cpu(lambda: _each(lambda p: _too_deep(p[0][0], MAX_JSON_DEPTH), parsed)),
        "worker_validate_batch": _cpu(lambda: _each(lambda p: ScoreBatch.model_validate(p[0][0]), parsed)),
        "worker_trace_to_run": _cpu(read_runs),
        "worker_scorers": _cpu(score),
        "worker_score_records": _cpu(records),
    }
    plain = stages["plain_gunzip_json_loads"]
    per_trace_us = {name: round(s * 1e6 / n, 1) for name, s in stages.items()}
    floor = sum(s for name, s in stages.items() if name != "plain_gunzip_json_loads")
    result = {
        "traces": n,
        "runs": len(runs),
        "scores": len(results),
        "cpu_us_per_trace": per_trace_us,
        "ratio_to_plain_parse": {name: round(s / plain, 2) for name, s in stages.items()},
        "floor_us_per_trace": round(floor * 1e6 / n, 1),
        "floor_ratio_to_plain_parse": round(floor / plain, 1),
        "target_ratio": 10,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} (shared with other work while measured)",
    }
    width = max(map(len, stages))
    for name in stages:
        print(f"{name:<{width}}  {per_trace_us[name]:8.1f} us/trace  {stages[name] / plain:6.2f}x plain")
    print(
        f"{'sum of the stages (no queue)':<{width}}  {result['floor_us_per_trace']:8.1f} us/trace"
        f"  {result['floor_ratio_to_plain_parse']:6.1f}x plain (target for the whole pipeline: 10x)"
    )
    out = ROOT / "bench" / "results" / "stages.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
