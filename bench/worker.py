"""Worker benchmark: 2 real Celery worker processes on Redis.

A. LLM judge: fake judge with 200 ms latency, 5,000 runs of a one-prompt-step scorer, a shared
   rate limit. Judge calls/s (counted by the fake judge) vs. the limit. Then a paced phase
   (runs arriving at 80 % of the limit) for the time from span end to score event (p50/p99):
   the bench stamps each run's span end when it enqueues it; the score event time is the
   record's ``scored_at``, just before the JSONL writer appends it.
B. Function-only scorer: 50,000 runs through Redis (batches of runs per message): runs/s from
   the first message sent to the last score recorded.

    .venv/bin/python bench/worker.py [--runs-judge 5000] [--runs-fast 50000] [--rpm 6000]

Starts its own redis-server (free port, password) unless TRACESCORE_BENCH_REDIS_URL names one
(whose DB it empties before and after). Writes bench/results/worker.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests._redis import RedisServer  # noqa: E402
from tests.fakellm import start_process  # noqa: E402
from tests.worker._batches import request  # noqa: E402
from tests.worker._workers import WorkerProcess, read_scores, wait_for  # noqa: E402
from tracing import CelerySink  # noqa: E402
from tracing.queue import ScoreBatch  # noqa: E402
from worker._keys import job_key, limiter_granted_key  # noqa: E402

REDIS_URL = os.environ.get("TRACESCORE_BENCH_REDIS_URL", "")  # empty: main() starts a private server


def judge_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_fake/stats", timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def batches(start: int, count: int, per_batch: int, scorer: str, salt: str, job_id: str) -> list[ScoreBatch]:
    out = []
    for first in range(start, start + count, per_batch):
        reqs = [
            request(n, [scorer], salt=salt, job_id=job_id) for n in range(first, min(first + per_batch, start + count))
        ]
        out.append(ScoreBatch(batch_id=f"{salt}-{first}", requests=reqs))
    return out


def stamp(batch: ScoreBatch) -> ScoreBatch:
    """Mark every run's span as ending now (the bench's stand-in for the agent's span end)."""
    now = time.time()
    for req in batch.requests:
        req.enqueued_at = now
    return batch


def progress(client: redis.Redis, job_id: str) -> int:
    raw = client.hmget(job_key(job_id), "scored", "failed")
    return sum(int(v or 0) for v in raw)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_judge(tmp: Path, runs: int, rpm: float, latency_ms: float) -> dict[str, Any]:
    fake, url = start_process(latency_ms)
    scores = tmp / "judge.jsonl"
    env = {
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "sk-fakellm-bench",
        "TRACESCORE_RATE_LIMITS": json.dumps({"openai/fake-judge": {"requests_per_minute": rpm}}),
        "TRACESCORE_MODEL_CONCURRENCY": "128",
    }
    # Threads pool: several messages in flight per process, all on the process's one event loop.
    workers = [
        WorkerProcess(f"judge-{i}", REDIS_URL, tmp, scores_path=scores, env=env, pool="threads", concurrency=8)
        for i in range(2)
    ]
    client = redis.Redis.from_url(REDIS_URL)
    sink = CelerySink(REDIS_URL)
    try:
        for w in workers:
            w.wait_ready()
        # Throughput: everything enqueued at once; the limit is the bottleneck.
        todo = batches(0, runs, 25, "judged", "judge", "bench-judge")
        calls_before = judge_stats(url)["total"]
        started = time.time()
        for b in todo:
            sink.send(stamp(b))
        if not wait_for(
            lambda: progress(client, "bench-judge") >= runs, timeout=runs / (rpm / 60) * 3 + 60, interval=0.2
        ):
            raise RuntimeError(f"judge phase incomplete: {progress(client, 'bench-judge')}/{runs}")
        elapsed = time.time() - started
        stats = judge_stats(url)
        granted = {int(k): int(v) for k, v in client.hgetall(limiter_granted_key("openai/fake-judge")).items()}
        calls = stats["total"] - calls_before
        per_second = [v for k, v in stats["per_second"].items() if started + 2 <= int(k) <= started + elapsed - 2]
        limit_per_s = rpm / 60
        # Latency under a steady load: runs arrive at 80 % of the limit for ~15 s.
        paced_runs = int(limit_per_s * 0.8 * 15)
        paced = batches(runs, paced_runs, 4, "judged", "paced", "bench-paced")
        interval = 4 / (limit_per_s * 0.8)
        t0 = time.time()
        for i, b in enumerate(paced):
            delay = t0 + i * interval - time.time()
            if delay > 0:
                time.sleep(delay)
            sink.send(stamp(b))
        if not wait_for(lambda: progress(client, "bench-paced") >= paced_runs, timeout=120, interval=0.2):
            raise RuntimeError(f"paced phase incomplete: {progress(client, 'bench-paced')}/{paced_runs}")
        latencies = [r["scored_at"] - r["enqueued_at"] for r in read_scores(scores) if r.get("job_id") == "bench-paced"]
        errors: dict[str, int] = {}
        for r in read_scores(scores):
            if r["error_type"]:
                key = f"{r['error_type']}: {(r['error_message'] or '')[:120]}"
                errors[key] = errors.get(key, 0) + 1
        return {
            "runs": runs,
            "judge_latency_ms": latency_ms,
            "limit_per_s": limit_per_s,
            "judge_calls": calls,
            "elapsed_s": round(elapsed, 2),
            "judge_calls_per_s": round(calls / elapsed, 2),
            "steady_calls_per_s_mean": round(statistics.mean(per_second), 2) if per_second else None,
            "steady_calls_per_s_max": max(per_second) if per_second else None,
            "fraction_of_limit": round(calls / elapsed / limit_per_s, 3),
            # Admissions by the shared limiter per second (Redis clock), all workers together.
            "limiter_grants_per_second_series": [granted[k] for k in sorted(granted)],
            "limiter_grants_per_second_max": max(granted.values()) if granted else None,
            # Arrivals at the fake judge per second (its clock): granted calls can arrive late.
            "calls_per_second_series": [
                v for k, v in stats["per_second"].items() if started - 1 <= int(k) <= started + elapsed + 1
            ],
            "paced_runs": paced_runs,
            "paced_arrival_per_s": round(limit_per_s * 0.8, 1),
            "span_end_to_score_p50_s": round(percentile(latencies, 0.5), 3),
            "span_end_to_score_p99_s": round(percentile(latencies, 0.99), 3),
            "error_records": errors,
        }
    finally:
        sink.close()
        for w in workers:
            w.stop()
        fake.kill()
        fake.wait()
        client.close()


def bench_fast(tmp: Path, runs: int, per_batch: int) -> dict[str, Any]:
    scores = tmp / "fast.jsonl"
    workers = [WorkerProcess(f"fast-{i}", REDIS_URL, tmp, scores_path=scores) for i in range(2)]
    client = redis.Redis.from_url(REDIS_URL)
    sink = CelerySink(REDIS_URL)
    try:
        built = time.perf_counter()
        todo = batches(0, runs, per_batch, "length", "fast", "bench-fast")
        payload_bytes = len(todo[0].model_dump_json())
        build_s = time.perf_counter() - built
        for w in workers:
            w.wait_ready()
        started = time.time()
        for b in todo:
            sink.send(b)
        enqueued_s = time.time() - started
        if not wait_for(lambda: progress(client, "bench-fast") >= runs, timeout=600, interval=0.1):
            raise RuntimeError(f"fast phase incomplete: {progress(client, 'bench-fast')}/{runs}")
        elapsed = time.time() - started
        lines = sum(1 for _ in scores.open())
        return {
            "runs": runs,
            "runs_per_message": per_batch,
            "message_bytes": payload_bytes,
            "build_messages_s": round(build_s, 2),
            "enqueue_s": round(enqueued_s, 2),
            "elapsed_s": round(elapsed, 2),
            "runs_per_s": round(runs / elapsed, 1),
            "score_lines_written": lines,
        }
    finally:
        sink.close()
        for w in workers:
            w.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-judge", type=int, default=5000)
    parser.add_argument("--runs-fast", type=int, default=50_000)
    parser.add_argument("--rpm", type=float, default=6000.0, help="judge requests/min limit")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--batch", type=int, default=250, help="runs per message, function-only phase")
    parser.add_argument("--skip-judge", action="store_true")
    parser.add_argument("--skip-fast", action="store_true")
    args = parser.parse_args()
    global REDIS_URL
    server: RedisServer | None = None
    if not REDIS_URL:
        server = RedisServer()
        server.start()
        REDIS_URL = server.url(11)
    try:
        _run(args)
    finally:
        if server is not None:
            server.close()


def _run(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "note": "2 cores shared with other work"}}
    with tempfile.TemporaryDirectory(prefix="tracescore-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            if not args.skip_judge:
                results["judge"] = bench_judge(tmp, args.runs_judge, args.rpm, args.latency_ms)
                print("judge:", json.dumps(results["judge"]), flush=True)
                client.flushdb()
            if not args.skip_fast:
                results["function_only"] = bench_fast(tmp, args.runs_fast, args.batch)
                print("function-only:", json.dumps(results["function_only"]), flush=True)
        finally:
            client.flushdb()
            client.close()
    out = ROOT / "bench" / "results" / "worker.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
