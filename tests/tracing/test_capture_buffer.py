"""TraceBuffer alone: a pure, clock-driven buffer (no threads, no sleeps; the time is an argument)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from tests.tracing._spans import Recorder, agent_trace
from tracing import ScoringRule
from tracing._markers import JUDGE_ROLE, ROLE_ATTRIBUTE
from tracing._rules import sampled
from tracing.capture._buffer import BufferLimits, TraceBuffer
from tracing.capture._tally import Tally

RULES = [ScoringRule(["s"])]


def _buffer(reserve: object = None, **limits: float) -> tuple[TraceBuffer, Tally]:
    """A buffer whose quiet-app bound is the grace alone (``processor_delay_s`` 0) unless a test
    says otherwise: these spans come one by one, as from a ``SimpleSpanProcessor``."""
    limits.setdefault("processor_delay_s", 0.0)
    tally = Tally()
    return TraceBuffer(RULES, BufferLimits(**limits), tally, reserve=reserve), tally  # type: ignore[arg-type]


def _trace(question: str = "Hi?") -> list[ReadableSpan]:
    rec = Recorder()
    agent_trace(rec, question=question)
    return rec.spans()  # children first, the agent root last


def _file(buffer: TraceBuffer, spans: list[ReadableSpan], now: float) -> None:
    for span in spans:
        buffer.add(span, now)


def _ids(polled_traces: list[object]) -> list[str]:
    return [t.trace_id for t in polled_traces]  # type: ignore[attr-defined]


def test_in_a_quiet_app_a_trace_is_handed_over_grace_and_processor_delay_after_its_root() -> None:
    """Nothing else comes: not before ``grace_s + processor_delay_s`` after the root arrived
    (a child that ended within the grace may still be held by the processor); then once, with
    every span."""
    buffer, _ = _buffer(grace_s=2.0, processor_delay_s=5.0)
    spans = _trace()
    _file(buffer, spans, now=100.0)
    buffer.delivered(spans[-1].end_time or 0)
    assert buffer.poll(106.9).traces == []
    (trace,) = buffer.poll(107.0).traces
    assert len(trace.spans) == len(spans)
    assert buffer.poll(500.0).traces == []
    assert (len(buffer), buffer.bytes) == (0, 0)


def test_a_trace_is_complete_once_a_span_that_ended_grace_after_its_root_arrives() -> None:
    """The processor hands spans over in the order they ended: once it delivered one that ended
    ``grace_s`` after the root, every child that ended within the grace is in. The trace goes at
    ``grace_s`` after its root arrived, not at the quiet app's bound (``processor_delay_s`` more)."""
    buffer, _ = _buffer(grace_s=2.0, processor_delay_s=5.0)
    spans = _trace()
    _file(buffer, spans, now=100.0)
    root_end = spans[-1].end_time or 0
    buffer.delivered(root_end + 1_999_999_999)
    assert buffer.poll(102.0).traces == []
    buffer.delivered(root_end + 2_000_000_000)
    assert buffer.poll(101.9).traces == []  # never sooner than grace_s after the root arrived
    (trace,) = buffer.poll(102.0).traces
    assert len(trace.spans) == len(spans)


def test_a_root_given_a_past_end_time_still_gets_its_grace() -> None:
    """A root ended with an end time seconds in the past (or a wall clock stepped back), the
    mark already past it: the trace still waits ``grace_s`` after the root arrived, for a child
    the processor still holds. (The mark alone handed it over at the next poll.)"""
    buffer, tally = _buffer(grace_s=2.0, processor_delay_s=5.0)
    *children, root = _trace()
    buffer.add(root, 10.0)
    buffer.delivered((root.end_time or 0) + 10 * 10**9)
    assert buffer.poll(11.9).traces == []
    _file(buffer, children, now=11.95)
    (trace,) = buffer.poll(12.0).traces
    assert len(trace.spans) == 1 + len(children)
    assert tally.dropped == {}


def test_an_infinite_grace_completes_only_on_force() -> None:
    """``grace_s=inf`` (accepted before the mark existed): no poll completes the trace, force does."""
    buffer, _ = _buffer(grace_s=float("inf"), processor_delay_s=5.0)
    spans = _trace()
    _file(buffer, spans, now=0.0)
    buffer.delivered(2**62)
    assert buffer.poll(1e12).traces == []
    assert len(buffer.poll(1e12, force=True).traces) == 1


def test_a_child_in_the_processors_next_batch_is_kept() -> None:
    """A child that ended just after its root, held by the processor for its next batch (5 s
    later), past ``grace_s`` after the root arrived: still in the run, and no late_span. (The
    grace used to be timed from the root's arrival alone.)"""
    buffer, tally = _buffer(grace_s=2.0, processor_delay_s=5.0)
    *children, root = _trace()
    buffer.add(root, 10.0)
    buffer.delivered(root.end_time or 0)
    assert buffer.poll(12.5).traces == []
    _file(buffer, children, now=15.0)  # the next batch: as if the children ended 0.5 s after the root
    buffer.delivered((root.end_time or 0) + 500_000_000)
    (trace,) = buffer.poll(17.0).traces
    assert len(trace.spans) == 1 + len(children)
    assert tally.dropped == {}


def test_a_child_ending_after_its_root_within_grace_is_kept() -> None:
    """The root first, a late child inside the grace window: both in the run."""
    buffer, _ = _buffer(grace_s=2.0)
    *children, root = _trace()
    buffer.add(root, 10.0)
    _file(buffer, children, now=11.5)
    (trace,) = buffer.poll(12.0).traces
    assert len(trace.spans) == 1 + len(children)


def test_a_span_ending_after_the_hand_off_opens_no_fragment() -> None:
    """After a trace is handed over (in time, or early from a full buffer) a straggler span of
    it is one late_span drop: it never holds a slot until max_trace_age."""
    buffer, tally = _buffer(grace_s=2.0, max_trace_age_s=300.0, max_traces=1)
    *children, root = _trace("first")
    _file(buffer, [*children[1:], root], now=10.0)
    assert len(buffer.poll(12.0).traces) == 1
    buffer.add(children[0], 12.5)  # a straggler of the trace just sent
    assert len(buffer) == 0
    *other_children, other_root = _trace("second")
    _file(buffer, [*other_children[1:], other_root], now=20.0)
    _file(buffer, _trace("third"), now=20.5)  # full: "second" is completed early
    assert buffer.poll(20.5).early == 1
    buffer.add(other_children[0], 21.0)  # a straggler inside second's cut-short grace window
    assert _ids(buffer.poll(23.0).traces) != []  # third, in time
    assert len(buffer) == 0
    buffer.poll(1000.0)
    assert tally.dropped == {"late_span": 2}


def _called(n: int) -> list[ReadableSpan]:
    """A call into this service within a distributed trace: a local root under a remote parent,
    one child; children first."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    caller = NonRecordingSpan(SpanContext(n + 1, 0x1111, is_remote=True, trace_flags=TraceFlags(1)))
    rec = Recorder()
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    with (
        rec.tracer.start_as_current_span("invoke_agent a", context=set_span_in_context(caller), attributes=agent),
        rec.tracer.start_as_current_span("chat m"),
    ):
        pass
    return rec.spans()


def test_a_trace_whose_own_root_went_keeps_no_ids_and_its_stragglers_are_late() -> None:
    """A trace handed over with its own root (no parent): nothing else of it can be another
    local root, so any later span of it is late, whatever its parent."""
    buffer, tally = _buffer(grace_s=0.0)
    child, root = _trace("whole")
    _file(buffer, [root], now=0.0)
    assert len(buffer.poll(0.0).traces) == 1
    buffer.add(child, 1.0)
    assert (len(buffer), tally.dropped) == (0, {"late_span": 1})


def test_the_span_ids_remembered_of_handed_over_traces_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """What was handed over of a trace that may have another local root is remembered by span
    id (a straggler under those spans is late), up to a bound in ids: the oldest traces go
    first. A straggler of one forgotten opens a fragment, as one of a trace never seen would;
    of one remembered, it is a late_span."""
    import tracing.capture._buffer as buffer_module

    monkeypatch.setattr(buffer_module, "_SENT_IDS_KEPT", 2)  # two parts handed over with their root alone
    buffer, tally = _buffer(grace_s=0.0)
    calls = [_called(i) for i in range(3)]
    for i, (_child, root) in enumerate(calls):
        _file(buffer, [root], now=float(i))
        assert len(buffer.poll(float(i)).traces) == 1
    buffer.add(calls[0][0], 10.0)  # forgotten: a fragment of its own
    buffer.add(calls[2][0], 10.0)  # remembered: late
    assert len(buffer) == 1
    assert tally.dropped == {"late_span": 1}


def test_force_hands_over_ended_traces_only() -> None:
    """force skips the grace window, never a trace whose root has not ended."""
    buffer, _ = _buffer(grace_s=60.0)
    done = _trace("done")
    *unfinished, _root = _trace("open")
    _file(buffer, done, 0.0)
    _file(buffer, unfinished, 0.0)
    polled = buffer.poll(0.0, force=True)
    assert len(polled.traces) == 1
    assert len(buffer) == 1


def test_an_unfinished_trace_expires_and_its_late_spans_are_ignored() -> None:
    """max_trace_age_s without a root: dropped, and its root arriving later starts nothing."""
    buffer, tally = _buffer(max_trace_age_s=30.0, grace_s=0.0)
    *children, root = _trace()
    _file(buffer, children, 0.0)
    assert buffer.poll(29.9).traces == []
    assert buffer.poll(30.0).traces == []
    assert tally.dropped == {"max_trace_age": 1}
    buffer.add(root, 31.0)
    assert buffer.poll(40.0).traces == []
    assert len(buffer) == 0


def test_full_buffer_completes_the_oldest_ended_trace_early() -> None:
    """At max_traces, the oldest trace whose root ended goes early (room reserved downstream)."""
    reserved: list[int] = []

    def reserve(size: int) -> str | None:
        reserved.append(size)
        return None

    buffer, tally = _buffer(reserve, max_traces=2, grace_s=60.0)
    first, second, third = _trace("1"), _trace("2"), _trace("3")
    _file(buffer, first, 0.0)
    _file(buffer, second, 0.0)
    buffer.wake = False
    _file(buffer, third, 0.0)
    assert buffer.wake  # worth a poll at once
    polled = buffer.poll(0.0)
    assert (polled.early, len(polled.traces)) == (1, 1)
    assert polled.early_bytes == reserved[0] > 0
    assert polled.traces[0].trace_id == format(first[0].context.trace_id, "032x")  # type: ignore[union-attr]
    assert tally.dropped == {}
    assert len(buffer) == 2


def test_full_buffer_drops_the_early_trace_when_the_queue_has_no_room() -> None:
    """The hand-off queue is full: the early trace is dropped, counted as a trace under the
    buffer's reason (the queue's reasons count runs, and this trace's were never planned)."""
    buffer, tally = _buffer(lambda size: "queue_full", max_traces=1, grace_s=60.0)
    _file(buffer, _trace("1"), 0.0)
    _file(buffer, _trace("2"), 0.0)
    assert tally.dropped == {"max_traces": 1}
    assert buffer.poll(0.0).traces == []


def test_full_buffer_of_unfinished_traces_drops_the_oldest_whole() -> None:
    """No root ended: the oldest unfinished trace is dropped, and its root later is ignored."""
    buffer, tally = _buffer(max_traces=1, grace_s=0.0)
    *old_children, old_root = _trace("old")
    _file(buffer, old_children, 0.0)
    *new_children, new_root = _trace("new")
    _file(buffer, new_children, 1.0)
    assert tally.dropped == {"max_traces": 1}
    buffer.add(old_root, 2.0)  # a dropped trace never comes back as a partial run
    buffer.add(new_root, 2.0)
    (trace,) = buffer.poll(2.0).traces
    assert trace.trace_id == format(new_root.context.trace_id, "032x")  # type: ignore[union-attr]


def test_a_trace_alone_over_max_buffer_bytes_goes_not_the_others() -> None:
    """Bytes: a trace bigger than the whole bound is dropped; the buffered one stays."""
    buffer, tally = _buffer(max_buffer_bytes=20_000, grace_s=0.0)
    small = _trace("small")
    _file(buffer, small, 0.0)
    _file(buffer, _trace("x" * 30_000), 0.0)
    assert tally.dropped == {"max_buffer_bytes": 1}
    (trace,) = buffer.poll(0.0).traces
    assert trace.trace_id == format(small[0].context.trace_id, "032x")  # type: ignore[union-attr]


def test_max_spans_per_trace_drops_the_oldest_spans() -> None:
    """Over max_spans_per_trace the oldest span goes, counted; the bytes follow."""
    buffer, tally = _buffer(max_spans_per_trace=2, grace_s=0.0)
    rec = Recorder()
    agent_trace(rec, tool=True)
    spans = rec.spans()
    _file(buffer, spans, 0.0)
    assert tally.dropped == {"max_spans_per_trace": len(spans) - 2}
    (trace,) = buffer.poll(0.0).traces
    assert [r.name for r in trace.spans] == [s.name for s in spans[-2:]]
    assert buffer.bytes == 0


def test_sampled_out_and_own_traces_are_decided_on_their_first_span() -> None:
    """No rule's sample takes it, or tracescore made it: counted once, its spans ignored."""
    tally = Tally()
    buffer = TraceBuffer([ScoringRule(["s"], sample_rate=0.5)], BufferLimits(grace_s=0.0), tally)
    taken = 0
    for i in range(20):
        spans = _trace(f"q{i}")
        _file(buffer, spans, 0.0)
        taken += sampled(format(spans[0].context.trace_id, "032x"), 0.5)  # type: ignore[union-attr]
    assert len(buffer.poll(0.0).traces) == taken
    assert tally.skipped == {"sampled_out": 20 - taken}

    own, tally = _buffer(grace_s=0.0)
    worker = Recorder(service="tracescore-worker")
    agent_trace(worker)
    _file(own, worker.spans(), 0.0)
    judge = Recorder()
    with judge.span("judge", {ROLE_ATTRIBUTE: JUDGE_ROLE}):
        agent_trace(judge)
    _file(own, judge.spans(), 0.0)
    assert own.poll(0.0).traces == []
    assert tally.skipped == {"loop_guard": 2}


def test_a_judge_span_inside_a_trace_is_noted_not_guarded() -> None:
    """A judge span under the app's root: the trace is kept, the judge span's id noted."""
    buffer, _ = _buffer(grace_s=0.0)
    rec = Recorder()
    with (
        rec.span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}),
        rec.span("judge", {ROLE_ATTRIBUTE: JUDGE_ROLE}) as judge,
    ):
        pass
    _file(buffer, rec.spans(), 0.0)
    (trace,) = buffer.poll(0.0).traces
    assert trace.judge_ids == {format(judge.get_span_context().span_id, "016x")}


def test_wake_when_a_trace_is_due_at_once_or_arrives_while_sleeping() -> None:
    """grace_s == 0 asks for a poll at once; so does a new trace while the caller sleeps."""
    buffer, _ = _buffer(grace_s=0.0)
    _file(buffer, _trace(), 0.0)
    assert buffer.wake
    lazy, _ = _buffer(grace_s=5.0)
    *children, _root = _trace()
    lazy.add(children[0], 0.0)
    assert not lazy.wake
    lazy.poll(0.0)
    lazy.sleeping = True
    lazy.add(_trace()[0], 0.0)
    assert lazy.wake
    assert not lazy.sleeping


def test_drain_forgets_everything() -> None:
    """Shutdown: every buffered trace is counted and forgotten."""
    buffer, _ = _buffer(grace_s=60.0)
    _file(buffer, _trace("1"), 0.0)
    _file(buffer, _trace("2")[:1], 0.0)
    assert buffer.drain() == (2, 0)
    assert (len(buffer), buffer.bytes, buffer.poll(1e9).traces) == (0, 0, [])


def test_a_span_refused_at_filing_costs_no_other_trace_and_no_span_of_its_own() -> None:
    """A span whose attribute nests past 32 levels is refused (an export error), but the buffer
    made room for it first: under max_traces it dropped another trace, under
    max_spans_per_trace its own trace's oldest span. It is built before room is made now."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.tracing._spans import chat_attributes

    deep: object = "x"
    for _ in range(40):
        deep = {"k": deep}
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
    memory = InMemorySpanExporter()  # not a Recorder: conftest reads every Recorder's traces
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my.app")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with tracer.start_as_current_span("chat m", attributes=chat_attributes("Hi?", "Hello.")):
            pass
        with tracer.start_as_current_span("execute_tool t", attributes=tool):
            pass
        with tracer.start_as_current_span("execute_tool t", attributes={**tool, "gen_ai.tool.input": deep}):  # type: ignore[dict-item]
            pass
    with tracer.start_as_current_span("execute_tool t", attributes={**tool, "gen_ai.tool.input": deep}):  # type: ignore[dict-item]
        pass
    chat, good_tool, bad_tool, root, bad_elsewhere = memory.get_finished_spans()

    buffer, tally = _buffer(max_spans_per_trace=2)
    _file(buffer, [chat, good_tool], now=100.0)
    with pytest.raises(ValueError, match="nesting deeper than 32 levels"):
        buffer.add(bad_tool, 100.0)
    assert tally.snapshot()[0] == {}  # its trace kept both spans

    buffer, tally = _buffer(max_traces=1)
    buffer.add(chat, 100.0)
    with pytest.raises(ValueError, match="nesting deeper than 32 levels"):
        buffer.add(bad_elsewhere, 100.0)
    buffer.add(root, 100.0)
    (trace,) = buffer.poll(200.0, force=True).traces
    assert ([s.name for s in trace.spans], tally.snapshot()[0]) == (["chat m", "invoke_agent a"], {})
    assert len(buffer) == 0
