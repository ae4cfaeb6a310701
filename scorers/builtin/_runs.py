"""Reading what the built-in scorers need out of an agent-typed run.

Every builtin is created with ``type="agent"``, so ``run.input`` is a
``ScorerRunInputForAgent`` and ``run.output`` a ``ScorerRunOutputForAgent`` (a plain string
input becomes one user message, a plain string output one assistant message).
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeAlias

from scorers import ScorerConfigError, ScorerRun
from scorers.agent import Message, ScorerRunInputForAgent, extract_tool_calls

__all__ = [
    "Reference",
    "assistant_text",
    "check_reference",
    "ground_truth_text",
    "reference_text",
    "tool_results",
    "user_text",
]

Reference: TypeAlias = Literal["input", "ground_truth"]


def user_text(run: ScorerRun) -> str:
    """This turn's user messages, joined by newlines ("" when there are none)."""
    run_input = run.input
    if not isinstance(run_input, ScorerRunInputForAgent):
        return ""
    return "\n".join(m.text for m in run_input.input_messages if m.role == "user" and m.text)


def assistant_text(run: ScorerRun) -> str:
    """The response's assistant text, every assistant message joined by newlines.

    All messages, not only the first: an agent that called tools answers in a later message.
    """
    messages: list[Message] = list(run.output or ())
    return "\n".join(m.text for m in messages if m.role == "assistant" and m.text)


def ground_truth_text(run: ScorerRun) -> str | None:
    """``run.ground_truth`` as text (non-strings as JSON), or None when absent or blank."""
    value = run.ground_truth
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if text.strip() else None


def check_reference(scorer_id: str, reference: str) -> Reference:
    if reference not in ("input", "ground_truth"):
        raise ScorerConfigError(f"scorer {scorer_id!r}: reference must be 'input' or 'ground_truth', got {reference!r}")
    return reference  # type: ignore[return-value]


def reference_text(run: ScorerRun, reference: Reference, scorer_id: str) -> str:
    """The text a comparison scorer measures the output against.

    ``reference="ground_truth"`` with no ground truth on the run is a usage error, not an
    unscorable run: the scorer was configured for runs that carry one.
    """
    if reference == "input":
        return user_text(run)
    text = ground_truth_text(run)
    if text is None:
        raise ValueError(
            f"scorer {scorer_id!r} compares against the ground truth, but run {run.run_id!r} has "
            "none; pass ground_truth= to run(), or build the scorer with reference='input'"
        )
    return text


def tool_results(run: ScorerRun) -> list[str]:
    """Results of the response's finished tool calls (as text), then any tool-role messages."""
    out: list[str] = []
    for info in extract_tool_calls(run.output).tool_call_infos:
        if not info.has_result or info.result is None:
            continue
        result: Any = info.result
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        out.append(f"{info.tool_name}: {text}")
    out.extend(m.text for m in run.output or () if m.role == "tool" and m.text)
    return out
