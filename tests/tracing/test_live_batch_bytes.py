"""Live batches are cut by bytes: one huge trace never sinks its neighbours (issue 10, live path).

A real ``BatchSpanProcessor`` → ``ScoringSpanExporter`` → ``CelerySink`` on this session's Redis
→ a real ``celery -A worker worker`` whose ``TRACESCORE_MAX_PAYLOAD_BYTES`` is 1 MiB. Before, the
sender put the 2 MB run and the small ones in one message; the worker dead-lettered all of them
(``payload_too_large``).
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests._redis import RedisServer
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink, ScoreBatch, ScoreRequest, ScoringRule, ScoringSpanExporter
from tracing.queue import request_json, task_message, wire_size

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")

DB = 12
CAP = 1024 * 1024
BIG_MARK = "BIG-ANSWER-CONTENT "


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisServer]:
    """DB 12 of the session's Redis, emptied before and after."""
    redis_server.client(DB).flushdb()
    try:
        yield redis_server
    finally:
        if redis_server.proc is None:
            redis_server.start()
        redis_server.client(DB).flushdb()


def _agent_trace(tracer: Any, n: int, answer: str) -> str:
    with (
        tracer.start_as_current_span(
            "invoke_agent support", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}
        ) as root,
        tracer.start_as_current_span(
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
        ),
    ):
        pass
    return format(root.get_span_context().trace_id, "032x")


def _queued_bodies(server: RedisServer, queue: str) -> list[str]:
    """The bodies of the Celery messages waiting in ``queue``, oldest first."""
    out = []
    for raw in reversed(server.client(DB).lrange(queue, 0, -1)):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body).decode()
        out.append(body)
    return out


def test_one_huge_live_trace_is_dropped_as_too_large_and_its_neighbours_are_scored(
    broker: RedisServer, tmp_path: Path
) -> None:
    """Ten small traces around one 2 MB trace, 1 MiB cap: the ten are scored by a real worker,
    the big one is counted as ``dropped.too_large`` and logged by id and size, not content."""
    url = broker.url(DB)
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("bytes", url, tmp_path, scores_path=scores, env={"TRACESCORE_MAX_PAYLOAD_BYTES": str(CAP)})
    try:
        worker.wait_ready()
        sink = CelerySink(url, max_payload_bytes=CAP)
        exporter = ScoringSpanExporter([ScoringRule(["length"])], sink, grace_s=0.0)
        provider = TracerProvider()
        # Exported only by force_flush: every span reaches the exporter in one call, so the runs
        # are handed to the sender together (the old sender sent them as one message).
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=60_000)
        provider.add_span_processor(processor)
        tracer = provider.get_tracer("test-app")
        small = [_agent_trace(tracer, n, "word " * (n + 1)) for n in range(5)]
        big = _agent_trace(tracer, 99, (BIG_MARK * (2 * 1024 * 1024 // len(BIG_MARK) + 1)))
        small += [_agent_trace(tracer, n, "word " * (n + 1)) for n in range(5, 10)]
        with structlog.testing.capture_logs() as logs:
            assert processor.force_flush(30_000)
            assert exporter.force_flush(30_000)
        stats = exporter.stats()
        provider.shutdown()

        assert stats["dropped"] == {"too_large": 1}, stats
        assert stats["runs_sent"] == 10, stats
        assert wait_for(lambda: len(read_scores(scores)) >= 10, 60), worker.text()[-3000:]
        got = read_scores(scores)
        assert sorted(s["trace_id"] for s in got) == sorted(small)
        assert all(s["error_type"] is None for s in got), got
        assert broker.client(DB).llen("tracescore:dlq") == 0

        (event,) = [e for e in logs if e["event"] == "exporter_run_too_large"]
        assert event["trace_id"] == big
        assert event["bytes"] > 2 * 1024 * 1024
        assert event["max_payload_bytes"] == CAP
        assert BIG_MARK not in repr(logs)
    finally:
        worker.stop()


def test_messages_stay_under_the_cap_and_carry_each_request_as_encoded(broker: RedisServer) -> None:
    """Runs of ~300 KB (non-ASCII text) under a 1 MiB cap: several messages, each within the cap
    by the worker's two measures (UTF-8 bytes, ASCII-escaped JSON), none lost, none repeated."""
    queue = "tracescore-bytes-test"
    sink = CelerySink(broker.url(DB), queue=queue, max_payload_bytes=CAP)
    exporter = ScoringSpanExporter([ScoringRule(["length"])], sink, grace_s=0.0)
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=60_000)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test-app")
    answer = "Zürich im Regen 🌧 " * 15_000  # ~300 KB as UTF-8, more as ASCII escapes
    traces = [_agent_trace(tracer, n, answer) for n in range(8)]
    assert processor.force_flush(30_000)
    assert exporter.force_flush(30_000)
    stats = exporter.stats()
    provider.shutdown()

    assert stats["dropped"] == {}, stats
    bodies = _queued_bodies(broker, queue)
    assert len(bodies) >= 3  # 8 × ~300 KB: the old sender sent 2 messages of ~1.2 MB
    sent = []
    for body in bodies:
        assert len(body.encode()) <= CAP
        args, _, _ = json.loads(body)
        assert len(json.dumps(args[0], separators=(",", ":"))) <= CAP  # the worker task's measure
        batch = ScoreBatch.model_validate(args[0])
        sent += [r.trace_id for r in batch.requests]
    assert sorted(sent) == sorted(traces)


def test_task_message_from_encoded_requests_is_the_same_message() -> None:
    """The body spliced from each request's JSON equals the one encoded from the batch."""
    requests = [
        ScoreRequest.model_validate(
            {
                "spans": [{"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": 'Zürich "q" 🌧'}],
                "target_span_ids": ["cd" * 8],
                "scorer_ids": ["a", "b"],
            }
        )
    ] * 3
    # (the id with characters JSON escapes was refused by the workers: test_queue's plain-id test)
    batch = ScoreBatch(batch_id="b/1:x=y+z@w", requests=requests)
    whole = task_message(batch, "x")
    spliced = task_message(batch, "x", [request_json(r) for r in requests])
    assert spliced.body == whole.body
    assert wire_size(whole.body) >= len(whole.body.encode())
    with pytest.raises(ValueError, match="3 requests"):
        task_message(batch, "x", ["{}"])


def test_celery_sink_refuses_a_batch_over_its_cap_naming_it(broker: RedisServer) -> None:
    """Sent directly (not through the exporter), an oversized batch is refused before the broker."""
    sink = CelerySink(broker.url(DB), queue="tracescore-bytes-test", max_payload_bytes=4096)
    request = ScoreRequest.model_validate(
        {
            "spans": [{"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "x" * 5000}],
            "target_span_ids": ["cd" * 8],
            "scorer_ids": ["a"],
        }
    )
    try:
        with pytest.raises(ValueError, match="max_payload_bytes=4096"):
            sink.send(ScoreBatch(batch_id="b1", requests=[request]))
        assert broker.client(DB).llen("tracescore-bytes-test") == 0
    finally:
        sink.close()
    with pytest.raises(ValueError, match="max_payload_bytes must be over"):
        CelerySink(broker.url(DB), max_payload_bytes=100)


def test_celery_sink_refuses_a_batch_past_the_pairs_bound_naming_it(broker: RedisServer) -> None:
    """A batch built by hand (not cut by ``RequestCutter``) asking for more (run, scorer id) pairs
    than the workers take is refused before the broker, as one over the byte cap is: it was
    sent, and dead-lettered by every worker (invalid_payload)."""
    from tracing import SpanRecord
    from tracing.queue import MAX_BATCH_PAIRS, MAX_SCORER_IDS, spans_request

    runs = MAX_BATCH_PAIRS // MAX_SCORER_IDS + 1
    spans = [SpanRecord(trace_id="ab" * 16, span_id=f"{i + 1:016x}", name="a") for i in range(runs)]
    request = spans_request(spans, [s.span_id for s in spans], [f"s{i}" for i in range(MAX_SCORER_IDS)])
    sink = CelerySink(broker.url(DB), queue="tracescore-pairs-test")
    try:
        with pytest.raises(ValueError, match=f"{runs * MAX_SCORER_IDS:,} .*at most {MAX_BATCH_PAIRS:,}"):
            sink.send(ScoreBatch.model_construct(batch_id="b1", requests=[request]))
        assert broker.client(DB).llen("tracescore-pairs-test") == 0
        fits = spans_request(spans[:-1], [s.span_id for s in spans[:-1]], request.scorer_ids)
        sink.send(ScoreBatch.model_construct(batch_id="b2", requests=[fits]))
        assert broker.client(DB).llen("tracescore-pairs-test") == 1
    finally:
        sink.close()
