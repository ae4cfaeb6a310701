"""Real ``celery -A worker worker`` processes on Redis DB 11: spans in, score events out."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink, ScoringRule, ScoringSpanExporter
from tracing.queue import SCORE_TASK_NAME
from worker.store import DeadLetter


class Workers:
    """Starts workers for one test and always stops them."""

    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.redis_url, self.tmp = redis_url, tmp
        self.scores = tmp / "scores.jsonl"
        self.started: list[WorkerProcess] = []

    def start(self, name: str, env: dict[str, str] | None = None, **options: Any) -> WorkerProcess:
        worker = WorkerProcess(name, self.redis_url, self.tmp, scores_path=self.scores, env=env, **options)
        self.started.append(worker)
        worker.wait_ready()
        return worker

    def stop(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture
def workers(redis_url: str, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes, stopped (and their logs closed) at the end."""
    ws = Workers(redis_url, tmp_path)
    try:
        yield ws
    finally:
        ws.stop()


def _producer(redis_url: str) -> Celery:
    app = Celery("test-producer", broker=redis_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json", "pickle"], broker_connection_retry_on_startup=True)
    return app


def _dlq(redis_url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


def _agent_trace(tracer: Any, n: int) -> tuple[str, str]:
    with tracer.start_as_current_span(
        "invoke_agent support", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}
    ) as root:
        answer = "word " * (n * 3)
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": f"q{n}"}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
                ),
            },
        ):
            pass
    ctx = root.get_span_context()
    return format(ctx.trace_id, "032x"), answer


def test_spans_to_score_events_through_a_worker(workers: Workers, redis_url: str) -> None:
    """Agent spans → ScoringSpanExporter → CelerySink → worker → one JSONL score per run × scorer."""
    # Prefork: each child process builds its own event loop, Redis clients and writer.
    workers.start("e2e", pool="prefork", concurrency=2)
    sink = CelerySink(redis_url)
    exporter = ScoringSpanExporter([ScoringRule(["length", "steps"])], sink, grace_s=0.0)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test-app")
    traces = dict(_agent_trace(tracer, n) for n in range(8))
    # The exporter's own flush: SimpleSpanProcessor.force_flush does not reach the exporter.
    assert exporter.force_flush(10_000)
    provider.shutdown()
    sink.close()

    assert wait_for(lambda: len(read_scores(workers.scores)) >= 16, 60), workers.started[0].text()[-2000:]
    scores = read_scores(workers.scores)
    assert len(scores) == 16
    assert {s["trace_id"] for s in scores} == set(traces)
    for s in scores:
        expected = min(1.0, len(traces[s["trace_id"]].strip()) / 100)
        assert s["error_type"] is None
        assert s["score"] == pytest.approx(expected, abs=0.05)
        if s["scorer_id"] == "steps":
            assert s["reason"].startswith("score ")
            assert s["label"] in {"long", "short"}


def test_poison_message_goes_to_the_dead_letter_list(workers: Workers, redis_url: str) -> None:
    """A payload that is not a ScoreBatch is dead-lettered with its reason; the worker carries on."""
    worker = workers.start("poison")
    producer = _producer(redis_url)
    producer.send_task(SCORE_TASK_NAME, args=[{"batch_id": "bad", "requests": [{"spans": 42}]}], queue="tracescore")
    producer.send_task(SCORE_TASK_NAME, args=[payload(range(3), ["length"], salt="after")], queue="tracescore")
    assert wait_for(lambda: len(read_scores(workers.scores)) == 3, 30), worker.text()[-2000:]
    (letter,) = _dlq(redis_url)
    assert letter.reason == "invalid_payload"
    assert letter.batch_id == "bad"
    assert "requests.0.spans" in letter.error
    assert not letter.retryable
    assert worker.proc.poll() is None
    producer.close()


def test_pickle_payload_is_refused(workers: Workers, redis_url: str) -> None:
    """A pickle-serialized task is refused and never runs; JSON tasks after it still run."""
    worker = workers.start("pickle")
    producer = _producer(redis_url)
    producer.send_task(
        SCORE_TASK_NAME, args=[payload(range(2), ["length"], salt="pickled")], queue="tracescore", serializer="pickle"
    )
    producer.send_task(SCORE_TASK_NAME, args=[payload(range(2), ["length"], salt="json")], queue="tracescore")
    assert wait_for(lambda: len(read_scores(workers.scores)) >= 2, 30), worker.text()[-2000:]
    assert wait_for(lambda: "reason=content_type_refused" in worker.text(), 10), worker.text()[-2000:]
    pickled = {r.trace_id for r in batch(range(2), ["length"], salt="pickled").requests}
    assert not pickled & {s["trace_id"] for s in read_scores(workers.scores)}
    assert len(read_scores(workers.scores)) == 2
    client = redis.Redis.from_url(redis_url)
    assert client.llen("tracescore") == 0  # consumed and dropped, not left to loop
    client.close()
    producer.close()


def test_sigkill_mid_batch_scores_every_run_exactly_once(workers: Workers, redis_url: str) -> None:
    """Kill -9 the worker midway; after redelivery every run × scorer is recorded exactly once."""
    env = {
        "TRACESCORE_VISIBILITY_TIMEOUT": "8",
        "TRACESCORE_TASK_TIME_LIMIT": "6",
        "TRACESCORE_TASK_SOFT_TIME_LIMIT": "5",
        "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
        "TRACESCORE_RUN_CONCURRENCY": "4",
        "TSTEST_SLOW_S": "0.25",
    }
    first = workers.start("doomed", env)
    sink = CelerySink(redis_url)
    sink.send(batch(range(40), ["slow", "length"], salt="kill"))
    sink.close()
    assert wait_for(lambda: len(read_scores(workers.scores)) >= 6, 30), first.text()[-2000:]
    first.kill()
    done_before = len(read_scores(workers.scores))
    assert done_before < 80  # killed midway

    killed_at = time.monotonic()
    second = workers.start("rescuer", env)
    assert wait_for(lambda: len(read_scores(workers.scores)) >= 80, 60), second.text()[-3000:]
    assert time.monotonic() - killed_at < 60
    scores = read_scores(workers.scores)
    ids = [s["score_id"] for s in scores]
    assert len(ids) == 80
    assert len(set(ids)) == 80
    assert all(s["error_type"] is None for s in scores)
    assert "already_scored" in second.text()  # the redelivery skipped what was recorded


def test_rate_limit_is_shared_by_two_workers(
    workers: Workers, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str
) -> None:
    """Two workers together keep the judge within its requests/min (counted by the fake judge)."""
    rpm = 1200  # 20/s, 1 s burst
    env = {
        **fake_llm_env,
        "TRACESCORE_RATE_LIMITS": json.dumps({"openai/fake-judge": {"requests_per_minute": rpm}}),
    }
    a = workers.start("limit-a", env)
    b = workers.start("limit-b", env)
    sink = CelerySink(redis_url)
    for i in range(10):
        sink.send(batch(range(i * 12, i * 12 + 12), ["judged"], salt="rl"))
    sink.close()
    assert wait_for(lambda: len(read_scores(workers.scores)) >= 120, 60), a.text()[-2000:] + b.text()[-2000:]
    assert all(s["error_type"] is None for s in read_scores(workers.scores))
    stamps = sorted(r.received_at for r in fake_llm.requests)
    assert len(stamps) == 120
    per_s = rpm / 60
    # Steady state, after the first 1.5 s (the initial burst, and first requests delayed by
    # connection set-up): the two workers together keep to the limit (+15 % arrival jitter).
    settle = stamps[0] + 1.5
    steady = [s for s in stamps if s >= settle]
    assert len(steady) / (stamps[-1] - settle) <= per_s * 1.15
    # Without the shared limit each worker alone would be far above it: the whole run took
    # about as long as the limit demands.
    assert stamps[-1] - stamps[0] >= (120 - 2 * per_s) / per_s * 0.85
    assert "batch_done" in a.text()
    assert "batch_done" in b.text()


def test_retry_budget_then_dead_letter_then_dlq_retry(
    workers: Workers,
    fake_llm: FakeLLMServer,
    fake_llm_env: dict[str, str],
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A judge down through every retry: error records + a dead letter; `dlq retry` then scores it."""
    from worker._settings import get_settings
    from worker.cli import main

    fake_llm.rule(Reply.error(503, "down for maintenance"))
    worker = workers.start("budget", {**fake_llm_env, "TRACESCORE_RETRY_BUDGET": "1"})
    sink = CelerySink(redis_url)
    sink.send(batch(range(2), ["judged"], salt="budget"))
    sink.close()
    assert wait_for(lambda: len(_dlq(redis_url)) == 1, 30), worker.text()[-3000:]
    (letter,) = _dlq(redis_url)
    assert letter.reason == "retry_budget_exhausted"
    assert letter.attempts == 2
    assert "JudgeServerError" in letter.error
    errors = read_scores(workers.scores)
    assert [e["error_type"] for e in errors] == ["JudgeServerError", "JudgeServerError"]
    assert all(e["retryable"] for e in errors)
    # Each run's judge was asked once per delivery: the first, then the worker's transient
    # retry (the per-run judge-call cap leaves the normal retries alone).
    assert fake_llm.count() == 2 * 2

    fake_llm.reset()  # the provider is back
    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    get_settings.cache_clear()
    try:
        assert main(["dlq", "retry", "--all"]) == 0
    finally:
        get_settings.cache_clear()
    assert wait_for(lambda: len(read_scores(workers.scores)) == 4, 30), worker.text()[-3000:]
    retried = read_scores(workers.scores)[2:]
    assert {r["score_id"] for r in retried} == {e["score_id"] for e in errors}
    assert all(r["error_type"] is None and r["score"] is not None for r in retried)
    assert _dlq(redis_url) == []
    assert fake_llm.count() == 2  # one call per run once the provider is back


def test_message_that_keeps_killing_its_worker_is_dead_lettered(workers: Workers, redis_url: str) -> None:
    """A batch whose scoring kills the pool child each time ends in the DLQ, not in a crash loop."""
    worker = workers.start("crashy", {"TRACESCORE_RETRY_BUDGET": "0"}, pool="prefork", concurrency=1)
    sink = CelerySink(redis_url)
    sink.send(batch(range(1), ["crash"], salt="crash"))
    sink.send(batch(range(2), ["length"], salt="fine"))
    sink.close()
    assert wait_for(lambda: len(_dlq(redis_url)) == 1, 90), worker.text()[-3000:]
    (letter,) = _dlq(redis_url)
    assert letter.reason == "too_many_deliveries"
    assert letter.attempts == 4  # 1 attempt + 2 tolerated crashes, dead-lettered on the 4th delivery
    assert wait_for(lambda: len(read_scores(workers.scores)) == 2, 30), worker.text()[-3000:]
    assert worker.proc.poll() is None


def test_an_unreadable_judge_answer_is_in_no_log_line_nor_quoted_in_the_record(
    workers: Workers, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str
) -> None:
    """A judge answer that does not read quoting the agent (as judges' answers do) failed the run
    as a JudgeOutputError whose message quoted 300 characters of the answer into the record's
    error_message. No log line of the worker carries it (the judge's lines name the problem, the
    worker's the error type); the record describes the answer by its length, as an unreadable
    provider body is described, and names what was wrong."""
    marker = "AGENT-CONTENT-MARKER-judge-answer"
    answer = f"I cannot score this. The agent said: {marker}, call 555-0199."
    fake_llm.rule(Reply.text(answer))
    worker = workers.start("unreadable", fake_llm_env)
    sink = CelerySink(redis_url)
    sink.send(batch(range(2), ["judged"], salt="unreadable"))
    sink.close()
    assert wait_for(lambda: len(read_scores(workers.scores)) == 2, 30), worker.text()[-3000:]
    assert wait_for(lambda: "batch_done" in worker.text(), 10), worker.text()[-3000:]
    records = read_scores(workers.scores)
    assert [r["error_type"] for r in records] == ["JudgeOutputError"] * 2
    for record in records:
        assert f"({len(answer)} characters) could not be read" in record["error_message"]
        assert "not valid JSON" in record["error_message"]
        assert marker not in record["error_message"]
    log = worker.text()
    assert "judge.fallback" in log  # the judge's own lines are in it: they name the problem only
    assert marker not in log
    assert "555-0199" not in log


def test_a_worker_logging_at_debug_logs_no_prompt(
    workers: Workers, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str], redis_url: str
) -> None:
    """`--loglevel DEBUG` sets the root logger's level, which the SDKs' loggers inherit: Anthropic's
    logged each request's options at DEBUG ("Request options: {... 'json_data': {'messages': ...}}"),
    the prompt (the agent's content) in the worker's log. The SDKs' loggers stay at WARNING, as
    the HTTP clients' do, unless given a level of their own."""
    from tests.worker.judge_log_scorers import MARKER

    worker = workers.start("debug", fake_llm_env, loglevel="DEBUG", scorers="tests.worker.judge_log_scorers")
    sink = CelerySink(redis_url)
    sink.send(batch(range(2), ["judged_openai", "judged_anthropic"], salt="debug"))
    sink.close()
    assert wait_for(lambda: len(read_scores(workers.scores)) == 4, 30), worker.text()[-3000:]
    assert all(r["error_type"] is None for r in read_scores(workers.scores))
    assert {r.provider for r in fake_llm.requests} == {"openai", "anthropic"}
    assert all(MARKER in r.user_text for r in fake_llm.requests)
    log = worker.text()
    assert "DEBUG" in log.upper()  # (the worker did log at DEBUG)
    assert MARKER not in log
    assert "question 1" not in log  # (the run's input, in the message's spans)
