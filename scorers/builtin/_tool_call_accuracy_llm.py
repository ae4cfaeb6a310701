"""``tool_call_accuracy_llm`` (LLM judge): were the tools the agent called the right ones?

Steps (Mastra's LLM tool-call-accuracy semantics, our prompts):
1. preprocess (code): the tool calls of the response, in order.
2. analyze (judge): for each call, whether calling that tool was appropriate for the user's
   request given the available tools; and which available tools should have been called but
   were not.
3. generate_score (code): ``appropriate calls / calls · scale``; with no calls, 0 when the
   judge names tools that should have been called, else ``scale`` (not calling was right).
4. generate_reason (judge).

``available_tools`` (required): the agent's tools, as ``{"name": ..., "description": ...}``
mappings, ``(name, description)`` pairs or bare names. Not scorable: no user message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from scorers import Judge, PromptStep, Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer
from scorers.agent import extract_tool_calls
from scorers.builtin._llm import (
    LLM_VERSION,
    ModelOption,
    as_json,
    check_scale,
    fenced,
    make_judge,
    parse,
    require_user,
    rounded,
)
from scorers.builtin._runs import assistant_text

__all__ = ["ToolCallEvaluations", "tool_call_accuracy_llm"]

INSTRUCTIONS = """You evaluate an AI agent's tool selection: given the user's request and the
tools the agent had, decide whether each tool it called was an appropriate choice, and whether
it failed to call a tool the request clearly needed. Judge the choice of tool, not the tool's
result."""

ToolSpec = Mapping[str, Any] | tuple[str, str] | str


class ToolCallEvaluation(BaseModel):
    tool_called: str
    was_appropriate: bool
    reasoning: str


class ToolCallEvaluations(BaseModel):
    evaluations: list[ToolCallEvaluation]
    missing_tools: list[str]


def _describe_tools(scorer_id: str, tools: Sequence[ToolSpec]) -> str:
    lines: list[str] = []
    for tool in tools:
        if isinstance(tool, str):
            name, description = tool, ""
        elif isinstance(tool, tuple) and len(tool) == 2:
            name, description = tool
        elif isinstance(tool, Mapping) and isinstance(tool.get("name") or tool.get("id"), str):
            name = str(tool.get("name") or tool.get("id"))
            description = str(tool.get("description") or "")
        else:
            raise ScorerConfigError(
                f"scorer {scorer_id!r}: each available tool must be a name, a (name, description) "
                f"pair or a mapping with 'name' and 'description'; got {tool!r}"
            )
        lines.append(f"- {name}: {description}" if description else f"- {name}")
    if not lines:
        raise ScorerConfigError(f"scorer {scorer_id!r}: available_tools must list at least one tool")
    return "\n".join(lines)


def tool_call_accuracy_llm(
    model: ModelOption,
    *,
    available_tools: Sequence[ToolSpec],
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "tool-call-accuracy-llm",
    name: str | None = None,
) -> Scorer:
    """Share of tool calls that were appropriate for the request (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        available_tools: the agent's tools (names, (name, description) pairs or mappings).
        scale: the best score (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    if isinstance(available_tools, str | Mapping):
        raise ScorerConfigError(f"scorer {id!r}: available_tools must be a list of tools")
    tool_list = _describe_tools(id, list(available_tools))

    def preprocess(run: ScorerRun) -> dict[str, Any]:
        require_user(run)
        calls = extract_tool_calls(run.output).tool_call_infos
        return {
            "actual_tools": [c.tool_name for c in calls],
            "tool_calls": [{"tool_name": c.tool_name, "args": c.args} for c in calls],
            "has_tool_calls": bool(calls),
        }

    def analyze_prompt(run: ScorerRun, results: StepResults) -> str:
        calls = results.preprocess_step_result["tool_calls"]
        answer = assistant_text(run)
        answered = f"\n\n{fenced('agent answer', answer)}" if answer.strip() else ""
        return (
            "Evaluate the agent's tool calls. For each call, in order, say whether calling that "
            "tool was appropriate for the user's request (was_appropriate) with a one-sentence "
            "reasoning. Then list in missing_tools the available tools the request clearly "
            "needed but the agent did not call (empty if none).\n\n"
            f"Available tools:\n{fenced('available tools', tool_list)}\n\n"
            f"{fenced('user message', require_user(run))}\n\n"
            f"Tool calls:\n{fenced('tool calls', as_json(calls) if calls else '(no tool calls)')}"
            f"{answered}\n\n"
            'Answer as JSON: {"evaluations": [{"tool_called": ..., "was_appropriate": true, '
            '"reasoning": ...}], "missing_tools": [...]}.'
        )

    def score(results: StepResults) -> float:
        analysis = parse(ToolCallEvaluations, results.analyze_step_result)
        if not analysis.evaluations:
            return 0.0 if analysis.missing_tools else rounded(1.0, scale)
        good = sum(e.was_appropriate for e in analysis.evaluations)
        return rounded(good / len(analysis.evaluations), scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        analysis = parse(ToolCallEvaluations, results.analyze_step_result)
        return (
            f"The tool-selection score is {score} on a scale of 0 to {scale:g}: the share of the "
            "agent's tool calls that were appropriate. Explain it in two or three sentences, "
            "naming inappropriate calls and missing tools if any.\n\n"
            f"Evaluation:\n{fenced('evaluation', as_json(analysis.model_dump()))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Tool call accuracy (LLM)",
            description="Whether the agent chose appropriate tools for the request (LLM judge).",
            judge=make_judge(id, model, INSTRUCTIONS, judge),
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .preprocess(preprocess)
        .analyze(PromptStep("Evaluate the tool choices", analyze_prompt, output_schema=ToolCallEvaluations))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
