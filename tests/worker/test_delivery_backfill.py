"""`tracescore backfill` in this process with --sink: every score reaches the sink once, the
summary shows each sink's delivered/failed/pending, and a refusal exits 4 with the backend's answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests._otlp_receiver import OtlpReceiver
from worker._registry import load_registry
from worker.cli import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    try:
        yield r
    finally:
        r.stop()


def _backfill(receiver: OtlpReceiver, *args: str) -> Result:
    env = {
        "TRACESCORE_BROKER_URL": "",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2",
        "TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "10",
    }
    return CliRunner().invoke(cli, ["backfill", str(EXAMPLES), "--scorers", "examples.scorers", *args], env=env)


def test_every_score_reaches_the_sink_once_and_the_summary_says_so(receiver: OtlpReceiver) -> None:
    """--sink otlp: 300 traces × the example scorers arrive at the receiver once each; the
    summary line and --json name the sink's delivered count; exit 0."""
    expected = 300 * len(load_registry("examples.scorers"))
    result = _backfill(receiver, "--sink", "otlp", "--json")
    assert result.exit_code == 0, result.output
    arrived = receiver.score_ids()
    assert len(arrived) == expected
    assert max(arrived.values()) == 1
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["sinks"]["otlp"]["delivered"] == expected
    assert (summary["sinks"]["otlp"]["failed"], summary["sinks"]["otlp"]["pending"]) == (0, 0)
    assert f"sink otlp         delivered {expected:,}, failed 0, pending 0" in result.stderr


def test_a_refused_write_exits_4_with_the_backends_answer(receiver: OtlpReceiver) -> None:
    """The endpoint answers 422 (MLflow without its experiment header): nothing is silently
    lost: the summary shows every score failed for that sink with the answer, exit code 4."""
    receiver.status, receiver.answer = 422, b"Missing required header: x-mlflow-experiment-id"
    expected = 300 * len(load_registry("examples.scorers"))
    result = _backfill(receiver, "--otlp")
    assert result.exit_code == 4, result.output
    assert f"sink otlp         delivered 0, failed {expected:,}, pending 0" in result.stderr
    assert "otlp_http_422: Missing required header: x-mlflow-experiment-id" in result.stderr
    assert "scores did not all reach their sinks (otlp:" in result.stderr
    # (they were dropped at the end without a word about it: the sink audit)
    assert "this process keeps none of them past its end: run the backfill again" in result.stderr
    assert receiver.score_ids() == {}


def test_without_a_sink_a_local_backfill_writes_nowhere(receiver: OtlpReceiver) -> None:
    """No --sink and no TRACESCORE_SINKS: the workers' WRITER default (otlp) does not apply here."""
    result = _backfill(receiver)
    assert result.exit_code == 0, result.output
    assert receiver.requests == 0
    assert "sink " not in result.stderr


def test_through_workers_the_summary_shows_the_jobs_scores_per_sink(
    receiver: OtlpReceiver, redis_url: str, tmp_path: Path
) -> None:
    """With a broker: the workers' OTLP sink is refused (422) while their JSONL sink takes every
    score; the backfill's summary counts the job's scores per sink and exits 4."""
    from tests.backfill._synth import write_otlp_files
    from tests.worker._workers import WorkerProcess

    write_otlp_files(tmp_path / "traces", 20, files=2)
    receiver.status, receiver.answer = 422, b"Missing required header: x-mlflow-experiment-id"
    worker = WorkerProcess(
        "bf",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        scorers="tests.backfill.scorers",
        env={
            "TRACESCORE_SINKS": "otlp,jsonl",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2",
        },
    )
    try:
        worker.wait_ready()
        result = CliRunner().invoke(
            cli,
            [
                "backfill",
                str(tmp_path / "traces"),
                "--scorers",
                "tests.backfill.scorers",
                "--broker",
                redis_url,
                "--json",
            ],
            env={"TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "20"},
        )
    finally:
        worker.stop()
    assert result.exit_code == 4, result.output + worker.text()[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    n = 20 * len(load_registry("tests.backfill.scorers"))
    assert {k: summary["sinks"]["jsonl"][k] for k in ("delivered", "failed", "pending")} == {
        "delivered": n,
        "failed": 0,
        "pending": 0,
    }
    assert {k: summary["sinks"]["otlp"][k] for k in ("delivered", "failed", "pending")} == {
        "delivered": 0,
        "failed": n,
        "pending": 0,
    }
    assert "otlp_http_422: Missing required header" in result.stderr
    assert "tracescore sinks retry SINK --all" in result.stderr


def test_through_workers_scores_still_pending_are_not_sent_to_sinks_retry(redis_url: str, tmp_path: Path) -> None:
    """The workers' OTLP endpoint is down (the README's quickstart without a collector): every
    score stays pending, exit 4. The line ended "retry a sink's failed scores with tracescore
    sinks retry SINK --all", with 0 failed: nothing for that command to retry. It now says the
    pending ones stay in Redis for the workers to deliver and where they say why they have not."""
    from tests._redis import free_port
    from tests.backfill._synth import write_otlp_files
    from tests.worker._workers import WorkerProcess

    write_otlp_files(tmp_path / "traces", 4, files=1)
    worker = WorkerProcess(
        "bf",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "unused.jsonl",  # (TRACESCORE_SINKS below names otlp alone)
        scorers="tests.backfill.scorers",
        env={
            "TRACESCORE_SINKS": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{free_port()}/v1/traces",  # nothing listens
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1",
        },
    )
    try:
        worker.wait_ready()
        result = CliRunner().invoke(
            cli,
            ["backfill", str(tmp_path / "traces"), "--scorers", "tests.backfill.scorers", "--broker", redis_url],
            env={"TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "3"},
        )
    finally:
        worker.stop()
    assert result.exit_code == 4, result.output + worker.text()[-3000:]
    n = 4 * len(load_registry("tests.backfill.scorers"))
    assert f"scores did not all reach their sinks (otlp: 0 failed, {n:,} pending)" in result.stderr
    assert "sinks retry" not in result.stderr, result.stderr
    assert "pending scores stay in Redis" in result.stderr, result.stderr
    assert "sink_retry" in result.stderr, result.stderr


def test_the_exporters_in_process_sink_delivers_to_sinks_before_it_closes() -> None:
    """embedded_sink(..., sinks=[...]): each score reaches every sink once, by the time it closes."""
    from tests.worker._batches import batch
    from tracing.sinks import MemorySink
    from worker._embedded import embedded_sink

    first, second = MemorySink("first"), MemorySink("second")
    sink = embedded_sink("tests.worker.sample_scorers", sinks=[first, second], run_timeout_s=30)
    sink.scorer.submit(batch(range(6), ["length"], salt="embedded-sinks"))
    sink.close()
    assert len(first.records) == len(second.records) == 6
    assert len({r.score_id for r in first.records}) == 6
    assert {n: c.delivered for n, c in sink.scorer.sink_counts.items()} == {"first": 6, "second": 6}


def test_sink_none_overrides_tracescore_sinks(tmp_path: Path) -> None:
    """`--sink none` delivers nowhere even when TRACESCORE_SINKS names a sink (it used to be
    dropped, and the environment's sinks applied); without it the environment's sink is used."""
    scores = tmp_path / "scores.jsonl"
    env = {"TRACESCORE_BROKER_URL": "", "TRACESCORE_SINKS": "jsonl", "TRACESCORE_JSONL_PATH": str(scores)}
    args = ["backfill", str(EXAMPLES), "--scorers", "tests.backfill.scorers", "--worst", "0", "--json"]
    result = CliRunner().invoke(cli, [*args, "--sink", "none"], env=env)
    assert result.exit_code == 0, result.output
    assert "sinks" not in json.loads(result.stdout.strip().splitlines()[-1])
    assert not scores.exists()
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["sinks"]["jsonl"]["delivered"] > 0
    assert len(scores.read_text().splitlines()) == summary["sinks"]["jsonl"]["delivered"]


def test_through_workers_dead_letters_dropped_past_the_bound_count_as_refused_not_unqueued(
    receiver: OtlpReceiver, redis_url: str, tmp_path: Path
) -> None:
    """A sink refusing every score with TRACESCORE_SINK_MAX_DEAD_LETTERS=2: the outbox keeps 2
    letters and drops the rest, whose ids it then knows nothing of (state "none"); the summary
    counted them "not queued", as if never owed. They were refused: named as dead letters
    dropped past the bound, with the kept ones making every score failed, exit 4."""
    from tests.backfill._synth import write_otlp_files
    from tests.worker._workers import WorkerProcess

    write_otlp_files(tmp_path / "traces", 10, files=1)
    receiver.status, receiver.answer = 400, b"project deleted"
    worker = WorkerProcess(
        "bound",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        scorers="tests.backfill.scorers",
        env={
            "TRACESCORE_SINKS": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2",
            "TRACESCORE_SINK_MAX_DEAD_LETTERS": "2",
        },
    )
    try:
        worker.wait_ready()
        result = CliRunner().invoke(
            cli,
            ["backfill", str(tmp_path / "traces"), "--scorers", "tests.backfill.scorers", "--broker", redis_url,
             "--json"],
            env={"TRACESCORE_SINK_DRAIN_TIMEOUT_SECONDS": "20"},
        )  # fmt: skip
    finally:
        worker.stop()
    assert result.exit_code == 4, result.output + worker.text()[-3000:]
    otlp = json.loads(result.stdout.strip().splitlines()[-1])["sinks"]["otlp"]
    n = 10 * len(load_registry("tests.backfill.scorers"))
    shown = {k: otlp.get(k) for k in ("delivered", "failed", "pending", "dead_letters_dropped", "not_queued")}
    assert shown == {"delivered": 0, "failed": 2, "pending": 0, "dead_letters_dropped": n - 2, "not_queued": 0}
    line = next(x for x in result.stderr.splitlines() if x.startswith("  sink otlp"))
    assert f"dead letters dropped past the bound {n - 2:,}" in line
    assert "not queued" not in line
    assert f"otlp: {n:,} failed, 0 pending" in result.stderr
