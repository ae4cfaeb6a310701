"""PhoenixSink against a real Phoenix server (arize-phoenix from .venv-servers/phoenix).

Agent traces made by the real OpenAI instrumentation (examples/traces, re-identified per test)
go to Phoenix over OTLP/HTTP; the real ``tracescore backfill`` scores them; the sink writes the
scores; Phoenix's own REST API must then return them as span annotations on the right spans.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration._drain import (
    CHANGED_SCORE,
    STORED_REASON,
    deliver_across_outage,
    deliver_early_then_late,
    drain_and_close,
    redeliver,
    running_worker,
    wait_delivered,
    wait_held,
)
from tests.integration._servers import ROOT, Server, phoenix_server
from tests.integration._traces import JUDGE_SCORE, fresh_traces, read_records, run_backfill, scored, send_otlp, span_ids
from tests.integration.phoenix_scorers import FAILURE_MESSAGE, SCORER_IDS
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, OtlpSink, PhoenixSink, carrier_spans


def phoenix_annotations(
    server: Server, project: str, spans: Iterable[str], headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every span annotation Phoenix holds on ``spans`` (all pages)."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    with httpx.Client(timeout=30, headers=headers) as client:
        while True:
            params: list[tuple[str, str | int | float | bool | None]] = [("span_ids", s) for s in sorted(set(spans))]
            params += [("limit", "1000")] + ([("cursor", cursor)] if cursor else [])
            response = client.get(f"{server.url}/v1/projects/{project}/span_annotations", params=params)
            response.raise_for_status()
            body = response.json()
            found += body["data"]
            cursor = body.get("next_cursor")
            if not cursor:
                return found


def ingested_spans(server: Server, project: str) -> set[str]:
    """The span ids Phoenix has written to ``project`` so far."""
    response = httpx.get(f"{server.url}/v1/projects/{project}/spans", params={"limit": "1000"}, timeout=30)
    if response.status_code == 404:  # the project appears with its first ingested span
        return set()
    response.raise_for_status()
    return {span["context"]["span_id"] for span in response.json()["data"]}


def wait_ingested(server: Server, project: str, spans: set[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not spans <= ingested_spans(server, project):
        assert time.monotonic() < deadline, f"Phoenix did not ingest {len(spans)} spans in {timeout_s}s"
        time.sleep(0.2)


def by_identifier(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    index = {a["identifier"]: a for a in found}
    assert len(index) == len(found), "an identifier appears twice"
    return index


def test_scores_arrive_on_their_spans_as_annotations(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Every score is one annotation on its span: name, LLM/CODE kind, score, label, explanation, metadata."""
    traces, records = scored(tmp_path, judge_env, project, lines=2)
    assert {r.scorer_id for r in records} == set(SCORER_IDS)
    send_otlp(phoenix.url, traces)
    drain_and_close(PhoenixSink(phoenix.url), records)

    found = by_identifier(phoenix_annotations(phoenix, project, {r.span_id for r in records}))
    assert len(found) == len(records)
    for record in records:
        got = found[f"tracescore:{record.score_id}"]
        assert got["span_id"] == record.span_id
        assert got["name"] == record.scorer_id
        assert got["source"] == "API"
        assert got["metadata"]["score_id"] == record.score_id
        assert got["metadata"]["scorer_version"] == "1"
        assert got["metadata"]["source"] == "backfill"
        # (the example traces' resource: deployment.environment.name=demo)
        assert got["metadata"]["environment"] == record.environment == "demo"
        result = got["result"]
        if record.scorer_id == "answer-length":
            assert got["annotator_kind"] == "CODE"
            assert result["score"] == pytest.approx(record.score)
            assert result["explanation"] == record.reason
            assert result["explanation"].endswith(" characters")
        elif record.scorer_id == "judged-helpfulness":
            assert got["annotator_kind"] == "LLM"
            assert result["score"] == pytest.approx(JUDGE_SCORE)
            assert result["explanation"] == f"the judge rated it {JUDGE_SCORE:.2f}"
            assert got["metadata"]["judge_models"] == record.judge_models
        elif record.scorer_id == "needs-ground-truth":
            assert got["annotator_kind"] == "CODE"
            assert result["score"] is None
            assert result["label"] == "not scorable"
            assert "no ground truth to compare with" in result["explanation"]
        else:
            assert result["score"] is None
            assert result["label"] == "error"
            assert result["explanation"].startswith("IndexError")
            assert FAILURE_MESSAGE in result["explanation"]
            assert got["metadata"]["error_type"] == "IndexError"


def test_a_rerun_updates_and_adds_nothing(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Re-sending the same scores (and a changed one) keeps one annotation per score; the change shows."""
    traces, records = scored(tmp_path, judge_env, project, lines=1)
    send_otlp(phoenix.url, traces)
    spans = {r.span_id for r in records}
    with_score, first, again = redeliver(
        PhoenixSink(phoenix.url), records, lambda: by_identifier(phoenix_annotations(phoenix, project, spans))
    )
    key = f"tracescore:{with_score.score_id}"
    assert again[key]["id"] == first[key]["id"]
    assert again[key]["result"]["score"] == pytest.approx(CHANGED_SCORE)
    assert again[key]["result"]["explanation"] == STORED_REASON


def test_spans_not_ingested_yet_are_retried_then_delivered(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Scores of spans Phoenix has not seen are Retry (named); the rest of the batch is Delivered."""
    traces, records = scored(tmp_path, judge_env, project, lines=2)

    def send(batch: list[dict[str, Any]]) -> None:
        send_otlp(phoenix.url, batch)
        wait_ingested(phoenix, project, span_ids(batch))

    deliver_early_then_late(PhoenixSink(phoenix.url), records, traces, send, "not in Phoenix yet")
    assert len(by_identifier(phoenix_annotations(phoenix, project, {r.span_id for r in records}))) == len(records)


def test_the_otlp_sink_reads_phoenixs_answer_to_an_export_as_an_acknowledgement(
    phoenix: Server, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP sink exporting to Phoenix's own /v1/traces (its answer: HTTP 200, an empty
    application/x-protobuf ExportTraceServiceResponse): every score Delivered, and its carrier
    span stored. (The sink counts an answer that is no ExportTraceServiceResponse a Retry: this
    is the real receiver it must not refuse.)"""
    trace = secrets.token_hex(16)
    spans = [secrets.token_hex(8) for _ in range(3)]
    records = [
        ScoreRecord(score_id=score_id_for(trace, span, "otlp-ack", "1"), trace_id=trace, span_id=span,
                    scorer_id="otlp-ack", score=0.5, reason="exported as a span event")
        for span in spans
    ]  # fmt: skip
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"x-project-name={project}")
    sink = OtlpSink(endpoint=f"{phoenix.url}/v1/traces", timeout_s=30)
    try:
        assert sink.deliver(records) == [Delivered()] * len(records)
    finally:
        sink.close()
    wait_ingested(phoenix, project, {f"{span.context.span_id:016x}" for span in carrier_spans(records)})


def test_phoenix_down_mid_run_then_back_loses_nothing(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Phoenix killed mid-run: Retry while down; restarted on the same database, every score
    arrives and none twice (everything is re-sent, as an outbox that lost its acks would)."""
    traces, records = scored(tmp_path, judge_env, project, lines=3)
    send_otlp(phoenix.url, traces)
    # Phoenix acknowledges OTLP before writing it: a SIGKILL would lose spans it had not written yet.
    wait_ingested(phoenix, project, {r.span_id for r in records})
    deliver_across_outage(phoenix, PhoenixSink(phoenix.url, timeout_s=5.0), records, "Phoenix unreachable")
    found = by_identifier(phoenix_annotations(phoenix, project, {r.span_id for r in records}))
    assert set(found) == {f"tracescore:{r.score_id}" for r in records}


def phoenix_env(phoenix: Server, judge_env: dict[str, str]) -> dict[str, str]:
    """A worker's settings to deliver into ``phoenix`` (and judge with the fake LLM)."""
    return {**judge_env, "TRACESCORE_SINKS": "phoenix", "TRACESCORE_PHOENIX_URL": phoenix.url}


def run_agent_app(
    phoenix: Server, redis_url: str, project: str, llm_env: dict[str, str], turns: int
) -> list[dict[str, str]]:
    """tests/integration/_agent_app.py: its spans to Phoenix, its agent traces to the queue."""
    app = subprocess.run(
        [sys.executable, "-m", "tests.integration._agent_app", f"{phoenix.url}/v1/traces", redis_url, project,
         str(turns)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **llm_env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert app.returncode == 0, app.stderr[-3000:]
    ran = json.loads(app.stdout.strip().splitlines()[-1])
    assert ran["exporter"]["runs_sent"] == turns, ran["exporter"]
    agents: list[dict[str, str]] = ran["agents"]
    assert len(agents) == turns
    return agents


def assert_live_scores(phoenix: Server, project: str, agents: list[dict[str, str]]) -> None:
    """Exactly one annotation per (agent span, scorer), each of the right kind and result."""
    found = by_identifier(phoenix_annotations(phoenix, project, {a["span_id"] for a in agents}))
    expected_ids = {
        f"tracescore:{score_id_for(a['trace_id'], a['span_id'], scorer, '1')}": (a, scorer)
        for a in agents
        for scorer in SCORER_IDS
    }
    assert set(found) == set(expected_ids)
    for identifier, (agent, scorer) in expected_ids.items():
        got = found[identifier]
        assert got["span_id"] == agent["span_id"]
        assert got["name"] == scorer
        assert got["metadata"]["source"] == "live"
        assert got["annotator_kind"] == ("LLM" if scorer == "judged-helpfulness" else "CODE")
        if scorer == "judged-helpfulness":
            assert got["result"]["score"] == pytest.approx(JUDGE_SCORE)
        elif scorer == "answer-length":
            assert 0 < got["result"]["score"] <= 1
        elif scorer == "always-fails":
            assert got["result"]["label"] == "error"
        else:
            assert got["result"]["label"] == "not scorable"


def test_live_agent_traces_scored_by_a_worker_land_in_phoenix(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str], redis_url: str
) -> None:
    """End to end: an app instrumented with the real OpenAI instrumentation sends its spans to
    Phoenix and, through ScoringSpanExporter and Redis, to a real worker with
    TRACESCORE_SINKS=phoenix; every score becomes one annotation on its agent span (the scores
    may beat the spans to Phoenix: those wait in the outbox), and the outbox counts them delivered."""
    with running_worker("phoenix-e2e", redis_url, tmp_path, phoenix_env(phoenix, judge_env)) as (worker, outbox):
        agents = run_agent_app(phoenix, redis_url, project, judge_env, turns=3)
        wait_delivered(outbox, "phoenix", len(agents) * len(SCORER_IDS), worker)
    assert_live_scores(phoenix, project, agents)


def test_a_worker_keeps_live_scores_through_a_phoenix_outage(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str], redis_url: str
) -> None:
    """The app's traces are in Phoenix and queued for scoring; Phoenix is killed; a worker scores
    them: the Phoenix deliveries wait in the outbox (pending, retried, none failed). Phoenix
    restarted on the same database: every score arrives, exactly once."""
    agents = run_agent_app(phoenix, redis_url, project, judge_env, turns=2)
    wait_ingested(phoenix, project, {a["span_id"] for a in agents})
    expected = len(agents) * len(SCORER_IDS)
    with phoenix.up_after():
        phoenix.stop(kill=True)
        with running_worker("phoenix-outage", redis_url, tmp_path, phoenix_env(phoenix, judge_env)) as (worker, outbox):
            wait_held(outbox, "phoenix", expected, worker)
            phoenix.start()
            wait_delivered(outbox, "phoenix", expected, worker)
    assert_live_scores(phoenix, project, agents)


def test_with_auth_on_the_api_key_setting_is_sent_and_a_wrong_key_is_refused_by_name(
    project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Phoenix with auth on: ``tracescore backfill --sink phoenix`` with a wrong
    TRACESCORE_PHOENIX_API_KEY exits 4 with the refusal (HTTP 401) and never prints the key;
    with the right key (Phoenix's admin secret, a bearer token like an API key) every score lands."""
    admin_key = "a1" + secrets.token_hex(20)
    server = phoenix_server(
        env={
            "PHOENIX_ENABLE_AUTH": "true",
            "PHOENIX_SECRET": "s1" + secrets.token_hex(20),
            "PHOENIX_ADMIN_SECRET": admin_key,
        }
    ).start()
    auth = {"Authorization": f"Bearer {admin_key}"}
    try:
        traces = fresh_traces(tmp_path / "traces", lines=1, salt=project, project=project)
        send_otlp(server.url, traces, headers=auth)

        def backfill(key: str) -> subprocess.CompletedProcess[str]:
            env = {**judge_env, "TRACESCORE_PHOENIX_API_KEY": key, "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2",
                   "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "1"}  # fmt: skip
            out = tmp_path / f"{key[:8]}.jsonl"
            return run_backfill(tmp_path / "traces", out, env, "--sink", "phoenix", "--phoenix-url", server.url)

        wrong_key = "wrong" + secrets.token_hex(16)
        wrong = backfill(wrong_key)
        output = wrong.stdout + wrong.stderr
        assert wrong.returncode == 4, output[-3000:]
        assert "HTTP 401" in output, output[-3000:]
        assert "check TRACESCORE_PHOENIX_API_KEY" in output, output[-3000:]
        assert wrong_key not in output

        right = backfill(admin_key)
        assert right.returncode == 0, (right.stdout + right.stderr)[-3000:]
        assert admin_key not in right.stdout + right.stderr
        records = read_records(tmp_path / f"{admin_key[:8]}.jsonl")
        spans = {r.span_id for r in records}
        found = by_identifier(phoenix_annotations(server, project, spans, headers=auth))
        assert set(found) == {f"tracescore:{r.score_id}" for r in records}
    finally:
        server.close()
