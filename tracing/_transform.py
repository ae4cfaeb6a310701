"""``trace_to_run``: one trace (its spans) → the agent-typed run a scorer sees. Pure; no I/O.

Spans are SDK ``ReadableSpan``s (live or decoded from OTLP) or the ``SpanRecord``s the
exporter ships to the worker; both read the same.

Target: the outermost agent span (``invoke_agent`` / OpenInference ``AGENT`` / Mastra
``agent_run``); a trace without one is scored on its outermost LLM span.

What the model saw is read from the target's first LLM call (else from the target's own
input): system messages and ``gen_ai.system_instructions`` become ``system_messages`` (those
carrying a ``tag`` go to ``tagged_system_messages``); the trailing run of user messages is
this turn's ``input_messages``; everything before it is ``remembered_messages``. The output
is one assistant message holding every LLM call's answer in order, tool calls as
``tool-invocation`` parts, filled with their results (``state="result"``) when the trace
has them (a tool span with the call id, or a later LLM call's tool message).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from tracing._errors import TraceReadError
from tracing._formats import (
    agent_name,
    conversation_id,
    model_name,
    read_input,
    read_output,
    read_system,
    read_tool,
    span_kind,
)
from tracing._messages import (
    Msg,
    StepBreak,
    ToolCall,
    ToolResult,
    attach_results,
    render_messages,
)
from tracing._run import RunIdentity, SpanRecord, TracedRun
from tracing._span import SpanEvent, SpanLike, SpanView, view_spans
from tracing._text import as_shipped
from tracing.read import plan_runs

__all__ = ["find_targets", "read_trace", "trace_to_run", "trace_to_runs"]


def _targets(views: Sequence[SpanView], exclude_under: Collection[str] = ()) -> list[SpanView]:
    """The runs' target spans in start order, as the one planner (``tracing.read.plan_runs``)
    chooses them for the exporter and backfill: top-level agent spans, else top-level LLM
    spans, none at or under a span in ``exclude_under``."""
    records = [
        SpanRecord("", v.span_id, v.name, v.parent.span_id if v.parent is not None else None, "INTERNAL", v.start_ns)
        for v in views
    ]
    for record, view in zip(records, views, strict=True):
        record.attributes = view.attributes  # type: ignore[assignment]  # read-only here: no copy
    by_id = {record.span_id: view for record, view in zip(records, views, strict=True)}
    plans = plan_runs(records, kinds=[span_kind(v) for v in views], exclude_under=exclude_under)
    return [by_id[target.span_id] for target, _ in plans]


def _attach_log_records(views: Sequence[SpanView], log_records: Iterable[Any]) -> None:
    """Log-based GenAI events (OTel logs API) → events of the span they were emitted in."""
    by_id = {v.sid: v for v in views}
    for item in log_records:
        record = getattr(item, "log_record", item)
        span_id = getattr(record, "span_id", None)
        name = getattr(record, "event_name", None) or (record.attributes or {}).get("event.name")
        if not isinstance(span_id, int) or not isinstance(name, str):
            continue
        view = by_id.get(span_id)
        if view is not None:
            body = as_shipped(record.body) if isinstance(record.body, Mapping) else record.body
            view.events.append(SpanEvent(name, as_shipped(dict(record.attributes or {})), body))


def _split(context: list[Msg], system_extra: list[Msg]) -> dict[str, Any]:
    system: list[Msg] = []
    tagged: dict[str, list[Msg]] = {}
    seen: set[str] = set()
    for msg in [*system_extra, *(m for m in context if m.role == "system")]:
        key = msg.text
        if key in seen:  # instructions recorded both as an attribute and as a message
            continue
        seen.add(key)
        if msg.tag:
            tagged.setdefault(msg.tag, []).append(msg)
        else:
            system.append(msg)
    rest = [m for m in context if m.role != "system"]
    start = len(rest)
    while start > 0 and rest[start - 1].role == "user":
        start -= 1
    if start == len(rest):  # the context does not end with the user's turn
        last_user = max((i for i, m in enumerate(rest) if m.role == "user"), default=None)
        start = last_user if last_user is not None else 0
    remembered, current = rest[:start], rest[start:]
    attach_results(remembered + current, _results_of(remembered + current))
    remembered = [m for m in remembered if not _only_attached_results(m)]
    current = [m for m in current if not _only_attached_results(m)]
    return {
        "input_messages": render_messages(current),
        "remembered_messages": render_messages(remembered),
        "system_messages": render_messages(system),
        "tagged_system_messages": {k: render_messages(v) for k, v in tagged.items()},
    }


def _open_calls(msg: Msg) -> bool:
    return any(isinstance(p, ToolCall) and not p.has_result for p in msg.parts)


def _results_of(messages: Iterable[Msg]) -> list[ToolResult]:
    return [p for m in messages if m.role == "tool" for p in m.parts if isinstance(p, ToolResult)]


def _only_attached_results(msg: Msg) -> bool:
    # A tool message whose results now sit in the assistant's tool-invocation parts.
    return msg.role == "tool" and bool(msg.parts) and all(isinstance(p, ToolResult) and p.attached for p in msg.parts)


def _members(target: SpanView, kind: str, *, through_agents: bool = False) -> list[SpanView]:
    """Outermost ``kind`` spans under ``target`` that belong to it (not to a nested agent, unless
    ``through_agents``).

    A walk down from ``target`` that stops at a nested agent (what is under it is that agent's)
    and at a ``kind`` span (those under it are not outermost): linear, whatever the depth.
    """
    out = []
    stack = list(target.children)
    while stack:
        span = stack.pop()
        found = span_kind(span)
        if found == "agent" and not through_agents:
            continue
        if found == kind:
            out.append(span)
            continue
        stack.extend(span.children)
    return sorted(out, key=SpanView.order_key)


def _run_for(target: SpanView, views: Sequence[SpanView]) -> TracedRun:
    is_agent = span_kind(target) == "agent"
    llms = _members(target, "llm") if is_agent else [target]
    through = is_agent and not llms
    if through:
        # An agent that calls no model itself but runs agents that do (a Traceloop @agent
        # around a framework's invoke_agent, an orchestrator): its run is theirs, read through.
        llms = _members(target, "llm", through_agents=True)
    tools = [read_tool(s) for s in _members(target, "tool", through_agents=through)]

    context: list[Msg] | None = None
    first_llm = None
    for llm in llms:
        context = read_input(llm)
        if context is not None:
            first_llm = llm
            break
    if context is None and is_agent:
        context = read_input(target)
    if context is None:
        source = llms[0] if llms else target
        raise TraceReadError(
            "no_content",
            "no input messages recorded (is message content capture on? e.g. "
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)",
            span_name=source.name,
            span_id=source.span_id,
            attribute="gen_ai.input.messages",
        )
    system_extra = read_system(target) if is_agent else []
    if first_llm is not None:
        system_extra = system_extra + read_system(first_llm)

    # One Msg per LLM step (with the step's start time), merged into one answer at the end.
    steps: list[tuple[int, Msg]] = []
    for llm in llms:
        for msg in read_output(llm) or []:
            if msg.role == "assistant":
                steps.append((llm.start_ns or 0, Msg("assistant", list(msg.parts))))
    if not steps and is_agent:
        steps = [(target.start_ns or 0, m) for m in read_output(target) or [] if m.role == "assistant"]
    if not steps:
        source = llms[0] if llms else target
        raise TraceReadError(
            "no_content",
            "no output messages recorded (is message content capture on?)",
            span_name=source.name,
            span_id=source.span_id,
            attribute="gen_ai.output.messages",
        )
    step_msgs = [m for _, m in steps]
    from_spans = [(t, t.as_result()) for t in tools]
    attach_results(step_msgs, [r for t, r in from_spans if t.has_result and t.call_id])
    if any(_open_calls(m) for m in step_msgs):
        # Results not in tool spans: a later LLM call's input carries them as tool messages.
        # Read only when needed: those inputs repeat the whole history and are the biggest.
        later = [r for llm in llms if llm is not first_llm for r in _results_of(read_input(llm) or [])]
        attach_results(step_msgs, later)
    attach_results(step_msgs, [r for t, r in from_spans if t.has_result and not t.call_id])
    # A tool span no recorded model call asked for (the LLM output was not captured with its
    # tool calls) is still a tool the agent invoked: add it to the step it ran in.
    calls = [p for m in step_msgs for p in m.parts if isinstance(p, ToolCall)]
    call_ids = {p.id for p in calls if p.id}
    # A tool span without a call id (Traceloop's @tool writes none) whose result came another
    # way (a later model call's input) is still the run of a call the model asked for: one
    # such span per asked call of its name, or it was counted twice.
    unclaimed = Counter(p.name for p in calls)
    for tool, res in from_spans:
        if res.attached or (tool.call_id is not None and tool.call_id in call_ids):
            unclaimed[tool.name or ""] -= 1
    starts = [t0 for t0, _ in steps]  # in order: the LLM spans are sorted by start
    for tool, res in from_spans:
        if res.attached or (tool.call_id is not None and tool.call_id in call_ids):
            continue
        if tool.call_id is None and unclaimed[tool.name or ""] > 0:
            unclaimed[tool.name or ""] -= 1
            continue
        # The last step that began by the tool's start (a scan per tool was quadratic).
        before = bisect.bisect_right(starts, tool.span.start_ns or 0)
        owner = step_msgs[before - 1] if before else step_msgs[0]
        owner.parts.append(ToolCall(tool.call_id, tool.name or "", tool.args, tool.result, tool.has_result))
    answer = Msg("assistant", [])
    for index, msg in enumerate(step_msgs):
        answer.parts.append(StepBreak(index))
        answer.parts.extend(msg.parts)

    model_src = first_llm or (llms[0] if llms else target)
    identity = RunIdentity(
        trace_id=target.trace_id,
        span_id=target.span_id,
        span_name=target.name,
        agent_name=agent_name(target) if is_agent else None,
        conversation_id=conversation_id(target) or next((c for s in llms if (c := conversation_id(s))), None),
        model=model_name(model_src) or model_name(target),
        service_name=target.service,
        start_time_ns=target.start_ns,
        end_time_ns=target.end_ns,
    )
    try:
        # One validation pass through pydantic's compiled schema: faster than building the
        # message models piece by piece, and it checks what we produced.
        return TracedRun.model_validate(
            {
                "identity": identity,
                "input": _split(context, system_extra),
                "output": render_messages([answer], steps=len(step_msgs) > 1),
            }
        )
    except ValidationError as exc:
        raise TraceReadError(
            "bad_message",
            f"the messages read do not form a valid agent run: {_validation_summary(exc)}",
            span_name=target.name,
            span_id=target.span_id,
        ) from None


def _validation_summary(exc: ValidationError) -> str:
    """Where and which rule, from the first error: its ``msg`` of a custom validator may quote
    the value, pydantic's own messages state the rule only."""
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "run"
    custom = first["type"] in ("value_error", "assertion_error")
    return f"{where}: {first['type'] if custom else first['msg']} ({exc.error_count()} errors)"


@contextmanager
def _views(spans: Sequence[SpanLike]) -> Iterator[list[SpanView]]:
    """Span views, unlinked afterwards: parent/child links are reference cycles, which only the
    cyclic GC would free; on the exporter's hot path that GC work cost more than the reading."""
    views = view_spans(spans)
    try:
        yield views
    finally:
        for v in views:
            v.parent = None
            v.children = []


def find_targets(spans: Sequence[SpanLike]) -> list[str]:
    """Span ids (hex) of every run in the trace: top-level agent spans, else top-level LLM spans."""
    with _views(spans) as views:
        return [v.span_id for v in _targets(views)]


def trace_to_runs(spans: Sequence[SpanLike], *, log_records: Iterable[Any] = ()) -> list[TracedRun]:
    """Every run of the trace (see ``find_targets``), in start order. Raises ``TraceReadError``."""
    with _views(spans) as views:
        _attach_log_records(views, log_records)
        targets = _targets(views)
        if not targets:
            raise TraceReadError("no_target", "the trace has no agent span and no LLM span")
        return [_run_for(t, views) for t in targets]


def read_trace(spans: Sequence[SpanLike], *, exclude_under: Iterable[str] = ()) -> list[TracedRun | TraceReadError]:
    """Every run of the trace, each read on its own: one unreadable run does not hide the others.

    Targets at or under a span in ``exclude_under`` (span ids, hex) are skipped (the loop guard).
    A trace that cannot be read at all (parent ids forming a cycle) is one ``TraceReadError``.
    """
    excluded = set(exclude_under)
    out: list[TracedRun | TraceReadError] = []
    try:
        with _views(spans) as views:
            for target in _targets(views, excluded):
                try:
                    out.append(_run_for(target, views))
                except TraceReadError as exc:
                    out.append(exc.with_traceback(None))  # a kept traceback would keep every frame
    except TraceReadError as exc:  # the trace as a whole cannot be read (its parent ids form a cycle)
        return [exc.with_traceback(None)]
    return out


def trace_to_run(
    spans: Sequence[SpanLike],
    target_span_id: str | None = None,
    *,
    log_records: Iterable[Any] = (),
) -> TracedRun:
    """Read one trace into the run a scorer sees. Raises ``TraceReadError``, never guesses.

    ``target_span_id`` (16 hex digits) picks the span to score; default: the first top-level
    agent span, else the first top-level LLM span. ``log_records`` are OTel log records
    (``LogData`` or ``LogRecord``) of the same trace, for instrumentations that emit their
    GenAI events through the logs API.
    """
    with _views(spans) as views:
        if not views:
            raise TraceReadError("no_target", "the trace has no spans")
        _attach_log_records(views, log_records)
        if target_span_id is not None:
            target = next((v for v in views if v.span_id == target_span_id.lower()), None)
            if target is None:
                raise TraceReadError("no_target", f"span {target_span_id} is not in the trace ({len(views)} spans)")
            return _run_for(target, views)
        targets = _targets(views)
        if not targets:
            root = next((v for v in views if v.parent is None), views[0])
            raise TraceReadError(
                "no_target",
                "the trace has no agent span (invoke_agent, openinference AGENT, mastra agent_run) "
                "and no LLM span (chat, openinference LLM, mastra model_generation)",
                span_name=root.name,
                span_id=root.span_id,
                attribute="gen_ai.operation.name",
            )
        return _run_for(targets[0], views)
