"""``tracescore compare`` on two large record files: its CPU and peak memory, beside a plain parse.

    .venv/bin/python bench/compare.py [--records 400000] [--runs 2] [--before PATH]

Writes two files of ``--records`` score records each (two scorers, a judge's reason of about
230 characters, as a backfill's ``--out`` holds them; the new side's scores moved), then times
``tracescore compare OLD NEW`` as a subprocess: user + system CPU and peak RSS (the least of
``--runs``). Beside it in the same run: a plain ``json.loads`` of every line of both files (the
least any reader of them pays) and, with ``--before PATH``, the same command on another
checkout (e.g. a ``git worktree`` of the code before a change), the runs interleaved.
Writes bench/results/compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_REASON = (
    "The answer addresses the question directly, cites the retrieved document and stays on topic; "
    "it is a little verbose in its second paragraph, which repeats the first one's point. "
)
_PLAIN_PARSE = (
    "import json, sys\nfor name in sys.argv[1:]:\n    for line in open(name, 'rb'):\n        json.loads(line)\n"
)


def _write(path: Path, records: int, shift: float, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(records // 2):
            for scorer in ("relevancy", "faithfulness"):
                record = {
                    "score_id": f"{rng.getrandbits(128):032x}",
                    "trace_id": f"{i:032x}",
                    "span_id": f"{i:016x}",
                    "scorer_id": scorer,
                    "scorer_version": "2" if shift else "1",
                    "score": min(1.0, rng.random() + shift),
                    "reason": _REASON,
                    "judge_models": ["openai/gpt-4o-mini"],
                    "judge_calls": 1,
                    "cost_usd": 0.00012,
                    "source": "backfill",
                }
                f.write(json.dumps(record) + "\n")


def _measure(command: list[str], tree: Path) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of one run of ``command`` in ``tree`` (which must succeed)."""
    process = subprocess.Popen(command, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.stderr is not None
    error = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}: {error.strip()}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000, help="records in each file")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--before", type=Path, default=None, help="another checkout to measure beside this one")
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    with tempfile.TemporaryDirectory(prefix="tracescore-bench-compare-") as tmp:
        old, new = Path(tmp) / "old.jsonl", Path(tmp) / "new.jsonl"
        _write(old, args.records, 0.0, seed=1)
        _write(new, args.records, 0.05, seed=2)
        compare = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())", "compare"]
        commands = {
            "plain json.loads of both files": ([sys.executable, "-c", _PLAIN_PARSE, str(old), str(new)], ROOT),
            **{f"tracescore compare ({tree})": ([*compare, str(old), str(new)], path) for tree, path in trees.items()},
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, (command, tree) in commands.items():
                samples[name].append(_measure(command, tree))
        size_mb = (old.stat().st_size + new.stat().st_size) / 2**20
    best = {name: (min(c for c, _ in runs), min(m for _, m in runs)) for name, runs in samples.items()}
    plain_cpu = best["plain json.loads of both files"][0]
    result = {
        "records_per_file": args.records,
        "files_mb": round(size_mb, 1),
        "runs": args.runs,
        "cpu_s": {name: round(cpu, 2) for name, (cpu, _) in best.items()},
        "peak_rss_mb": {name: round(rss, 1) for name, (_, rss) in best.items()},
        "cpu_ratio_to_plain_parse": {name: round(cpu / plain_cpu, 2) for name, (cpu, _) in best.items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work while measured)",
        "python": platform.python_version(),
    }
    width = max(map(len, commands))
    print(f"two files of {args.records:,} records ({size_mb:,.0f} MB); least of {args.runs} runs")
    for name, (cpu, rss) in best.items():
        print(f"{name:<{width}}  {cpu:7.2f} s CPU ({cpu / plain_cpu:4.2f}x plain)  {rss:8.1f} MB peak RSS")
    out = ROOT / "bench" / "results" / "compare.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
