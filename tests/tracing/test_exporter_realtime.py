"""ScoringSpanExporter behind a real BatchSpanProcessor, in real time: traces that trickle in are
handed off by the exporter's own threads (no force_flush), a burst through a small buffer loses
nothing deliverable, ``TracerProvider.shutdown()`` keeps the exporter's deadline with the broker
down, and the hand-off queue is bounded in bytes.

Intervals are shortened through constructor arguments (grace 0.2 s, flush interval 0.1 s, the
processor's schedule delay 0.1 s) but stay real: background threads do every hand-off.
"""

from __future__ import annotations

import functools
import gc
import socket
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog.testing
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, set_span_in_context

from tests._redis import RedisServer
from tests.tracing._exporting import read, wait_for
from tests.tracing._spans import chat_attributes
from tracing import CallbackSink, CelerySink, ScoreBatch, ScoringRule, ScoringSpanExporter, Sink, TracedRun

GRACE_S = 0.2
FLUSH_S = 0.1
SCHEDULE_S = 0.1
# What a loaded 2-core machine may add to a hand-off (thread wake-ups, GC, other test runs).
SLACK_S = 1.5
# A quiet app's trace reaches the sink this long after its root ended: the processor's delay
# to bring the root, then the grace and the processor's delay again (a child that ended within
# the grace may come in its next batch), the flusher's interval, and the slack.
QUIET_BOUND_S = 2 * SCHEDULE_S + GRACE_S + FLUSH_S + SLACK_S
DROP_REASONS = {"max_traces", "queue_full", "queue_bytes"}


class Arrivals:
    """A sink target that stamps when each trace's request arrived (monotonic seconds)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.batches: list[ScoreBatch] = []
        self._lock = threading.Lock()

    def __call__(self, batch: ScoreBatch) -> None:
        now = time.monotonic()
        with self._lock:
            self.batches.append(batch)
            for request in batch.requests:
                assert request.trace_id is not None
                self.at.setdefault(request.trace_id, now)

    def count(self) -> int:
        with self._lock:
            return len(self.at)


def held(arrivals: Arrivals, release: threading.Event) -> Callable[[ScoreBatch], None]:
    """A sink target that blocks each send until ``release``, then records it in ``arrivals``."""

    def send(batch: ScoreBatch) -> None:
        release.wait(30)
        arrivals(batch)

    return send


def exporter_for_app(sink: Sink, rules: list[ScoringRule] | None = None, **settings: Any) -> ScoringSpanExporter:
    """The exporter to put behind ``App``: its timings shortened alike (grace ``GRACE_S``, flush
    interval ``FLUSH_S``, processor delay the App's ``SCHEDULE_S``), ``settings`` on top."""
    settings = {"grace_s": GRACE_S, "processor_delay_s": SCHEDULE_S, "flush_interval_s": FLUSH_S, **settings}
    return ScoringSpanExporter(rules or [ScoringRule(["s"])], sink, **settings)


class App:
    """An application's tracer provider with the exporter behind a real BatchSpanProcessor."""

    def __init__(self, exporter: ScoringSpanExporter, *, id_generator: IdGenerator | None = None, **bsp: Any) -> None:
        self.exporter = exporter
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "shop-app"}), id_generator=id_generator
        )
        bsp.setdefault("schedule_delay_millis", SCHEDULE_S * 1000)
        self.processor = BatchSpanProcessor(exporter, **bsp)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("my.app")

    def agent_run(self, question: str, *, pause_s: float = 0.0, content: str = "") -> tuple[str, float]:
        """One agent run (agent → chat → tool); returns its trace id and when its root ended.
        ``pause_s`` sleeps between the spans so they reach the exporter in separate batches."""
        with self.tracer.start_as_current_span(
            "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
        ) as root:
            with self.tracer.start_as_current_span(
                "chat m",
                attributes=chat_attributes(question + content, f"answer to {question}"),
            ):
                pass
            time.sleep(pause_s)
            with self.tracer.start_as_current_span(
                "execute_tool t", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
            ):
                pass
            time.sleep(pause_s)
        return format(root.get_span_context().trace_id, "032x"), time.monotonic()

    def shutdown(self) -> None:
        self.provider.shutdown()


@pytest.fixture
def arrivals() -> Arrivals:
    return Arrivals()


@pytest.fixture
def app(arrivals: Arrivals) -> Iterator[App]:
    exporter = exporter_for_app(CallbackSink(arrivals))
    application = App(exporter)
    try:
        yield application
    finally:
        application.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_trickling_traces_are_handed_off_while_the_app_runs(app: App, arrivals: Arrivals) -> None:
    """One agent run every 0.5 s: each reaches the sink within ``QUIET_BOUND_S``, with no
    force_flush. (The flusher's wake-up used to be lost
    when a trace's first span and its root came in one batch: nothing left before shutdown.)"""
    bound = QUIET_BOUND_S
    for i in range(4):
        trace_id, ended = app.agent_run(f"question {i}")
        arrived = functools.partial(arrivals.at.__contains__, trace_id)
        assert wait_for(arrived, bound + 5), f"run {i} was not handed off"
        assert arrivals.at[trace_id] - ended <= bound, f"run {i} took {arrivals.at[trace_id] - ended:.2f}s"
        time.sleep(0.5)
    stats = app.exporter.stats()
    assert (stats["traces_completed"], stats["runs_sent"], stats["dropped"]) == (4, 4, {})


def test_a_run_spread_over_several_batches_is_handed_off(app: App, arrivals: Arrivals) -> None:
    """Spans of one run that reach the exporter across several batches (a slow agent), then a
    quiet app: the run is complete and handed off within the bound after its root ends."""
    bound = QUIET_BOUND_S
    trace_id, ended = app.agent_run("slow", pause_s=3 * SCHEDULE_S)
    assert wait_for(lambda: trace_id in arrivals.at, bound + 5)
    assert arrivals.at[trace_id] - ended <= bound
    (request,) = [r for b in arrivals.batches for r in b.requests]
    assert {s.name for s in request.spans or []} == {"invoke_agent a", "chat m", "execute_tool t"}
    assert read(request).input.input_messages[0].text == "slow"


def test_a_child_ending_after_its_root_in_the_processors_next_batch_is_in_the_run(arrivals: Arrivals) -> None:
    """A chat span that ends just after its agent root (a streamed answer), after the processor
    handed the root over: it comes in the processor's next batch, a schedule delay (1.5 s)
    later, past the grace (0.3 s) after the root's arrival. It is in the run and nothing is
    dropped. (The grace was timed from the root's arrival: the run went without its chat span,
    and the span was a late_span.)"""
    schedule_s = 1.5
    exporter = exporter_for_app(CallbackSink(arrivals), grace_s=0.3, processor_delay_s=schedule_s)
    app = App(exporter, schedule_delay_millis=schedule_s * 1000)
    try:
        root = app.tracer.start_span(
            "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
        )
        chat = app.tracer.start_span(
            "chat m",
            context=set_span_in_context(root),
            attributes=chat_attributes("stream it", "streamed"),
        )
        root.end()
        assert wait_for(lambda: exporter.stats()["spans_seen"] == 1, 10), "the root never reached the exporter"
        chat.end()
        trace_id = format(root.get_span_context().trace_id, "032x")
        assert wait_for(lambda: trace_id in arrivals.at, 10)
        (request,) = [r for b in arrivals.batches for r in b.requests]
        assert {s.name for s in request.spans or []} == {"invoke_agent a", "chat m"}
        assert read(request).output.text == "streamed"
        assert exporter.stats()["dropped"] == {}
    finally:
        app.shutdown()


def test_with_traffic_flowing_a_trace_goes_before_the_quiet_apps_bound(arrivals: Arrivals) -> None:
    """The processor's later batches say when a trace is complete: with other runs ending every
    0.1 s, a trace goes about ``grace_s`` after its root, not ``processor_delay_s`` (30 s) later."""
    exporter = exporter_for_app(CallbackSink(arrivals), processor_delay_s=30.0)
    app = App(exporter)
    try:
        first, ended = app.agent_run("first")
        deadline = time.monotonic() + 10
        while first not in arrivals.at and time.monotonic() < deadline:
            app.agent_run("more traffic")
            time.sleep(0.1)
        assert first in arrivals.at, "the first trace waited for the quiet app's bound"
        assert arrivals.at[first] - ended <= GRACE_S + 2 * SCHEDULE_S + FLUSH_S + SLACK_S
    finally:
        app.shutdown()


def test_flood_through_a_small_buffer_drops_nothing_deliverable(arrivals: Arrivals) -> None:
    """A burst of 600 runs through a 16-trace buffer: every run is delivered, none dropped (the
    buffer used to drop its oldest traces, which were finished and only waiting for the grace
    window)."""
    exporter = exporter_for_app(CallbackSink(arrivals), max_traces=16)
    app = App(exporter, max_queue_size=8192)
    try:
        ids = [app.agent_run(f"q{i}")[0] for i in range(600)]
        assert wait_for(lambda: arrivals.count() == len(ids), 30), exporter.stats()
        assert set(arrivals.at) == set(ids)
        stats = exporter.stats()
        assert stats["dropped"] == {}
        assert stats["traces_completed"] == stats["runs_sent"] == len(ids)
    finally:
        app.shutdown()


def test_flood_with_a_stuck_sink_counts_every_drop_by_reason() -> None:
    """The same burst with a sink that blocks and a small queue: what cannot be kept is dropped,
    and every run is either sent or counted under a drop reason; export never blocks."""
    release = threading.Event()
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(held(arrivals, release)), max_traces=16, queue_size=40, batch_size=10)
    app = App(exporter, max_queue_size=8192)
    try:
        started = time.monotonic()
        n = 400
        for i in range(n):
            app.agent_run(f"q{i}")
        assert time.monotonic() - started < 20  # the app was never held up by the stuck sink

        def settled() -> bool:
            s = exporter.stats()
            return bool(s["traces_buffered"] == 0 and s["spans_seen"] == 3 * n)

        assert wait_for(settled, 30), exporter.stats()
        stats = exporter.stats()
        assert stats["dropped"], stats
        assert set(stats["dropped"]) <= DROP_REASONS, stats
        release.set()
        assert wait_for(lambda: exporter.stats()["queue_depth"] == 0, 30)
        stats = exporter.stats()
        assert stats["runs_sent"] == arrivals.count()
        assert arrivals.count() + sum(stats["dropped"].values()) == n, stats
        assert arrivals.count() >= 40  # a full queue's worth was kept and sent
    finally:
        release.set()
        app.shutdown()


@pytest.mark.parametrize("broker", ["closed_port", "stopped_redis"])
def test_provider_shutdown_with_the_broker_down_keeps_the_exporter_deadline(
    broker: str, redis_server: RedisServer
) -> None:
    """``TracerProvider.shutdown()`` (which passes the SDK's 30 s) returns within the exporter's
    ``shutdown_timeout_s`` plus a little when the broker is down; the unsent runs are counted."""
    if broker == "closed_port":
        url = f"redis://127.0.0.1:{_closed_port()}/3"
        restart = False
    else:
        url, restart = redis_server.url(3), True
        redis_server.stop()
    try:
        sink = CelerySink(url, queue="tracescore-h2-shutdown", connect_timeout_s=0.5, publish_timeout_s=0.5)
        exporter = exporter_for_app(sink, shutdown_timeout_s=1.0, retry_initial_s=0.05, retry_max_s=0.2)
        app = App(exporter)
        for i in range(3):
            app.agent_run(f"q{i}")
        assert wait_for(lambda: exporter.stats()["send_failures"] >= 1, 10)
        started = time.monotonic()
        app.shutdown()
        took = time.monotonic() - started
        assert took < 1.0 + 1.5, f"shutdown took {took:.1f}s"
        stats = exporter.stats()
        assert stats["runs_sent"] == 0
        assert stats["dropped"] == {"shutdown_unsent": 3}
    finally:
        if restart:
            redis_server.start()


def test_hand_off_queue_is_bounded_in_bytes_with_the_broker_down() -> None:
    """Large traces with the broker down: the queue holds at most ``max_queue_bytes`` of
    records, the rest is dropped as ``queue_bytes``, and the process does not grow with them."""
    limit = 4 * 1024 * 1024
    big = 256 * 1024
    n = 120  # 30 MB of message content in all
    sink = CelerySink(f"redis://127.0.0.1:{_closed_port()}/3", queue="tracescore-h2-bytes", connect_timeout_s=0.2)
    exporter = exporter_for_app(
        sink, grace_s=0.0, max_queue_bytes=limit, batch_size=5, max_batch_bytes=4 * big, retry_initial_s=0.05,
        retry_max_s=0.2, shutdown_timeout_s=0.5,
    )  # fmt: skip
    app = App(exporter)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        peak_queue = 0
        for i in range(n):
            # Built here per run (not interned): each run's content is freed once dropped.
            app.agent_run(f"q{i}", content=f"{i:07d}" * (big // 7))
            app.provider.force_flush()  # the processor's: its spans reach export(), nothing more
            peak_queue = max(peak_queue, exporter.stats()["queue_bytes"])
        assert wait_for(lambda: exporter.stats()["spans_seen"] == 3 * n and exporter.stats()["traces_buffered"] == 0)
        held = tracemalloc.get_traced_memory()[0] - base
        stats = exporter.stats()
        assert stats["runs_sent"] == 0
        assert stats["queue_bytes"] <= limit
        assert peak_queue <= limit
        assert stats["dropped"].get("queue_bytes", 0) >= n - (limit + 6 * big) // big, stats
        # The queue's records, one batch in flight and the message being built: not 30 MB.
        assert held < 2 * limit, f"{held / 1e6:.1f} MB held"
    finally:
        tracemalloc.stop()
        app.shutdown()
    assert sum(exporter.stats()["dropped"].values()) == n


@pytest.mark.parametrize("stuck", ["slow", "never"])
def test_shutdown_returns_in_time_behind_a_filter_that_is_slow_or_never_returns(arrivals: Arrivals, stuck: str) -> None:
    """A rule's filter runs in the flusher: at 0.3 s a run with 30 traces due, shutdown took 9 s
    (then dropped them all anyway); a filter that never returned held shutdown for good.
    Shutdown returns by its deadline; what was not read is dropped as shutdown_deadline, and
    nothing the abandoned pass reads later is shipped or counted twice."""
    release = threading.Event()
    entered = threading.Event()

    def judge_worthy(run: object) -> bool:
        entered.set()
        if stuck == "never":
            release.wait(30)
        else:
            time.sleep(0.3)
        return True

    exporter = exporter_for_app(
        CallbackSink(arrivals), rules=[ScoringRule(["s"], filter=judge_worthy)], shutdown_timeout_s=1.0
    )
    application = App(exporter)
    for i in range(30):
        application.agent_run(f"q{i}")
    assert entered.wait(30), "the flusher never reached the filter"
    closed = threading.Event()
    threading.Thread(target=lambda: (application.shutdown(), closed.set()), daemon=True).start()
    try:
        assert closed.wait(15), "shutdown did not return"
        stats = exporter.stats()
        shipped = arrivals.count()
        dropped = stats["dropped"]
        assert dropped.get("shutdown_deadline", 0) > 0, stats
        # Every trace either reached the sink or is counted (one run a trace here).
        assert shipped + sum(dropped.values()) == 30, (shipped, stats)
    finally:
        release.set()
    # The abandoned pass goes on once its filter returns, then the flusher ends: it shipped
    # and counted nothing more.
    assert wait_for(lambda: not exporter._flusher.is_alive(), 30)
    assert (arrivals.count(), exporter.stats()["dropped"]) == (shipped, dropped)


def test_force_flush_keeps_its_timeout_behind_a_filter_that_does_not_return(arrivals: Arrivals) -> None:
    """force_flush ran its pass, the rules' filters included, in the caller's thread with no
    stop: force_flush(1000) behind a filter blocked for 20 s returned after 40 s, and one that
    never returned held the app's thread for good. The flusher runs the forced pass; the caller
    waits with its deadline (False when it passes), and what the pass completes later is sent."""
    release = threading.Event()
    threads: list[str] = []

    def judge_worthy(run: object) -> bool:
        threads.append(threading.current_thread().name)
        release.wait(60)
        return True

    exporter = exporter_for_app(CallbackSink(arrivals), rules=[ScoringRule(["s"], filter=judge_worthy)])
    application = App(exporter)
    try:
        for i in range(2):
            application.agent_run(f"q{i}")
        application.provider.force_flush()  # the processor's: the spans reach the exporter
        answered: list[bool] = []
        caller = threading.Thread(target=lambda: answered.append(exporter.force_flush(500)), daemon=True)
        caller.start()
        caller.join(15)
        assert answered == [False], "force_flush did not return by its deadline"
        assert threads
        assert set(threads) == {"tracescore-flusher"}  # never in the app's thread
        release.set()
        assert exporter.force_flush(30_000) is True
        assert arrivals.count() == 2
    finally:
        release.set()
        application.shutdown()


def test_traces_handed_over_early_behind_a_filter_that_never_returns_are_counted_at_shutdown(
    arrivals: Arrivals,
) -> None:
    """The flusher's pass stuck in a filter while traces keep coming into a full buffer: each is
    handed over early (room held in the sender) for a pass that never comes. Shutdown gave up on
    the pass and counted only the buffered traces: 32 of 41 were neither sent nor counted. They
    are dropped as shutdown_deadline now."""
    release = threading.Event()
    entered = threading.Event()

    def judge_worthy(run: object) -> bool:
        entered.set()
        release.wait(30)
        return True

    exporter = exporter_for_app(
        CallbackSink(arrivals), rules=[ScoringRule(["s"], filter=judge_worthy)], max_traces=8, shutdown_timeout_s=1.0
    )
    application = App(exporter)
    application.agent_run("first")
    assert entered.wait(30), "the flusher never reached the filter"
    for i in range(40):
        application.agent_run(f"q{i}")
    assert wait_for(lambda: exporter.stats()["spans_seen"] == 41 * 3, 30)
    try:
        application.shutdown()
        dropped = exporter.stats()["dropped"]
        assert dropped.get("shutdown_deadline", 0) > 1, dropped
        assert arrivals.count() + sum(dropped.values()) == 41, (arrivals.count(), dropped)
    finally:
        release.set()


def test_every_run_of_an_overloaded_exporter_is_sent_or_counted_by_its_unit() -> None:
    """A flood through a small buffer and a small queue into a slow sink, each trace holding two
    agent runs for two delay groups (four runs). A trace the full buffer handed over early,
    with no room in the queue either, was counted once under queue_full, a reason that counts
    runs: three runs of each such trace went uncounted (2,493 of 4,800 in the repro). Traces
    dropped count under the trace reasons, runs under the run reasons, and they add up."""
    trace_reasons = {
        "max_traces",
        "max_buffer_bytes",
        "max_trace_age",
        "shutdown_incomplete_trace",
        "shutdown_deadline",
    }
    arrivals = Arrivals()

    def slow(batch: ScoreBatch) -> None:
        time.sleep(0.01)
        arrivals(batch)

    exporter = exporter_for_app(
        CallbackSink(slow),
        rules=[ScoringRule(["s1"]), ScoringRule(["s2"], delay_s=0.3)],
        queue_size=200,
        batch_size=7,
        max_traces=50,
    )
    application = App(exporter, max_queue_size=100_000)
    tracer = application.tracer
    agents = [{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": a} for a in ("a", "b")]

    def traces(n: int) -> None:
        for _ in range(n):
            with tracer.start_as_current_span("GET /x"):
                for agent in agents:
                    with (
                        tracer.start_as_current_span(f"invoke_agent {agent['gen_ai.agent.name']}", attributes=agent),
                        tracer.start_as_current_span("chat m", attributes=chat_attributes("Hi?", "Hello.")),
                    ):
                        pass

    threads = [threading.Thread(target=traces, args=(250,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    application.shutdown()
    stats = exporter.stats()
    runs_sent = sum(len(r.target_span_ids) for b in arrivals.batches for r in b.requests)
    traces_dropped = sum(v for k, v in stats["dropped"].items() if k in trace_reasons)
    runs_dropped = sum(v for k, v in stats["dropped"].items() if k not in trace_reasons)
    assert stats["spans_seen"] == 1000 * 5, stats
    assert traces_dropped > 0, stats  # the overload this test is about
    assert runs_dropped > 0, stats
    assert 4 * (1000 - traces_dropped - sum(stats["skipped"].values())) == runs_sent + runs_dropped, stats


def _runs_of(arrivals: Arrivals, trace_id: str) -> list[str]:
    return [t for b in arrivals.batches for r in b.requests if r.trace_id == trace_id for t in r.target_span_ids]


def _has_runs(arrivals: Arrivals, trace_id: str, n: int) -> Callable[[], bool]:
    return lambda: len(_runs_of(arrivals, trace_id)) == n


def test_a_second_request_in_one_trace_is_scored_as_its_own_run(arrivals: Arrivals, app: App) -> None:
    """A service called twice within one distributed trace (an orchestrator's two calls): each
    call is a local root under a remote parent. After the first was handed over, every span of
    the second was a late_span drop and its run never scored. A span that is not under the
    spans already handed over starts a unit of its own; a straggler under them is still late."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id = 0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0
    for call, remote in enumerate((0x1111, 0x2222)):
        caller = NonRecordingSpan(SpanContext(trace_id, remote, is_remote=True, trace_flags=TraceFlags(1)))
        context = set_span_in_context(caller)
        agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
        with (
            app.tracer.start_as_current_span("invoke_agent a", context=context, attributes=agent) as root,
            app.tracer.start_as_current_span("chat m", attributes=chat_attributes(f"call {call}", "ok")),
        ):
            pass
        assert wait_for(_has_runs(arrivals, f"{trace_id:032x}", call + 1), 10), app.exporter.stats()
        if call == 0:
            first_root = root
    # A straggler under the first call's root, after both were sent: late, not a run of its own.
    with app.tracer.start_as_current_span("chat m", context=set_span_in_context(first_root)):
        pass
    assert wait_for(lambda: app.exporter.stats()["dropped"] == {"late_span": 1}, 10), app.exporter.stats()
    assert len(_runs_of(arrivals, f"{trace_id:032x}")) == 2


def test_a_sessions_later_runs_are_scored_after_its_first_was_handed_over(arrivals: Arrivals) -> None:
    """A session's span stays open while its agent runs come and go: at max_trace_age_s the
    trace is handed over with its ended agent runs. The runs after that were late_span drops,
    never scored; each age window's runs go now."""
    exporter = exporter_for_app(CallbackSink(arrivals), max_trace_age_s=1.0)
    application = App(exporter)
    try:
        agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
        with application.tracer.start_as_current_span("session") as session:
            trace_id = format(session.get_span_context().trace_id, "032x")
            for turn in range(2):
                with (
                    application.tracer.start_as_current_span("invoke_agent a", attributes=agent),
                    application.tracer.start_as_current_span(
                        "chat m", attributes=chat_attributes(f"turn {turn}", "ok")
                    ),
                ):
                    pass
                assert wait_for(_has_runs(arrivals, trace_id, turn + 1), 15), exporter.stats()
        assert "late_span" not in exporter.stats()["dropped"]
    finally:
        application.shutdown()


def test_a_long_agents_run_is_not_scored_from_its_later_part_alone(arrivals: Arrivals) -> None:
    """An agent whose root runs past max_trace_age_s: its sub-agent's ended run is handed over
    then. The agent's own later work and its end are a later part of the trace: its run would
    be read without what went before, so it is not scored (``partial_run``), and the sub-agent's
    run is scored once."""
    exporter = exporter_for_app(CallbackSink(arrivals), max_trace_age_s=1.0)
    application = App(exporter)
    tracer = application.tracer
    try:
        outer = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "outer"}
        sub = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "sub"}
        with tracer.start_as_current_span("invoke_agent outer", attributes=outer) as root:
            trace_id = format(root.get_span_context().trace_id, "032x")
            with (
                tracer.start_as_current_span("invoke_agent sub", attributes=sub),
                tracer.start_as_current_span("chat m", attributes=chat_attributes("sub", "ok")),
            ):
                pass
            assert wait_for(_has_runs(arrivals, trace_id, 1), 15), exporter.stats()
            with tracer.start_as_current_span("chat m", attributes=chat_attributes("outer", "done")):
                pass
        assert wait_for(lambda: exporter.stats()["skipped"].get("partial_run") == 1, 15), exporter.stats()
        assert len(_runs_of(arrivals, trace_id)) == 1
        assert exporter.stats()["skipped"] == {"partial_run": 1}
    finally:
        application.shutdown()


def test_a_send_that_lands_after_shutdown_gave_up_is_counted_once() -> None:
    """A sink whose send outlasts shutdown's deadline (a CallbackSink cannot be interrupted):
    its runs are counted as shutdown_unsent when shutdown returns; when the send lands after
    all, they were counted as sent too (sent + dropped = 10 for 5 traces). They move to sent."""
    release = threading.Event()
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(held(arrivals, release)), shutdown_timeout_s=0.5)
    application = App(exporter)
    for i in range(5):
        application.agent_run(f"q{i}")
    assert wait_for(lambda: exporter.stats()["runs_enqueued"] == 5, 30)
    application.shutdown()
    stats = exporter.stats()
    assert (stats["runs_sent"], stats["dropped"]) == (0, {"shutdown_unsent": 5})
    release.set()
    assert wait_for(lambda: exporter.stats()["runs_sent"] == 5, 30)
    assert exporter.stats()["dropped"] == {}
    assert arrivals.count() == 5


def _worker_refusal(batch: ScoreBatch) -> str | None:
    """What a worker makes of ``batch``'s message: its screen, then the task's validation."""
    from types import SimpleNamespace

    from pydantic import ValidationError

    from tracing.queue import SCORE_TASK_NAME, task_message
    from tracing.queue._wire import CONTENT_ENCODING, CONTENT_TYPE
    from worker._guard import check_message
    from worker._settings import Settings

    message = task_message(batch, "app")
    raw = SimpleNamespace(
        headers=message.headers,
        body=message.body.encode(),
        content_type=CONTENT_TYPE,
        content_encoding=CONTENT_ENCODING,
    )
    refusal, decoded = check_message(raw, Settings(), frozenset({SCORE_TASK_NAME}))
    if refusal is not None:
        return refusal.reason
    try:
        ScoreBatch.model_validate(decoded[0][0])
    except ValidationError:
        return "invalid_payload"
    return None


@pytest.mark.parametrize("bad", ["nested_attribute", "name_not_a_string", "kind_not_a_span_kind"])
def test_a_span_the_workers_would_refuse_costs_no_other_traces_run(arrivals: Arrivals, bad: str) -> None:
    """The SDK takes attribute values nested to any depth and any object as a span's name. Such a
    span was shipped as it was, and the workers refused its whole message (``too_deep``, or the
    task's validation: ``invalid_payload``), dead-lettering the other traces' runs in it while
    ``stats()`` counted them sent. A value nested past 32 levels is refused at filing now (that
    span, counted in ``errors["export"]``), and a name that is not a string is sent as text. A
    kind that is no ``SpanKind`` (the SDK takes any object there too) is read as ``INTERNAL``,
    the OTel default: it failed the filing of its span, counted as an export error and logged
    as an ``AttributeError``, and the run went without that span."""
    deep: Any = "x"
    for _ in range(100):
        deep = {"k": deep}
    app = App(exporter_for_app(CallbackSink(arrivals)))
    try:
        for i in range(3):
            odd = i == 1
            with app.tracer.start_as_current_span(
                "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
            ):
                arguments = deep if odd and bad == "nested_attribute" else '{"q": 1}'
                with app.tracer.start_as_current_span(
                    "execute_tool t",
                    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": arguments},
                    kind=None if odd and bad == "kind_not_a_span_kind" else SpanKind.INTERNAL,  # type: ignore[arg-type]
                ) as tool:
                    if odd and bad == "name_not_a_string":
                        tool.update_name(None)  # type: ignore[arg-type]
                    if odd and bad == "nested_attribute":  # kept by the SDK: the case is real
                        assert tool.attributes["gen_ai.tool.call.arguments"] == deep  # type: ignore[attr-defined]
        assert wait_for(lambda: arrivals.count() == 3, QUIET_BOUND_S + 10)
    finally:
        app.shutdown()
    assert [_worker_refusal(batch) for batch in arrivals.batches] == [None] * len(arrivals.batches)
    stats = app.exporter.stats()
    assert (stats["runs_sent"], stats["dropped"]) == (3, {})
    assert stats["errors"] == ({"export": 1} if bad == "nested_attribute" else {})
    shipped = [s for batch in arrivals.batches for r in batch.requests for s in r.spans]
    assert sum(s.name != "invoke_agent a" for s in shipped) == (2 if bad == "nested_attribute" else 3)
    assert {s.kind for s in shipped} == {"INTERNAL"}


class _OddIds(RandomIdGenerator):
    """An app's own id generator, handing out ``trace_id`` / ``span_id`` once ``odd`` is set."""

    def __init__(self, trace_id: int | None, span_id: int | None) -> None:
        self.odd = False
        self._trace_id, self._span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        return self._trace_id if self.odd and self._trace_id is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        return self._span_id if self.odd and self._span_id is not None else super().generate_span_id()


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [(0, None), (2**128 + 7, None), (None, 2**64 + 7), (None, -7)],
    ids=["trace_id_0", "trace_id_past_128_bits", "span_id_past_64_bits", "span_id_negative"],
)
def test_a_span_with_an_invalid_id_costs_no_other_traces_run(
    arrivals: Arrivals, trace_id: int | None, span_id: int | None
) -> None:
    """The SDK records spans with whatever ids the app's IdGenerator makes. An id too long for its
    hex width (or negative) was written as it was, and the workers refused the whole message,
    dead-lettering the other traces' runs in it while ``stats()`` counted them sent; a trace id
    of 0 made every request one trace. Such a span has no valid context: dropped as ``no_context``."""
    ids = _OddIds(trace_id, span_id)
    app = App(exporter_for_app(CallbackSink(arrivals)), id_generator=ids, schedule_delay_millis=500)
    try:
        good = [app.agent_run("q0")[0]]
        ids.odd = True
        app.agent_run("odd")
        ids.odd = False
        good.append(app.agent_run("q1")[0])
        assert wait_for(lambda: arrivals.count() >= 2 and app.exporter.stats()["queue_depth"] == 0, QUIET_BOUND_S + 10)
    finally:
        app.shutdown()
    assert [_worker_refusal(batch) for batch in arrivals.batches] == [None] * len(arrivals.batches)
    assert set(arrivals.at) == set(good)
    stats = app.exporter.stats()
    assert stats["runs_sent"] == 2
    # The SDK starts a span under an invalid parent as a root of a new trace: each odd span is alone.
    assert stats["dropped"] == {"no_context": 3}


def test_a_parent_with_an_invalid_span_id_is_no_parent(arrivals: Arrivals) -> None:
    """A span built outside the SDK (a bridge from another tracer) may name a parent whose span id
    is past 64 bits: written out, the workers refused its message whole. It is read as the SDK
    reads an invalid parent when a span starts: none (the span is a root)."""
    app = App(exporter_for_app(CallbackSink(arrivals)))
    try:
        good = app.agent_run("q0")[0]
        now = time.time_ns()
        bridged = ReadableSpan(
            name="invoke_agent a",
            context=SpanContext(0xB1D9E, 0x5, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
            parent=SpanContext(0xB1D9E, 2**64 + 5, is_remote=False),
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
            start_time=now - 1000,
            end_time=now,
            resource=Resource.create({"service.name": "shop-app"}),
        )
        app.processor.on_end(bridged)
        assert wait_for(lambda: arrivals.count() == 2, QUIET_BOUND_S + 10)
    finally:
        app.shutdown()
    assert [_worker_refusal(batch) for batch in arrivals.batches] == [None] * len(arrivals.batches)
    assert set(arrivals.at) == {good, format(0xB1D9E, "032x")}
    (request,) = [r for b in arrivals.batches for r in b.requests if r.trace_id == format(0xB1D9E, "032x")]
    assert request.spans[0].parent_span_id is None


def test_spans_sharing_an_id_cost_no_other_traces_run(arrivals: Arrivals) -> None:
    """An app's IdGenerator that repeats itself gives the spans of one trace the same id (an agent,
    the sub-agent it calls, their model call). Each span was a target of its own, and the trace's
    request named that id three times: the workers refused its whole message, dead-lettering the
    other traces' runs in it while ``stats()`` counted them sent. The first span of each id is
    kept (as backfill reads such a trace), the others dropped as ``duplicate_span``."""
    ids = _OddIds(None, 0xABC)
    app = App(exporter_for_app(CallbackSink(arrivals)), id_generator=ids, schedule_delay_millis=500)
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    try:
        good = [app.agent_run("q0")[0]]
        ids.odd = True
        with (
            app.tracer.start_as_current_span("invoke_agent a", attributes=agent) as root,
            app.tracer.start_as_current_span("invoke_agent b", attributes=agent),
            app.tracer.start_as_current_span("chat m", attributes=chat_attributes("q", "a")),
        ):
            pass
        ids.odd = False
        good.append(app.agent_run("q1")[0])
        assert wait_for(lambda: arrivals.count() == 3 and app.exporter.stats()["queue_depth"] == 0, QUIET_BOUND_S + 10)
    finally:
        app.shutdown()
    assert [_worker_refusal(batch) for batch in arrivals.batches] == [None] * len(arrivals.batches)
    assert set(arrivals.at) == {*good, format(root.get_span_context().trace_id, "032x")}
    stats = app.exporter.stats()
    assert (stats["runs_sent"], stats["dropped"]) == (3, {"duplicate_span": 2})


def test_a_sink_that_calls_sys_exit_is_retried_and_the_sender_lives_on(arrivals: Arrivals) -> None:
    """A CallbackSink's function that calls ``sys.exit`` once (a library's command-line error
    path): the SystemExit ended the sender's thread without a word (threading does not print
    it), and no run was sent again while the app ran, however long. It is a failed send now,
    retried like any other."""
    calls: list[ScoreBatch] = []

    def send(batch: ScoreBatch) -> None:
        calls.append(batch)
        if len(calls) == 1:
            sys.exit(3)
        arrivals(batch)

    app = App(exporter_for_app(CallbackSink(send), retry_initial_s=0.05))
    try:
        ids = [app.agent_run(f"q{i}")[0] for i in range(3)]
        assert wait_for(lambda: arrivals.count() == 3, QUIET_BOUND_S + 10), app.exporter.stats()
        assert set(arrivals.at) == set(ids)
    finally:
        app.shutdown()
    stats = app.exporter.stats()
    assert (stats["runs_sent"], stats["send_failures"], stats["dropped"]) == (3, 1, {})


def test_a_filter_that_calls_sys_exit_costs_its_run_only(arrivals: Arrivals) -> None:
    """A rule's filter that calls ``sys.exit`` once: the SystemExit ended the flusher's thread, the
    run it was reading was lost uncounted, and no trace was handed off again while the app ran
    (only at shutdown). It counts as the filter's failure now (``errors["filter"]``), that run only."""
    seen: list[str] = []

    def keep(run: TracedRun) -> bool:
        seen.append(run.identity.trace_id)
        if len(seen) == 1:
            sys.exit(2)
        return True

    app = App(exporter_for_app(CallbackSink(arrivals), [ScoringRule(["s"], filter=keep)]))
    try:
        ids = [app.agent_run(f"q{i}")[0] for i in range(3)]
        assert wait_for(lambda: arrivals.count() == 2, QUIET_BOUND_S + 10), app.exporter.stats()
        assert set(arrivals.at) == set(ids) - {seen[0]}
    finally:
        app.shutdown()
    stats = app.exporter.stats()
    assert (stats["runs_sent"], stats["errors"], stats["skipped"]) == (2, {"filter": 1}, {"filtered_out": 1})


def test_a_delayed_run_is_sent_while_the_app_runs(arrivals: Arrivals) -> None:
    """A rule's ``delay_s`` holds a run back, and then nothing else comes: the run reaches the sink
    about ``delay_s`` after its trace was complete, by the exporter's own threads (no force_flush,
    no shutdown: both send what is held, and would hide a flusher gone idle with a run held)."""
    delay = 0.5
    exporter = exporter_for_app(CallbackSink(arrivals), rules=[ScoringRule(["s"], delay_s=delay)])
    app = App(exporter)
    try:
        trace_id, ended = app.agent_run("later")
        assert wait_for(lambda: trace_id in arrivals.at, QUIET_BOUND_S + delay + 10), exporter.stats()
        took = arrivals.at[trace_id] - ended
        assert delay <= took <= QUIET_BOUND_S + delay, f"{took:.2f}s"
        assert exporter.stats()["delayed"] == 0
    finally:
        app.shutdown()


def test_drops_are_logged_by_reason_once_not_per_run_and_without_content() -> None:
    """What the exporter drops it counts and logs: a burst into a stuck sink through a small queue
    logs ``exporter_dropped`` once for its reason (the first drop; then every 1,000th), with the
    count and never the runs' content, while ``stats()`` counts every drop."""
    marker = "customer-4711-private-text"
    release = threading.Event()
    arrivals = Arrivals()
    exporter = exporter_for_app(CallbackSink(held(arrivals, release)), queue_size=5, batch_size=1)
    app = App(exporter)
    n = 60
    try:
        with structlog.testing.capture_logs() as logs:
            for i in range(n):
                app.agent_run(f"q{i}", content=marker)
            assert wait_for(
                lambda: exporter.stats()["spans_seen"] == 3 * n and exporter.stats()["traces_buffered"] == 0
            )
            assert wait_for(lambda: exporter.stats()["dropped"].get("queue_full", 0) >= n - 6), exporter.stats()
        dropped = exporter.stats()["dropped"]
        assert set(dropped) == {"queue_full"}, dropped
        drop_logs = [e for e in logs if e["event"] == "exporter_dropped"]
        assert [e["reason"] for e in drop_logs] == ["queue_full"], drop_logs
        assert 1 <= drop_logs[0]["total"] <= dropped["queue_full"]
        assert marker not in repr(logs)
    finally:
        release.set()
        app.shutdown()
    assert arrivals.count() + sum(exporter.stats()["dropped"].values()) == n


@pytest.mark.parametrize("traffic", ["scored", "sampled_out", "judges_own"])
def test_memory_stays_flat_under_endless_traffic(traffic: str) -> None:
    """An app that runs for days: every trace it has seen is remembered for a while (handed over:
    its late spans are dropped; sampled out or the judges' own: its later spans are ignored), and
    each of those memories is bounded. Past the bound (16,384 traces), 17,000 more traces leave
    the exporter's memory where it was."""
    from tracing import JUDGE_ROLE, ROLE_ATTRIBUTE

    rule = ScoringRule(["s"], sample_rate=0.0 if traffic == "sampled_out" else 1.0)
    exporter = exporter_for_app(CallbackSink(lambda batch: None), rules=[rule], grace_s=0.0, max_traces=64)
    app = App(exporter, max_queue_size=100_000, max_export_batch_size=2048)
    attributes = chat_attributes("Hi?", "Hello.")
    if traffic == "judges_own":
        attributes = {**attributes, ROLE_ATTRIBUTE: JUDGE_ROLE}
    seen = 0

    def run(n: int) -> int:
        nonlocal seen
        for _ in range(n):
            with app.tracer.start_as_current_span("chat m", attributes=attributes):
                pass
        seen += n
        app.provider.force_flush()  # the processor's: every span has reached export() and left it
        handed = seen if traffic == "scored" else 0  # sent, or dropped by the queue in the burst

        def settled() -> bool:
            stats = exporter.stats()
            return bool(stats["runs_sent"] + sum(stats["dropped"].values()) == handed and stats["queue_depth"] == 0)

        assert wait_for(settled, 60), exporter.stats()
        assert exporter.stats()["traces_buffered"] == 0, exporter.stats()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        run(17_000)  # past every bound
        before = run(1_000)
        after = run(17_000)
    finally:
        tracemalloc.stop()
        app.shutdown()
    stats = exporter.stats()
    if traffic == "scored":
        assert stats["runs_sent"] + sum(stats["dropped"].values()) == seen, stats
    else:
        assert stats["skipped"] == {"sampled_out" if traffic == "sampled_out" else "loop_guard": seen}, stats
    # Unbounded, each trace held about 130 bytes more: 2.3 MB (measured); bounded, a table of
    # them may have been resized meanwhile: up to 1 MB (measured).
    assert after - before < 1_600_000, f"{(after - before) / 1e6:.2f} MB more after 17,000 traces"
