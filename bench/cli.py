"""CPU of one ``tracescore`` command-line call, above all the probes Kubernetes runs in each worker pod.

    .venv/bin/python bench/cli.py [--runs 7] [--before PATH]

``tracescore probe live|ready`` is an exec probe: a new Python process every 15 s (ready) and
30 s (live) in every worker pod (deploy/k8s/worker-deployment.yaml). Each call is timed as a
subprocess (its user + system CPU, the least of ``--runs``), beside the same run's baselines: a
bare interpreter (``python -c pass``), an import of everything (the Celery app, the scorers, the
exporter and the sinks: what every command loaded before the packages loaded their names on
first use), and with ``--before PATH`` the same commands on another checkout (e.g. a
``git worktree`` of the code before a change; its packages are imported from there), the runs of
the two trees interleaved. The probes run against the files a live worker writes (this process
writes them, as a worker does) and a private redis-server. ``pod_probe_millicores`` is what the
manifest's two probes cost a pod on average: ready / 15 s + live / 30 s. Two backfills show what
a job pays before its first trace: the README's run (300 example traces scored in this process)
and a job of 20 traces sent to the Redis queue without waiting. Writes bench/results/cli.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._redis import RedisServer  # noqa: E402
from tests.backfill._synth import write_otlp_files  # noqa: E402
from worker import _heartbeat  # noqa: E402

READY_PERIOD_S, LIVE_PERIOD_S = 15, 30  # deploy/k8s/worker-deployment.yaml


def _cpu_s(command: list[str], env: dict[str, str], tree: Path) -> float:
    """User + system CPU seconds of one run of ``command`` in ``tree`` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _pod_millicores(cpu_s: dict[str, float]) -> float:
    """The manifest's two probes' average CPU in a pod."""
    ready, live = cpu_s["tracescore probe ready"], cpu_s["tracescore probe live"]
    return round(1000 * (ready / READY_PERIOD_S + live / LIVE_PERIOD_S), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", type=Path, default=None, help="another checkout to measure beside this one")
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    tracescore = [sys.executable, "-c", "from worker.cli import main; raise SystemExit(main())"]
    server = RedisServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="tracescore-probe-") as probe_dir:
            # The files a consuming worker writes: this process stands in for it while measured.
            _heartbeat.set_probe_dir(probe_dir)
            _heartbeat.consumer_started()
            _heartbeat.beat(_heartbeat.loop_file())
            env = {**os.environ, "TRACESCORE_BROKER_URL": server.url(0), "TRACESCORE_PROBE_DIR": probe_dir}
            embedded = {k: v for k, v in env.items() if k != "TRACESCORE_BROKER_URL"}
            traces = write_otlp_files(Path(probe_dir) / "traces", 20, files=1, traces_per_line=20)[0]
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "import of everything": [
                    sys.executable,
                    "-c",
                    "import worker._app, worker.cli._backfill, tracing.sinks, tracing.capture",
                ],
                # An app's start-up with the exporter (its own process: one import, not a command).
                "app: import the exporter": [
                    sys.executable,
                    "-c",
                    "from tracing import CelerySink, ScoringRule, ScoringSpanExporter",
                ],
                "tracescore --version": [*tracescore, "--version"],
                "tracescore probe live": [*tracescore, "probe", "live", "--max-age", "240"],
                "tracescore probe ready": [*tracescore, "probe", "ready", "--timeout", "2"],
                "tracescore status --json": [*tracescore, "status", "--json"],
                "backfill: the README's run": [
                    *tracescore,
                    *("backfill", "examples/traces", "--scorers", "examples.scorers"),
                ],
                "backfill: 20 traces to Redis": [
                    *tracescore,
                    *("backfill", str(traces), "--scorers", "bench.backfill_scorers", "--no-wait", "--json"),
                ],
            }
            envs = {name: embedded if name == "backfill: the README's run" else env for name in commands}
            samples: dict[str, dict[str, list[float]]] = {tree: {name: [] for name in commands} for tree in trees}
            for _ in range(args.runs):
                for name, command in commands.items():
                    for tree, path in trees.items():
                        samples[tree][name].append(_cpu_s(command, envs[name], path))
    finally:
        server.close()
    best = {tree: {name: min(runs) for name, runs in by_name.items()} for tree, by_name in samples.items()}
    result = {
        "runs": args.runs,
        "cpu_s": {tree: {name: round(s, 3) for name, s in by_name.items()} for tree, by_name in best.items()},
        "pod_probe_millicores": {tree: _pod_millicores(by_name) for tree, by_name in best.items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work while measured)",
        "python": platform.python_version(),
    }
    width = max(map(len, commands))
    print(f"{'ms CPU, least of ' + str(args.runs):<{width}}  " + "  ".join(f"{tree:>10}" for tree in trees))
    for name in commands:
        print(f"{name:<{width}}  " + "  ".join(f"{best[tree][name] * 1000:10.0f}" for tree in trees))
    print(
        f"probes per worker pod (ready every {READY_PERIOD_S} s, live every {LIVE_PERIOD_S} s), millicores: "
        + ", ".join(f"{tree} {m}" for tree, m in result["pod_probe_millicores"].items())
    )
    out = ROOT / "bench" / "results" / "cli.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
