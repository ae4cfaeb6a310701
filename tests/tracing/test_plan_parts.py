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
