"""trace_to_run on the flat prompt/completion attributes OpenLLMetry wrote before the GenAI
message attributes: ``gen_ai.prompt.<i>.*`` / ``gen_ai.completion.<i>.*`` on spans marked only by
``llm.request.type``.

The attributes are those opentelemetry-instrumentation-openai and -anthropic 0.40.14 (and the
Anthropic changes of 0.45-0.53) wrote in runs against tests/fakellm on 2026-12-05; OpenAI wrote
them up to 0.54, Anthropic up to 0.53. Backfilled traces of those months are in this shape.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scorers.agent import get_assistant_message, get_combined_system_prompt, get_user_message
from tests.tracing._spans import Recorder
from tracing import TraceReadError, trace_to_run
from tracing._records import span_record
from tracing.queue import ScoreRequest, request_json, spans_request
from tracing.read import plan_runs

SYSTEM = "You are a terse assistant."
QUESTION = "Weather in Paris?"
ANSWER = "It is sunny and 21 C in Paris."
CALL_ID = "call_83a03d1ef386b7a6"
RESULT = '{"temp_c": 21, "sky": "sunny"}'


def _openai(prompts: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """An ``openai.chat`` span's attributes (0.40.14), the other request attributes included."""
    attrs: dict[str, Any] = {
        "llm.request.type": "chat",
        "gen_ai.system": "OpenAI",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini",
        "llm.headers": "None",
        "llm.is_streaming": False,
        "llm.request.functions.0.name": "get_weather",
        "llm.request.functions.0.parameters": '{"type": "object", "properties": {"city": {"type": "string"}}}',
        "gen_ai.usage.prompt_tokens": 10,
        "gen_ai.usage.completion_tokens": 7,
    }
    attrs.update({f"gen_ai.prompt.{k}": v for k, v in prompts.items()})
    attrs.update({f"gen_ai.completion.{k}": v for k, v in completion.items()})
    return attrs


ASKED = {"0.role": "system", "0.content": SYSTEM, "1.role": "user", "1.content": QUESTION}
CALLED = {
    **ASKED,
    "2.role": "assistant",
    "2.tool_calls.0.id": CALL_ID,
    "2.tool_calls.0.name": "get_weather",
    "2.tool_calls.0.arguments": '{"city": "Paris"}',
    "3.role": "tool",
    "3.content": RESULT,
    "3.tool_call_id": CALL_ID,
}


def _shipped(spans: list[Any]) -> list[Any]:
    """The spans as a worker gets them from the exporter: compact records through the queue's JSON."""
    records = [span_record(s) for s in spans]
    target = plan_runs(records)[0][0].span_id
    request = ScoreRequest.model_validate_json(request_json(spans_request(records, [target], ["s"])))
    return request.spans


def test_a_legacy_chat_span_is_a_run_in_process_and_after_the_queue() -> None:
    """Without an agent span, the LLM span (known only by llm.request.type) is the run: the system
    prompt, the question and the first completion. The exporter ships the flat attributes: the
    worker reads the same run."""
    rec = Recorder()
    completion = {"0.finish_reason": "stop", "0.role": "assistant", "0.content": "Paris.", "1.content": "Lyon."}
    with rec.span("openai.chat", _openai(ASKED, completion)):
        pass
    run = trace_to_run(rec.spans())
    assert get_combined_system_prompt(run.input) == SYSTEM
    assert get_user_message(run.input) == QUESTION
    assert get_assistant_message(run.output) == "Paris."  # the first choice, as the app went on with
    assert run.identity.model == "gpt-4o-mini"
    assert trace_to_run(_shipped(rec.spans())).model_dump() == run.model_dump()


def test_an_openllmetry_agent_with_legacy_model_calls_is_one_run_with_its_tool() -> None:
    """A Traceloop @agent around two legacy model calls (the tool call, then the answer with the
    tool's result in the prompt) and the @tool span: one run, whose tool invocation has the
    arguments and the result."""
    rec = Recorder()
    tool_call = {
        "0.finish_reason": "tool_calls",
        "0.role": "assistant",
        "0.tool_calls.0.id": CALL_ID,
        "0.tool_calls.0.name": "get_weather",
        "0.tool_calls.0.arguments": '{"city": "Paris"}',
    }
    with rec.span("weather_agent.agent", {"traceloop.span.kind": "agent", "traceloop.entity.name": "weather_agent"}):
        with rec.span("openai.chat", _openai(ASKED, tool_call)):
            pass
        tool = {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "get_weather",
            "traceloop.entity.input": json.dumps({"args": ["Paris"], "kwargs": {}}),
            "traceloop.entity.output": RESULT,
        }
        with rec.span("get_weather.tool", tool):
            pass
        with rec.span("openai.chat", _openai(CALLED, {"0.role": "assistant", "0.content": ANSWER})):
            pass
    for spans in (rec.spans(), _shipped(rec.spans())):
        run = trace_to_run(spans)
        assert run.identity.span_name == "weather_agent.agent"
        assert get_user_message(run.input) == QUESTION
        assert get_assistant_message(run.output) == ANSWER
        calls = [c for m in run.output for c in m.tool_invocations]
        assert [(c.tool_call_id, c.tool_name, c.args, c.result) for c in calls] == [
            (CALL_ID, "get_weather", {"city": "Paris"}, {"temp_c": 21, "sky": "sunny"})
        ]


# Anthropic's tool round trip as 0.40.14 wrote it (the assistant's blocks as JSON content), and as
# 0.49-0.53 did (the same blocks, and the tool_use once more as tool_calls.*). Its tool result is a
# tool_result block in a *user* turn, as Anthropic's API takes it.
_BLOCKS = json.dumps(
    [
        {"type": "text", "text": "Let me check the weather."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]
)
_ANTHROPIC = {
    "0.role": "system",
    "0.content": SYSTEM,
    "1.role": "user",
    "1.content": QUESTION,
    "2.role": "assistant",
    "2.content": _BLOCKS,
    "3.role": "user",
    "3.content": json.dumps([{"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT}]),
}
_TWICE = {
    **_ANTHROPIC,
    "2.tool_calls.0.id": "toolu_1",
    "2.tool_calls.0.name": "get_weather",
    "2.tool_calls.0.arguments": '{"city": "Paris"}',
}


@pytest.mark.parametrize("prompts", [_ANTHROPIC, _TWICE], ids=["0.40", "0.49-0.53"])
def test_anthropics_tool_result_in_a_user_turn_answers_the_call(prompts: dict[str, Any]) -> None:
    """The tool_result block answers the assistant's tool_use (it was read as the user's turn,
    the call left without a result), and a tool_use written twice is one call."""
    rec = Recorder()
    attrs = {
        "llm.request.type": "completion",  # what the Anthropic instrumentation says for Messages calls
        "gen_ai.system": "Anthropic",
        "gen_ai.request.model": "claude-3-5-haiku-latest",
        **{f"gen_ai.prompt.{k}": v for k, v in prompts.items()},
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": ANSWER,
    }
    with rec.span("anthropic.chat", attrs):
        pass
    for spans in (rec.spans(), _shipped(rec.spans())):
        run = trace_to_run(spans)
        assert get_combined_system_prompt(run.input) == SYSTEM
        assert get_user_message(run.input) == QUESTION
        calls = [p for m in run.input.input_messages for p in m.tool_invocations]
        assert [(c.tool_call_id, c.args, c.result, c.state) for c in calls] == [
            ("toolu_1", {"city": "Paris"}, {"temp_c": 21, "sky": "sunny"}, "result")
        ]
        assert get_assistant_message(run.output) == ANSWER


def test_content_blocks_as_json_are_parts_and_text_that_looks_like_json_stays_text() -> None:
    """A multimodal content list was written as its JSON: it is read as parts. A user who typed
    JSON (a list that is not content blocks) is quoted as typed."""
    rec = Recorder()
    image = json.dumps(
        [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        ]
    )
    with rec.span("openai.chat", _openai({"0.role": "user", "0.content": image}, {"0.content": "A cat."})):
        pass
    with rec.span("openai.chat", _openai({"0.role": "user", "0.content": '[{"a": 1}]'}, {"0.content": "ok"})):
        pass
    first, second = (trace_to_run(rec.spans(), format(s.context.span_id, "016x")) for s in rec.spans())
    assert get_user_message(first.input) == "What is in this image?"
    (message,) = first.input.input_messages
    assert [p.type for p in message.content.parts] == ["text", "data-image_url"]
    assert get_user_message(second.input) == '[{"a": 1}]'


@pytest.mark.parametrize(
    ("attributes", "attribute"),
    [
        ({"gen_ai.prompt.0.role": "wizard", "gen_ai.prompt.0.content": "hi"}, "gen_ai.prompt.0.role"),
        ({"gen_ai.completion.0.tool_calls.0.arguments": "{}"}, "gen_ai.completion.0"),
    ],
)
def test_a_bad_flat_message_is_a_named_read_error(attributes: dict[str, Any], attribute: str) -> None:
    """An unknown role, or a tool call without a name, is a TraceReadError naming the message's
    attributes."""
    rec = Recorder()
    base = {"llm.request.type": "chat", "gen_ai.prompt.9.role": "user", "gen_ai.prompt.9.content": "q"}
    with rec.span("openai.chat", {**base, "gen_ai.completion.0.content": "a", **attributes}):
        pass
    with pytest.raises(TraceReadError) as caught:
        trace_to_run(rec.spans())
    assert caught.value.attribute == attribute


def test_blocks_that_are_not_content_blocks_stay_text() -> None:
    """A list of objects whose 'type' is not a string is no content-block list: quoted as typed."""
    rec = Recorder()
    with rec.span("openai.chat", _openai({"0.role": "user", "0.content": '[{"type": 5}]'}, {"0.content": "a"})):
        pass
    assert get_user_message(trace_to_run(rec.spans()).input) == '[{"type": 5}]'
