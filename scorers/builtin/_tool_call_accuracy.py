"""``tool_call_accuracy``: did the agent call the expected tool, or the expected tools in order?

Algorithm (Mastra's code scorer, 0 or 1), over the response's tool calls in call order:

- ``expected_tool``: lenient — the tool is among the calls; strict — it is the *only* call.
- ``expected_tool_order``: lenient — each expected name is called, and their *first* calls come
  in that order (other calls may come between them; a name expected twice never passes: Mastra's
  ``checkToolOrder``, where ``checks.tool_order`` takes any later call, a subsequence); strict —
  the calls are exactly that sequence.
- No tool calls at all scores 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from scorers import Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer
from scorers.agent import extract_tool_calls

__all__ = ["first_calls_in_order", "tool_call_accuracy"]


def first_calls_in_order(expected: Sequence[str], actual: Sequence[str]) -> bool:
    """Whether every name of ``expected`` is in ``actual`` and their first calls come in that
    order, strictly (so a name expected twice never passes)."""
    firsts: dict[str, int] = {}
    for position, name in enumerate(actual):
        firsts.setdefault(name, position)
    positions = [firsts.get(name) for name in expected]
    if any(p is None for p in positions):
        return False
    return all(a < b for a, b in itertools.pairwise(positions))  # type: ignore[operator]


def tool_call_accuracy(
    *,
    expected_tool: str | None = None,
    expected_tool_order: Sequence[str] | None = None,
    strict_mode: bool = False,
    id: str = "tool-call-accuracy",
    name: str | None = None,
) -> Scorer:
    """1 when the tool calls match the expectation, else 0 (higher is better).

    Options (give exactly one of the first two):
        expected_tool: the tool the agent should call.
        expected_tool_order: the tools the agent should call, in this order.
        strict_mode: no other calls allowed (default False, see the module docstring).
        id, name: the scorer's identity.
    """
    order = list(expected_tool_order) if expected_tool_order is not None else None
    if (expected_tool is None) == (order is None):
        raise ScorerConfigError(
            f"scorer {id!r}: give exactly one of expected_tool (a tool name) or "
            "expected_tool_order (a list of tool names)"
        )
    if order is not None and (not order or not all(isinstance(t, str) and t for t in order)):
        raise ScorerConfigError(f"scorer {id!r}: expected_tool_order must be a non-empty list of tool names")
    if expected_tool is not None and (not isinstance(expected_tool, str) or not expected_tool):
        raise ScorerConfigError(f"scorer {id!r}: expected_tool must be a non-empty tool name")

    def preprocess(run: ScorerRun) -> dict[str, Any]:
        actual = extract_tool_calls(run.output).tools
        if order is not None:
            passed = actual == order if strict_mode else first_calls_in_order(order, actual)
        else:
            passed = actual == [expected_tool] if strict_mode else expected_tool in actual
        return {
            "actual_tools": actual,
            "expected_tool": expected_tool,
            "expected_tool_order": order,
            "strict_mode": strict_mode,
            "has_tool_calls": bool(actual),
            "passed": bool(actual) and passed,
        }

    def score(results: StepResults) -> float:
        return 1.0 if results.preprocess_step_result["passed"] else 0.0

    def reason(results: StepResults) -> str:
        pre = results.preprocess_step_result
        called = ", ".join(pre["actual_tools"]) or "no tools"
        wanted = f"the order {' → '.join(order)}" if order is not None else f"the tool {expected_tool!r}"
        verdict = "matches" if pre["passed"] else "does not match"
        mode = "strict" if strict_mode else "lenient"
        return f"Called {called}; this {verdict} {wanted} ({mode} mode)."

    description = (
        f"Whether the agent called the tools in the order [{', '.join(order)}]."
        if order is not None
        else f"Whether the agent called the tool {expected_tool!r}."
    )
    return (
        create_scorer(
            id,
            name=name or "Tool call accuracy",
            description=description,
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
            # 2: calls in Mastra's content.toolInvocations are read (they were ignored). 3: the
            # lenient order, which was 2 already: it reads each tool's first call (Mastra's
            # rule; 1 took any later call).
            version="3" if order is not None and not strict_mode else "2",
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )
