"""ScoringSpanExporter: grace window, bounds, sampling, loop guard, errors, hand-off and flush."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import structlog.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from tests.tracing._exporting import FakeClock, Recording, read, read_runs, wait_for
from tests.tracing._spans import (
    THREE_AGENTS,
    Recorder,
    agent_trace,
    chat_attributes,
    genai_messages,
    three_agent_trace,
)
from tracing import (
    JUDGE_ROLE,
    ROLE_ATTRIBUTE,
    CallbackSink,
    ScoreBatch,
    ScoringRule,
    ScoringSpanExporter,
    TraceReadError,
    sampled,
)
from tracing.queue import MAX_SCORER_IDS, MESSAGE_ENVELOPE_BYTES, ScoreRequest, request_json

CHAT = "chat"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> Recording:
    return Recording()


@pytest.fixture
def exporter(clock: FakeClock, sink: Recording) -> Iterator[ScoringSpanExporter]:
    # Spans come as a SimpleSpanProcessor hands them over, at once: no processor delay.
    exp = ScoringSpanExporter(
        [ScoringRule(["s1"])], CallbackSink(sink), grace_s=2.0, processor_delay_s=0.0, clock=clock
    )
    yield exp
    exp.shutdown(timeout_millis=2000)


def test_trace_completes_after_grace_window(exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording) -> None:
    """A finished agent trace is read only once the grace window after its root has passed."""
    rec = Recorder()
    trace_id = agent_trace(rec)
    assert exporter.export(rec.spans()) is SpanExportResult.SUCCESS
    assert exporter.tick() == 0
    clock.advance(2.5)
    assert exporter.tick() == 1
    assert wait_for(lambda: len(sink.requests) == 1)
    request = sink.requests[0]
    assert request.scorer_ids == ["s1"]
    assert request.trace_id == trace_id
    assert read(request).output.text == "Hello."
    assert request.enqueued_at is not None
    stats = exporter.stats()
    assert (stats["spans_seen"], stats["traces_completed"], stats["runs_enqueued"]) == (2, 1, 1)
    assert (stats["runs_found"], stats["runs_read_in_app"]) == (1, 0)
    assert wait_for(lambda: exporter.stats()["runs_sent"] == 1)


def test_each_span_record_carries_where_it_ran(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """The resource's environment (OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=...) goes
    with every span's record, and a span's own langfuse.environment before it (Langfuse's order):
    a score sent to Langfuse lands in its trace's environment."""
    rec = Recorder(resource={"deployment.environment.name": "prod-eu"})
    with (
        rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}),
        rec.span("chat m", {**chat_attributes("Hi?", "Hello."), "langfuse.environment": "canary"}),
    ):
        pass
    other = Recorder()  # no environment: the records say none
    plain = agent_trace(other)
    exporter.export(rec.spans())
    exporter.export(other.spans())
    clock.advance(2.5)
    assert exporter.tick() == 2
    assert wait_for(lambda: len(sink.requests) == 2)
    by_trace = {r.trace_id: {s.name: s.environment for s in r.spans} for r in sink.requests}
    assert by_trace.pop(plain) == {"invoke_agent a": None, "chat m": None}
    assert list(by_trace.values()) == [{"invoke_agent a": "prod-eu", "chat m": "canary"}]


def test_children_ending_after_root_within_grace(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """Spans exported after the root, inside the grace window, still belong to the run."""
    rec = Recorder()
    agent_trace(rec, tool=True)
    spans = {s.name: s for s in rec.spans()}
    exporter.export([spans["invoke_agent a"]])
    clock.advance(1.0)
    exporter.export([spans["chat m"], spans["execute_tool t"]])
    exporter.tick()
    clock.advance(1.5)
    assert exporter.tick() == 1
    assert wait_for(lambda: len(sink.requests) == 1)
    inv = read(sink.requests[0]).output[0].tool_invocations[0]
    assert (inv.state, inv.result) == ("result", "ok")


def test_span_after_grace_is_not_in_the_run(exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording) -> None:
    """A child arriving after its trace was handed over is not in the run: one late_span drop
    (not a rootless fragment holding a slot until max_trace_age)."""
    rec = Recorder()
    agent_trace(rec, tool=True)
    spans = {s.name: s for s in rec.spans()}
    exporter.export([spans["invoke_agent a"], spans["chat m"]])
    clock.advance(3)
    exporter.tick()
    exporter.export([spans["execute_tool t"]])
    assert wait_for(lambda: len(sink.requests) == 1)
    assert read(sink.requests[0]).output[0].tool_invocations[0].state == "call"
    assert exporter.stats()["traces_buffered"] == 0
    clock.advance(301)
    exporter.tick()
    assert exporter.stats()["dropped"] == {"late_span": 1}


@pytest.mark.parametrize(
    ("setting", "quiet_bound_s"),
    [("750", 1.75), ("not a number", 6.0), ("1500.0", 6.0), ("1e3", 6.0), (None, 6.0)],
)
def test_the_quiet_apps_bound_follows_the_batch_processors_schedule_delay(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, sink: Recording, setting: str | None, quiet_bound_s: float
) -> None:
    """Nothing else comes after a trace: it goes ``grace_s`` plus the processor's schedule delay
    after its root, the delay read from ``OTEL_BSP_SCHEDULE_DELAY`` (milliseconds) as the SDK's
    ``BatchSpanProcessor`` reads it: 5 s when unset or not an integer ("1500.0" too)."""
    if setting is None:
        monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    else:
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", setting)
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), grace_s=1.0, clock=clock)
    try:
        rec = Recorder()
        agent_trace(rec)
        exp.export(rec.spans())
        clock.advance(quiet_bound_s - 0.01)
        assert exp.tick() == 0
        clock.advance(0.01)
        assert exp.tick() == 1
    finally:
        exp.shutdown(timeout_millis=2000)


def test_a_span_given_a_future_end_time_completes_no_other_trace(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """The processor hands spans over in the order they ended, so the last one's end time says
    which traces have every child in: but not past the wall clock's now. A span an app ended
    with a timestamp an hour ahead must not complete a trace before its grace."""
    rec = Recorder()
    agent_trace(rec)
    exporter.export(rec.spans())
    hour_ahead = time.time_ns() + 3600 * 10**9
    rec.tracer.start_span("invoke_agent b", start_time=hour_ahead - 1).end(end_time=hour_ahead)
    exporter.export([s for s in rec.spans() if s.end_time == hour_ahead])
    clock.advance(1.0)
    assert exporter.tick() == 0
    clock.advance(1.0)
    assert exporter.tick() == 2  # both, at the grace (this fixture's processor delay is 0)


def test_a_batch_ending_in_a_future_span_moves_no_mark(clock: FakeClock, sink: Recording) -> None:
    """A batch cut after a span ended an hour ahead says nothing of the spans queued behind it
    (they ended after its ``on_end``, before now): the trace whose child is among them waits
    for it. (The mark was clamped to now and the trace went without the child, a late_span.)"""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), grace_s=2.0, processor_delay_s=5.0, clock=clock)
    try:
        rec = Recorder()
        wall = time.time_ns()
        root = rec.tracer.start_span("invoke_agent a", start_time=wall - 5 * 10**9)
        chat = rec.tracer.start_span(
            "chat m",
            context=set_span_in_context(root),
            start_time=wall - 4 * 10**9,
            attributes=chat_attributes("Hi?", "Hello."),
        )
        root.end(end_time=wall - 3 * 10**9)
        rec.tracer.start_span("invoke_agent x", start_time=wall).end(end_time=wall + 3600 * 10**9)
        chat.end(end_time=wall - 2_500_000_000)  # within the root's grace, queued behind x
        by_name = {s.name: s for s in rec.spans()}
        exp.export([by_name["invoke_agent a"], by_name["invoke_agent x"]])
        clock.advance(2.5)
        assert exp.tick() == 0
        exp.export([by_name["chat m"]])
        clock.advance(4.5)
        assert exp.tick() == 2  # a's trace and x's
        trace_id = format(root.get_span_context().trace_id, "032x")
        assert wait_for(lambda: any(r.trace_id == trace_id for r in sink.requests))
        (request,) = [r for r in sink.requests if r.trace_id == trace_id]
        assert {s.name for s in request.spans or []} == {"invoke_agent a", "chat m"}
        assert exp.stats()["dropped"] == {}
    finally:
        exp.shutdown(timeout_millis=2000)


def test_max_traces_completes_finished_traces_early(clock: FakeClock, sink: Recording) -> None:
    """Over max_traces a trace whose root ended is completed early (before its grace window),
    not dropped: the flusher ships it without force_flush or a clock move."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_traces=2, clock=clock)
    try:
        recs = [Recorder() for _ in range(3)]
        ids = [agent_trace(r, question=f"q{i}") for i, r in enumerate(recs)]
        for r in recs:
            exp.export(r.spans())
        assert wait_for(lambda: [r.trace_id for r in sink.requests] == ids[:1])
        assert exp.stats()["dropped"] == {}
        assert exp.stats()["traces_buffered"] == 2
        assert exp.force_flush(5000)
        assert sorted(r.trace_id for r in sink.requests) == sorted(ids)
    finally:
        exp.shutdown(2000)


def test_max_traces_drops_oldest_unfinished(clock: FakeClock, sink: Recording) -> None:
    """Over max_traces with no finished trace buffered, the oldest unfinished one is dropped
    and counted; its later spans (the root, even many traces later) are ignored, not shipped
    as a fragment run."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_traces=2, clock=clock)
    try:
        recs = [Recorder() for _ in range(40)]
        ids = [agent_trace(r, question=f"q{i}") for i, r in enumerate(recs)]
        for r in recs:  # children only: no root ended yet
            exp.export([s for s in r.spans() if s.name == "chat m"])
        assert exp.stats()["dropped"] == {"max_traces": 38}
        for r in recs:
            exp.export([s for s in r.spans() if s.name != "chat m"])
        assert exp.force_flush(5000)
        assert sorted(r.trace_id for r in sink.requests) == sorted(ids[38:])
        assert exp.stats()["dropped"] == {"max_traces": 38}
    finally:
        exp.shutdown(2000)


def test_span_names_count_against_the_buffer_and_queue_bounds(clock: FakeClock) -> None:
    """Content in span names (a prompt pasted into one): each span of 200 kB names was sized as if
    it had none, so with the sink stalled 300 such traces held 120 MB past bounds of 2 MiB. The
    name counts now: the buffer and the queue stay under their bounds, the rest is dropped."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    limit = 2 * 1024 * 1024
    release = threading.Event()
    exp = ScoringSpanExporter(
        [ScoringRule(["s"])],
        CallbackSink(lambda batch: release.wait(30)),  # stalled: the first batch never returns
        max_buffer_bytes=limit,
        max_queue_bytes=limit,
        batch_size=1,
        clock=clock,
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracer = provider.get_tracer("app")
    try:
        for _ in range(40):
            agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
            with (
                tracer.start_as_current_span("invoke_agent " + "n" * 100_000, attributes=agent),
                tracer.start_as_current_span("chat " + "m" * 100_000),
            ):
                pass
            assert exp.stats()["buffer_bytes"] <= limit
        exp.tick()
        clock.advance(60)
        exp.tick()
        stats = exp.stats()
        assert 0 < stats["queue_bytes"] <= limit, stats
        assert sum(stats["dropped"].values()) >= 40 - 1 - limit // 200_000, stats
    finally:
        release.set()
        exp.shutdown(2000)


def test_buffer_is_bounded_in_bytes(clock: FakeClock, sink: Recording) -> None:
    """max_buffer_bytes bounds the buffered records: large unfinished traces beyond it are
    dropped oldest first (counted), finished ones are handed off early instead."""
    big = 64 * 1024
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_buffer_bytes=4 * big, clock=clock)
    try:
        recs = [Recorder() for _ in range(8)]
        ids = [agent_trace(r, question=f"{i}" * big) for i, r in enumerate(recs)]
        for r in recs:  # children only: unfinished
            exp.export([s for s in r.spans() if s.name == "chat m"])
            assert exp.stats()["buffer_bytes"] <= 4 * big
        assert exp.stats()["dropped"] == {"max_buffer_bytes": 5}
        for r in recs[5:]:
            exp.export([s for s in r.spans() if s.name != "chat m"])
        assert exp.force_flush(5000)
        assert sorted(r.trace_id for r in sink.requests) == sorted(ids[5:])

        more = [Recorder() for _ in range(8)]
        ids = [agent_trace(r, question=f"{i}" * big) for i, r in enumerate(more)]
        for r in more:  # finished: completed early when the buffer is full, never dropped
            exp.export(r.spans())
        assert exp.stats()["dropped"] == {"max_buffer_bytes": 5}
        assert exp.force_flush(5000)
        assert {r.trace_id for r in sink.requests} >= set(ids)
        assert exp.stats()["buffer_bytes"] == 0
    finally:
        exp.shutdown(2000)


@pytest.mark.parametrize("with_a_number", [False, True])
def test_text_inside_a_sequence_attribute_counts_against_the_byte_bound(
    clock: FakeClock, sink: Recording, with_a_number: bool
) -> None:
    """A read attribute holding a tuple of strings was sized by its item count (and at 0 with a
    number among the read attributes): 2 MiB a trace went past max_buffer_bytes unseen, memory
    growing without bound. Its text counts now."""
    big = 256 * 1024
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_buffer_bytes=4 * big, clock=clock)
    try:
        for i in range(8):
            rec = Recorder()
            with (
                rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}),
                rec.span("chat m", {"gen_ai.operation.name": CHAT}) as chat,
            ):
                chat.set_attribute("gen_ai.output.messages", (f"{i}" * big,))  # a real sequence
                if with_a_number:
                    chat.set_attribute("gen_ai.conversation.id", 5)
            exp.export([s for s in rec.spans() if s.name == "chat m"])  # unfinished: no root yet
            assert exp.stats()["buffer_bytes"] <= 4 * big
        assert exp.stats()["dropped"] == {"max_buffer_bytes": 5}
    finally:
        exp.shutdown(2000)


def test_a_trace_over_the_byte_bound_alone_is_dropped_alone(clock: FakeClock, sink: Recording) -> None:
    """One trace larger than max_buffer_bytes is dropped (with its later spans), not the
    traces buffered beside it."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_buffer_bytes=64 * 1024, clock=clock)
    try:
        small = [Recorder() for _ in range(3)]
        ids = [agent_trace(r, question=f"q{i}") for i, r in enumerate(small)]
        for r in small:
            exp.export([s for s in r.spans() if s.name == "chat m"])
        huge = Recorder()
        agent_trace(huge, question="x" * 100_000)
        exp.export([s for s in huge.spans() if s.name == "chat m"])
        exp.export([s for s in huge.spans() if s.name != "chat m"])
        assert exp.stats()["dropped"] == {"max_buffer_bytes": 1}
        for r in small:
            exp.export([s for s in r.spans() if s.name != "chat m"])
        assert exp.force_flush(5000)
        assert sorted(r.trace_id for r in sink.requests) == sorted(ids)
    finally:
        exp.shutdown(2000)


def test_delayed_and_filtered_requests_count_against_the_byte_bound(clock: FakeClock, sink: Recording) -> None:
    """Requests held by delay_s, and runs read in the app for a filter, are within
    max_queue_bytes too: beyond it they are dropped as queue_bytes."""
    big = 64 * 1024
    for rule in (ScoringRule(["s"], delay_s=600), ScoringRule(["s"], filter=lambda run: True)):
        stuck = _Stuck()
        exp = ScoringSpanExporter([rule], CallbackSink(stuck), max_queue_bytes=4 * big, batch_size=1, clock=clock)
        try:
            for i in range(8):
                rec = Recorder()
                agent_trace(rec, question=f"{i}" * big)
                exp.export(rec.spans())
                exp.force_flush(0)
            stats = exp.stats()
            assert stats["queue_bytes"] <= 4 * big, stats
            assert stats["dropped"].get("queue_bytes", 0) >= 3, stats
        finally:
            stuck.release.set()
            exp.shutdown(2000)


class _Stuck:
    """A sink target that blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, batch: ScoreBatch) -> None:
        self.release.wait(10)


def test_max_spans_per_trace_drops_oldest_span(clock: FakeClock, sink: Recording) -> None:
    """Over max_spans_per_trace the trace's oldest span is dropped and counted."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_spans_per_trace=2, clock=clock)
    try:
        rec = Recorder()
        agent_trace(rec, tool=True)  # 3 spans: chat, tool, agent (export order = end order)
        exp.export(rec.spans())
        assert exp.stats()["dropped"] == {"max_spans_per_trace": 1}
        assert exp.force_flush(5000)
        # The chat span (oldest) is gone: the worker finds no LLM content left to read.
        (request,) = sink.requests
        assert [s.name for s in request.spans or []] == ["execute_tool t", "invoke_agent a"]
        with pytest.raises(TraceReadError) as err:
            read(request)
        assert err.value.reason == "no_content"
    finally:
        exp.shutdown(2000)


def _malformed_traces() -> Recorder:
    rec = Recorder()
    with rec.span("chat m", {"gen_ai.operation.name": CHAT, "gen_ai.input.messages": "{not json"}):
        pass
    with rec.span("chat m", {"gen_ai.operation.name": CHAT, "gen_ai.input.messages": genai_messages(("bot", "x"))}):
        pass
    return rec


def test_malformed_spans_are_shipped_unread(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """By default nothing is parsed in the app: unreadable traces go out, the worker names the error."""
    rec = _malformed_traces()
    assert exporter.export(rec.spans()) is SpanExportResult.SUCCESS
    assert exporter.force_flush(5000)
    assert exporter.stats()["errors"] == {}
    reasons = []
    for request in sink.requests:
        with pytest.raises(TraceReadError) as err:
            read(request)
        assert err.value.attribute == "gen_ai.input.messages"
        reasons.append(err.value.reason)
    assert sorted(reasons) == ["bad_json", "unknown_role"]


def test_malformed_spans_with_a_filter_are_counted_never_raised(clock: FakeClock, sink: Recording) -> None:
    """With a filter the trace is read in the app: unreadable ones are counted, named errors."""
    exp = ScoringSpanExporter([ScoringRule(["s"], filter=lambda run: True)], CallbackSink(sink), clock=clock)
    try:
        assert exp.export(_malformed_traces().spans()) is SpanExportResult.SUCCESS
        assert exp.force_flush(5000)
        assert exp.stats()["errors"] == {"bad_json": 1, "unknown_role": 1}
        assert sink.requests == []
    finally:
        exp.shutdown(2000)


def test_a_reader_crash_with_a_filter_loses_that_run_only(
    clock: FakeClock, sink: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a reader (an exception other than TraceReadError, as a Mastra tool call id that
    was a list once raised) costs the run it hit: its neighbours in the trace still ship, and it
    is counted and logged as read_failed, by ids and error type only. It dropped the whole
    trace as ``internal`` before."""
    from tracing.capture import _exporter

    real = _exporter.trace_to_run
    crashed: list[str] = []

    def reader(spans: Sequence[object], target: str) -> object:
        run = real(spans, target)  # type: ignore[arg-type]
        if run.identity.agent_name == "researcher":
            crashed.append(target)
            raise TypeError("unhashable type: 'list'")
        return run

    monkeypatch.setattr(_exporter, "trace_to_run", reader)
    exp = ScoringSpanExporter([ScoringRule(["s"], filter=lambda run: True)], CallbackSink(sink), clock=clock)
    try:
        rec = Recorder()
        three_agent_trace(rec)
        with structlog.testing.capture_logs() as logs:
            exp.export(rec.spans())
            clock.advance(60)
            assert exp.force_flush(5000)
        assert crashed
        runs = [run for request in sink.requests for run in read_runs(request)]
        assert sorted(run.identity.agent_name or "" for run in runs) == ["planner", "writer"]
        stats = exp.stats()
        assert stats["errors"] == {"read_failed": 1}, stats
        (line,) = [entry for entry in logs if entry["event"] == "trace_read_crashed"]
        assert line["span_id"] == crashed[0]
        assert line["error"] == "TypeError"
    finally:
        exp.shutdown(2000)


@pytest.mark.parametrize("error", [ValueError, ConnectionError])
def test_logs_never_quote_agent_content(clock: FakeClock, sink: Recording, error: type[Exception]) -> None:
    """Unreadable messages and a filter that raises are logged by reason, span and error type,
    never with the message text (agent content) the errors quote: a network error of the
    filter's (a moderation service's client failing on the run) was logged with its text, as a
    broker's is (log audit)."""
    marker = "customer-4711-private-text"

    def nosy(run: object) -> bool:
        raise error(f"cannot judge {run!r}")

    exp = ScoringSpanExporter([ScoringRule(["s"], filter=nosy)], CallbackSink(sink), clock=clock)
    try:
        rec = Recorder()
        with rec.span("chat m", {"gen_ai.operation.name": CHAT, "gen_ai.input.messages": "{" + marker}):
            pass
        readable = Recorder()
        agent_trace(readable, question=marker)
        with structlog.testing.capture_logs() as logs:
            exp.export([*rec.spans(), *readable.spans()])
            assert exp.force_flush(5000)
        assert exp.stats()["errors"] == {"bad_json": 1, "filter": 1}
        events = {entry["event"] for entry in logs}
        assert {"trace_unreadable", "rule_filter_failed"} <= events
        assert [e["error"] for e in logs if e["event"] == "rule_filter_failed"] == [error.__name__]
        assert marker not in repr(logs)
    finally:
        exp.shutdown(2000)


@pytest.mark.parametrize("last", [False, True], ids=["first", "last"])
def test_export_of_garbage_does_not_raise(exporter: ScoringSpanExporter, sink: Recording, last: bool) -> None:
    """A non-span in the batch gives FAILURE, one counted error and one log line naming one bad
    span; the good spans still count. (Last in the batch, where the end-time mark is read, the
    log said two.)"""
    rec = Recorder()
    agent_trace(rec)
    batch = [*rec.spans(), object()] if last else [object(), *rec.spans()]
    with structlog.testing.capture_logs() as logs:
        result = exporter.export(batch)  # type: ignore[arg-type]
    assert result is SpanExportResult.FAILURE
    assert exporter.stats()["errors"] == {"export": 1}
    assert [e["spans"] for e in logs if e["event"] == "exporter_export_failed"] == [1]
    assert exporter.force_flush(5000)
    assert len(sink.requests) == 1


def _independent_sample(trace_id: str, rate: float) -> bool:
    value = int(hashlib.sha256(trace_id.encode()).hexdigest()[:16], 16)
    return value < rate * 2**64


def test_sampling_is_deterministic_on_trace_id(clock: FakeClock, sink: Recording) -> None:
    """Exactly the traces whose sha256(trace_id) falls under the rate are scored."""
    exp = ScoringSpanExporter([ScoringRule(["s"], sample_rate=0.5)], CallbackSink(sink), clock=clock)
    try:
        ids = []
        for i in range(40):
            rec = Recorder()
            ids.append(agent_trace(rec, question=f"q{i}"))
            exp.export(rec.spans())
        assert exp.force_flush(5000)
        scored = {r.trace_id for r in sink.requests}
        expected = {t for t in ids if _independent_sample(t, 0.5)}
        assert scored == expected
        assert 0 < len(expected) < 40
        assert exp.stats()["skipped"] == {"sampled_out": 40 - len(expected)}
    finally:
        exp.shutdown(2000)


def test_sampled_edges_and_agreement() -> None:
    """sampled() matches an independent sha256 computation; rate 0 and 1 are absolute."""
    ids = [hashlib.md5(str(i).encode()).hexdigest() for i in range(500)]
    for t in ids:
        assert sampled(t, 0.3) == _independent_sample(t, 0.3)
    assert not any(sampled(t, 0.0) for t in ids)
    assert all(sampled(t, 1.0) for t in ids)
    assert 100 < sum(sampled(t, 0.3) for t in ids) < 200


def test_sampled_takes_any_string() -> None:
    """A malformed trace id (non-ASCII, a lone surrogate) is sampled deterministically, not an error."""
    for bad in ("zz-é-not-hex", "abc\udc80", ""):
        assert sampled(bad, 0.5) in (True, False)
        assert sampled(bad, 0.5) == sampled(bad, 0.5)


# A judge model's call, as the judge's own traffic records it.
_JUDGE_CHAT = chat_attributes("Rate this", '{"score": 1}')


def test_loop_guard_judge_root_trace(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """A trace rooted in a judge span (tracescore.role=judge) is never scored."""
    rec = Recorder()
    with (
        rec.span("judge helpfulness", {ROLE_ATTRIBUTE: JUDGE_ROLE}),
        rec.span("chat judge-model", _JUDGE_CHAT),
    ):
        pass
    exporter.export(rec.spans())
    assert exporter.force_flush(5000)
    assert sink.requests == []
    assert exporter.stats()["skipped"] == {"loop_guard": 1}
    assert exporter.stats()["traces_buffered"] == 0


def test_loop_guard_judge_subtree_inside_app_trace(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """In the embedded mode a judge span inside an app trace hides only its own subtree."""
    rec = Recorder()
    with rec.span("request"):
        agent_trace(rec, question="app question")
        with (
            rec.span("judge", {ROLE_ATTRIBUTE: JUDGE_ROLE}),
            rec.span(
                "chat judge",
                chat_attributes("judge prompt", "judge answer"),
            ),
        ):
            pass
    exporter.export(rec.spans())
    assert exporter.force_flush(5000)
    assert [read(r).input.input_messages[0].text for r in sink.requests] == ["app question"]
    # Only the agent's own subtree travels: neither the request root nor the judge's spans.
    assert sorted(s.name for s in sink.requests[0].spans or []) == ["chat m", "invoke_agent a"]


def _nested_agents(rec: Recorder) -> None:
    """An orchestrator agent (the root) calling a sub-agent, then working on with its own LLM."""
    with rec.span("invoke_agent outer", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "outer"}):
        with rec.span("invoke_agent sub", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "sub"}):
            pass
        with rec.span(
            "chat m",
            chat_attributes("plan the trip", "done"),
        ):
            pass


def test_a_sub_agent_ending_does_not_hand_its_callers_trace_over(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """An agent span's end set the trace due: a sub-agent that ended while its caller still
    worked handed the trace over alone, its caller's spans became late_span drops and the
    orchestrator's run was never scored. The root's end completes the trace."""
    rec = Recorder()
    _nested_agents(rec)
    sub = [s for s in rec.spans() if s.name == "invoke_agent sub"]
    exporter.export(sub)
    clock.advance(30)  # far past grace_s: the caller works on
    exporter.tick()
    assert sink.requests == []
    exporter.export([s for s in rec.spans() if s.name != "invoke_agent sub"])
    clock.advance(30)
    assert exporter.force_flush(5000)
    (request,) = sink.requests
    assert read(request).identity.agent_name == "outer"
    assert len(request.spans or []) == 3
    assert exporter.stats()["dropped"] == {}


def test_an_agent_under_a_judges_span_stays_the_judges_own_traffic(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """The judge's span ends after the spans under it: an agent span under it arriving more
    than grace_s earlier was handed over as the app's run before the loop guard saw the trace."""
    rec = Recorder()
    with (
        rec.span("judge helpfulness", {ROLE_ATTRIBUTE: JUDGE_ROLE}),
        rec.span("invoke_agent judge-agent", {"gen_ai.operation.name": "invoke_agent"}),
        rec.span("chat judge-model", _JUDGE_CHAT),
    ):
        pass
    exporter.export([s for s in rec.spans() if s.name != "judge helpfulness"])
    clock.advance(30)
    exporter.tick()
    exporter.export([s for s in rec.spans() if s.name == "judge helpfulness"])
    assert exporter.force_flush(5000)
    assert sink.requests == []
    assert exporter.stats()["skipped"] == {"loop_guard": 1}


def test_agent_runs_under_a_root_that_never_ends_go_at_max_trace_age(clock: FakeClock, sink: Recording) -> None:
    """A long-lived root (a session's span): its agent runs are handed over once the trace is
    max_trace_age_s old, not dropped; a trace without an ended agent span still is."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_trace_age_s=60, clock=clock)
    try:
        rec = Recorder()
        with rec.span("session"):
            agent_trace(rec, question="first")
        exp.export([s for s in rec.spans() if s.name != "session"])  # the session never ends
        lone = Recorder()
        with lone.span("request"), lone.span("db query"):
            pass
        exp.export([s for s in lone.spans() if s.name == "db query"])
        clock.advance(30)
        exp.tick()
        assert exp.stats()["traces_buffered"] == 2  # its root may still end: waited for
        clock.advance(31)
        exp.tick()
        assert exp.force_flush(5000)
        assert [read(r).input.input_messages[0].text for r in sink.requests] == ["first"]
        assert exp.stats()["dropped"] == {"max_trace_age": 1}
    finally:
        exp.shutdown(2000)


def test_loop_guard_own_service(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """Spans from tracescore's own service or tracer scope exclude their trace."""
    for rec in (Recorder(service="tracescore-worker"), Recorder(scope="tracescore.score_writer")):
        agent_trace(rec)
        exporter.export(rec.spans())
    assert exporter.force_flush(5000)
    assert sink.requests == []
    assert exporter.stats()["skipped"] == {"loop_guard": 2}


def test_rules_filter_union_and_delay(clock: FakeClock, sink: Recording) -> None:
    """A filter makes the app read the run; rules merge scorer ids; delay_s holds a request back."""
    rules = [
        ScoringRule(["a", "b"]),
        ScoringRule(["b", "c"], filter=lambda run: "refund" in (run.input.input_messages[0].text)),
        ScoringRule(["slow"], delay_s=60),
    ]
    exp = ScoringSpanExporter(rules, CallbackSink(sink), clock=clock)
    try:
        rec = Recorder()
        agent_trace(rec, question="I want a refund")
        exp.export(rec.spans())
        assert exp.force_flush(5000)
        assert [r.scorer_ids for r in sink.requests] == [["a", "b", "c"]]
        # The filter read the run here; it travels as span records all the same.
        assert read(sink.requests[0]).input.input_messages[0].text == "I want a refund"
        assert exp.stats()["runs_read_in_app"] == 1
        assert exp.stats()["delayed"] == 1
        clock.advance(61)
        exp.tick()
        assert wait_for(lambda: len(sink.requests) == 2)
        assert sink.requests[1].scorer_ids == ["slow"]
    finally:
        exp.shutdown(2000)


def test_filter_rejecting_and_raising(clock: FakeClock, sink: Recording) -> None:
    """A filter that rejects skips the run; one that raises is counted, not propagated."""

    def boom(run: object) -> bool:
        raise RuntimeError("bad filter")

    exp = ScoringSpanExporter(
        [ScoringRule(["a"], filter=lambda run: False), ScoringRule(["b"], filter=boom)], CallbackSink(sink), clock=clock
    )
    try:
        rec = Recorder()
        agent_trace(rec)
        exp.export(rec.spans())
        assert exp.force_flush(5000)
        assert sink.requests == []
        assert exp.stats()["skipped"] == {"filtered_out": 1}
        assert exp.stats()["errors"] == {"filter": 1}
    finally:
        exp.shutdown(2000)


def test_queue_full_drops_without_blocking(clock: FakeClock) -> None:
    """With the sink stuck, export and completion never block; overflow is dropped and counted."""
    release = threading.Event()
    got: list[ScoreBatch] = []

    def stuck(batch: ScoreBatch) -> None:
        release.wait(10)
        got.append(batch)

    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(stuck), queue_size=2, batch_size=1, clock=clock)
    try:
        for i in range(6):
            rec = Recorder()
            agent_trace(rec, question=f"q{i}")
            assert exp.export(rec.spans()) is SpanExportResult.SUCCESS
        assert exp.force_flush(200) is False  # the sink is stuck: the deadline wins
        stats = exp.stats()
        assert stats["runs_found"] == 6
        assert stats["dropped"]["queue_full"] >= 3
        assert stats["runs_enqueued"] + stats["dropped"]["queue_full"] == 6
        release.set()
        assert wait_for(lambda: exp.stats()["runs_sent"] == stats["runs_enqueued"])
    finally:
        release.set()
        exp.shutdown(2000)


def test_sink_failures_are_retried(clock: FakeClock) -> None:
    """A sink that fails twice then succeeds gets the batch delivered; failures are counted."""
    calls: list[int] = []

    def flaky(batch: ScoreBatch) -> None:
        calls.append(len(batch.requests))
        if len(calls) < 3:
            raise ConnectionError("broker down")

    exp = ScoringSpanExporter(
        [ScoringRule(["s"])], CallbackSink(flaky), retry_initial_s=0.01, retry_max_s=0.02, clock=clock
    )
    try:
        rec = Recorder()
        agent_trace(rec)
        exp.export(rec.spans())
        assert exp.force_flush(5000)
        assert len(calls) == 3
        assert exp.stats()["send_failures"] == 2
        assert exp.stats()["runs_sent"] == 1
    finally:
        exp.shutdown(2000)


def test_sender_survives_a_request_it_cannot_build(
    clock: FakeClock, sink: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose requests cannot be built is dropped and counted; the sender sends the next one."""
    import tracing.capture._sender as exporter_module

    real = exporter_module.spans_request
    calls: list[int] = []

    def breaks_once(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("cannot build")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(exporter_module, "spans_request", breaks_once)
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), clock=clock)
    try:
        for _ in range(2):
            rec = Recorder()
            agent_trace(rec)
            exp.export(rec.spans())
            assert exp.force_flush(5000)
        stats = exp.stats()
        assert stats["dropped"] == {"send_failed": 1}
        assert stats["errors"] == {"send": 1}
        assert (stats["runs_sent"], stats["queue_depth"]) == (1, 0)
        assert len(sink.requests) == 1
    finally:
        exp.shutdown(2000)


def test_shutdown_sends_delayed_and_counts_incomplete(clock: FakeClock, sink: Recording) -> None:
    """shutdown() sends delayed requests now and counts traces whose root never ended."""
    exp = ScoringSpanExporter([ScoringRule(["s"], delay_s=600)], CallbackSink(sink), clock=clock)
    rec = Recorder()
    agent_trace(rec)
    exp.export(rec.spans())
    exp.force_flush(5000)
    assert sink.requests == []
    rec2 = Recorder()
    agent_trace(rec2)
    child_only = [s for s in rec2.spans() if s.name == "chat m"]
    exp.export(child_only)
    exp.shutdown(5000)
    assert len(sink.requests) == 1
    assert exp.stats()["dropped"] == {"shutdown_incomplete_trace": 1}
    assert exp.export(rec.spans()) is SpanExportResult.FAILURE


def test_shutdown_sends_a_delayed_run_of_a_trace_it_completes(clock: FakeClock, sink: Recording) -> None:
    """A trace still in its grace window at shutdown is completed there; its delay_s run is sent
    too, not left in the delay heap uncounted."""
    exp = ScoringSpanExporter([ScoringRule(["s"], delay_s=600)], CallbackSink(sink), clock=clock)
    rec = Recorder()
    agent_trace(rec)
    exp.export(rec.spans())
    exp.shutdown(5000)
    assert len(sink.requests) == 1
    stats = exp.stats()
    assert (stats["runs_sent"], stats["delayed"], stats["dropped"]) == (1, 0, {})


def test_shutdown_with_stuck_sink_keeps_its_deadline(clock: FakeClock) -> None:
    """shutdown() as the SDK calls it (no timeout) gives up after shutdown_timeout_s, counting."""
    release = threading.Event()
    exp = ScoringSpanExporter(
        [ScoringRule(["s"])], CallbackSink(lambda b: release.wait(30)), shutdown_timeout_s=0.2, clock=clock
    )
    try:
        for i in range(3):
            rec = Recorder()
            agent_trace(rec, question=f"q{i}")
            exp.export(rec.spans())
        exp.shutdown()
        stats = exp.stats()
        assert stats["runs_sent"] == 0
        assert stats["dropped"] == {"shutdown_unsent": 3}
    finally:
        release.set()


def test_bad_arguments_raise_at_once() -> None:
    """Bad rules or bounds are refused when the exporter is built."""
    sink = CallbackSink(lambda b: None)
    with pytest.raises(ValueError, match="ScoringRule"):
        ScoringSpanExporter([], sink)
    with pytest.raises(ValueError, match="max_traces"):
        ScoringSpanExporter([ScoringRule(["s"])], sink, max_traces=0)
    with pytest.raises(ValueError, match="sample_rate"):
        ScoringRule(["s"], sample_rate=1.5)
    with pytest.raises(TypeError, match="list of scorer ids"):
        ScoringRule("s")
    with pytest.raises(ValueError, match="non-empty"):
        ScoringRule([])
    # The workers refuse a request naming more scorers than MAX_SCORER_IDS: rules whose ids
    # together (those of one delay travel in one request) pass it would ship nothing scorable.
    many = [f"s{i}" for i in range(MAX_SCORER_IDS + 1)]
    with pytest.raises(ValueError, match=f"{MAX_SCORER_IDS + 1} scorer ids .*delay_s=0.*at most {MAX_SCORER_IDS}"):
        ScoringSpanExporter([ScoringRule(many[:60]), ScoringRule(many[40:])], sink)
    ScoringSpanExporter([ScoringRule(many[:60]), ScoringRule(many[40:], delay_s=5)], sink).shutdown()
    ScoringSpanExporter([ScoringRule(many[:MAX_SCORER_IDS] + many[:3])], sink).shutdown()


def test_default_path_ships_compact_spans(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """Without a filter the run's spans travel unread, keeping only what the transform reads."""
    rec = Recorder(service="shop-app", scope="shop.agent")
    chat_attrs = {**chat_attributes("Hi?", "Hello."), "gen_ai.usage.input_tokens": 12}
    agent_attrs = {"gen_ai.operation.name": "invoke_agent", "http.route": "/chat"}
    with rec.span("invoke_agent a", agent_attrs) as root, rec.span("chat m", chat_attrs) as chat:
        chat.add_event("exception", {"exception.message": "not read"})
        chat.add_event("gen_ai.choice", {"index": 0})
    exporter.export(rec.spans())
    assert exporter.force_flush(5000)
    (request,) = sink.requests
    assert request.target_span_ids[0] == format(root.get_span_context().span_id, "016x")
    spans = {s.name: s for s in request.spans or []}
    assert spans["invoke_agent a"].attributes == {"gen_ai.operation.name": "invoke_agent"}
    assert set(spans["chat m"].attributes) == {
        "gen_ai.operation.name",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
    }
    assert [e.name for e in spans["chat m"].events] == ["gen_ai.choice"]
    assert (spans["chat m"].service_name, spans["chat m"].scope_name) == ("shop-app", "shop.agent")
    assert spans["chat m"].parent_span_id == request.target_span_ids[0]
    assert read(request).output.text == "Hello."
    assert exporter.stats()["runs_read_in_app"] == 0


def test_each_top_level_agent_ships_its_own_subtree(exporter: ScoringSpanExporter, sink: Recording) -> None:
    """Two agents under one request root: one request naming both, carrying their spans once
    (not the root's), each run read from its own agent's spans only."""
    rec = Recorder()
    with rec.span("request"):
        agent_trace(rec, question="first")
        with rec.span("invoke_agent outer", {"gen_ai.operation.name": "invoke_agent"}):
            agent_trace(rec, question="nested")  # a sub-agent: part of the outer agent's run
            with rec.span(
                "chat m",
                chat_attributes("second", "ok"),
            ):
                pass
    exporter.export(rec.spans())
    assert exporter.force_flush(5000)
    (request,) = sink.requests
    assert sorted(s.name for s in request.spans) == sorted(
        ["chat m", "invoke_agent a", "chat m", "chat m", "invoke_agent a", "invoke_agent outer"]
    )
    first, outer = request.target_span_ids
    assert [request.targets()[t].name for t in (first, outer)] == ["invoke_agent a", "invoke_agent outer"]
    by_target = request.run_spans()
    assert sorted(s.name for s in by_target[first]) == ["chat m", "invoke_agent a"]
    assert sorted(s.name for s in by_target[outer]) == ["chat m", "chat m", "invoke_agent a", "invoke_agent outer"]
    assert [run.input.input_messages[0].text for run in read_runs(request)] == ["first", "second"]
    assert exporter.stats()["runs_found"] == 2
    assert exporter.stats()["runs_sent"] == 2


class _Capped(Recording):
    """A sink with a message cap that takes requests encoded (as CelerySink does)."""

    def __init__(self, max_payload_bytes: int) -> None:
        super().__init__()
        self.max_payload_bytes = max_payload_bytes

    def send(self, batch: ScoreBatch) -> None:
        raise AssertionError("a capped sink gets encoded requests")

    def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        assert list(requests_json) == [request_json(r) for r in batch.requests]
        assert sum(len(j) + 1 for j in requests_json) <= self.max_payload_bytes - MESSAGE_ENVELOPE_BYTES
        self(batch)


def _padded_three_agents(rec: Recorder, sizes: Sequence[int]) -> None:
    """Three agent runs under a workflow span, their answers ``sizes`` characters long."""
    with rec.span("workflow"):
        for (name, question), size in zip(THREE_AGENTS, sizes, strict=True):
            attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            chat = chat_attributes(question, "x" * size)
            with rec.span(f"invoke_agent {name}", attrs), rec.span("chat m", chat):
                pass


def test_a_trace_of_three_runs_is_one_request_unless_too_large_together(clock: FakeClock) -> None:
    """Under a 64 KB cap: three small runs of one trace go as one request of three targets; runs
    too large together go one request each (each with its own spans), and only a run too
    large alone is dropped (``too_large``)."""
    for sizes, shipped, dropped in (
        ((100, 200, 300), [["planner", "researcher", "writer"]], {}),
        ((40_000, 100, 40_000), [["planner"], ["researcher"], ["writer"]], {}),
        ((100_000, 100, 20_000), [["researcher"], ["writer"]], {"too_large": 1}),
    ):
        sink = _Capped(64 * 1024)
        exp = ScoringSpanExporter([ScoringRule(["s"])], sink, grace_s=0.0, clock=clock)
        try:
            rec = Recorder()
            _padded_three_agents(rec, sizes)
            exp.export(rec.spans())
            assert exp.force_flush(5000)
            stats = exp.stats()
        finally:
            exp.shutdown(2000)
        names = {r.span_id: r.name.removeprefix("invoke_agent ") for q in sink.requests for r in q.spans}
        assert [[names[t] for t in r.target_span_ids] for r in sink.requests] == shipped
        for request in sink.requests:  # each carries its runs' spans, no one else's
            targets = request.target_span_ids
            assert sorted(s.name for s in request.spans) == sorted(
                [f"invoke_agent {names[t]}" for t in targets] + ["chat m"] * len(targets)
            )
        questions = dict(THREE_AGENTS)
        assert [r.input.input_messages[0].text for q in sink.requests for r in read_runs(q)] == [
            questions[n] for targets in shipped for n in targets
        ]
        assert (stats["runs_sent"], stats["dropped"]) == (3 - len(dropped), dropped)


def test_nothing_is_sent_after_shutdown(clock: FakeClock) -> None:
    """With the broker down, shutdown() stops the sender at its deadline: no attempt after it."""
    attempts: list[int] = []

    def down(batch: ScoreBatch) -> None:  # like a broker connect that times out
        attempts.append(len(batch.requests))
        time.sleep(0.05)
        raise ConnectionError("broker down")

    exp = ScoringSpanExporter(
        [ScoringRule(["s"])], CallbackSink(down), batch_size=1, retry_initial_s=0.01, retry_max_s=0.02, clock=clock
    )
    for i in range(4):
        rec = Recorder()
        agent_trace(rec, question=f"q{i}")
        exp.export(rec.spans())
    assert exp.force_flush(100) is False
    assert wait_for(lambda: len(attempts) >= 3)
    exp.shutdown(200)
    assert not exp._sender.is_alive()
    assert not exp._flusher.is_alive()
    made = len(attempts)
    stats = exp.stats()
    assert stats["runs_sent"] == 0
    assert stats["dropped"] == {"shutdown_unsent": 4}  # each counted once
    assert stats["queue_depth"] == 0
    # Both threads are gone, so no attempt can follow; one more export is refused outright.
    assert exp.export(Recorder().spans()) is SpanExportResult.FAILURE
    assert len(attempts) == made


def test_spans_handed_over_after_shutdown_are_counted() -> None:
    """An app that shuts the exporter down before its provider (to read the final stats): the
    spans its BatchSpanProcessor still held went nowhere, uncounted and unlogged. They are
    dropped as after_shutdown."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    sent: list[ScoreBatch] = []
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sent.append))
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exp, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("app")
    for i in range(4):
        with tracer.start_as_current_span(f"invoke_agent a{i}", attributes={"gen_ai.operation.name": "invoke_agent"}):
            pass
    exp.shutdown(1000)
    provider.shutdown()  # the processor hands its 4 spans over now
    assert sent == []
    assert exp.stats()["dropped"] == {"after_shutdown": 4}


def test_force_flush_racing_shutdown_is_answered() -> None:
    """force_flush hands its pass to the flusher: a flusher that stopped for a shutdown before
    taking the ticket left force_flush waiting its whole timeout, then False (241 of 300 races).
    With nothing held it answers True, from this thread's pass when the flusher is gone; and a
    rule's filter that calls it gets False at once (the pass is its own)."""
    answers: list[bool] = []
    for _ in range(60):
        exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(lambda batch: None))
        go = threading.Barrier(2)

        def flush(exp: ScoringSpanExporter = exp, go: threading.Barrier = go) -> None:
            go.wait()
            answers.append(exp.force_flush(10_000))

        caller = threading.Thread(target=flush)
        caller.start()
        go.wait()
        exp.shutdown(1000)
        caller.join(30)
    assert answers == [True] * 60

    asked: list[bool] = []
    exp = ScoringSpanExporter([ScoringRule(["s"], filter=lambda run: asked.append(exp.force_flush(10_000)) or True)],
                              CallbackSink(lambda batch: None))  # fmt: skip
    rec = Recorder()
    agent_trace(rec)
    exp.export(rec.spans())
    try:
        assert exp.force_flush(10_000) is True
        assert asked == [False]
    finally:
        exp.shutdown(1000)

    # The same from shutdown's own pass, in the app's thread (the flusher waits on that pass).
    asked.clear()
    sent: list[int] = []
    exp = ScoringSpanExporter(
        [ScoringRule(["s"], filter=lambda run: asked.append(exp.force_flush(10_000)) or True)],
        CallbackSink(lambda batch: sent.append(len(batch.requests))),
        grace_s=600,
        flush_interval_s=3600,
    )
    rec = Recorder()
    agent_trace(rec)
    exp.export(rec.spans())
    exp.shutdown(5000)
    assert asked == [False]
    assert sent == [1]


def test_batches_are_split_by_size(clock: FakeClock, sink: Recording) -> None:
    """Span-carrying requests go in batches of about max_batch_bytes, never one run split."""
    exp = ScoringSpanExporter([ScoringRule(["s"])], CallbackSink(sink), max_batch_bytes=6000, clock=clock)
    try:
        for i in range(6):
            rec = Recorder()
            agent_trace(rec, question=f"q{i} " + "x" * 1500)
            exp.export(rec.spans())
        assert exp.force_flush(5000)
        assert len(sink.requests) == 6
        assert all(1 <= len(b.requests) <= 3 for b in sink.batches)
        assert len(sink.batches) >= 2
        assert exp.stats()["batches_sent"] == len(sink.batches)
        assert all(len(b.model_dump_json()) <= 6000 or len(b.requests) == 1 for b in sink.batches)
    finally:
        exp.shutdown(2000)


def test_one_trace_under_the_same_scorers_at_two_delays_never_names_a_run_twice() -> None:
    """Two rules with the same scorers at two delays: a trace's two runs go once per rule. With
    the sender held up by a slow broker, both groups are queued side by side and taken in one
    batch; each must stay its own request (a request naming a run twice is refused whole by
    the worker, losing the other requests of its message)."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    gate = threading.Event()
    sent: list[str] = []

    def slow_broker(batch: ScoreBatch) -> None:
        sent.append(batch.model_dump_json())
        if len(sent) == 1:
            gate.wait(10)

    clock = FakeClock()
    exporter = ScoringSpanExporter(
        [ScoringRule(["s"]), ScoringRule(["s"], delay_s=5)],
        CallbackSink(slow_broker),
        grace_s=0.0,
        clock=clock,
        flush_interval_s=60,
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")

    def agent(name: str) -> None:
        attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
        with tracer.start_as_current_span(f"invoke_agent {name}", attributes=attrs):
            chat = chat_attributes(name, "ok")
            with tracer.start_as_current_span("chat m", attributes=chat):
                pass

    try:
        agent("warmup")
        exporter.tick()  # the first batch: the broker holds it
        assert wait_for(lambda: len(sent) == 1, 5)
        clock.advance(6)
        exporter.tick()
        # Two agents, each a local root (their parent is remote): one trace of two runs.
        remote = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=TraceFlags(1))
        token = otel_context.attach(otel.set_span_in_context(NonRecordingSpan(remote)))
        try:
            agent("A")
            agent("B")
        finally:
            otel_context.detach(token)
        exporter.tick()  # the runs without delay: queued behind the held batch
        clock.advance(6)
        exporter.tick()  # the delayed ones come due: queued right after them
        gate.set()
        exporter.force_flush(5000)
    finally:
        gate.set()
        provider.shutdown()
    requests = [r for raw in sent for r in ScoreBatch.model_validate_json(raw).requests]  # the worker's check
    for request in requests:
        assert len(set(request.target_span_ids)) == len(request.target_span_ids)
    abc = [r for r in requests if r.trace_id == format(0xABC, "032x")]
    assert sorted(len(r.target_span_ids) for r in abc) == [2, 2]
    assert exporter.stats()["runs_sent"] == 6
    assert not exporter.stats()["dropped"]


def test_a_span_time_otlp_cannot_carry_is_refused_and_its_batch_still_goes(
    exporter: ScoringSpanExporter, clock: FakeClock, sink: Recording
) -> None:
    """A span timed outside OTLP's fixed64 (an app's clock in the wrong unit, a negative
    time) is a bad span, counted: shipped, it failed the OTLP sink's encoding of every score
    written beside its own. The trace beside it in the batch goes, and what goes validates."""
    rec = Recorder()
    good = agent_trace(rec)
    # Not a Recorder's: conftest checks each Recorder's traces read the same once shipped.
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "b"}
    for start, end in ((-5, 10), (2**70, 2**70 + 1)):
        provider.get_tracer("t").start_span("invoke_agent b", attributes=attrs, start_time=start).end(end_time=end)
    assert exporter.export([*rec.spans(), *memory.get_finished_spans()]) is SpanExportResult.FAILURE
    clock.advance(2.5)
    exporter.tick()
    assert wait_for(lambda: len(sink.requests) == 1)
    (request,) = sink.requests
    assert request.trace_id == good
    assert ScoreRequest.model_validate_json(request_json(request)).trace_id == good
    assert exporter.stats()["errors"] == {"export": 2}
