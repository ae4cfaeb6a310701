"""Promises of the README's "Capturing traces from your app" that no test held, checked with
the real pieces: a real ``BatchSpanProcessor`` in front, the exporter's own flusher and sender
threads, real time, polling with a deadline (never ``force_flush``, which would hide a flusher
that stalled).

- a rule's ``delay_s`` holds at most ``queue_size`` runs: the rest are ``delay_queue_full``;
- spans another processor hands over out of end-time order still make their run when they
  come within ``grace_s`` after its root arrived;
- a full buffer with no ended root hands off a trace with an ended agent span (not the oldest);
- a failing sink is retried with a backoff doubling from ``retry_initial_s`` to ``retry_max_s``.
"""

from __future__ import annotations

import itertools
import threading
import time

import structlog.testing
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import Span as ApiSpan
from opentelemetry.trace import set_span_in_context

from tests.tracing._exporting import read, wait_for
from tests.tracing._spans import chat_attributes
from tests.tracing.test_exporter_realtime import QUIET_BOUND_S, SLACK_S, App, Arrivals, exporter_for_app
from tracing import CallbackSink, ScoreBatch, ScoringRule

AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}


def _hex(span: ApiSpan) -> str:
    return format(span.get_span_context().trace_id, "032x")


def test_runs_held_by_delay_s_past_the_bound_are_dropped_counted_and_logged_once() -> None:
    """``queue_size`` also bounds the runs a rule's ``delay_s`` holds back: a burst of 8 runs
    behind a 3-run bound keeps 3, which reach the sink after the delay by the exporter's own
    threads, and drops 5 as ``delay_queue_full``, logged once, by reason and count, no content."""
    marker = "customer-4711-private-text"
    delay, bound, n = 2.0, 3, 8
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(arrivals), rules=[ScoringRule(["s"], delay_s=delay)], queue_size=bound)
    app = App(exporter)
    try:
        with structlog.testing.capture_logs() as logs:
            started = time.monotonic()
            for i in range(n):
                app.agent_run(f"q{i}", content=marker)
            # All of them completed and either held or dropped, well within the delay.
            assert wait_for(lambda: exporter.stats()["traces_completed"] == n, QUIET_BOUND_S + 5), exporter.stats()
            assert time.monotonic() - started < delay, "the burst took longer than the delay: nothing was held at once"
            stats = exporter.stats()
            assert (stats["delayed"], stats["dropped"]) == ((bound, {"delay_queue_full": n - bound})), stats
            assert arrivals.count() == 0, "a held run was sent before its delay"
            assert wait_for(lambda: arrivals.count() == bound, delay + QUIET_BOUND_S + 5), exporter.stats()
        stats = exporter.stats()
        assert (stats["runs_sent"], stats["delayed"], stats["dropped"]) == (bound, 0, {"delay_queue_full": n - bound})
        drop_logs = [e for e in logs if e["event"] == "exporter_dropped"]
        assert [(e["reason"], e["total"]) for e in drop_logs] == [("delay_queue_full", 1)], drop_logs
        assert marker not in repr(logs)
    finally:
        app.shutdown()


class _Holding(SpanProcessor):
    """Another processor in front of the same exporter: it holds the spans that end until the
    test hands them over, in whatever order the test picks."""

    def __init__(self) -> None:
        self.spans: dict[str, ReadableSpan] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.spans[span.name] = span

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass


def test_a_child_another_processor_hands_over_after_its_root_within_grace_is_in_the_run() -> None:
    """The README: spans another processor feeds the exporter "may come out of that order, and
    a trace then goes ``grace_s`` after its root arrived". A run's chat span ends before its
    agent root, but a second processor hands the root over first, 4.5 s late, and the chat span
    0.3 s after that (grace 3 s: room for a loaded machine's pauses), while other traffic flows through the real
    ``BatchSpanProcessor``: its spans end later than the root's grace, so the processor's order
    alone would call the trace complete as soon as its root came. The chat span is in the run,
    and nothing is dropped as ``late_span``."""
    grace = 3.0
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(arrivals), grace_s=grace)
    app = App(exporter)  # the traffic's processor: a real BatchSpanProcessor
    holding = _Holding()
    other = TracerProvider(resource=Resource.create({"service.name": "shop-app"}))
    other.add_span_processor(holding)
    tracer = other.get_tracer("my.app")
    stop = threading.Event()

    def traffic() -> None:  # spans of other traces, ending every 20 ms (no runs in them)
        while not stop.is_set():
            with app.tracer.start_as_current_span("GET /health"):
                pass
            stop.wait(0.02)

    flowing = threading.Thread(target=traffic, daemon=True)
    try:
        root = tracer.start_span("invoke_agent a", attributes=AGENT)
        chat = tracer.start_span("chat m", context=set_span_in_context(root), attributes=chat_attributes("q?", "a!"))
        chat.end()
        root.end()
        trace_id = _hex(root)
        flowing.start()
        time.sleep(1.5 * grace)  # the other processor's delay (what it holds, not an assertion)
        assert exporter.export([holding.spans["invoke_agent a"]]).name == "SUCCESS"
        root_arrived = time.monotonic()
        time.sleep(0.3)
        assert exporter.export([holding.spans["chat m"]]).name == "SUCCESS"
        handed = time.monotonic() - root_arrived
        assert handed < grace, f"the child came {handed:.2f}s after its root: outside the grace, the test says nothing"
        assert trace_id not in arrivals.at, "the run went before its child arrived"
        assert wait_for(lambda: trace_id in arrivals.at, QUIET_BOUND_S + 5), exporter.stats()
        (request,) = [r for b in arrivals.batches for r in b.requests if r.trace_id == trace_id]
        assert {s.name for s in request.spans or []} == {"invoke_agent a", "chat m"}
        assert read(request).output.text == "a!"
        assert exporter.stats()["dropped"] == {}
    finally:
        stop.set()
        if flowing.is_alive():
            flowing.join(5)
        other.shutdown()
        app.shutdown()


def test_a_full_buffer_with_no_ended_root_hands_off_a_trace_with_an_ended_agent_span() -> None:
    """``max_traces`` 2, both held by traces whose roots are still open: the older one has only a
    chat span ended, the newer one a whole agent run (a session's first). A third trace's span
    makes room by handing the agent's run off at once (not at ``max_trace_age_s``, 300 s); the
    older trace, with no agent span ended, is kept, not dropped as the oldest."""
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(arrivals), max_traces=2)
    app = App(exporter)
    tracer = app.tracer
    try:
        older = tracer.start_span("workflow", attributes={"http.route": "/older"})
        with tracer.start_as_current_span(
            "chat m", context=set_span_in_context(older), attributes=chat_attributes("older?", "older.")
        ):
            pass
        session = tracer.start_span("session", attributes={"session.id": "s1"})
        with (
            tracer.start_as_current_span("invoke_agent a", context=set_span_in_context(session), attributes=AGENT),
            tracer.start_as_current_span("chat m", attributes=chat_attributes("first run?", "first run.")),
        ):
            pass
        assert wait_for(lambda: exporter.stats()["traces_buffered"] == 2, 10), exporter.stats()
        assert exporter.stats()["spans_seen"] == 3
        assert arrivals.count() == 0, "the agent's run went with its root still open and room in the buffer"
        third = tracer.start_span("workflow", attributes={"http.route": "/third"})
        with tracer.start_as_current_span("GET /x", context=set_span_in_context(third)):
            pass
        session_id = _hex(session)
        assert wait_for(lambda: session_id in arrivals.at, QUIET_BOUND_S + 5), exporter.stats()
        (request,) = arrivals.batches[0].requests
        assert {s.name for s in request.spans or []} == {"invoke_agent a", "chat m"}
        assert read(request).output.text == "first run."
        stats = exporter.stats()
        assert (stats["dropped"], stats["traces_buffered"]) == ({}, 2), stats  # the older and the third
        for open_root in (older, session, third):
            open_root.end()
    finally:
        app.shutdown()


def test_a_failing_sink_is_retried_with_backoff_doubling_up_to_its_cap() -> None:
    """A sink failing every send: the attempts' gaps follow ``retry_initial_s`` doubling up to
    ``retry_max_s``. Each wait is jittered to 50-100% of its step, so each gap is at least half
    its step (the growth: a step that did not double falls under it), and the gaps once capped
    add up to at most the cap each plus one slack for the whole stretch (a step that kept
    doubling overshoots it). The send goes through once the sink recovers."""
    initial, cap = 0.05, 0.4
    capped = 6  # gaps counted at the cap
    steps = [min(cap, initial * 2**k) for k in range(20)]
    first_capped = next(k for k, step in enumerate(steps) if step == cap)
    wanted = first_capped + capped + 1  # attempts
    attempts: list[float] = []
    recovered = threading.Event()
    arrivals = Arrivals()

    def send(batch: ScoreBatch) -> None:
        attempts.append(time.monotonic())
        if not recovered.is_set():
            if len(attempts) >= wanted:
                recovered.set()  # the next attempt succeeds
            raise ConnectionError("broker down")
        arrivals(batch)

    exporter = exporter_for_app(CallbackSink(send), retry_initial_s=initial, retry_max_s=cap)
    app = App(exporter)
    try:
        trace_id, _ = app.agent_run("retried")
        budget = sum(steps[:wanted]) + QUIET_BOUND_S + 10
        # (the run counts as sent once the send returns, a moment after it arrived)
        assert wait_for(lambda: trace_id in arrivals.at and exporter.stats()["runs_sent"] == 1, budget), (
            exporter.stats()
        )
        gaps = [b - a for a, b in itertools.pairwise(attempts)][:wanted]
        assert len(gaps) == wanted, gaps
        tick = 0.005  # a timer may fire this much early on some platforms
        for k, gap in enumerate(gaps):
            assert gap >= steps[k] / 2 - tick, f"gap {k} was {gap:.3f}s, under half its step {steps[k]}: {gaps}"
        at_cap = gaps[first_capped : first_capped + capped]
        assert sum(at_cap) <= capped * cap + SLACK_S, f"gaps past the cap: {at_cap}"
        stats = exporter.stats()
        assert (stats["runs_sent"], stats["send_failures"], stats["dropped"]) == (1, wanted, {}), stats
    finally:
        app.shutdown()
