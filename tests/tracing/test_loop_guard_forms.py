"""The loop guard's two forms give one verdict: the exporter's ``TraceBuffer`` (span by span,
over SDK spans) and ``loop_guard`` (a whole trace's span records, as backfill reads them).

Over a table of traces, each form's verdict is ``None`` (the whole trace is tracescore's own)
or the judge span ids whose subtrees are excluded. The rules live in ``tracing.read._guard``;
this table is what keeps the two callers from drifting apart. They differ in one row, by
design: a judge span with a remote parent roots what the exporter's process has (the whole
trace goes), while in a stored trace, which holds the other process's spans too, it is a
child (its subtree goes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.tracing._spans import Recorder, agent_trace
from tracing import JUDGE_ROLE, ROLE_ATTRIBUTE, ScoringRule
from tracing._records import span_record
from tracing.capture._buffer import BufferLimits, TraceBuffer
from tracing.capture._tally import Tally
from tracing.read import loop_guard

Verdict = frozenset[str] | None
JUDGE = {ROLE_ATTRIBUTE: JUDGE_ROLE}
AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}


def _hex(span: trace.Span) -> str:
    return format(span.get_span_context().span_id, "016x")


@contextmanager
def _remote_parent() -> Iterator[None]:
    """Spans started inside are children of a span in another process (a propagated context)."""
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        yield
    finally:
        context.detach(token)


def _ordinary() -> tuple[list[ReadableSpan], Verdict]:
    rec = Recorder()
    agent_trace(rec)
    return rec.spans(), frozenset()


def _own_scope() -> tuple[list[ReadableSpan], Verdict]:
    """One span of a tracescore tracer inside the app's trace (same service)."""
    app, own = Recorder(), Recorder(scope="tracescore.score_writer")
    with app.span("invoke_agent a", AGENT), own.span("write scores"):
        agent_trace(app)
    return app.spans() + own.spans(), None


def _own_service() -> tuple[list[ReadableSpan], Verdict]:
    rec = Recorder(service="tracescore-worker")
    agent_trace(rec)
    return rec.spans(), None


def _judge_root() -> tuple[list[ReadableSpan], Verdict]:
    rec = Recorder()
    with rec.span("judge", JUDGE):
        agent_trace(rec)
    return rec.spans(), None


def _judge_child_with_children() -> tuple[list[ReadableSpan], Verdict]:
    rec = Recorder()
    with rec.span("invoke_agent a", AGENT), rec.span("judge", JUDGE) as judge:
        agent_trace(rec)
    return rec.spans(), frozenset({_hex(judge)})


def _remote_parent_judge() -> tuple[list[ReadableSpan], Verdict]:
    """A judge span whose parent is in another process: the root of what this process has, so
    the exporter drops the trace; a stored trace's reader sees a child and drops its subtree
    (``records_verdict`` reads this row's expectation from ``STORED``)."""
    rec = Recorder()
    with _remote_parent(), rec.span("judge", JUDGE):
        agent_trace(rec)
    return rec.spans(), None


def _judge_under_remote_parent_app_root() -> tuple[list[ReadableSpan], Verdict]:
    """The app's root has a remote parent; a judge span under it is not a root."""
    rec = Recorder()
    with _remote_parent(), rec.span("invoke_agent a", AGENT), rec.span("judge", JUDGE) as judge:
        agent_trace(rec)
    return rec.spans(), frozenset({_hex(judge)})


CASES: dict[str, Callable[[], tuple[list[ReadableSpan], Verdict]]] = {
    "ordinary trace": _ordinary,
    "own scope": _own_scope,
    "own service": _own_service,
    "judge root": _judge_root,
    "judge child with children": _judge_child_with_children,
    "remote-parent judge span": _remote_parent_judge,
    "judge under a remote-parent app root": _judge_under_remote_parent_app_root,
}


# Where the stored trace's verdict differs from the exporter's (see the module docstring).
STORED: dict[str, Callable[[list[ReadableSpan]], Verdict]] = {
    "remote-parent judge span": lambda spans: frozenset(
        format(s.context.span_id, "016x") for s in spans if s.context is not None and s.name == "judge"
    ),
}


def buffer_verdict(spans: list[ReadableSpan]) -> Verdict:
    """What the exporter's buffer decides for one trace's spans, filed in this order."""
    tally = Tally()
    buffer = TraceBuffer([ScoringRule(["s"])], BufferLimits(grace_s=0.0), tally)
    for span in spans:
        buffer.add(span, 0.0)
    traces = buffer.poll(0.0, force=True).traces
    if tally.skipped.get("loop_guard"):
        assert traces == []
        assert len(buffer) == 0, "a guarded trace left spans behind"
        return None
    (entry,) = traces
    assert len(entry.spans) == len(spans)
    return frozenset(entry.judge_ids or ())


def records_verdict(spans: list[ReadableSpan]) -> Verdict:
    """What ``loop_guard`` decides over the same spans as span records (backfill's input)."""
    return loop_guard([span_record(span) for span in spans])


def test_the_buffer_and_loop_guard_give_one_verdict() -> None:
    """Every case, both span orders (the SDK's, children first, and roots first): both forms
    give the expected verdict. One test over the table, so a drift in any row fails it."""
    got: dict[str, tuple[Verdict, Verdict]] = {}
    wanted: dict[str, tuple[Verdict, Verdict]] = {}
    for name, build in CASES.items():
        spans, expected = build()
        assert len({s.context.trace_id for s in spans if s.context is not None}) == 1, name
        for order, ordered in (("ended first", spans), ("roots first", spans[::-1])):
            key = f"{name}, {order}"
            stored = STORED[name](spans) if name in STORED else expected
            got[key] = (buffer_verdict(ordered), records_verdict(ordered))
            wanted[key] = (expected, stored)
    assert got == wanted
