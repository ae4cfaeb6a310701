"""Quick checks: small 0/1 scorers for common assertions, combinable with ``all_of``/``any_of``.

Each check is an ordinary scorer built with ``create_scorer`` (type ``"agent"``): a preprocess
step decides pass/fail and records what it saw, ``generate_score`` maps it to 1 or 0 and
``generate_reason`` says why. Text checks read the response's assistant text (every assistant
message, joined by newlines); tool checks read its tool invocations in call order.

``all_of``/``any_of`` run the given scorers on the same run (through their public ``run``) and
pass when all / any of them scored 1. A sub-scorer that is not scorable counts as not passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scorers import Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer
from scorers._steps import plain_json
from scorers.agent import ToolInvocation, extract_tool_calls
from scorers.builtin._runs import assistant_text

__all__ = [
    "all_of",
    "any_of",
    "called_tool",
    "did_not_call",
    "equals",
    "excludes",
    "includes",
    "is_subsequence",
    "matches",
    "max_tool_calls",
    "no_tool_errors",
    "tool_order",
]

Verdict = Callable[[ScorerRun], dict[str, Any]]


# The checks that read tool calls. "2" (2026-12-05): calls in Mastra's content.toolInvocations
# are read (they were ignored), a call in the AI SDK's v5 states too.
TOOL_CALLS_VERSION = "2"


def _check(check_id: str, name: str, description: str, decide: Verdict, explain: str, version: str = "1") -> Scorer:
    """A 0/1 scorer; ``decide`` returns details including ``passed``; ``explain`` is a template."""

    def score(results: StepResults) -> float:
        return 1.0 if results.preprocess_step_result["passed"] else 0.0

    def reason(results: StepResults) -> str:
        details = results.preprocess_step_result
        verdict = "Passed" if details["passed"] else "Failed"
        return f"{verdict}: " + explain.format(**details)

    return (
        create_scorer(
            check_id,
            name=name,
            description=description,
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
            version=version,
        )
        .preprocess(plain_json(decide))
        .generate_score(score)
        .generate_reason(reason)
    )


def _text_arg(check_id: str, option: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ScorerConfigError(f"scorer {check_id!r}: {option} must be a non-empty string, got {value!r}")
    return value


# --- output text ---------------------------------------------------------------------------


def includes(expected: str, *, ignore_case: bool = True, id: str = "check-includes", name: str | None = None) -> Scorer:
    """1 when the output text contains ``expected`` (case-insensitive by default)."""
    target = _text_arg(id, "expected", expected)

    def decide(run: ScorerRun) -> dict[str, Any]:
        text = assistant_text(run)
        found = target.lower() in text.lower() if ignore_case else target in text
        return {"expected": target, "passed": found}

    return _check(
        id,
        name or "Includes check",
        f"Output includes {target!r}.",
        decide,
        "output includes {expected!r}: {passed}.",
    )


def excludes(unwanted: str, *, ignore_case: bool = True, id: str = "check-excludes", name: str | None = None) -> Scorer:
    """1 when the output text does NOT contain ``unwanted``."""
    target = _text_arg(id, "unwanted", unwanted)

    def decide(run: ScorerRun) -> dict[str, Any]:
        text = assistant_text(run)
        found = target.lower() in text.lower() if ignore_case else target in text
        return {"unwanted": target, "passed": not found}

    return _check(
        id,
        name or "Excludes check",
        f"Output does not include {target!r}.",
        decide,
        "output free of {unwanted!r}: {passed}.",
    )


def equals(
    expected: str,
    *,
    ignore_case: bool = True,
    strip: bool = True,
    id: str = "check-equals",
    name: str | None = None,
) -> Scorer:
    """1 when the output text equals ``expected`` (after ``strip`` of surrounding whitespace and
    ``ignore_case``)."""
    if not isinstance(expected, str):
        raise ScorerConfigError(f"scorer {id!r}: expected must be a string, got {expected!r}")

    def norm(text: str) -> str:
        text = text.strip() if strip else text
        return text.lower() if ignore_case else text

    def decide(run: ScorerRun) -> dict[str, Any]:
        text = assistant_text(run)
        return {"expected": expected, "output": text, "passed": norm(text) == norm(expected)}

    return _check(
        id,
        name or "Equals check",
        f"Output equals {expected!r}.",
        decide,
        "output {output!r} equals {expected!r}: {passed}.",
    )


def matches(
    pattern: str | re.Pattern[str],
    *,
    exact: bool = False,
    id: str = "check-matches",
    name: str | None = None,
) -> Scorer:
    """1 when the output text matches the regular expression ``pattern``.

    ``exact=True`` needs the whole text to match (``re.fullmatch``); otherwise ``re.search``.
    Give flags inside a compiled pattern or inline (``(?i)``).
    """
    try:
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    except re.error as exc:
        raise ScorerConfigError(f"scorer {id!r}: invalid regular expression {pattern!r}: {exc}") from exc
    if not isinstance(regex, re.Pattern):
        raise ScorerConfigError(f"scorer {id!r}: pattern must be a str or re.Pattern, got {pattern!r}")

    def decide(run: ScorerRun) -> dict[str, Any]:
        text = assistant_text(run)
        found = regex.fullmatch(text) if exact else regex.search(text)
        return {
            "pattern": regex.pattern,
            "match": found.group(0) if found else None,
            "passed": found is not None,
        }

    how = "fully matches" if exact else "matches"
    return _check(
        id,
        name or "Matches check",
        f"Output {how} /{regex.pattern}/.",
        decide,
        "output " + how + " /{pattern}/: {passed}.",
    )


# --- tool calls ----------------------------------------------------------------------------


def called_tool(tool_name: str, *, times: int = 1, id: str = "check-called-tool", name: str | None = None) -> Scorer:
    """1 when ``tool_name`` was called at least ``times`` times (default once)."""
    tool = _text_arg(id, "tool_name", tool_name)
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ScorerConfigError(f"scorer {id!r}: times must be an int >= 1, got {times!r}")

    def decide(run: ScorerRun) -> dict[str, Any]:
        count = extract_tool_calls(run.output).tools.count(tool)
        return {"tool_name": tool, "times": times, "count": count, "passed": count >= times}

    return _check(
        id,
        name or "Called tool check",
        f"The agent called {tool!r}" + (f" at least {times} times." if times > 1 else "."),
        decide,
        "{tool_name!r} called {count} time(s), needed {times}.",
        version=TOOL_CALLS_VERSION,
    )


def did_not_call(tool_name: str, *, id: str = "check-did-not-call", name: str | None = None) -> Scorer:
    """1 when ``tool_name`` was never called."""
    tool = _text_arg(id, "tool_name", tool_name)

    def decide(run: ScorerRun) -> dict[str, Any]:
        count = extract_tool_calls(run.output).tools.count(tool)
        return {"tool_name": tool, "count": count, "passed": count == 0}

    return _check(
        id,
        name or "Did not call check",
        f"The agent did not call {tool!r}.",
        decide,
        "{tool_name!r} called {count} time(s).",
        version=TOOL_CALLS_VERSION,
    )


def is_subsequence(expected: Sequence[str], actual: Sequence[str]) -> bool:
    """Whether ``expected`` occurs in ``actual`` in order, possibly with gaps."""
    remaining = iter(actual)
    return all(any(name == seen for seen in remaining) for name in expected)


def tool_order(expected_order: Sequence[str], *, id: str = "check-tool-order", name: str | None = None) -> Scorer:
    """1 when the tools in ``expected_order`` were called in that order (gaps allowed)."""
    order = list(expected_order) if not isinstance(expected_order, str) else []
    if not order or not all(isinstance(t, str) and t for t in order):
        raise ScorerConfigError(f"scorer {id!r}: expected_order must be a non-empty list of tool names")

    def decide(run: ScorerRun) -> dict[str, Any]:
        actual = extract_tool_calls(run.output).tools
        return {
            "expected_order": order,
            "actual_tools": actual,
            "expected": " → ".join(order),
            "actual": " → ".join(actual) or "(no calls)",
            "passed": is_subsequence(order, actual),
        }

    return _check(
        id,
        name or "Tool order check",
        f"Tools called in the order {' → '.join(order)}.",
        decide,
        "expected {expected}, called {actual}.",
        version=TOOL_CALLS_VERSION,
    )


def max_tool_calls(limit: int, *, id: str = "check-max-tool-calls", name: str | None = None) -> Scorer:
    """1 when the agent made at most ``limit`` tool calls."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ScorerConfigError(f"scorer {id!r}: limit must be an int >= 0, got {limit!r}")

    def decide(run: ScorerRun) -> dict[str, Any]:
        count = len(extract_tool_calls(run.output).tools)
        return {"limit": limit, "count": count, "passed": count <= limit}

    return _check(
        id,
        name or "Max tool calls check",
        f"At most {limit} tool call(s).",
        decide,
        "{count} tool call(s), limit {limit}.",
        version=TOOL_CALLS_VERSION,
    )


def _invocation_error(inv: ToolInvocation, incomplete_is_error: bool) -> str | None:
    # As Mastra's checks: a call that threw is stored as state output-error with errorText.
    if inv.state == "output-error" or inv.is_error is True:
        return f"error: {inv.error_text[:200]}" if inv.error_text else "the call failed"
    if not inv.has_result:
        return "no result (the call never completed)" if incomplete_is_error else None
    result = inv.result
    if isinstance(result, Mapping):
        if result.get("isError") is True or result.get("is_error") is True:
            return "result flagged isError"
        if result.get("error"):
            return f"error: {str(result['error'])[:200]}"
    return None


def no_tool_errors(
    *, incomplete_is_error: bool = True, id: str = "check-no-tool-errors", name: str | None = None
) -> Scorer:
    """1 when no tool call failed.

    A call failed when it is in state ``output-error`` or has ``isError`` set (as Mastra's checks
    read it), when its result is a mapping with a truthy ``error`` or ``isError``/``is_error``
    set to true, or (``incomplete_is_error``, default True) when it never got a result
    (state ``call``/``partial-call``/``input-available``). No tool calls at all passes.
    """

    def decide(run: ScorerRun) -> dict[str, Any]:
        errors: list[dict[str, Any]] = []
        total = 0
        for message in run.output or ():
            for inv in message.tool_invocations:
                total += 1
                problem = _invocation_error(inv, incomplete_is_error)
                if problem is not None:
                    errors.append(
                        {
                            "tool_name": inv.tool_name,
                            "tool_call_id": inv.tool_call_id,
                            "error": problem,
                        }
                    )
        failed = ", ".join(f"{e['tool_name']} ({e['error']})" for e in errors) or "none"
        return {
            "total_calls": total,
            "error_count": len(errors),
            "errors": errors,
            "failed": failed,
            "passed": not errors,
        }

    return _check(
        id,
        name or "No tool errors check",
        "No tool call failed.",
        decide,
        "{error_count} of {total_calls} tool call(s) failed: {failed}.",
        # "2": also, a call flagged isError on the invocation itself fails it (it passed in "1").
        version=TOOL_CALLS_VERSION,
    )


# --- combinators ---------------------------------------------------------------------------


def _combine(kind: str, checks: tuple[Scorer, ...], combine_id: str, name: str | None) -> Scorer:
    if not checks:
        raise ScorerConfigError(f"scorer {combine_id!r}: {kind} needs at least one scorer")
    bad = [repr(c) for c in checks if not isinstance(c, Scorer)]
    if bad:
        raise ScorerConfigError(f"scorer {combine_id!r}: {kind} takes scorers, got {', '.join(bad)}")
    ids = [c.id for c in checks]
    if len(set(ids)) != len(ids):
        raise ScorerConfigError(
            f"scorer {combine_id!r}: {kind} got two scorers with the same id; give each check its own id="
        )

    @plain_json  # its scorers may call a judge: a resumed run must not pay for them again
    async def preprocess(run: ScorerRun) -> dict[str, Any]:
        outcomes: list[dict[str, Any]] = []
        for check in checks:
            result = await check.run(
                input=run.input,
                output=run.output,
                run_id=run.run_id,
                ground_truth=run.ground_truth,
                request_context=run.request_context,
            )
            outcomes.append(
                {
                    "id": check.id,
                    "score": result.score,
                    "reason": result.reason,
                    "passed": result.score == 1.0,
                }
            )
        passed = [o["passed"] for o in outcomes]
        return {"checks": outcomes, "passed": all(passed) if kind == "all_of" else any(passed)}

    def score(results: StepResults) -> float:
        return 1.0 if results.preprocess_step_result["passed"] else 0.0

    def reason(results: StepResults) -> str:
        outcomes = results.preprocess_step_result["checks"]
        failed = [o for o in outcomes if not o["passed"]]
        head = f"{len(outcomes) - len(failed)} of {len(outcomes)} checks passed"
        if not failed:
            return head + "."
        return head + "; failed: " + "; ".join(f"{o['id']}: {o['reason'] or 'not scorable'}" for o in failed)

    joiner = " and " if kind == "all_of" else " or "
    return (
        create_scorer(
            combine_id,
            name=name or combine_id,
            description=("All of: " if kind == "all_of" else "Any of: ") + joiner.join(ids),
            type="agent",
            score_range=(0.0, 1.0),
            direction="higher",
            # Its verdict is its scorers': a new version of one is a new version of it.
            version="1/" + "+".join(f"{c.id}@{c.version}" for c in checks),
        )
        .preprocess(preprocess)
        .generate_score(score)
        .generate_reason(reason)
    )


def all_of(*checks: Scorer, id: str = "check-all", name: str | None = None) -> Scorer:
    """1 when every given scorer scores 1 on the run, else 0."""
    return _combine("all_of", checks, id, name)


def any_of(*checks: Scorer, id: str = "check-any", name: str | None = None) -> Scorer:
    """1 when at least one given scorer scores 1 on the run, else 0."""
    return _combine("any_of", checks, id, name)
