"""``filter_run``: a declarative ``prepare_run`` that trims what a scorer sees."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scorers._run import ScorerRun
from scorers.agent import (
    Message,
    ScorerRunInputForAgent,
    ScorerRunOutputForAgent,
    ToolInvocation,
    ToolInvocationPart,
)

__all__ = ["filter_run"]


def filter_run(
    *,
    part_types: Sequence[str] | None = None,
    tool_names: Sequence[str] | None = None,
    max_remembered_messages: int | None = None,
    max_output_messages: int | None = None,
    drop_request_context: bool = False,
    drop_ground_truth: bool = False,
) -> Callable[[ScorerRun], ScorerRun]:
    """Build a ``prepare_run`` for agent-typed scorers.

    Parts of remembered and output messages are kept when their type starts with one of
    ``part_types`` and, for tool invocations, their tool name starts with one of
    ``tool_names``; a message left with no parts is dropped, a message that had none is
    kept. Then only the last ``max_*`` messages are kept. Input messages are never filtered.

    Unlike Mastra, whose filters keep or drop whole messages, this filters the parts inside a
    message: with ``part_types=["tool-invocation"], tool_names=["calc"]``, an assistant message
    holding a ``search_web`` call, a ``calc`` call and text keeps only its ``calc`` part.
    """
    for name, limit in (
        ("max_remembered_messages", max_remembered_messages),
        ("max_output_messages", max_output_messages),
    ):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"filter_run: {name} must be a non-negative int, got {limit!r}")
    for name, prefixes in (("part_types", part_types), ("tool_names", tool_names)):
        # A bare string would be split into one-letter prefixes that match almost everything.
        if prefixes is not None and (isinstance(prefixes, str) or not all(isinstance(p, str) for p in prefixes)):
            raise ValueError(f"filter_run: {name} must be a list of strings, got {prefixes!r}")
    types = tuple(part_types) if part_types is not None else None
    tools = tuple(tool_names) if tool_names is not None else None

    def keep_part(part: object) -> bool:
        kind = getattr(part, "type", "")
        if types is not None and not kind.startswith(types):
            return False
        if tools is not None and isinstance(part, ToolInvocationPart):
            return part.tool_invocation.tool_name.startswith(tools)
        return True

    def keep_invocation(invocation: ToolInvocation) -> bool:
        if types is not None and not "tool-invocation".startswith(types):
            return False
        return tools is None or invocation.tool_name.startswith(tools)

    # A message's plain ``content`` text stands in for text parts it lacks: it goes with them.
    keep_text = types is None or "text".startswith(types)

    def trim(messages: Sequence[Message], limit: int | None) -> list[Message]:
        kept: list[Message] = []
        for message in messages:
            legacy = message.content.tool_invocations  # Mastra's older field beside the parts
            if (not message.parts and not legacy) or (types is None and tools is None):
                kept.append(message)
                continue
            parts = [p for p in message.parts if keep_part(p)]
            invocations = [i for i in legacy or () if keep_invocation(i)]
            if parts or invocations:
                content = message.content.model_copy(
                    update={
                        "parts": parts,
                        "tool_invocations": invocations or None,
                        "content": message.content.content if keep_text else None,
                    }
                )
                kept.append(message.model_copy(update={"content": content}))
        if limit is not None:
            # kept[-limit:], not kept[len - limit:]: a limit above the count must keep everything
            kept = kept[-limit:] if limit else []
        return kept

    def prepare(run: ScorerRun) -> ScorerRun:
        run_input, run_output = run.input, run.output
        if not isinstance(run_input, ScorerRunInputForAgent) or not isinstance(run_output, ScorerRunOutputForAgent):
            raise TypeError("filter_run works on agent-typed runs: create the scorer with type='agent'")
        return run.replace(
            input=run_input.model_copy(
                update={"remembered_messages": trim(run_input.remembered_messages, max_remembered_messages)}
            ),
            output=ScorerRunOutputForAgent(trim(run_output, max_output_messages)),
            request_context=None if drop_request_context else run.request_context,
            ground_truth=None if drop_ground_truth else run.ground_truth,
        )

    return prepare
