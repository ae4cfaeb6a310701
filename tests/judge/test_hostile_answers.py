"""Judge answers a broken or hostile provider may send, through the real SDKs over HTTP: each is
a named judge error or a clean value, with the call's cost kept, and none breaks the result's
JSON, a log line's promise or a secret (found by an audit with a hostile server)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from structlog.testing import capture_logs

from scorers import Judge, PromptStep, ScoreResult, ScorerRunError, create_scorer
from scorers.judge import (
    AnthropicJudgeModel,
    JudgeBadRequestError,
    JudgeMessage,
    JudgeOutputError,
    JudgeRateLimitError,
    JudgeRequest,
    JudgeResponseError,
    JudgeServerError,
    StreamErrorRetryProcessor,
    aclose_clients,
    fence,
)
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import MODELS, Verdict, run
from tests.judge.test_body_cap import ANSWER, ANTHROPIC_ANSWER

ROOT = Path(__file__).resolve().parents[2]
# Shaped like no known key format, so only its value can mask it.
CORP_KEY = "corpkeyOPENAI9f8e7d6c5b4a3f2e1d0c"


def _verdict_then_reason(judge: Judge, schema: Any = Verdict) -> Any:
    """analyze asks for ``schema``; the reason is free text."""
    return (
        create_scorer("hostile", judge=judge)
        .analyze(PromptStep("analyze", lambda run: f"Analyze:\n{fence(run.output, 'answer')}", output_schema=schema))
        .generate_score(lambda results: 0.5)
        .generate_reason(PromptStep("reason", lambda score: f"Explain the score {score}."))
    )


def _failure(scorer: Any) -> ScorerRunError:
    with pytest.raises(ScorerRunError) as info:
        run(scorer)
    return info.value


@pytest.mark.parametrize("model", MODELS)
def test_a_lone_surrogate_in_an_answer_becomes_a_replacement_character(fake_llm: FakeLLMServer, model: str) -> None:
    """A "\\ud800" escape in a structured answer or a reason: the result could not be written as
    JSON (`score --json` ended with a PydanticSerializationError, losing every other run)."""
    fake_llm.rule(Reply.json({"verdict": "ok \ud800 fine", "confidence": 0.5}), user_contains="Analyze")
    fake_llm.rule(Reply.text("because \udfff it is"), user_contains="Explain")
    result = run(_verdict_then_reason(Judge(model)))
    assert result.analyze_step_result["verdict"] == "ok \ufffd fine"
    assert result.reason == "because \ufffd it is"
    assert ScoreResult.model_validate_json(result.model_dump_json()) == result


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verdict: str


CLOSED_SCHEMAS = {
    "json schema": {
        "type": "object",
        "properties": {"verdict": {"type": "string"}},
        "required": ["verdict"],
        "additionalProperties": False,
    },
    "pydantic": _Closed,
    "pydantic dict": dict[str, int],
}


@pytest.mark.parametrize("schema", list(CLOSED_SCHEMAS.values()), ids=list(CLOSED_SCHEMAS))
def test_the_fallback_log_names_no_key_the_answer_made_up(fake_llm: FakeLLMServer, schema: Any) -> None:
    """judge.fallback "names where the answer failed, never its values": a key the answer made up
    (an agent's words, a name and a phone number) was logged as where it failed."""
    leak = "Jane Doe 555-0199 said"
    fake_llm.script(Reply.json({"verdict": "x", leak: "not a number", "5550199": 1}), Reply.text("not json"))
    with capture_logs() as logs:
        _failure(_verdict_then_reason(Judge("openai/gpt-4o-mini"), schema))
    fallback = [e for e in logs if e["event"] == "judge.fallback"]
    assert fallback, logs
    assert leak not in repr(logs)
    assert "5550199" not in repr(logs)  # a made-up key of digits is no list index
    assert fallback[0]["problem"] == "does not fit the output schema"


def test_a_local_servers_placeholder_key_is_no_secret_to_mask(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local OpenAI-compatible server's key is often a word ("none", "ollama"): masked, it
    rewrote the answers ("none of the claims hold" as "*** of the claims hold"; review)."""
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    fake_llm.rule(Reply.text("none of the claims hold"), user_contains="Explain")
    assert run(_verdict_then_reason(Judge("openai/gpt-4o-mini"))).reason == "none of the claims hold"


def test_an_answer_quoting_the_api_key_does_not_carry_it(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key of no known shape, echoed by the provider in a 200 answer, reached the output
    error's message (stderr, the record's error_message) and a stored reason as it was; an
    error body with it was masked already."""
    monkeypatch.setenv("OPENAI_API_KEY", CORP_KEY)
    fake_llm.rule(Reply.text(f"not json, your key is {CORP_KEY}"), user_contains="Analyze")
    error = _failure(_verdict_then_reason(Judge("openai/gpt-4o-mini")))
    assert CORP_KEY not in str(error)
    assert CORP_KEY not in error.partial.model_dump_json()
    assert "your key is ***" in error.cause.raw_output  # (the message describes the answer, never quotes it)

    fake_llm.reset()
    monkeypatch.setenv("OPENAI_API_KEY", CORP_KEY)
    fake_llm.rule(Reply.text(f"the key {CORP_KEY} was in the prompt"), user_contains="Explain")
    result = run(_verdict_then_reason(Judge("openai/gpt-4o-mini")))
    assert result.reason == "the key *** was in the prompt"
    assert CORP_KEY not in result.model_dump_json()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("depth", [990, 10_000])
def test_an_answer_nested_too_deeply_is_an_output_error_that_keeps_its_cost(
    fake_llm: FakeLLMServer, model: str, depth: int
) -> None:
    """It was a bare RecursionError (an internal error): no schema fallback, and the record said
    0 judge calls and 0 cost for two paid answers."""
    deep = "[" * depth + "]" * depth
    fake_llm.rule(Reply.text(deep, input_tokens=40, output_tokens=9), user_contains="Analyze")
    error = _failure(_verdict_then_reason(Judge(model)))
    assert isinstance(error.__cause__, JudgeOutputError), repr(error.__cause__)
    assert "nested" in str(error)
    execution = error.partial.judge["analyze"]
    assert execution.attempt_count == 2  # native, then the schema in the system message
    assert execution.usage.output_tokens == 18
    assert fake_llm.count() == 2


def test_an_anthropic_tool_input_nested_too_deeply_is_an_output_error(fake_llm: FakeLLMServer) -> None:
    """The forced tool's input itself nesting past what the judge reads."""
    deep: Any = []
    for _ in range(600):
        deep = [deep]
    fake_llm.rule(Reply.json({"verdict": deep, "confidence": 0.5}, output_tokens=9), user_contains="Analyze")
    error = _failure(_verdict_then_reason(Judge("anthropic/claude-3-5-haiku-latest")))
    assert isinstance(error.__cause__, JudgeOutputError), repr(error.__cause__)
    assert "nested" in str(error)
    assert error.partial.judge["analyze"].usage.output_tokens == 18


def _anthropic_message(**fields: Any) -> str:
    """test_body_cap's Anthropic answer with ``fields`` replaced (``...``: left out)."""
    message = {**ANTHROPIC_ANSWER, "content": [{"type": "text", "text": "a fine answer"}], **fields}
    return json.dumps({k: v for k, v in message.items() if v is not ...})


def _generate(model: AnthropicJudgeModel) -> Any:
    request = JudgeRequest(system="judge", messages=(JudgeMessage("user", "hi"),), timeout_s=5)

    async def main() -> Any:
        try:
            return await model.generate(request)
        except Exception as exc:
            return exc
        finally:
            await aclose_clients()

    return asyncio.run(main())


@pytest.mark.parametrize("usage", [None, ...], ids=["null", "missing"])
def test_an_anthropic_answer_without_usage_costs_nothing(fake_llm: FakeLLMServer, usage: Any) -> None:
    """A model that reports no usage costs 0, as the README says: Anthropic's failed the run with
    AttributeError: 'NoneType' object has no attribute 'input_tokens'."""
    fake_llm.script(Reply.raw(_anthropic_message(usage=usage)))
    response = _generate(AnthropicJudgeModel("m"))
    assert not isinstance(response, Exception), repr(response)
    assert response.text == "a fine answer"
    assert response.usage.total_tokens == 0


ODD_BODIES = {
    "html": ("<html><body>upstream is down</body></html>", {"content-type": "text/html"}),
    "array": ("[1, 2]", {}),
    "content is a string": (_anthropic_message(content="a string"), {}),
    "content of numbers": (_anthropic_message(content=[1, 2]), {}),
    "a text block without text": (_anthropic_message(content=[{"type": "text"}]), {}),
    "OpenAI's shape": (json.dumps({"choices": [{"message": {"content": "hi"}}]}), {}),
    "usage is a list": (_anthropic_message(usage=[1]), {}),
}


@pytest.mark.parametrize(("body", "headers"), list(ODD_BODIES.values()), ids=list(ODD_BODIES))
def test_an_anthropic_body_of_another_shape_is_a_response_error(
    fake_llm: FakeLLMServer, body: str, headers: dict[str, str]
) -> None:
    """Each was a generic JudgeProviderError quoting a Python internal ("'str' object has no
    attribute 'content'"); OpenAI's path said what was wrong with the body."""
    fake_llm.script(Reply.raw(body, headers=headers))
    error = _generate(AnthropicJudgeModel("m"))
    assert type(error) is JudgeResponseError, repr(error)
    assert "anthropic/m: the message could not be read" in str(error)


SLOW_IMPORT = textwrap.dedent(
    """
    import importlib.abc, sys, time

    class _Slow(importlib.abc.MetaPathFinder):
        # an SDK that takes seconds to import (a loaded machine's first call)
        def find_spec(self, name, path=None, target=None):
            if name in ("openai", "anthropic"):
                time.sleep(2.0)
            return None

    sys.meta_path.insert(0, _Slow())

    from scorers import Judge, PromptStep, create_scorer

    scorer = create_scorer("s", judge=Judge(sys.argv[1], timeout=1.0)).generate_score(
        PromptStep("score", lambda run: "score it")
    )
    print(scorer.run_sync(input="q", output="a").score)
    """
)


@pytest.mark.parametrize("model", MODELS)
def test_importing_the_sdk_does_not_count_against_the_first_calls_timeout(
    fake_llm_env: dict[str, str], model: str
) -> None:
    """Each process's first call failed as "no answer within 1s" when its SDK took longer to
    import (7 s once, on a loaded machine), with no request sent."""
    env = {**os.environ, **fake_llm_env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SLOW_IMPORT, model], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert 0.0 <= float(done.stdout.strip()) <= 1.0


@pytest.mark.parametrize("model", MODELS)
def test_a_redirect_is_not_followed_with_the_prompt(fake_llm: FakeLLMServer, model: str) -> None:
    """A 307 to another host was followed, and the prompt (the agent's content) sent there."""
    with FakeLLMServer() as elsewhere:
        path = "/v1/chat/completions" if model.startswith("openai") else "/v1/messages"
        fake_llm.script(
            Reply.raw(
                "",
                status=307,
                headers={"location": f"http://user:pw@localhost:{elsewhere.url.rsplit(':', 1)[1]}{path}"},
            )
        )
        error = _failure(_verdict_then_reason(Judge(model)))
        assert elsewhere.count() == 0
    assert "returned HTTP 307: a redirect to localhost, not followed (it would send the prompt there)" in str(error)
    assert "pw" not in str(error)


# A 200 whose body is an error object, as a gateway or an OpenAI-compatible proxy passes its
# upstream's failure on: (provider, body, error class, category).
ERRORS_IN_A_200 = {
    "OpenRouter's upstream 429": (
        "openai/m",
        {"error": {"code": 429, "message": "Provider returned error: rate limited upstream"}},
        JudgeRateLimitError,
        "retryable",
    ),
    "OpenAI's invalid request": (
        "openai/m",
        {"error": {"type": "invalid_request_error", "message": "Provider returned error: bad thing"}},
        JudgeBadRequestError,
        "invalid_request",
    ),
    "Anthropic's api_error": (
        "anthropic/m",
        {"type": "error", "error": {"type": "api_error", "message": "Provider returned error: internal"}},
        JudgeServerError,
        "retryable",
    ),
    "Anthropic's invalid request": (
        "anthropic/m",
        {"type": "error", "error": {"type": "invalid_request_error", "message": "Provider returned error: no"}},
        JudgeBadRequestError,
        "invalid_request",
    ),
    "a type that names no status": (
        "openai/m",
        {"error": {"type": "upstream_error", "message": f"Provider returned error: key {CORP_KEY}"}},
        JudgeResponseError,
        "unknown",
    ),
}


@pytest.mark.parametrize(
    ("model", "body", "kind", "category"), list(ERRORS_IN_A_200.values()), ids=list(ERRORS_IN_A_200)
)
def test_a_200_carrying_an_error_object_is_that_error(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, model: str, body: Any, kind: type, category: str
) -> None:
    """OpenAI's was read as an empty answer: a fallback call paid, then "the answer is empty",
    an invalid_output never retried (an upstream 429 too); Anthropic's as a message that could
    not be read ("'NoneType' object is not iterable"), retryable or not by chance."""
    monkeypatch.setenv("OPENAI_API_KEY", CORP_KEY)
    fake_llm.rule(Reply.raw(json.dumps(body)))
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is kind, repr(error.cause)
    assert error.category == category
    assert f"{model}: {model.split('/')[0]} answered HTTP 200 with an error" in str(error)
    assert "Provider returned error:" in str(error)
    assert CORP_KEY not in str(error)
    assert fake_llm.count() == 1  # no fallback call: it is no answer to ask again for


@pytest.mark.parametrize(("model", "header"), [("openai/m", "x-request-id"), ("anthropic/m", "request-id")])
def test_a_request_id_echoing_the_key_is_not_kept(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, model: str, header: str
) -> None:
    """A gateway echoing the request's key as its request id: the id went whole into the
    attempt's record and into the error's text ("request id <key>")."""
    monkeypatch.setenv("OPENAI_API_KEY", CORP_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", CORP_KEY)
    fake_llm.script(Reply.json({"verdict": "ok", "confidence": 0.5}, headers={header: CORP_KEY}))
    fake_llm.script(Reply.error(500, "boom", headers={header: f"req-{CORP_KEY}"}))
    error = _failure(_verdict_then_reason(Judge(model)))
    assert "request id req-***" in str(error)
    record = error.partial.model_dump_json()
    assert CORP_KEY not in record
    assert '"request_id":"***"' in record


@pytest.mark.parametrize(
    ("model", "finish"),
    [("openai/m", "content_filter"), ("openai/m", "tool_calls"), ("anthropic/m", "tool_use")],
)
@pytest.mark.parametrize("prompt", ["Analyze", "Explain"], ids=["structured", "reason"])
def test_an_empty_answer_names_the_finish_reason(fake_llm: FakeLLMServer, model: str, finish: str, prompt: str) -> None:
    """An answer withheld by a content filter, or a tool call where text was asked for, failed
    as "the answer is empty", the provider's reason for it left out of the error."""
    fake_llm.rule(Reply.text("", finish=finish), user_contains=prompt)
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeOutputError, repr(error.cause)
    assert f"the answer is empty (finish reason '{finish}')" in str(error)


@pytest.mark.parametrize(("model", "finish"), [("openai/m", "length"), ("anthropic/m", "max_tokens")])
def test_an_empty_reason_cut_at_the_token_limit_says_so(fake_llm: FakeLLMServer, model: str, finish: str) -> None:
    """A reasoning model that spent max_tokens thinking answers no text, cut at the limit: the
    reason step failed as "the answer is empty", the cause and its remedy unsaid."""
    fake_llm.rule(Reply.text("", finish=finish), user_contains="Explain")
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeOutputError, repr(error.cause)
    assert f"the answer is empty: cut at the output token limit (finish reason '{finish}'; raise max_tokens)" in str(
        error
    )


def _openai_content(content: Any) -> str:
    """test_body_cap's chat completion with ``content`` as its message's content."""
    choice = {**ANSWER["choices"][0], "message": {"role": "assistant", "content": content}}  # type: ignore[index]
    return json.dumps({**ANSWER, "choices": [choice]})


def test_an_openai_answer_in_content_parts_is_read_as_its_text(fake_llm: FakeLLMServer) -> None:
    """An OpenAI-compatible server answering content as a list of parts (a thinking part, then
    text): its Python repr was read as the answer, "not valid JSON", after a fallback call."""
    parts = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": '{"verdict": "ok", '}]
    parts.append({"type": "text", "text": '"confidence": 0.5}'})
    fake_llm.rule(Reply.raw(_openai_content(parts)), user_contains="Analyze")
    result = run(_verdict_then_reason(Judge("openai/m")))
    assert result.analyze_step_result == {"verdict": "ok", "confidence": 0.5}
    assert fake_llm.count() == 2  # analyze, reason: no fallback


@pytest.mark.parametrize("content", [{"verdict": "ok", "confidence": 0.5}, 12345, True])
def test_an_openai_content_that_is_not_text_is_a_response_error(fake_llm: FakeLLMServer, content: Any) -> None:
    """A dict (a proxy that parsed the JSON for us) or a number as content: its repr was the
    answer ("not valid JSON" for a dict; a reason of "12345" accepted)."""
    fake_llm.rule(Reply.raw(_openai_content(content)), user_contains="Explain")
    error = _failure(_verdict_then_reason(Judge("openai/m")))
    assert type(error.cause) is JudgeResponseError, repr(error.cause)
    assert f"message.content is a {type(content).__name__}, not text" in str(error)


@pytest.mark.parametrize("choices", [[], None, ...], ids=["empty", "null", "missing"])
@pytest.mark.parametrize("prompt", ["Analyze", "Explain"], ids=["structured", "reason"])
def test_an_openai_answer_without_choices_is_a_response_error(
    fake_llm: FakeLLMServer, choices: Any, prompt: str
) -> None:
    """A chat completion of zero choices (a provider or gateway that answered nothing, not even
    a finish reason) was read as an empty answer: a structured step paid a fallback call, then
    failed as an invalid_output "could not be read", a reason step as "the answer is empty"."""
    body = {k: v for k, v in ANSWER.items() if k != "choices"}
    if choices is not ...:
        body["choices"] = choices
    fake_llm.rule(Reply.raw(json.dumps(body)), user_contains=prompt)
    error = _failure(_verdict_then_reason(Judge("openai/m")))
    assert type(error.cause) is JudgeResponseError, repr(error.cause)
    assert error.category == "unknown"  # the provider's answer is broken, not the judge's output
    assert "openai/m: the chat completion has no choices" in str(error)
    assert fake_llm.count() == (1 if prompt == "Analyze" else 2)  # no fallback call


# Answers that carry nothing to read as the step's answer, though their finish reason says
# nothing went wrong: (model, 200 body). The agent's words in them must not reach any error.
AGENT_WORDS = "Jane Doe 555-0199 said"
NO_CONTENT = {
    "Anthropic, no blocks": ("anthropic/m", _anthropic_message(content=[])),
    "Anthropic, a thinking block only": (
        "anthropic/m",
        _anthropic_message(content=[{"type": "thinking", "thinking": AGENT_WORDS, "signature": "s"}]),
    ),
    "Anthropic, a tool call not asked for": (
        "anthropic/m",
        _anthropic_message(content=[{"type": "tool_use", "id": "t1", "name": "other", "input": {"q": AGENT_WORDS}}]),
    ),
    "OpenAI, content null": ("openai/m", _openai_content(None)),
    "OpenAI, a thinking part only": ("openai/m", _openai_content([{"type": "thinking", "thinking": AGENT_WORDS}])),
    "OpenAI, blank text": ("openai/m", _openai_content(" \n")),
}


@pytest.mark.parametrize(("model", "body"), list(NO_CONTENT.values()), ids=list(NO_CONTENT))
@pytest.mark.parametrize("prompt", ["Analyze", "Explain"], ids=["structured", "reason"])
def test_an_answer_with_no_content_is_a_response_error(
    fake_llm: FakeLLMServer, model: str, body: str, prompt: str
) -> None:
    """Anthropic's `content: []` with `stop_reason: "end_turn"` (and an answer of only blocks
    the judge does not read, or OpenAI's null content) was read as an empty answer: a structured
    step paid a fallback call, then failed as an invalid_output "the answer is empty" (its
    finish reason left out), a reason step too, never retried; OpenAI's answer of no choices
    (the same nothing) is a response error already."""
    fake_llm.rule(Reply.raw(body), user_contains=prompt)
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeResponseError, repr(error.cause)
    assert error.category == "unknown"
    assert f"{model}: the answer has no content (finish reason " in str(error)
    assert fake_llm.count() == (1 if prompt == "Analyze" else 2)  # no fallback call
    step = "analyze" if prompt == "Analyze" else "generate_reason"
    execution = error.partial.judge[step]
    assert (execution.attempt_count, execution.usage.output_tokens) == (1, 5)  # paid for: counted
    assert AGENT_WORDS not in str(error)
    assert AGENT_WORDS not in error.partial.model_dump_json()


def test_an_answer_with_no_content_is_retried_as_unknown_errors_are(
    fake_llm: FakeLLMServer, sleeps: list[float]
) -> None:
    """A reason step's empty answer was final (an invalid_output no processor sees); it is
    retried by a processor that retries unknown errors, as an answer without choices is."""
    fake_llm.rule(Reply.raw(_anthropic_message(content=[])), user_contains="Explain", times=1)
    processor = StreamErrorRetryProcessor(max_retries=1, retry_unknown_errors=True)
    judge = Judge("anthropic/m", error_processors=[processor], max_processor_retries=1)
    result = run(_verdict_then_reason(judge))
    assert result.reason
    attempts = result.judge["generate_reason"].attempts
    assert [(a.status, a.error_type) for a in attempts] == [("error", "JudgeResponseError"), ("ok", None)]
    assert fake_llm.count() == 3  # analyze, the reason twice


# 200 answers the judge cannot read, each holding the agent's words: (model, body, headers, what
# the error says the body is).
UNREADABLE = {
    "OpenAI, an HTML page": (
        "openai/m",
        f"<html><body>{AGENT_WORDS}</body></html>",
        {"content-type": "text/html; charset=utf-8"},
        "the body is not JSON (text/html, 48 bytes)",
    ),
    "OpenAI, a stream's events": (
        "openai/m",
        f"data: {_openai_content(AGENT_WORDS)}\n\ndata: [DONE]\n\n",
        {"content-type": "text/event-stream"},
        "the body is not JSON (text/event-stream, ",
    ),
    "OpenAI, a JSON array": ("openai/m", json.dumps([AGENT_WORDS]), {}, "the body is a JSON array, not an object"),
    "OpenAI, a JSON string": ("openai/m", json.dumps(AGENT_WORDS), {}, "the body is text (22 characters), not an"),
    "OpenAI, a choice that is text": (
        "openai/m",
        json.dumps({**ANSWER, "choices": [AGENT_WORDS]}),
        {},
        "(AttributeError: 'str' object has no attribute 'get')",
    ),
    "OpenAI, content an object": (
        "openai/m",
        _openai_content({"said": AGENT_WORDS}),
        {},
        "could not be read: message.content is a dict, not text",
    ),
    "Anthropic, an HTML page": (
        "anthropic/m",
        f"<html><body>{AGENT_WORDS}</body></html>",
        {"content-type": "text/html"},
        "the body is not JSON (text/html, 48 bytes)",
    ),
    "Anthropic, a JSON array": ("anthropic/m", json.dumps([AGENT_WORDS]), {}, "the body is a JSON array, not an"),
    "Anthropic, content a string": (
        "anthropic/m",
        _anthropic_message(content=AGENT_WORDS),
        {},
        "message.content is text (22 characters), not a list of blocks",
    ),
}


@pytest.mark.parametrize(("model", "body", "headers", "said"), list(UNREADABLE.values()), ids=list(UNREADABLE))
def test_an_answer_that_cannot_be_read_is_described_never_quoted(
    fake_llm: FakeLLMServer, model: str, body: str, headers: dict[str, str], said: str
) -> None:
    """An answer the judge could not read was quoted in its error (200 characters of the body, or
    the SDK's repr of the message, its text blocks included): the agent's words went into the
    run's record, its error message and logs. The error names what the body is, not what it says."""
    fake_llm.script(Reply.raw(body, headers=headers))
    with capture_logs() as logs:
        error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeResponseError, repr(error.cause)
    assert error.category == "unknown"
    assert said in str(error)
    everything = [str(error), error.partial.model_dump_json(), repr(logs), *traceback.format_exception(error)]
    assert AGENT_WORDS not in "".join(everything)


@pytest.mark.parametrize(("model", "header"), [("openai/m", "x-request-id"), ("anthropic/m", "request-id")])
@pytest.mark.parametrize("value", ["r" * 50_000, f"id {AGENT_WORDS}"], ids=["50 KB", "words"])
def test_a_request_id_that_is_no_id_is_not_kept(fake_llm: FakeLLMServer, model: str, header: str, value: str) -> None:
    """A proxy's request-id header of 50,000 characters (or of words) was kept whole: in every
    attempt's record and in the error's message ("(status 503, request id rrrr...)", 50 KB). A
    request id is kept only if it looks like one: up to 128 visible ASCII characters, no spaces."""
    fake_llm.rule(Reply.auto(headers={header: value}), user_contains="Analyze")
    fake_llm.rule(Reply.error(503, "busy", headers={header: value}), user_contains="Explain")
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeServerError
    assert "request id" not in str(error)
    assert len(str(error)) < 300
    assert [a.request_id for a in error.partial.judge["analyze"].attempts] == [None]  # answered
    assert [a.request_id for a in error.partial.judge["generate_reason"].attempts] == [None]  # failed


LONG_ERRORS = {
    "a 503 HTML page": (503, "<html>" + "upstream busy " * 4_000 + "</html>", {"content-type": "text/html"}),
    "a 529 of a long message": (
        529,
        json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy " * 10_000}}),
        {},
    ),
    "a 200 error object": (200, json.dumps({"error": {"code": 503, "message": "busy " * 10_000}}), {}),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("status", "body", "headers"), list(LONG_ERRORS.values()), ids=list(LONG_ERRORS))
def test_a_long_error_text_is_cut_in_the_message(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str, status: int, body: str, headers: dict[str, str]
) -> None:
    """A provider's error text of 50 KB (an HTML error page, a gateway's long message) was the
    error's message whole, in each attempt's record: 4 attempts kept 200 KB of it. The message
    keeps its first 1,000 characters and says how long the text was; the status still decides."""
    fake_llm.rule(Reply.raw(body, status=status, headers=headers))
    judge = Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=3)], max_processor_retries=3)
    error = _failure(_verdict_then_reason(judge))
    assert error.category == "retryable"
    assert isinstance(error.cause, JudgeServerError)
    assert error.cause.status_code == (503 if status == 200 else status)
    assert len(str(error.cause)) < 1_200
    attempts = error.partial.judge["analyze"].attempts
    assert len(attempts) == 4
    assert all(len(a.error or "") < 1_200 for a in attempts)


# A 200 whose body carries an error beside the usage of the call that failed upstream (a gateway
# or proxy passing its upstream's failure on): (model, body, error class, category, what names it).
_USED = {"prompt_tokens": 700, "completion_tokens": 30}
_ANTHROPIC_USED = {"input_tokens": 700, "output_tokens": 30}
ERRORS_WITH_USAGE = {
    "OpenAI, an upstream 429 beside usage": (
        "openai/m",
        {"error": {"code": 429, "message": "rate limited upstream"}, "usage": _USED},
        JudgeRateLimitError,
        "retryable",
        "(429)",
    ),
    "OpenAI, choices beside a server error": (
        "openai/m",
        {**ANSWER, "error": {"type": "server_error", "message": "cut off upstream"}, "usage": _USED},
        JudgeServerError,
        "retryable",
        "(server_error)",
    ),
    "OpenAI, an error of a type that is no name": (
        "openai/m",
        {"error": {"type": f"{AGENT_WORDS} " * 20, "code": {"said": AGENT_WORDS}}, "usage": _USED},
        JudgeResponseError,
        "unknown",
        "answered HTTP 200 with an error: no message",
    ),
    # OpenRouter's: an error met while the model answered is the choice's, its finish reason "error".
    "OpenAI, a choice that finished with an upstream 502": (
        "openai/m",
        {
            **ANSWER,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"partial: {AGENT_WORDS}"},
                    "finish_reason": "error",
                    "error": {"code": 502, "message": "upstream went away"},
                }
            ],
            "usage": _USED,
        },
        JudgeServerError,
        "retryable",
        "(502)",
    ),
    "OpenAI, a choice that finished with an error it does not name": (
        "openai/m",
        {
            **ANSWER,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": AGENT_WORDS}, "finish_reason": "error"}
            ],
            "usage": _USED,
        },
        JudgeResponseError,
        "unknown",
        "the choice finished with an error (finish reason 'error')",
    ),
    "Anthropic, an overloaded error beside usage": (
        "anthropic/m",
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}, "usage": _ANTHROPIC_USED},
        JudgeServerError,
        "retryable",
        "(overloaded_error)",
    ),
    "Anthropic, a message beside an invalid request": (
        "anthropic/m",
        {**ANTHROPIC_ANSWER, "error": {"type": "invalid_request_error", "message": "no"}, "usage": _ANTHROPIC_USED},
        JudgeBadRequestError,
        "invalid_request",
        "(invalid_request_error)",
    ),
}


@pytest.mark.parametrize(
    ("model", "body", "kind", "category", "named"), list(ERRORS_WITH_USAGE.values()), ids=list(ERRORS_WITH_USAGE)
)
def test_a_200_carrying_an_error_and_usage_is_that_error_paid_for(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str, body: Any, kind: type, category: str, named: str
) -> None:
    """The error was raised before the usage beside it was read: the upstream call it reports
    was in no attempt, no step usage and no spend (and the host's guard counted it as a failed
    call, not an answered one). The error is still the one its status or type says, named by
    its type or code (a type or code that is no name, such as the agent's words, is left out);
    the call's usage is on the error and the attempt; a retryable one is retried and its
    retry's usage added. A choice that finished with an error (OpenRouter's finish reason
    "error") was read as the judge's answer: an invalid output, or a part answer's fallback."""
    fake_llm.rule(Reply.raw(json.dumps(body)), user_contains="Analyze", times=1)
    fake_llm.rule(Reply.auto(input_tokens=100, output_tokens=10), user_contains="Analyze")
    retrying = Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=1)], max_processor_retries=1)
    with capture_logs() as logs:
        if category == "retryable":
            execution = run(_verdict_then_reason(retrying)).judge["analyze"]
        else:
            error = _failure(_verdict_then_reason(retrying))
            assert type(error.cause) is kind, repr(error.cause)
            assert error.category == category
            assert named in str(error)
            assert AGENT_WORDS not in str(error) + error.partial.model_dump_json()
            execution = error.partial.judge["analyze"]
    first = execution.attempts[0]
    assert (first.status, first.error_type) == ("error", kind.__name__)
    assert named in (first.error or "")
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (700, 30)
    retried = 100 if category == "retryable" else 0
    assert (execution.usage.input_tokens, execution.usage.output_tokens) == (700 + retried, 30 + retried // 10)
    assert AGENT_WORDS not in repr(logs)


_OK_BODIES = {"openai/m": json.dumps(ANSWER), "anthropic/m": json.dumps(ANTHROPIC_ANSWER)}
# Bodies that are no JSON text the parser takes, though they look like it: (how, model -> bytes).
NOT_JSON_TEXT = {
    "latin-1 bytes": lambda model: _OK_BODIES[model].replace("0.5", "0.5 \xe9").encode("latin-1"),
    "gzip bytes under no content-encoding": lambda model: gzip.compress(_OK_BODIES[model].encode()),
    "a token count of 5,000 digits": lambda model: re.sub(
        r'("(?:prompt|input)_tokens": )10', r"\g<1>" + "9" * 5000, _OK_BODIES[model]
    ).encode(),
}


@pytest.mark.parametrize("model", ["openai/m", "anthropic/m"])
@pytest.mark.parametrize("how", list(NOT_JSON_TEXT))
def test_a_body_the_json_parser_refuses_is_a_response_error(fake_llm: FakeLLMServer, model: str, how: str) -> None:
    """Anthropic's SDK parses the body itself: bytes that are no UTF-8 (another charset, gzip
    sent without its header) or an integer past Python's 4,300 digits raised a UnicodeDecodeError
    or a ValueError out of it, which the judge took for a custom model's own exception (a bare
    JudgeProviderError, "UnicodeDecodeError: ..."); OpenAI's path already said the body is not
    JSON. Both are a JudgeResponseError now, as any body that does not read."""
    fake_llm.rule(Reply.raw(NOT_JSON_TEXT[how](model)))
    error = _failure(_verdict_then_reason(Judge(model)))
    assert type(error.cause) is JudgeResponseError, repr(error.cause)
    assert error.category == "unknown"
    assert "not JSON" in str(error) or "not valid JSON" in str(error)
    assert fake_llm.count() == 1


def test_an_anthropic_message_of_many_blocks_is_read_without_the_sdks_models(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic's SDK built a model object for each content block, trying each block type in
    turn for one of a type it does not know: 100,000 blocks ({"type": "x"}, 1.5 MB, well inside
    the 16 MiB a call reads) cost 7 s of CPU (70 us a block; 42 s for 600,000), the worker's event
    loop held all along. The body is read as JSON, as OpenAI's is: blocks are dicts, looked at once.
    Asserted as what it is, not as a CPU time (speed targets live in bench/): the SDK's parse of a
    response, where it builds those models, is never called. (max_tokens=8192: at the default 1024,
    a body of this many values is refused unparsed.)"""
    from anthropic._response import BaseAPIResponse

    parsed: list[int] = []

    def sdk_parse(self: Any, **kwargs: Any) -> Any:
        parsed.append(1)
        raise AssertionError("the SDK parsed the response into its models")

    monkeypatch.setattr(BaseAPIResponse, "_parse", sdk_parse)
    blocks = [{"type": "x"}] * 50_000 + [{"type": "text", "text": ""}] * 50_000
    answer = [{"type": "text", "text": '{"verdict": "ok", "confidence": 0.5}'}]
    fake_llm.rule(Reply.raw(_anthropic_message(content=blocks + answer)), user_contains="Analyze")
    result = run(_verdict_then_reason(Judge("anthropic/m", max_tokens=8192)))
    assert parsed == []
    assert result.analyze_step_result == {"verdict": "ok", "confidence": 0.5}


def _tool_use(tool_input: Any) -> str:
    block = {"type": "tool_use", "id": "toolu_1", "name": "Verdict", "input": tool_input}
    return _anthropic_message(content=[block], stop_reason="tool_use")


def test_an_anthropic_tool_input_sent_as_a_json_string_is_read_as_the_object(fake_llm: FakeLLMServer) -> None:
    """Some translating proxies send a forced tool call's ``input`` as the JSON text of the object
    (OpenAI's ``arguments`` form). It was validated as a string, failed as a schema mismatch and
    cost a fallback call; a string that parses as a JSON object is the input."""
    fake_llm.rule(Reply.raw(_tool_use(json.dumps({"verdict": "ok", "confidence": 0.5}))), user_contains="Analyze")
    result = run(_verdict_then_reason(Judge("anthropic/m")))
    assert result.analyze_step_result == {"verdict": "ok", "confidence": 0.5}
    attempts = result.judge["analyze"].attempts
    assert [(a.status, a.prompt_injection) for a in attempts] == [("ok", "native")]
    assert fake_llm.count() == 2  # analyze once, reason once: no fallback call


@pytest.mark.parametrize("tool_input", ['["ok", 0.5]', "ok", '{"verdict": "ok", "confidence": 0.5'])
def test_an_anthropic_tool_input_string_that_is_no_json_object_is_still_a_mismatch(
    fake_llm: FakeLLMServer, tool_input: str
) -> None:
    fake_llm.rule(Reply.raw(_tool_use(tool_input)), user_contains="Analyze", times=1)
    fake_llm.rule(Reply.text('{"verdict": "ok", "confidence": 0.5}'), user_contains="Analyze")
    result = run(_verdict_then_reason(Judge("anthropic/m")))
    attempts = result.judge["analyze"].attempts
    assert [(a.status, a.prompt_injection) for a in attempts] == [("error", "native"), ("ok", "system")]


def test_an_anthropic_tool_input_string_longer_than_max_tokens_allows_is_refused_unparsed(
    fake_llm: FakeLLMServer,
) -> None:
    """The string is not parsed past what max_tokens could hold: refused as too long, its tokens counted."""
    huge = json.dumps({"verdict": "ok", "confidence": 0.5, "pad": [{}] * 20_000})
    fake_llm.rule(Reply.raw(_tool_use(huge)), user_contains="Analyze")
    error = _failure(_verdict_then_reason(Judge("anthropic/m", max_tokens=256)))
    assert isinstance(error.cause, JudgeResponseError), error.cause
    assert "more than max_tokens=256 allows" in str(error.cause)
    assert error.cause.execution.usage.total_tokens == 15
