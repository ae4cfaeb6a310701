"""Function-only scorer throughput in one process (issue 2's target: >= 10,000 runs/s on one core).

A 4-step function scorer (split words, count overlap, ratio, reason string) runs N times
sequentially with ``run_sync`` and as concurrent ``asyncio.gather`` batches with ``run``.
Prints runs/s and peak RSS; writes bench/results/pipeline.json.

    .venv/bin/python bench/pipeline.py [--runs 20000] [--batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import time
from pathlib import Path

from scorers import Scorer, create_scorer

TARGET_RUNS_PER_S = 10_000


def overlap_scorer() -> Scorer:
    return (
        create_scorer("word-overlap", description="share of input words found in the output")
        .preprocess(lambda run: (run.input.lower().split(), run.output.lower().split()))
        .analyze(lambda results: len(set(results.preprocess_step_result[0]) & set(results.preprocess_step_result[1])))
        .generate_score(
            lambda results: results.analyze_step_result / max(1, len(set(results.preprocess_step_result[0])))
        )
        .generate_reason(lambda results, score: f"{results.analyze_step_result} input words found; score {score:.2f}")
    )


PAIRS = [
    ("what is the capital of france", "the capital of france is paris"),
    ("how do I reset my password", "open settings and choose reset password"),
    ("summarise the quarterly report", "revenue grew while costs stayed flat this quarter"),
    ("which tools did you call", "I called the search tool and the calculator"),
]


def sequential(scorer: Scorer, runs: int) -> float:
    started = time.perf_counter()
    for i in range(runs):
        question, answer = PAIRS[i % len(PAIRS)]
        scorer.run_sync(input=question, output=answer, run_id=str(i))
    return runs / (time.perf_counter() - started)


def batched(scorer: Scorer, runs: int, batch: int) -> float:
    async def main() -> None:
        for start in range(0, runs, batch):
            await asyncio.gather(
                *(
                    scorer.run(input=PAIRS[i % len(PAIRS)][0], output=PAIRS[i % len(PAIRS)][1], run_id=str(i))
                    for i in range(start, min(runs, start + batch))
                )
            )

    started = time.perf_counter()
    asyncio.run(main())
    return runs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):  # the target is per core: pin to one
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    scorer = overlap_scorer()
    sequential(scorer, 500)  # warm-up
    seq = sequential(scorer, args.runs)
    con = batched(scorer, args.runs, args.batch)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "benchmark": "pipeline",
        "runs": args.runs,
        "batch": args.batch,
        "sequential_runs_per_s": round(seq),
        "concurrent_runs_per_s": round(con),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "target_runs_per_s": TARGET_RUNS_PER_S,
        "meets_target": min(seq, con) >= TARGET_RUNS_PER_S,
        "python": platform.python_version(),
        "cpus_used": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    print(f"sequential run_sync:        {seq:>10,.0f} runs/s")
    print(f"concurrent run (batch {args.batch}): {con:>10,.0f} runs/s")
    print(f"peak RSS:                   {peak_rss_mb:>10.1f} MB")
    print(f"target {TARGET_RUNS_PER_S:,} runs/s: {'met' if figures['meets_target'] else 'NOT met'}")
    out = Path(__file__).parent / "results" / "pipeline.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
