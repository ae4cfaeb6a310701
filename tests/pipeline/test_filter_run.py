"""filter_run: a declarative prepare_run."""

from __future__ import annotations

from typing import Any

import pytest

from scorers import ScorerRun, create_scorer, filter_run


def _tool(name: str, call_id: str) -> dict[str, Any]:
    return {"type": "tool-invocation", "tool_invocation": {"tool_call_id": call_id, "tool_name": name}}


RUN_INPUT = {
    "input_messages": [
        {"role": "user", "content": {"parts": [{"type": "reasoning", "reasoning": "kept"}, "question"]}}
    ],
    "remembered_messages": [
        {"role": "user", "content": "old 1"},
        {"role": "assistant", "content": {"parts": [_tool("search_web", "a"), "old answer"]}},
        {"role": "assistant", "content": {"parts": [{"type": "reasoning", "reasoning": "r"}]}},
        {"role": "user", "content": "old 2"},
    ],
}
RUN_OUTPUT = [
    {"role": "assistant", "content": {"parts": [_tool("search_web", "b"), _tool("calc", "c"), "answer 1"]}},
    {"role": "assistant", "content": {"parts": []}},
    {"role": "assistant", "content": {"parts": [{"type": "data-chart", "data": 1}, "answer 2"]}},
]


def _prepared(**options: Any) -> ScorerRun:
    seen: list[ScorerRun] = []
    scorer = create_scorer("f", type="agent", prepare_run=filter_run(**options)).generate_score(
        lambda run: seen.append(run) or 1.0
    )
    scorer.run_sync(input=RUN_INPUT, output=RUN_OUTPUT, ground_truth="gt", request_context={"k": 1})
    return seen[0]


def test_part_types_prefix_filter() -> None:
    """Only parts whose type starts with a listed prefix stay; messages left empty go, empty ones stay."""
    run = _prepared(part_types=["text", "data-"])
    assert [m.text for m in run.input.remembered_messages] == ["old 1", "old answer", "old 2"]
    assert [[p.type for p in m.parts] for m in run.output] == [["text"], [], ["data-chart", "text"]]
    # input messages are never filtered
    assert [p.type for p in run.input.input_messages[0].parts] == ["reasoning", "text"]


def test_tool_names_prefix_filter() -> None:
    """Tool invocations are kept only for tools matching a prefix; other parts stay."""
    run = _prepared(tool_names=["search"])
    names = [p.tool_invocation.tool_name for m in run.output for p in m.parts if p.type == "tool-invocation"]
    assert names == ["search_web"]
    assert run.output[0].text == "answer 1"


def test_filters_apply_to_tool_calls_in_content_tool_invocations_and_to_plain_content() -> None:
    """Mastra's older ``content.toolInvocations`` field is filtered as the parts are, and a
    message's plain ``content`` text (which stands in for text parts) goes with the text parts."""
    legacy = {
        "role": "assistant",
        "content": {
            "parts": [{"type": "text", "text": "answer"}],
            "content": "answer",
            "toolInvocations": [
                {"toolCallId": "a", "toolName": "search_web", "state": "call"},
                {"toolCallId": "b", "toolName": "calc", "state": "call"},
            ],
        },
    }
    seen: list[ScorerRun] = []
    for options in ({"tool_names": ["calc"]}, {"part_types": ["tool-invocation"]}, {"part_types": ["text"]}):
        scorer = create_scorer("f", type="agent", prepare_run=filter_run(**options)).generate_score(
            lambda run: seen.append(run) or 1.0
        )
        scorer.run_sync(input="q", output=[legacy])
    by_tools, tools_only, text_only = (
        [(i.tool_name, m.text) for m in r.output for i in m.tool_invocations] for r in seen
    )
    assert by_tools == [("calc", "answer")]
    assert tools_only == [("search_web", ""), ("calc", "")]
    assert text_only == []
    assert seen[2].output[0].text == "answer"


def test_keep_last_n_messages_after_filtering() -> None:
    """max_* keep the last N messages after part filtering."""
    run = _prepared(part_types=["text"], max_remembered_messages=2, max_output_messages=1)
    assert [m.text for m in run.input.remembered_messages] == ["old answer", "old 2"]
    assert [m.text for m in run.output] == ["answer 2"]
    assert _prepared(max_output_messages=0).output == []


def test_limit_above_message_count_keeps_all() -> None:
    """A max_* larger than the number of messages keeps every message."""
    run = _prepared(max_remembered_messages=5, max_output_messages=4)
    assert len(run.input.remembered_messages) == len(RUN_INPUT["remembered_messages"])
    assert len(run.output) == len(RUN_OUTPUT)


def test_drop_request_context_and_ground_truth() -> None:
    """The drop_* options clear those fields; by default they are kept."""
    kept = _prepared()
    assert (kept.request_context, kept.ground_truth) == ({"k": 1}, "gt")
    dropped = _prepared(drop_request_context=True, drop_ground_truth=True)
    assert (dropped.request_context, dropped.ground_truth) == (None, None)


def test_bad_limits_and_untyped_runs_are_rejected() -> None:
    """Negative limits fail at once; filter_run on an untyped scorer fails the run clearly."""
    with pytest.raises(ValueError, match="max_output_messages must be a non-negative int"):
        filter_run(max_output_messages=-1)
    untyped = create_scorer("u", prepare_run=filter_run()).generate_score(lambda: 1.0)
    with pytest.raises(Exception, match="type='agent'"):
        untyped.run_sync(input="a", output="b")


def test_prefix_options_must_be_lists_of_strings() -> None:
    """A bare string for part_types/tool_names is refused rather than split into letters."""
    with pytest.raises(ValueError, match="part_types must be a list of strings"):
        filter_run(part_types="text")
    with pytest.raises(ValueError, match="tool_names must be a list of strings"):
        filter_run(tool_names=["search", 3])  # type: ignore[list-item]


def test_filters_parts_inside_a_multi_part_message_unlike_mastra() -> None:
    """One message with a search call, a calc call and text: filter_run keeps the message but
    only its matching part (Mastra's filters keep or drop the whole message)."""
    run = _prepared(part_types=["tool-invocation"], tool_names=["calc"])
    first = run.output[0]
    assert [p.type for p in first.parts] == ["tool-invocation"]
    assert first.parts[0].tool_invocation.tool_name == "calc"
    assert first.text == ""  # the text part of the same message is gone
    # the chart+text message had no matching part and goes; the one that never had parts stays
    assert len(run.output) == 2
