"""The fake LLM server answers the real SDKs the way the providers do."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import openai
import pytest

from tests.fakellm import FakeLLMServer, Reply, Rule, instance_for

T = TypeVar("T")
SCORE_SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["score"],
    "additionalProperties": False,
}


def _with_clients(fake: FakeLLMServer, fn: Callable[[Any, Any], Awaitable[T]]) -> T:
    async def main() -> T:
        o = openai.AsyncOpenAI(base_url=fake.openai_base_url, api_key="k", max_retries=0)
        a = anthropic.AsyncAnthropic(base_url=fake.anthropic_base_url, api_key="k", max_retries=0)
        try:
            return await fn(o, a)
        finally:
            await o.close()
            await a.close()

    return asyncio.run(main())


def test_openai_json_schema_gets_schema_valid_answer(fake_llm: FakeLLMServer) -> None:
    """A response_format json_schema request gets a schema-valid JSON answer and a request id."""

    async def go(o: Any, a: Any) -> Any:
        return await o.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "system", "content": "judge"}, {"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": SCORE_SCHEMA},
            },
        )

    raw = _with_clients(fake_llm, go)
    completion = raw.parse()
    assert json.loads(completion.choices[0].message.content) == {"score": 0.5}
    assert raw.headers["x-request-id"] == fake_llm.requests[0].request_id
    assert fake_llm.requests[0].structured == "openai_json_schema"
    assert fake_llm.requests[0].system == "judge"
    assert completion.usage.total_tokens > 0


def test_anthropic_forced_tool_gets_tool_use(fake_llm: FakeLLMServer) -> None:
    """A forced tool call is answered with a tool_use block whose input fits the schema."""

    async def go(o: Any, a: Any) -> Any:
        return await a.messages.create(
            model="claude-haiku",
            max_tokens=50,
            system="judge",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "answer", "input_schema": SCORE_SCHEMA}],
            tool_choice={"type": "tool", "name": "answer"},
        )

    message = _with_clients(fake_llm, go)
    assert message.content[0].type == "tool_use"
    assert message.content[0].input == {"score": 0.5}
    assert fake_llm.count(provider="anthropic", model="claude-haiku") == 1


def test_script_then_rule_then_auto(fake_llm: FakeLLMServer) -> None:
    """Queued replies come first, then matching rules, then the automatic answer."""
    fake_llm.script(Reply.text("first"), Rule(Reply.text("for-b"), model="b"))
    fake_llm.rule(Reply.text("ruled"), user_contains="magic", times=1)

    async def go(o: Any, a: Any) -> list[str]:
        out = []
        for model, text in [("a", "x"), ("a", "magic"), ("b", "y"), ("a", "magic")]:
            c = await o.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
            out.append(c.choices[0].message.content)
        return out

    assert _with_clients(fake_llm, go) == [
        "first",
        "ruled",
        "for-b",
        "This is the fake judge's answer.",
    ]


def test_faults_reach_the_sdk_as_errors(fake_llm: FakeLLMServer) -> None:
    """429 with headers, 529, a dropped connection and a timeout surface as SDK errors."""
    fake_llm.script(
        Reply.rate_limited(retry_after="3", retry_after_ms="1500"),
        Reply.overloaded(),
        Reply.drop(),
        Reply.hang(5),
    )

    async def go(o: Any, a: Any) -> list[BaseException]:
        errors: list[BaseException] = []
        calls = [
            o.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}]),
            a.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "2"}]),
            o.chat.completions.create(model="m", messages=[{"role": "user", "content": "3"}]),
            o.with_options(timeout=0.2).chat.completions.create(model="m", messages=[{"role": "user", "content": "4"}]),
        ]
        for call in calls:
            with pytest.raises(Exception) as info:
                await call
            errors.append(info.value)
        return errors

    rate, overloaded, dropped, timeout = _with_clients(fake_llm, go)
    assert isinstance(rate, openai.RateLimitError)
    assert rate.response.headers["retry-after"] == "3"
    assert rate.response.headers["retry-after-ms"] == "1500"
    assert rate.request_id == fake_llm.requests[0].request_id
    assert isinstance(overloaded, anthropic.APIStatusError)
    assert overloaded.status_code == 529
    assert overloaded.request_id == fake_llm.requests[1].request_id
    assert isinstance(dropped, openai.APIConnectionError)
    assert isinstance(timeout, openai.APITimeoutError)


def test_schema_instances_respect_ranges() -> None:
    """Generated instances honour ranges, enums, nesting and $ref."""
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 5},
            "kind": {"enum": ["good", "bad"]},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        },
        "$defs": {"Item": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
    }
    assert instance_for(schema) == {"n": 3, "kind": "good", "items": [{"ok": True}]}


def test_runs_as_a_process_with_control_endpoints() -> None:
    """`python -m tests.fakellm` serves, and reports counts on /_fake/stats."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakellm", "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["object"] == "chat.completion"
        with urllib.request.urlopen(f"{url}/_fake/stats", timeout=10) as resp:
            assert json.loads(resp.read())["per_model"] == {"m": 1}
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
