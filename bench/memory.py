"""Worker memory benchmark: a worker pod's processes, idle and flooded, as deploy/ runs them.

    .venv/bin/python bench/memory.py [--traces 4000] [--context-kb 8] [--latency-ms 200]

Starts one ``tracescore worker`` with the arguments of deploy/k8s/worker-deployment.yaml (prefork,
``--concurrency 2``) and the settings of deploy/k8s/configmap.yaml (run and model concurrency,
time limits, ``TRACESCORE_MEMORY_LIMIT_MB``, metrics on, the OTLP score sink) pointed at loopback:
its own redis-server (free port, password; tests/_redis.py), the fake judge (tests/fakellm,
``--latency-ms`` before each answer) and an OTLP receiver (tests/_otlp_receiver.py). The scorers
are examples.scorers with the LLM-judge built-ins on (TRACESCORE_JUDGE_MODEL), so each trace gets
four judge scorers beside five code scorers. The ConfigMap's shared rate limit (500 requests a minute)
is left out: with it a flood takes half an hour; runs waiting for the limit are in flight all the
same, and how many are is bounded by the batch (one a process, prefetch 1) and
TRACESCORE_RUN_CONCURRENCY, not by the limit.

Samples every process of the worker (the consumer and its pool children; a child replaced for
passing the memory limit shows as another pid) every ``--interval`` seconds: RSS, and PSS (pages
shared since the fork counted once, as the pod's memory cgroup charges them), per process and
summed at each instant. Three phases: idle (the baseline, the worker started and settled, nothing
queued), load (``tracescore backfill`` of ``--traces`` synthetic agent traces from
tests/backfill/_synth.py, their system prompt padded to ``--context-kb`` KiB as a retrieval
context is, from the start of the backfill to its last score), after (idle again: what the
processes keep). Prints the figures; writes bench/results/memory.json. Takes no speed figure:
the machine is shared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._otlp_receiver import OtlpReceiver  # noqa: E402
from tests._redis import RedisServer, free_port  # noqa: E402
from tests.backfill._synth import write_otlp_files  # noqa: E402
from tests.fakellm import start_process  # noqa: E402

DEPLOY = ROOT / "deploy" / "k8s"
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))
MODEL = "openai/gpt-4o-mini"  # the ConfigMap's judge model, answered by the fake judge


def deploy_worker() -> tuple[list[str], dict[str, str]]:
    """The worker container's arguments and the ConfigMap's settings, as deploy/ has them."""
    deployment = yaml.safe_load((DEPLOY / "worker-deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())["data"]
    return list(container["args"]), {k: str(v) for k, v in config.items()}


def pad_context(paths: list[Path], context_kb: int) -> None:
    """Give every span's system message ``context_kb`` KiB of text (a retrieval context), as the
    prompts of a real agent carry: the synthetic traces' own messages are a sentence each."""
    if context_kb <= 0:
        return
    filler = ("Retrieved passage: the weather service reports hourly observations per city. " * 200)[
        : context_kb * 1024
    ]
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = [json.loads(line) for line in handle]
        for document in lines:
            for resource in document["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    for span in scope["spans"]:
                        for attribute in span.get("attributes", []):
                            if attribute["key"] == "gen_ai.input.messages":
                                messages = json.loads(attribute["value"]["stringValue"])
                                for message in messages:
                                    if message["role"] == "system":
                                        message["parts"][0]["content"] += " " + filler
                                attribute["value"]["stringValue"] = json.dumps(messages)
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            for document in lines:
                handle.write(json.dumps(document, separators=(",", ":")) + "\n")


class Sampler:
    """RSS and PSS of a process and its descendants, sampled on a thread, per phase."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.phase = "start"
        self.phases: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # (never started when the worker did not start)
            self._thread.join(10)

    def _processes(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            figures: dict[int, tuple[float, float]] = {}
            for process in self._processes():
                try:
                    full = process.memory_full_info()
                except psutil.Error:
                    continue  # gone (a child replaced) since it was listed
                figures[process.pid] = (full.rss / 2**20, full.pss / 2**20)
            if not figures:
                continue
            phase = self.phases.setdefault(
                self.phase, {"samples": 0, "processes": {}, "peak_total_rss_mb": 0.0, "peak_total_pss_mb": 0.0}
            )
            phase["samples"] += 1
            for pid, (rss, pss) in figures.items():
                role = "consumer" if pid == self.root.pid else f"child {pid}"
                seen = phase["processes"].setdefault(role, {"peak_rss_mb": 0.0, "peak_pss_mb": 0.0, "last_rss_mb": 0.0})
                seen["peak_rss_mb"] = max(seen["peak_rss_mb"], rss)
                seen["peak_pss_mb"] = max(seen["peak_pss_mb"], pss)
                seen["last_rss_mb"] = rss
            phase["peak_total_rss_mb"] = max(phase["peak_total_rss_mb"], sum(r for r, _ in figures.values()))
            phase["peak_total_pss_mb"] = max(phase["peak_total_pss_mb"], sum(p for _, p in figures.values()))

    def rounded(self) -> dict[str, Any]:
        def r(value: Any) -> Any:
            if isinstance(value, float):
                return round(value, 1)
            if isinstance(value, dict):
                return {k: r(v) for k, v in value.items()}
            return value

        return {name: r(phase) for name, phase in self.phases.items() if name != "start"}


def wait_for(condition: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=4000)
    parser.add_argument("--context-kb", type=int, default=8, help="KiB of system-prompt context a span")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the fake judge's delay a call")
    parser.add_argument("--batch-size", type=int, default=500, help="runs a message (backfill --batch-size)")
    parser.add_argument("--idle-s", type=float, default=15.0, help="seconds of each idle phase")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    args = parser.parse_args()

    server = RedisServer()
    server.start()
    receiver = OtlpReceiver().start()
    fake, judge_url = start_process(args.latency_ms)
    try:
        _run(args, server, receiver, judge_url)
    finally:
        fake.kill()
        fake.wait()
        receiver.stop()
        server.close()


def _run(args: argparse.Namespace, server: RedisServer, receiver: OtlpReceiver, judge_url: str) -> None:
    worker_args, config = deploy_worker()
    broker = server.url(0)
    with tempfile.TemporaryDirectory(prefix="tracescore-bench-memory-") as tmp:
        env = {
            **os.environ,
            **config,
            "TRACESCORE_BROKER_URL": broker,
            "TRACESCORE_RATE_LIMITS": "{}",
            "TRACESCORE_JUDGE_MODEL": MODEL,
            "OPENAI_BASE_URL": f"{judge_url}/v1",
            "OPENAI_API_KEY": "sk-fakellm-bench",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "TRACESCORE_METRICS_PORT": str(free_port()),
            "TRACESCORE_PROBE_DIR": str(Path(tmp) / "probe"),
            "PYTHONPATH": str(ROOT),
        }
        data = Path(tmp) / "traces"
        paths = write_otlp_files(data, args.traces, files=4, traces_per_line=20)
        pad_context(paths, args.context_kb)
        size_mb = sum(p.stat().st_size for p in paths) / 2**20
        print(f"wrote {args.traces:,} traces ({args.context_kb} KiB of context a span), {size_mb:.1f} MiB gzip")

        log_path = Path(tmp) / "worker.log"
        log = log_path.open("wb")
        worker = subprocess.Popen(
            [TRACESCORE, *worker_args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        sampler = Sampler(worker.pid, args.interval)
        try:
            ready = wait_for(
                lambda: (
                    subprocess.run(
                        [TRACESCORE, "probe", "ready"], cwd=ROOT, env=env, capture_output=True, check=False
                    ).returncode
                    == 0
                    or worker.poll() is not None
                ),
                90,
                1.0,
            )
            if not ready or worker.poll() is not None:
                raise SystemExit(f"the worker did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(5)  # the pool's children finish their start-up (imports, the scorers)
            sampler.start()
            sampler.phase = "idle"
            time.sleep(args.idle_s)

            sampler.phase = "load"
            started = time.perf_counter()
            backfill = subprocess.run(
                [TRACESCORE, "backfill", str(data), "--scorers", config["TRACESCORE_SCORERS"],
                 "--batch-size", str(args.batch_size), "--json"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False,
            )  # fmt: skip
            elapsed = time.perf_counter() - started
            if backfill.returncode != 0:
                sys.stderr.write(backfill.stderr[-3000:])
                raise SystemExit(f"backfill failed with exit code {backfill.returncode}")
            summary = json.loads(backfill.stdout.strip().splitlines()[-1])

            sampler.phase = "after"
            time.sleep(args.idle_s)
        finally:
            sampler.stop()
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
            log.close()
        replaced = log_path.read_text(errors="replace").count("worker_memory_limit_exiting")

    phases = sampler.rounded()
    result = {
        "traces": args.traces,
        "context_kb_a_span": args.context_kb,
        "input_gzip_mb": round(size_mb, 1),
        "judge_latency_ms": args.latency_ms,
        "batch_size": args.batch_size,
        "worker_args": worker_args,
        "memory_limit_mb": int(config.get("TRACESCORE_MEMORY_LIMIT_MB", "0")),
        "run_concurrency": int(config["TRACESCORE_RUN_CONCURRENCY"]),
        "model_concurrency": int(config["TRACESCORE_MODEL_CONCURRENCY"]),
        "scorers": summary["scorers"],
        "scored": summary["scored"],
        "failed": summary["failed"],
        "load_s": round(elapsed, 1),
        "otlp_requests_received": receiver.requests,
        "processes_replaced_for_memory": replaced,
        "phases": phases,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work while measured)",
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=2))
    for name in ("idle", "load", "after"):
        phase = phases.get(name, {})
        each = ", ".join(
            f"{role} {p['peak_rss_mb']} MB RSS / {p['peak_pss_mb']} PSS"
            for role, p in phase.get("processes", {}).items()
        )
        print(
            f"{name}: pod total peak {phase.get('peak_total_rss_mb')} MB RSS, {phase.get('peak_total_pss_mb')} MB PSS "
            f"({each})"
        )
    print(
        f"{summary['scored']:,} scores ({summary['failed']:,} failed) in {elapsed:.0f} s; "
        f"processes replaced for passing {result['memory_limit_mb']} MB: {replaced}"
    )
    out = ROOT / "bench" / "results" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
