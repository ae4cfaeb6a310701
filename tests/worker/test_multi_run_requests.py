"""A request naming several runs of one trace (the spans once, every run's target), end to end.

The exporter (behind a real ``BatchSpanProcessor``) ships a trace of three agent runs as ONE
request of three targets; ``score_batch`` and a real worker process store one record per run ×
scorer, each with its own run's span name, times and content. A message of the older shape
(one ``target_span_id``) still in a queue is scored; a request whose targets are wrong is one
dead letter naming what is wrong.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scorers import create_scorer
from tests.tracing._exporting import Recording
from tests.tracing._spans import THREE_AGENTS, genai_messages
from tests.worker._batches import OUTPUT, output_messages, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.sample_scorers import POISON_MARKER, length
from tests.worker.test_hostile_messages import envelope, task_body
from tracing import (
    CallbackSink,
    CelerySink,
    MemoryScoreWriter,
    ScoreBatch,
    ScoreRequest,
    ScoringRule,
    ScoringSpanExporter,
    SpanRecord,
)
from tracing.capture import Sink
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker._task import _split
from worker.store import DeadLetter, MemoryScoreStore

QUEUE = "tracescore"
asked = create_scorer("asked", type="agent").generate_score(
    lambda run: [q for _, q in THREE_AGENTS].index(run.input.input_messages[0].text) / 10
)


def _export(sink: Sink, scorer_ids: list[str]) -> dict[str, ReadableSpan]:
    """A workflow span over three agent runs (the researcher calls a sub-agent: part of its
    run), through a real BatchSpanProcessor into the exporter and ``sink``. Each run's answer
    is 10, 20, 30 characters (``length`` scores 0.1, 0.2, 0.3). Returns the agents' SDK spans
    by span id."""
    exporter = ScoringSpanExporter([ScoringRule(scorer_ids)], sink, grace_s=0.0)
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=60_000)
    provider.add_span_processor(processor)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test-app")
    with tracer.start_as_current_span("workflow"):
        for i, (name, question) in enumerate(THREE_AGENTS):
            attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            with tracer.start_as_current_span(f"invoke_agent {name}", attributes=attrs):
                chat = {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages": genai_messages(("user", question)),
                    "gen_ai.output.messages": genai_messages(("assistant", "x" * 10 * (i + 1))),
                }
                with tracer.start_as_current_span("chat m", attributes=chat):
                    pass
                if name == "researcher":
                    sub = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "sub"}
                    with tracer.start_as_current_span("invoke_agent sub", attributes=sub):
                        pass
    assert processor.force_flush(30_000)
    assert exporter.force_flush(30_000)
    stats = exporter.stats()
    provider.shutdown()
    assert (stats["runs_found"], stats["runs_sent"], stats["dropped"]) == (3, 3, {})
    agents = [s for s in memory.get_finished_spans() if s.name in {f"invoke_agent {n}" for n, _ in THREE_AGENTS}]
    return {format(s.context.span_id, "016x"): s for s in agents}  # type: ignore[union-attr]


def _expected(agents: dict[str, ReadableSpan]) -> dict[tuple[str, str], tuple[str, int | None, int | None, float]]:
    """(span id, scorer) -> (span name, start, end, score) for every run × scorer."""
    out = {}
    for span_id, span in agents.items():
        i = [f"invoke_agent {n}" for n, _ in THREE_AGENTS].index(span.name)
        out[span_id, "length"] = (span.name, span.start_time, span.end_time, round(0.1 * (i + 1), 6))
        out[span_id, "asked"] = (span.name, span.start_time, span.end_time, i / 10)
    return out


def test_exporter_ships_three_runs_as_one_request_and_score_batch_records_each_run() -> None:
    """One request, three targets (the agents in start order), the trace's spans once; the
    worker's score_batch stores 3 runs × 2 scorers, each record with its run's span name and
    times, scored on its run's own content. A redelivery scores nothing again."""
    sink = Recording()
    agents = _export(CallbackSink(sink), ["length", "asked"])
    (batch,) = sink.batches
    (request,) = batch.requests
    assert sorted(request.target_span_ids) == sorted(agents)
    assert [agents[t].name for t in request.target_span_ids] == [f"invoke_agent {n}" for n, _ in THREE_AGENTS]
    assert len({s.span_id for s in request.spans}) == len(request.spans) == 7  # 3 agents, 3 chats, 1 sub-agent

    received = ScoreBatch.model_validate_json(batch.model_dump_json())  # as a worker gets it
    writer = MemoryScoreWriter()
    deps = ScoringDeps(registry=Registry([length, asked]), store=MemoryScoreStore(), writer=writer)
    report = asyncio.run(score_batch(received, deps))
    assert (report.requests, report.pairs, report.scored, dict(report.failed)) == (1, 6, 6, {})
    got = {
        (r.span_id, r.scorer_id): (r.span_name, r.span_start_ns, r.span_end_ns, round(r.score or 0, 6))
        for r in writer.records
    }
    assert len(writer.records) == 6
    assert got == _expected(agents)
    assert {r.trace_id for r in writer.records} == {request.trace_id}
    again = asyncio.run(score_batch(received, deps))
    assert (again.scored, again.skipped) == (0, {"already_scored": 6})


def _dlq(redis_url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


def test_a_worker_scores_three_runs_of_one_request_and_an_old_shape_message(redis_url: str, tmp_path: Path) -> None:
    """A real worker process: the exporter's one request of three runs gives 3 records with
    each run's span name and times; a message body of the old shape (``target_span_id``: one
    string) is scored; requests with no target, a target twice, a target not among the spans or
    one under another are each one dead letter (invalid_payload) naming what is wrong."""
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("multi", redis_url, tmp_path, scores_path=scores)
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        agents = _export(sink, ["length"])
        sink.close()

        old = payload(range(1), ["length"], salt="old-shape")
        (request,) = old["requests"]
        (old_target,) = request.pop("target_span_ids")
        request["target_span_id"] = old_target
        body = task_body([old])
        assert '"target_span_id": "' in body
        assert "target_span_ids" not in body
        good = payload(range(1), ["length"], salt="bad")["requests"][0]
        inner = {**good["spans"][0], "span_id": "e" * 16, "parent_span_id": good["target_span_ids"][0]}
        bad = {
            "empty": {**good, "target_span_ids": []},
            "twice": {**good, "target_span_ids": [good["target_span_ids"][0]] * 2},
            "missing": {**good, "target_span_ids": [good["target_span_ids"][0], "0" * 16]},
            # A run inside another: each reads the other's spans again (2,000 nested in 430 KB
            # took 77 s of a worker's CPU); no producer plans one.
            "nested": {
                **good,
                "spans": [*good["spans"], inner],
                "target_span_ids": [*good["target_span_ids"], "e" * 16],
            },
        }
        client = redis.Redis.from_url(redis_url)
        try:
            client.lpush(QUEUE, envelope(body)[1])
            for name, req in bad.items():
                client.lpush(QUEUE, envelope(task_body([{"batch_id": name, "requests": [req]}]))[1])
        finally:
            client.close()

        assert wait_for(lambda: len(read_scores(scores)) >= 4 and len(_dlq(redis_url)) >= 4, 60), worker.text()[-3000:]
        records = read_scores(scores)
        assert len(records) == 4
        live = [r for r in records if r["span_id"] != old_target]
        got = {
            (r["span_id"], r["scorer_id"]): (r["span_name"], r["span_start_ns"], r["span_end_ns"], round(r["score"], 6))
            for r in live
        }
        assert got == {k: v for k, v in _expected(agents).items() if k[1] == "length"}
        (old_record,) = [r for r in records if r["span_id"] == old_target]
        assert (old_record["span_name"], old_record["error_type"]) == ("agent.run", None)

        letters = {d.batch_id: d for d in _dlq(redis_url)}
        assert {b: d.reason for b, d in letters.items()} == dict.fromkeys(bad, "invalid_payload")
        assert "requests.0.target_span_ids: List should have at least 1 item" in letters["empty"].error
        assert f"target_span_ids names {good['target_span_ids'][0]} twice" in letters["twice"].error
        assert f"target_span_ids {'0' * 16} not among the 1 spans" in letters["missing"].error
        assert f"target_span_ids: {'e' * 16} is under {good['target_span_ids'][0]}" in letters["nested"].error
        assert worker.proc.poll() is None
    finally:
        worker.stop()


def test_old_shape_json_is_the_same_request() -> None:
    """The compatibility read keeps everything else of the old message as it was."""
    new = ScoreBatch.model_validate(payload(range(2), ["length"], salt="compat"))
    old = json.loads(new.model_dump_json())
    for request in old["requests"]:
        (request["target_span_id"],) = request.pop("target_span_ids")
    assert ScoreBatch.model_validate_json(json.dumps(old)) == new


def _three_run_payload(poisoned: int | None = None) -> dict[str, Any]:
    """One message, one request of three agent runs (under a workflow span) of one trace;
    run ``poisoned``'s answer carries the poison marker."""
    trace = "ab" * 16
    root = SpanRecord(trace_id=trace, span_id="f" * 16, name="workflow")
    spans = [root]
    for i in range(3):
        agent = SpanRecord(
            trace_id=trace, span_id=f"{i + 1:016x}", name=f"invoke_agent {i}", parent_span_id=root.span_id,
            attributes={"gen_ai.operation.name": "invoke_agent"},
        )  # fmt: skip
        answer = f"this one kills: {POISON_MARKER}" if i == poisoned else f"answer {i}"
        chat = SpanRecord(
            trace_id=trace, span_id=f"{i + 11:016x}", name="chat m", parent_span_id=agent.span_id,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": genai_messages(("user", f"q{i}")),
                OUTPUT: output_messages(answer),
            },
        )  # fmt: skip
        spans += [agent, chat]
    request = ScoreRequest(spans=spans, target_span_ids=[f"{i + 1:016x}" for i in range(3)], scorer_ids=["poison"])
    return ScoreBatch(batch_id="three", requests=[request]).model_dump(mode="json")


class _Requeued:
    """What ``_split`` hands back to the queue (``task.apply_async``)."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], str, str]] = []
        self.headers: list[dict[str, Any]] = []

    def apply_async(self, *, args: tuple[dict[str, Any]], task_id: str, queue: str, headers: dict[str, Any]) -> None:
        self.sent.append((args[0], task_id, queue))
        self.headers.append(headers)


def test_a_crashed_request_of_three_runs_is_split_into_one_message_per_run() -> None:
    """After a crashed delivery, each run of a multi-run request goes back alone: one message,
    one request, one target, carrying its own run's spans only; the same ids on a second split;
    each marked as split (its run was delivered before: the judge-call cap reads its count)."""
    raw = _three_run_payload()
    batch = ScoreBatch.model_validate(raw)
    first, again = _Requeued(), _Requeued()
    _split(first, raw, batch, "task-1", "q")  # type: ignore[arg-type]
    _split(again, raw, batch, "task-1", "q")  # type: ignore[arg-type]
    assert [t for _, t, _ in first.sent] == [t for _, t, _ in again.sent]
    assert len({t for _, t, _ in first.sent}) == 3
    assert first.headers == [{"tracescore_split_from": "task-1"}] * 3
    parts = [ScoreBatch.model_validate(body) for body, _, _ in first.sent]
    assert [p.batch_id for p in parts] == ["three/0", "three/1", "three/2"]
    assert [[r.target_span_ids for r in p.requests] for p in parts] == [[[f"{i + 1:016x}"]] for i in range(3)]
    assert [sorted(s.name for s in p.requests[0].spans) for p in parts] == [
        ["chat m", f"invoke_agent {i}"] for i in range(3)
    ]


def test_the_run_that_kills_its_worker_is_dead_lettered_alone_from_a_multi_run_request(
    redis_url: str, tmp_path: Path
) -> None:
    """One request of three runs, the second SIGKILLs its process: the message is split per
    run, the poison run alone is dead-lettered (its run id in the letter), the other two scored."""
    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "poisoned-multi", redis_url, tmp_path, scores_path=scores, pool="prefork", concurrency=1,
        env={"TRACESCORE_RUN_CONCURRENCY": "2"},
    )  # fmt: skip
    try:
        worker.wait_ready()
        raw = _three_run_payload(poisoned=1)
        sink = CelerySink(redis_url)
        sink.send(ScoreBatch.model_validate(raw))
        sink.close()
        assert wait_for(lambda: len(_dlq(redis_url)) >= 1, 120), worker.text()[-3000:]
        (letter,) = _dlq(redis_url)
        poison_id = f"{'ab' * 16}:{2:016x}"
        assert (letter.reason, letter.run_ids, letter.batch_id) == ("too_many_deliveries", [poison_id], "three/1")
        assert poison_id in letter.error
        # Split in the one-run shape a worker of the previous release reads too.
        assert [r["target_span_id"] for r in letter.payload["requests"]] == [f"{2:016x}"]
        assert "target_span_ids" not in letter.payload["requests"][0]
        assert wait_for(lambda: len(read_scores(scores)) >= 2, 60), worker.text()[-3000:]
        recorded = read_scores(scores)
        assert sorted(r["span_id"] for r in recorded) == [f"{1:016x}", f"{3:016x}"]
        assert all(r["error_type"] is None for r in recorded)
    finally:
        worker.stop()


def test_a_real_worker_scores_a_run_sent_three_times_in_one_message_once(redis_url: str, tmp_path: Path) -> None:
    """Copies of one request in a message, through a real worker on a real Redis: one record,
    the scorer run (a judge paid) once, each copy counted for the job as ``skipped:duplicate``,
    so the job's scored + skipped reach the pairs it sent and it does not wait for good."""
    from worker._keys import job_key

    scores = tmp_path / "scores.jsonl"
    worker = WorkerProcess("copies", redis_url, tmp_path, scores_path=scores)
    try:
        worker.wait_ready()
        one, other = payload(range(2), ["steps"], salt="copies", job_id="job-copies")["requests"]
        body = task_body([{"batch_id": "copies", "requests": [one, other, one, one]}])
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            client.lpush(QUEUE, envelope(body)[1])

            def progress() -> dict[str, int]:
                return {k: int(v) for k, v in client.hgetall(job_key("job-copies")).items()}

            assert wait_for(lambda: progress().get("scored", 0) + progress().get("skipped", 0) >= 4, 60), worker.text()[
                -3000:
            ]
            assert progress() == {"scored": 2, "skipped": 2, "skipped:duplicate": 2}
            assert int(client.get("tstest:calls:steps:generate_score") or 0) == 2
        finally:
            client.close()
        # The sink gets the records from the outbox after the job's counts move: waited for.
        expected = sorted(r["target_span_ids"][0] for r in (one, other))
        assert wait_for(lambda: sorted(r["span_id"] for r in read_scores(scores)) == expected, 30), read_scores(scores)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
