"""Live text no JSON can hold never costs a run, its own or its neighbours'.

An application may put a lone surrogate in an attribute (a string decoded with
``surrogateescape``, a ``\\ud800`` escape it parsed): the SDK keeps it, and pydantic cannot encode
it. The exporter's sender used to fail the whole hand-off on it: every run sent with it was
dropped as ``send_failed``. A real ``BatchSpanProcessor`` on its own schedule (no
``force_flush``) → ``ScoringSpanExporter`` → ``CelerySink`` on this session's Redis → a real
worker: every run is scored, the bad text as U+FFFD, and the replacement is counted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests._redis import RedisServer
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink, ScoringRule, ScoringSpanExporter

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")

DB = 11


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[RedisServer]:
    """DB 11 of the session's Redis, emptied before and after."""
    redis_server.client(DB).flushdb()
    yield redis_server
    redis_server.client(DB).flushdb()


def _agent_trace(tracer: Any, question: str, answer: str) -> str:
    """An agent run whose messages hold their text as is (a surrogate stays one)."""

    def messages(role: str, text: str) -> str:
        return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)

    with (
        tracer.start_as_current_span(
            "invoke_agent support", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}
        ) as root,
        tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": messages("user", question),
                "gen_ai.output.messages": messages("assistant", answer),
            },
        ),
    ):
        pass
    return format(root.get_span_context().trace_id, "032x")


def test_a_lone_surrogate_in_a_live_answer_is_scored_as_u_fffd_with_its_neighbours(
    broker: RedisServer, tmp_path: Path
) -> None:
    url = broker.url(DB)
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("text", url, tmp_path, scores_path=scores)
    provider = TracerProvider()
    try:
        worker.wait_ready()
        exporter = ScoringSpanExporter([ScoringRule(["length"])], CelerySink(url), grace_s=0.0)
        # The processor's own thread exports every 200 ms: the traces below end within one
        # period, so they reach the sender together, as an application's burst does.
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        tracer = provider.get_tracer("test-app")
        answers = [f"answer number {n}" for n in range(6)]
        answers[3] = "Rome \ud800 is warm"
        traces = [_agent_trace(tracer, f"q{n}", answer) for n, answer in enumerate(answers)]

        assert wait_for(lambda: len(read_scores(scores)) >= 6, 60), worker.text()[-3000:]
        stats = exporter.stats()
        assert (stats["runs_sent"], stats["dropped"], stats["errors"]) == (6, {}, {"text_replaced": 1}), stats
        got = {s["trace_id"]: s for s in read_scores(scores)}
        assert sorted(got) == sorted(traces)
        assert all(s["error_type"] is None for s in got.values())
        # The length scorer's score is the answer's length / 100: one U+FFFD where the surrogate was.
        assert got[traces[3]]["score"] == pytest.approx(len("Rome \ufffd is warm") / 100)
        assert broker.client(DB).llen("tracescore:dlq") == 0
    finally:
        provider.shutdown()
        worker.stop()
