"""plan_part: the runs of a trace read in parts, each part's runs those no part before held."""

from __future__ import annotations

from tracing import SpanRecord
from tracing.read import plan_part, plan_runs

TRACE = "0af7651916cd43dd8448eb211c80319c"
KINDS = {"agent": "invoke_agent", "llm": "chat", "tool": "execute_tool", "other": "handle"}


def span(span_id: int, kind: str, parent: int | None = None) -> SpanRecord:
    name = "POST /ask" if kind == "other" else f"{KINDS[kind]} x"
    attributes = {} if kind == "other" else {"gen_ai.operation.name": KINDS[kind]}
    return SpanRecord(
        TRACE,
        f"{span_id:016x}",
        name,
        f"{parent:016x}" if parent else None,
        start_time_ns=span_id,
        attributes=attributes,
    )


def targets(runs: list[tuple[SpanRecord, list[SpanRecord]]]) -> list[int]:
    return [int(target.span_id, 16) for target, _ in runs]


def test_a_first_part_is_planned_as_plan_runs_plans_it() -> None:
    """Before nothing: the same runs as plan_runs, and an agent root holding it all leaves a
    later part no run to find (nothing kept)."""
    agent_trace = [span(1, "agent"), span(2, "llm", 1), span(3, "tool", 1)]
    plan = plan_part(agent_trace, None)
    assert targets(plan.runs) == targets(plan_runs(agent_trace)) == [1]
    assert plan.after is None
    calls = [span(1, "other"), span(2, "llm", 1)]
    assert targets(plan_part(calls, None).runs) == [2]


def test_a_later_part_is_a_run_only_under_a_span_no_run_held() -> None:
    """Top-level LLM calls under a root that is no agent: a later call under the root is a run,
    one under a call read before (that call's run) is not."""
    before = plan_part([span(1, "other"), span(2, "llm", 1)], None).after
    assert before is not None
    second = plan_part([span(4, "llm", 1)], before)
    assert targets(second.runs) == [4]
    assert second.after is not None
    assert targets(plan_part([span(7, "llm", 1)], second.after).runs) == [7]  # a third part: the same
    nested = plan_part([span(5, "llm", 2), span(6, "tool", 5)], before)
    assert (nested.runs, nested.split) == ([], [])


def test_an_agent_read_before_makes_a_later_llm_call_no_run() -> None:
    """The parts before held an agent: the trace's runs are its top-level agents, so a later
    top-level LLM call is no run, and a later top-level agent is."""
    before = plan_part([span(1, "other"), span(2, "agent", 1)], None).after
    assert before is not None
    assert plan_part([span(4, "llm", 1)], before).runs == []
    assert targets(plan_part([span(5, "agent", 1), span(6, "llm", 5)], before).runs) == [5]


def test_a_later_run_with_spans_read_before_under_it_is_split_not_scored() -> None:
    """A tool span read before its agent, whose agent comes late: that agent's run is not whole
    (its tool span was read without it): split, no run."""
    before = plan_part([span(1, "other"), span(3, "tool", 2)], None).after
    assert before is not None
    plan = plan_part([span(2, "agent", 1)], before)
    assert (plan.runs, targets(plan.split)) == ([], [2])


def _parts(*parts: list[SpanRecord]) -> list[list[int]]:
    """Each part's runs (targets), each part planned with what the parts before left."""
    before, found = None, []
    for n, part in enumerate(parts):
        plan = plan_part(part, before)
        found.append(targets(plan.runs))
        before = plan.after
        if before is None:
            found.extend([] for _ in parts[n + 1 :])
            break
    return found


def test_a_later_llm_call_under_a_parent_not_read_is_no_run() -> None:
    """Two LLM calls of an agent whose root (sent last, as exporters do) comes last: the first
    read as a run (all a first part can do), the second was scored as a run of its own under
    the agent not read, and the agent lost. A whole read makes the agent the one run: the second
    call is a late span, the agent (with spans read before under it) split."""
    first, second, root = [span(2, "llm", 1)], [span(3, "llm", 1)], [span(1, "agent")]
    assert targets(plan_runs([*first, *second, *root])) == [1]
    assert _parts(first, second, root) == [[2], [], []]
    before = plan_part(first, None).after
    assert before is not None
    later = plan_part(second, before)
    assert (later.runs, later.split) == ([], [])
    assert later.after is not None
    assert targets(plan_part(root, later.after).split) == [1]


def test_a_root_sent_last_then_opens_the_trace_to_later_calls() -> None:
    """The root that is no agent comes after its first LLM call: a later call under it is a
    run (a whole read makes both calls runs)."""
    parts = [span(2, "llm", 1)], [span(1, "other")], [span(3, "llm", 1)]
    assert targets(plan_runs([s for part in parts for s in part])) == [2, 3]
    assert _parts(*parts) == [[2], [], [3]]


def test_a_span_under_a_run_read_before_is_no_run_once_its_parent_comes() -> None:
    """A tool span (X) read under a parent not read (Q), which comes later under an LLM call
    read (L1): an LLM call under X is inside L1's run, no run of its own (a whole read makes L1
    alone). It was scored, X's id kept open for good."""
    first = [span(1, "other"), span(2, "llm", 1), span(4, "tool", 3)]
    second = [span(3, "tool", 2), span(5, "tool", 2)]
    third = [span(6, "llm", 4)]
    assert targets(plan_runs([*first, *second, *third])) == [2]
    assert _parts(first, second, third) == [[2], [], []]


def test_a_later_root_is_no_run_while_spans_read_before_hang_under_a_span_not_read() -> None:
    """An LLM call read under a parent not read, then an agent root: the parent may come later
    under the agent (a whole read then makes the agent's run, holding the call read before), so
    the agent is no run yet."""
    first, root, middle = [span(2, "llm", 1)], [span(9, "agent")], [span(1, "other", 9)]
    assert targets(plan_runs([*first, *root, *middle])) == [9]
    assert _parts(first, root, middle) == [[2], [], []]
