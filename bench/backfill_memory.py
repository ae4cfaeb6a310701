"""Peak memory of a backfill whose traces carry big prompts, beside a plain read of the same file.

    .venv/bin/python bench/backfill_memory.py [--traces 60] [--prompt-mb 16] [--before PATH]

Each trace (tests/backfill/_synth.py's, one a line) has its chat span's prompt padded to
``--prompt-mb`` MB: about ``traces x prompt-mb`` of input. Every case is its own process, and
its figure is that process's peak RSS (``ru_maxrss``):

- the baseline: the same lines read and ``json.loads``-ed one at a time, each dropped;
- ``tracescore backfill`` in this process, with the default bounds and with ``--max-open-mb 128``;
- ``tracescore backfill`` sent to a Redis of its own (``--no-wait``, no workers, a high-water mark
  above the batches: nothing waits), on input of the same size in prompts four times smaller
  (a run over the workers' 8 MiB message cap is not sent, and a 16 MB prompt is one).

``--before PATH`` runs the backfill cases on another checkout as well (``git worktree add`` of the
code before a change), alternating with this one. Memory only: no speed figure. Writes
bench/results/backfill_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._redis import RedisServer  # noqa: E402
from tests.backfill._synth import trace_spans  # noqa: E402

_MB = 2**20


def _write(path: Path, traces: int, prompt_mb: float) -> int:
    """``traces`` traces, one a line, each prompt ``prompt_mb`` MB; the file's bytes."""
    pad = "x" * int(prompt_mb * _MB)
    prompt = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q " + pad}]}])
    with path.open("w") as out:
        for i in range(traces):
            children, root = trace_spans(i)
            for attribute in children[0]["attributes"]:
                if attribute["key"] == "gen_ai.input.messages":
                    attribute["value"] = {"stringValue": prompt}
            document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "bench"}, "spans": [*children, root]}]}]}
            out.write(json.dumps(document) + "\n")
    return path.stat().st_size


def _peak_mb(command: list[str], env: dict[str, str], tree: Path) -> float:
    """The peak RSS in MB of one run of ``command`` in ``tree`` (which must succeed)."""
    proc = subprocess.Popen(command, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}: {err.decode()[-2000:]}")
    return usage.ru_maxrss / 1024


_PLAIN = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=60)
    parser.add_argument("--prompt-mb", type=float, default=16.0)
    parser.add_argument("--before", type=Path, default=None, help="another checkout to measure beside this one")
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    tracescore = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())"]
    server = RedisServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="tracescore-bench-memory-") as tmp:
            big, small = Path(tmp) / "big.jsonl", Path(tmp) / "small.jsonl"
            input_mb = _write(big, args.traces, args.prompt_mb) / _MB
            _write(small, 4 * args.traces, args.prompt_mb / 4)
            embedded = {k: v for k, v in os.environ.items() if k != "TRACESCORE_BROKER_URL"}
            scorers = ("--scorers", "bench.backfill_scorers")
            backfill = {
                "in process": [*tracescore, "backfill", str(big), *scorers],
                "in process, --max-open-mb 128": [*tracescore, "backfill", str(big), *scorers, "--max-open-mb", "128"],
                "to Redis, --no-wait": [
                    *tracescore,
                    *("backfill", str(small), *scorers, "--broker", server.url(0)),
                    *("--no-wait", "--high-water", "100000"),
                ],
            }
            peaks: dict[str, dict[str, float]] = {tree: {} for tree in trees}
            baseline = _peak_mb([sys.executable, "-c", _PLAIN, str(big)], embedded, ROOT)
            for name, command in backfill.items():
                for tree, path in trees.items():
                    if name == "in process, --max-open-mb 128" and tree == "before":
                        continue  # (no such option before it)
                    server.client(0).flushdb()
                    peaks[tree][name] = round(_peak_mb(command, embedded, path), 1)
    finally:
        server.close()
    result = {
        "traces": args.traces,
        "prompt_mb": args.prompt_mb,
        "input_mb": round(input_mb, 1),
        "plain_json_loads_peak_rss_mb": round(baseline, 1),
        "peak_rss_mb": peaks,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work while measured)",
        "python": platform.python_version(),
    }
    print(f"input: {args.traces} traces, {args.prompt_mb:g} MB prompts, {input_mb:,.0f} MB")
    print(f"{'plain json.loads of each line':<34} {baseline:8,.0f} MB")
    for name in backfill:
        figures = "  ".join(f"{tree} {peaks[tree][name]:8,.0f} MB" for tree in trees if name in peaks[tree])
        print(f"{name:<34} {figures}")
    out = ROOT / "bench" / "results" / "backfill_memory.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
