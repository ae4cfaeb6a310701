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
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._redis import RedisServer
from tests.fakellm import FakeLLMServer, Reply
from tests.integration._servers import ROOT, Server, phoenix_server
from tests.integration._traces import TRACESCORE, backfill_scores, fresh_traces, send_otlp, span_ids
from tests.integration.phoenix_scorers import FAILURE_MESSAGE
from tests.worker._workers import WorkerProcess, wait_for
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, Delivery, PhoenixSink, Refused, Retry
from worker.store import RedisOutbox

JUDGE_SCORE = 0.75


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


def drain(sink: PhoenixSink, records: Sequence[ScoreRecord], timeout_s: float = 60.0) -> list[list[Delivery]]:
    """Deliver until every record is Delivered (a stand-in for the outbox's drainer); returns
    every round's outcomes. A Refused record fails the test."""
    rounds: list[list[Delivery]] = []
    pending = list(records)
    deadline = time.monotonic() + timeout_s
    while pending:
        outcomes = sink.deliver(pending)
        assert len(outcomes) == len(pending)
        rounds.append(outcomes)
        refused = [o for o in outcomes if isinstance(o, Refused)]
        assert not refused, refused
        pending = [r for r, o in zip(pending, outcomes, strict=True) if not isinstance(o, Delivered)]
        if pending:
            assert time.monotonic() < deadline, f"{len(pending)} records still not delivered: {outcomes[:3]}"
            time.sleep(0.2)
    return rounds


def scored(
    tmp_path: Path, fake_llm_server: FakeLLMServer, project: str, *, lines: int
) -> tuple[list[Any], list[ScoreRecord]]:
    """Fresh agent traces in ``project`` and their score records from the real backfill command."""
    fake_llm_server.reset()
    fake_llm_server.rule(Reply.json({"score": JUDGE_SCORE}))
    traces = fresh_traces(tmp_path / "traces", lines=lines, salt=project, project=project)
    env = {"OPENAI_BASE_URL": fake_llm_server.openai_base_url, "OPENAI_API_KEY": "sk-fakellm-test"}
    records = backfill_scores(tmp_path / "traces", tmp_path / "scores.jsonl", env)
    fake_llm_server.reset()
    assert records, "backfill produced no scores"
    assert {r.span_id for r in records} <= span_ids(traces)
    return traces, records


def by_identifier(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    index = {a["identifier"]: a for a in found}
    assert len(index) == len(found), "an identifier appears twice"
    return index


def test_scores_arrive_on_their_spans_as_annotations(
    phoenix: Server, project: str, tmp_path: Path, fake_llm_server: FakeLLMServer
) -> None:
    """Every score is one annotation on its span: name, LLM/CODE kind, score, label, explanation, metadata."""
    traces, records = scored(tmp_path, fake_llm_server, project, lines=2)
    kinds = {r.scorer_id for r in records}
    assert kinds == {"answer-length", "judged-helpfulness", "needs-ground-truth", "always-fails"}
    send_otlp(phoenix.url, traces)
    sink = PhoenixSink(phoenix.url)
    try:
        drain(sink, records)
    finally:
        sink.close()

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
    phoenix: Server, project: str, tmp_path: Path, fake_llm_server: FakeLLMServer
) -> None:
    """Re-sending the same scores (and a changed one) keeps one annotation per score; the change shows."""
    traces, records = scored(tmp_path, fake_llm_server, project, lines=1)
    send_otlp(phoenix.url, traces)
    spans = {r.span_id for r in records}
    with_score = next(r for r in records if r.score is not None)
    sink = PhoenixSink(phoenix.url)
    try:
        drain(sink, records)
        first = by_identifier(phoenix_annotations(phoenix, project, spans))
        assert len(first) == len(records)

        assert all(isinstance(o, Delivered) for o in sink.deliver(records))
        changed = with_score.model_copy(update={"score": 0.123, "reason": "re-scored"})
        assert sink.deliver([changed, changed]) == [Delivered(), Delivered()]
    finally:
        sink.close()

    again = by_identifier(phoenix_annotations(phoenix, project, spans))
    assert again.keys() == first.keys()
    key = f"tracescore:{with_score.score_id}"
    assert again[key]["id"] == first[key]["id"]
    assert again[key]["result"]["score"] == pytest.approx(0.123)
    assert again[key]["result"]["explanation"] == "re-scored"


def test_spans_not_ingested_yet_are_retried_then_delivered(
    phoenix: Server, project: str, tmp_path: Path, fake_llm_server: FakeLLMServer
) -> None:
    """Scores of spans Phoenix has not seen are Retry (named); the rest of the batch is Delivered."""
    traces, records = scored(tmp_path, fake_llm_server, project, lines=2)
    early, late = traces[0], traces[1]
    early_spans = span_ids([early])
    assert any(r.span_id in early_spans for r in records)
    assert any(r.span_id not in early_spans for r in records)

    sink = PhoenixSink(phoenix.url)
    try:
        nothing_yet = sink.deliver(records)
        assert all(isinstance(o, Retry) and "not in Phoenix yet" in o.reason for o in nothing_yet), nothing_yet

        send_otlp(phoenix.url, [early])
        wait_ingested(phoenix, project, early_spans)
        mixed = sink.deliver(records)
        for record, outcome in zip(records, mixed, strict=True):
            if record.span_id in early_spans:
                assert outcome == Delivered()
            else:
                assert isinstance(outcome, Retry)
                assert "not in Phoenix yet" in outcome.reason
                assert outcome.after_s > 0

        send_otlp(phoenix.url, [late])
        drain(sink, records)
    finally:
        sink.close()
    assert len(by_identifier(phoenix_annotations(phoenix, project, {r.span_id for r in records}))) == len(records)


def test_phoenix_down_mid_run_then_back_loses_nothing(
    phoenix: Server, project: str, tmp_path: Path, fake_llm_server: FakeLLMServer
) -> None:
    """Phoenix killed mid-run: Retry while down; restarted on the same database, every score
    arrives and none twice (everything is re-sent, as an outbox that lost its acks would)."""
    traces, records = scored(tmp_path, fake_llm_server, project, lines=3)
    send_otlp(phoenix.url, traces)
    # Phoenix acknowledges OTLP before writing it: a SIGKILL would lose spans it had not written yet.
    wait_ingested(phoenix, project, {r.span_id for r in records})
    half = len(records) // 2
    sink = PhoenixSink(phoenix.url, timeout_s=5.0)
    try:
        drain(sink, records[:half])
        phoenix.stop(kill=True)
        while_down = sink.deliver(records[half:])
        assert all(isinstance(o, Retry) and "unreachable" in o.reason for o in while_down), while_down[:3]

        phoenix.start()
        drain(sink, records)
    finally:
        sink.close()
        if phoenix.proc is None:
            phoenix.start()  # the session's other tests need it
    found = by_identifier(phoenix_annotations(phoenix, project, {r.span_id for r in records}))
    assert set(found) == {f"tracescore:{r.score_id}" for r in records}


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """DB 14 of the session's own Redis, emptied before and after the test."""
    client = redis_server.client(14)
    client.flushdb()
    try:
        yield redis_server.url(14)
    finally:
        client.flushdb()
        client.close()


SCORERS = ("answer-length", "judged-helpfulness", "needs-ground-truth", "always-fails")


def phoenix_worker(
    name: str, phoenix: Server, redis_url: str, tmp_path: Path, llm_env: dict[str, str]
) -> WorkerProcess:
    """A real worker scoring with tests.integration.phoenix_scorers into Phoenix (not waited for)."""
    return WorkerProcess(
        name,
        redis_url,
        tmp_path,
        scores_path=tmp_path / f"{name}-scores.jsonl",
        scorers="tests.integration.phoenix_scorers",
        env={
            **llm_env,
            "TRACESCORE_SINKS": "phoenix",
            "TRACESCORE_PHOENIX_URL": phoenix.url,
            "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2",
            "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "1",
            "TRACESCORE_SINK_MAX_ATTEMPTS": "1000",
        },
    )


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


def sink_counts(outbox: RedisOutbox) -> dict[str, int]:
    counts = outbox.counts().get("phoenix")
    return counts.as_dict() if counts else {}


def assert_live_scores(phoenix: Server, project: str, agents: list[dict[str, str]]) -> None:
    """Exactly one annotation per (agent span, scorer), each of the right kind and result."""
    found = by_identifier(phoenix_annotations(phoenix, project, {a["span_id"] for a in agents}))
    expected_ids = {
        f"tracescore:{score_id_for(a['trace_id'], a['span_id'], scorer, '1')}": (a, scorer)
        for a in agents
        for scorer in SCORERS
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


@pytest.fixture
def llm_env(fake_llm_server: FakeLLMServer) -> Iterator[dict[str, str]]:
    """The fake LLM answering the judge with JUDGE_SCORE (and the app's chat calls with text)."""
    fake_llm_server.reset()
    fake_llm_server.rule(Reply.json({"score": JUDGE_SCORE}), system_contains="You grade a support agent")
    yield {"OPENAI_BASE_URL": fake_llm_server.openai_base_url, "OPENAI_API_KEY": "sk-fakellm-test"}
    fake_llm_server.reset()


def test_live_agent_traces_scored_by_a_worker_land_in_phoenix(
    phoenix: Server, project: str, tmp_path: Path, llm_env: dict[str, str], redis_url: str
) -> None:
    """End to end: an app instrumented with the real OpenAI instrumentation sends its spans to
    Phoenix and, through ScoringSpanExporter and Redis, to a real worker with
    TRACESCORE_SINKS=phoenix; every score becomes one annotation on its agent span (the scores
    may beat the spans to Phoenix: those wait in the outbox), and the outbox counts them delivered."""
    worker = phoenix_worker("phoenix-e2e", phoenix, redis_url, tmp_path, llm_env)
    outbox = RedisOutbox(redis_url)
    try:
        worker.wait_ready()
        agents = run_agent_app(phoenix, redis_url, project, llm_env, turns=3)
        expected = len(agents) * len(SCORERS)
        assert wait_for(lambda: sink_counts(outbox).get("delivered") == expected, timeout=120), (
            sink_counts(outbox),
            worker.text()[-3000:],
        )
        assert sink_counts(outbox)["pending"] == 0
        assert sink_counts(outbox)["failed"] == 0
    finally:
        outbox.close()
        worker.stop()
    assert_live_scores(phoenix, project, agents)


def test_a_worker_keeps_live_scores_through_a_phoenix_outage(
    phoenix: Server, project: str, tmp_path: Path, llm_env: dict[str, str], redis_url: str
) -> None:
    """The app's traces are in Phoenix and queued for scoring; Phoenix is killed; a worker scores
    them: the Phoenix deliveries wait in the outbox (pending, retried, none failed). Phoenix
    restarted on the same database: every score arrives, exactly once."""
    agents = run_agent_app(phoenix, redis_url, project, llm_env, turns=2)
    wait_ingested(phoenix, project, {a["span_id"] for a in agents})
    phoenix.stop(kill=True)
    worker = phoenix_worker("phoenix-outage", phoenix, redis_url, tmp_path, llm_env)
    outbox = RedisOutbox(redis_url)
    expected = len(agents) * len(SCORERS)
    try:
        worker.wait_ready()
        assert wait_for(lambda: sink_counts(outbox).get("retried", 0) >= expected, timeout=120), (
            sink_counts(outbox),
            worker.text()[-3000:],
        )
        assert sink_counts(outbox)["pending"] == expected
        assert sink_counts(outbox)["delivered"] == 0
        assert sink_counts(outbox)["failed"] == 0

        phoenix.start()
        assert wait_for(lambda: sink_counts(outbox).get("delivered") == expected, timeout=120), (
            sink_counts(outbox),
            worker.text()[-3000:],
        )
        assert sink_counts(outbox)["pending"] == 0
        assert sink_counts(outbox)["failed"] == 0
    finally:
        outbox.close()
        worker.stop()
        if phoenix.proc is None:
            phoenix.start()  # the session's other tests need it
    assert_live_scores(phoenix, project, agents)


def test_with_auth_on_the_api_key_setting_is_sent_and_a_wrong_key_is_refused_by_name(
    project: str, tmp_path: Path, fake_llm_server: FakeLLMServer
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
    fake_llm_server.reset()
    fake_llm_server.rule(Reply.json({"score": JUDGE_SCORE}))
    try:
        traces = fresh_traces(tmp_path / "traces", lines=1, salt=project, project=project)
        send_otlp(server.url, traces, headers=auth)

        def backfill(key: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [TRACESCORE, "backfill", str(tmp_path / "traces"), "--scorers", "tests.integration.phoenix_scorers",
                 "--sink", "phoenix", "--phoenix-url", server.url, "--out", str(tmp_path / f"{key[:8]}.jsonl")],
                cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
                env={**os.environ, "PYTHONPATH": str(ROOT), "TRACESCORE_PHOENIX_API_KEY": key,
                     "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2", "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "1",
                     "OPENAI_BASE_URL": fake_llm_server.openai_base_url, "OPENAI_API_KEY": "sk-fakellm-test"},
            )  # fmt: skip

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
        records = [
            ScoreRecord.model_validate_json(line)
            for line in (tmp_path / f"{admin_key[:8]}.jsonl").read_text().splitlines()
            if line.strip()
        ]
        spans = {r.span_id for r in records}
        found = by_identifier(phoenix_annotations(server, project, spans, headers=auth))
        assert set(found) == {f"tracescore:{r.score_id}" for r in records}
    finally:
        fake_llm_server.reset()
        server.close()
