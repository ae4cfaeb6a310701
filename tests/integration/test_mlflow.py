"""MlflowSink against a real MLflow tracking server (mlflow from .venv-servers/mlflow, SQLite).

Agent traces made by the real OpenAI instrumentation (examples/traces, re-identified per test)
go to MLflow over OTLP/HTTP into an experiment of the test's own; the real ``tracescore
backfill`` scores them; the sink writes the scores; MLflow's own REST API must then return them
as feedback assessments on the right traces and spans.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration._drain import (
    CHANGED_SCORE,
    STORED_REASON,
    deliver_across_outage,
    deliver_early_then_late,
    drain,
    drain_and_close,
    redeliver,
    running_worker,
    sink_counts,
    wait_delivered,
    wait_held,
)
from tests.integration._servers import ROOT, Server
from tests.integration._traces import (
    JUDGE_SCORE,
    TRACESCORE,
    backfill_scores,
    fresh_traces,
    read_records,
    run_backfill,
    scored,
    send_otlp,
)
from tests.integration.phoenix_scorers import FAILURE_MESSAGE, SCORER_IDS
from tracing import ScoreRecord
from tracing.sinks import Delivered, MlflowSink, Refused, Retry

API = "/api/3.0/mlflow"
# MLflow's OTLP endpoint files a trace under the experiment this header names (and 422s without it).
EXPERIMENT_HEADER = "x-mlflow-experiment-id"


@pytest.fixture
def experiment(mlflow: Server, project: str) -> str:
    """An MLflow experiment of this test's own; its id."""
    response = httpx.post(f"{mlflow.url}/api/2.0/mlflow/experiments/create", json={"name": project}, timeout=30)
    response.raise_for_status()
    return str(response.json()["experiment_id"])


def get_trace(server: Server, trace_id: str) -> dict[str, Any]:
    """MLflow's trace ``tr-<trace_id>`` with its spans (GET /mlflow/traces/get)."""
    response = httpx.get(f"{server.url}{API}/traces/get", params={"trace_id": f"tr-{trace_id}"}, timeout=30)
    response.raise_for_status()
    trace: dict[str, Any] = response.json()["trace"]
    return trace


def assessments(server: Server, trace_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Every assessment MLflow holds on these traces, by assessment id (an id twice fails)."""
    found: dict[str, dict[str, Any]] = {}
    for trace_id in sorted(set(trace_ids)):
        for assessment in get_trace(server, trace_id)["trace_info"].get("assessments", []):
            assert assessment["assessment_id"] not in found, f"{assessment['assessment_id']} twice"
            found[assessment["assessment_id"]] = assessment
    return found


def assessment_id(record: ScoreRecord) -> str:
    return f"a-{record.score_id[:32]}"


def mlflow_scored(
    tmp_path: Path, judge_env: dict[str, str], project: str, *, lines: int
) -> tuple[list[Any], list[ScoreRecord]]:
    """``scored`` with trace ids of MLflow's own (apart from the other servers' tests)."""
    return scored(tmp_path, judge_env, project, lines=lines, salt=f"mlflow:{project}")


def test_scores_arrive_as_feedback_on_their_traces_and_spans(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Every score is one feedback assessment on tr-<trace id> and its span: name, LLM_JUDGE/CODE
    source, value, rationale, error, metadata."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=2)
    assert {r.scorer_id for r in records} == set(SCORER_IDS)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    drain_and_close(MlflowSink(mlflow.url), records)

    found = assessments(mlflow, {r.trace_id for r in records})
    assert set(found) == {assessment_id(r) for r in records}
    spans_of = {
        trace_id: {base64.b64decode(s["span_id"]).hex() for s in get_trace(mlflow, trace_id)["spans"]}
        for trace_id in {r.trace_id for r in records}
    }
    for record in records:
        got = found[assessment_id(record)]
        assert got["trace_id"] == f"tr-{record.trace_id}"
        assert got["span_id"] == record.span_id
        assert got["span_id"] in spans_of[record.trace_id]
        assert got["assessment_name"] == (record.scorer_name or record.scorer_id)
        assert got["source"]["source_id"] == record.scorer_id
        assert got["metadata"]["score_id"] == record.score_id
        assert got["metadata"]["scorer_version"] == "1"
        assert got["metadata"]["source"] == "backfill"
        # (the example traces' resource: deployment.environment.name=demo)
        assert got["metadata"]["environment"] == record.environment == "demo"
        feedback = got["feedback"]
        if record.scorer_id == "answer-length":
            assert got["source"]["source_type"] == "CODE"
            assert feedback["value"] == pytest.approx(record.score)
            assert got["rationale"] == record.reason
            assert got["rationale"].endswith(" characters")
        elif record.scorer_id == "judged-helpfulness":
            assert got["source"]["source_type"] == "LLM_JUDGE"
            assert feedback["value"] == pytest.approx(JUDGE_SCORE)
            assert got["rationale"] == f"the judge rated it {JUDGE_SCORE:.2f}"
            assert got["metadata"]["judge_models"] == ",".join(record.judge_models)
        elif record.scorer_id == "needs-ground-truth":
            assert got["source"]["source_type"] == "CODE"
            assert feedback.get("value") is None
            assert "error" not in feedback
            assert "no ground truth to compare with" in got["rationale"]
        else:
            assert feedback.get("value") is None
            assert feedback["error"]["error_code"] == "IndexError"
            assert FAILURE_MESSAGE in feedback["error"]["error_message"]


def stamp(text: str) -> datetime:
    """An MLflow time as a datetime: its JSON drops the fraction of a whole second, so strings do not order."""
    return datetime.fromisoformat(text)


def test_a_rerun_updates_and_adds_nothing(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Re-sending the same scores (and a changed one) keeps one assessment per score; the change shows."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=1)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    trace_ids = {r.trace_id for r in records}
    with_score, first, again = redeliver(MlflowSink(mlflow.url), records, lambda: assessments(mlflow, trace_ids))
    key = assessment_id(with_score)
    assert again[key]["feedback"]["value"] == pytest.approx(CHANGED_SCORE)
    assert again[key]["rationale"] == STORED_REASON
    assert again[key]["create_time"] == first[key]["create_time"]
    assert stamp(again[key]["last_update_time"]) > stamp(first[key]["last_update_time"])


def test_a_record_replacing_an_error_leaves_none_of_the_errors_fields(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """A retryable error record (no judge answered: CODE, a failed_step) replaced by its judged
    score: MLflow keeps an assessment's source and merges its metadata on update, so the score
    showed as CODE with the error's failed_step (sink audit). It is made anew, once; a plain
    re-send still only updates."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=1)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    judged = next(r for r in records if r.scorer_id == "judged-helpfulness" and r.score is not None)
    failed = judged.model_copy(
        update={
            "score": None,
            "reason": None,
            "error_type": "JudgeServerError",
            "error_message": "the judge answered HTTP 503",
            "retryable": True,
            "judge_models": [],
            "failed_step": "generate_score",
        }
    )
    sink = MlflowSink(mlflow.url)
    methods: list[str] = []
    sink._client.event_hooks["request"].append(lambda request: methods.append(request.method))
    try:
        drain(sink, [failed])
        before = assessments(mlflow, [judged.trace_id])[assessment_id(judged)]
        assert (before["source"]["source_type"], before["metadata"]["failed_step"]) == ("CODE", "generate_score")
        assert before["feedback"]["error"]["error_code"] == "JudgeServerError"

        methods.clear()
        assert sink.deliver([judged]) == [Delivered()]
        assert methods == ["PATCH", "DELETE", "POST"]
        (after,) = assessments(mlflow, [judged.trace_id]).values()
        assert after["assessment_id"] == assessment_id(judged)
        assert after["source"] == {"source_type": "LLM_JUDGE", "source_id": judged.scorer_id}
        assert "failed_step" not in after["metadata"]
        assert after["metadata"]["judge_models"] == ",".join(judged.judge_models)
        assert after["feedback"] == {"value": pytest.approx(JUDGE_SCORE)}

        methods.clear()
        assert sink.deliver([judged]) == [Delivered()]
        assert methods == ["PATCH"]
    finally:
        sink.close()


def test_a_trace_not_ingested_yet_is_retried_then_delivered(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """Scores of a trace MLflow has not seen are Retry (named, with a hint); the rest of the batch
    is Delivered; once the trace arrives, so do they."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=2)

    def send(batch: list[dict[str, Any]]) -> None:
        send_otlp(mlflow.url, batch, {EXPERIMENT_HEADER: experiment})

    mixed = deliver_early_then_late(MlflowSink(mlflow.url), records, traces, send, "not in MLflow yet")
    for record, outcome in zip(records, mixed, strict=True):
        if isinstance(outcome, Retry):
            assert outcome.reason == f"trace tr-{record.trace_id} not in MLflow yet (HTTP 404)"
    assert set(assessments(mlflow, {r.trace_id for r in records})) == {assessment_id(r) for r in records}


def test_mlflow_down_mid_run_then_back_loses_nothing(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """MLflow killed mid-run: Retry while down (one timeout per batch, not per score); restarted
    on the same SQLite file, every score arrives and none twice (everything is re-sent, as an
    outbox that lost its acks would)."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=3)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    deliver_across_outage(mlflow, MlflowSink(mlflow.url, timeout_s=5.0), records, "MLflow unreachable")
    found = assessments(mlflow, {r.trace_id for r in records})
    assert set(found) == {assessment_id(r) for r in records}
    assert {a["metadata"]["score_id"] for a in found.values()} == {r.score_id for r in records}


def test_refused_writes_carry_mlflows_answer(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """A wrong URL and a trace that never reached this server are Refused with MLflow's own
    answer (named, short, without the token or the score's text); nothing is written."""
    traces, records = mlflow_scored(tmp_path, judge_env, project, lines=1)
    record = next(r for r in records if r.reason)
    token = "tok-do-not-echo-0123456789"

    wrong_url = MlflowSink(f"{mlflow.url}/not-mlflow", token=token)
    try:
        [outcome] = wrong_url.deliver([record])
    finally:
        wrong_url.close()
    assert isinstance(outcome, Refused), outcome
    assert outcome.reason == "no MLflow tracking API at this URL (HTTP 404): check TRACESCORE_MLFLOW_URL"
    assert "Not Found" in outcome.detail
    assert token not in outcome.detail

    # Scored an hour ago and still not in MLflow: the agent exported it elsewhere (or nowhere).
    stale = record.model_copy(update={"scored_at": time.time() - 3600})
    sink = MlflowSink(mlflow.url, token=token, trace_wait_s=600)
    try:
        [outcome] = sink.deliver([stale])
    finally:
        sink.close()
    assert isinstance(outcome, Refused), outcome
    # (one reason for every such letter: `sinks drop --reason` takes them all; the trace in the detail)
    assert outcome.reason == (
        "trace still not in MLflow 600 s after scoring (HTTP 404): was it exported to this server?"
    )
    assert outcome.detail.startswith(f"trace tr-{record.trace_id}, 360")  # (s after scoring)
    assert "s after scoring; MLflow said: " in outcome.detail
    assert outcome.detail.endswith(f"RESOURCE_DOES_NOT_EXIST: Trace with ID 'tr-{record.trace_id}' not found.")
    assert record.reason
    assert record.reason not in outcome.reason + outcome.detail

    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})  # the trace exists: still nothing was written
    assert assessments(mlflow, {record.trace_id}) == {}


def test_records_mlflow_cannot_match_are_refused_without_a_request() -> None:
    """A trace or span id that is not OpenTelemetry hex is Refused by the sink itself, named."""
    base = {"score_id": "f" * 64, "scorer_id": "s", "score": 1.0}
    bad_trace = ScoreRecord(trace_id="not-a-trace", span_id="0" * 16, **base)
    bad_span = ScoreRecord(trace_id="0" * 32, span_id="xyz", **base)
    sink = MlflowSink("http://127.0.0.1:9")  # nothing listens: a request would be Retry
    try:
        outcomes = sink.deliver([bad_trace, bad_span])
    finally:
        sink.close()
    assert all(isinstance(o, Refused) for o in outcomes), outcomes
    assert "trace id is not 32 hex digits" in str(outcomes[0])
    assert "span id is not 16 hex digits" in str(outcomes[1])


def test_a_worker_delivers_every_score_once_across_an_mlflow_outage(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str], redis_url: str
) -> None:
    """End to end: the agent's traces in MLflow; MLflow stopped; ``tracescore backfill --broker``
    hands the runs to a real worker (TRACESCORE_SINKS=jsonl,mlflow), which scores and stores them:
    the MLflow scores wait in the outbox (pending, retried). MLflow restarted on the same SQLite
    file: every score arrives as one assessment, none twice, and the outbox counts them delivered."""
    traces = fresh_traces(tmp_path / "traces", lines=3, salt=f"mlflow:{project}", project=project)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    worker_env = {**judge_env, "TRACESCORE_SINKS": "jsonl,mlflow", "TRACESCORE_MLFLOW_URL": mlflow.url}
    with mlflow.up_after():
        mlflow.stop()
        with running_worker("mlflow-e2e", redis_url, tmp_path, worker_env) as (worker, outbox):
            broker = ("--broker", redis_url, "--wait-timeout", "120")
            records = backfill_scores(tmp_path / "traces", tmp_path / "scores.jsonl", judge_env, *broker)
            assert {r.scorer_id for r in records} == set(SCORER_IDS)

            wait_held(outbox, "mlflow", len(records), worker, timeout_s=60)
            # MLflow down holds up nothing else: the JSONL sink has every score already.
            assert sink_counts(outbox, "jsonl")["delivered"] == len(records)

            mlflow.start()
            wait_delivered(outbox, "mlflow", len(records), worker)
            listed = subprocess.run(
                [TRACESCORE, "sinks", "list", "mlflow", "--json", "--broker", redis_url],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
                check=True,
            )  # fmt: skip
            shown = json.loads(listed.stdout)["mlflow"]
            assert (shown["delivered"], shown["pending"], shown["failed"], shown["dead_letters"]) == (
                len(records),
                0,
                0,
                [],
            )

    found = assessments(mlflow, {r.trace_id for r in records})
    assert set(found) == {assessment_id(r) for r in records}
    for record in records:
        got = found[assessment_id(record)]
        assert got["span_id"] == record.span_id
        assert got["metadata"]["score_id"] == record.score_id
        assert got["metadata"]["source"] == "backfill"
    log = worker.text()
    leaked = [r.reason for r in records if r.reason and r.reason in log]
    assert not leaked, f"the worker logged scores' reasons: {leaked[:2]}"


def test_backfill_with_sink_mlflow_follows_the_readme(
    mlflow: Server, experiment: str, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """``tracescore backfill ... --sink mlflow --mlflow-url URL`` in process: exit 0, the summary
    counts every score delivered, MLflow holds one assessment per record written; the same with a
    URL that is not MLflow's API: exit 4 naming the 404 and the setting to check."""
    traces = fresh_traces(tmp_path / "traces", lines=2, salt=f"mlflow:{project}", project=project)
    send_otlp(mlflow.url, traces, {EXPERIMENT_HEADER: experiment})
    env = {**judge_env, "TRACESCORE_BROKER_URL": ""}

    def backfill(url: str, out: Path) -> subprocess.CompletedProcess[str]:
        return run_backfill(tmp_path / "traces", out, env, "--sink", "mlflow", "--mlflow-url", url, "--worst", "0")

    good = backfill(mlflow.url, tmp_path / "good.jsonl")
    assert good.returncode == 0, good.stdout + good.stderr
    records = read_records(tmp_path / "good.jsonl")
    assert f"sink mlflow       delivered {len(records):,}, failed 0, pending 0" in good.stdout + good.stderr
    assert set(assessments(mlflow, {r.trace_id for r in records})) == {assessment_id(r) for r in records}

    wrong = backfill(f"{mlflow.url}/no-api-here", tmp_path / "wrong.jsonl")
    output = wrong.stdout + wrong.stderr
    assert wrong.returncode == 4, output
    assert "no MLflow tracking API at this URL (HTTP 404): check TRACESCORE_MLFLOW_URL" in output
    assert f"sink mlflow       delivered 0, failed {len(records):,}, pending 0" in output
