"""Agent traces for the dashboard servers: the README's sample traces, made fresh per test.

``examples/traces`` holds OTLP JSON made by the real OpenAI instrumentation. ``fresh_traces``
copies some of its lines with new trace and span ids (one server database serves many tests,
and span ids are unique in it), moved in time so they end now (dashboards list recent traces
first) and tagged with a project; ``send_otlp`` posts them to a server's OTLP/HTTP endpoint as
protobuf, as an OTel exporter does. ``run_backfill`` runs the real ``tracescore backfill``
command on the copied files with the integration scorers (tests/integration/phoenix_scorers.py);
``scored`` makes fresh traces and returns them with the score records it wrote.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracing import ScoreRecord

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "traces"
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))
_ID_KEYS = ("traceId", "spanId", "parentSpanId")
# The score the fake LLM's judge answers with (the ``judge_env`` fixture, tests/integration/conftest.py).
JUDGE_SCORE = 0.75


def _example_lines() -> Iterator[str]:
    for path in sorted(EXAMPLES.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            yield from (line for line in f if line.strip())


def _spans(request: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for resource_spans in request["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            yield from scope_spans["spans"]


def fresh_traces(dest: Path, *, lines: int, salt: str, project: str) -> list[dict[str, Any]]:
    """The first ``lines`` OTLP requests of examples/traces, re-identified by ``salt``, ending
    now, in ``project``; written to ``dest/traces.jsonl`` and returned."""
    requests = [json.loads(line) for _, line in zip(range(lines), _example_lines(), strict=False)]

    def new_id(old: str) -> str:
        return hashlib.sha256(f"{salt}:{old}".encode()).hexdigest()[: len(old)]

    last_end = max(int(span["endTimeUnixNano"]) for request in requests for span in _spans(request))
    shift = time.time_ns() - last_end
    for request in requests:
        for resource_spans in request["resourceSpans"]:
            attributes = resource_spans.setdefault("resource", {}).setdefault("attributes", [])
            attributes.append({"key": "openinference.project.name", "value": {"stringValue": project}})
        for span in _spans(request):
            for key in _ID_KEYS:
                if span.get(key):
                    span[key] = new_id(span[key])
            for link in span.get("links", []):
                link["traceId"], link["spanId"] = new_id(link["traceId"]), new_id(link["spanId"])
            for key in ("startTimeUnixNano", "endTimeUnixNano"):
                span[key] = str(int(span[key]) + shift)
            for event in span.get("events", []):
                event["timeUnixNano"] = str(int(event["timeUnixNano"]) + shift)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    return requests


def span_ids(requests: list[dict[str, Any]]) -> set[str]:
    return {span["spanId"] for request in requests for span in _spans(request)}


def to_protobuf(request: Mapping[str, Any]) -> bytes:
    """OTLP JSON (hex ids) → ExportTraceServiceRequest bytes (protobuf's JSON mapping wants base64 ids)."""
    request = json.loads(json.dumps(request))
    for span in _spans(request):
        for key in _ID_KEYS:
            if span.get(key):
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        for link in span.get("links", []):
            for key in ("traceId", "spanId"):
                link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    message = ParseDict(request, ExportTraceServiceRequest())
    return bytes(message.SerializeToString())


def send_otlp(base_url: str, requests: list[dict[str, Any]], headers: Mapping[str, str] | None = None) -> None:
    """POST each request to ``{base_url}/v1/traces`` (OTLP/HTTP protobuf); raises unless 2xx."""
    with httpx.Client(timeout=30) as client:
        for request in requests:
            response = client.post(
                f"{base_url}/v1/traces",
                content=to_protobuf(request),
                headers={"Content-Type": "application/x-protobuf", **(headers or {})},
            )
            response.raise_for_status()


def run_backfill(
    traces_dir: Path, out: Path, env: Mapping[str, str], *options: str, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """``tracescore backfill traces_dir --scorers tests.integration.phoenix_scorers *options --out out``
    in the repo, with ``env`` added to this process's environment; its exit is the caller's to check."""
    return subprocess.run(
        [TRACESCORE, "backfill", str(traces_dir), "--scorers", "tests.integration.phoenix_scorers", *options,
         "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def read_records(out: Path) -> list[ScoreRecord]:
    """The score records of a JSONL file ``tracescore backfill --out`` wrote (fails if there is none)."""
    assert out.exists(), f"backfill wrote no {out.name}"
    return [ScoreRecord.model_validate_json(line) for line in out.read_text().splitlines() if line.strip()]


def backfill_scores(traces_dir: Path, out: Path, env: Mapping[str, str], *options: str) -> list[ScoreRecord]:
    """``run_backfill``'s score records; fails with its output if it wrote none."""
    result = run_backfill(traces_dir, out, env, *options)
    if not out.exists():
        raise AssertionError(f"backfill wrote no scores (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return read_records(out)


def scored(
    tmp_path: Path, judge_env: Mapping[str, str], project: str, *, lines: int, salt: str | None = None
) -> tuple[list[dict[str, Any]], list[ScoreRecord]]:
    """Fresh agent traces in ``project`` (``tmp_path/traces``, re-identified by ``salt``, the
    project by default) and the score records the real backfill command made of them, judged
    through ``judge_env`` (the ``judge_env`` fixture)."""
    traces = fresh_traces(tmp_path / "traces", lines=lines, salt=project if salt is None else salt, project=project)
    records = backfill_scores(tmp_path / "traces", tmp_path / "scores.jsonl", judge_env)
    assert records, "backfill produced no scores"
    assert {r.span_id for r in records} <= span_ids(traces)
    return traces, records
