"""Judge cost: cached tokens read through the real OpenAI and Anthropic SDKs from tests/fakellm,
Anthropic's cache breakpoint on the instructions, and the price table."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import BaseModel

from scorers import Judge, PromptStep, ScorerRunError, create_scorer
from scorers._result import JudgeExecution, JudgeUsage
from scorers.judge import (
    DEFAULT_PRICES,
    PRICES_TAKEN,
    ModelPrice,
    find_price,
    price_executions,
    price_usage,
)
from tests.fakellm import FakeLLMServer, Reply

# Long enough to pass the fake's cache minimum (1024 tokens at 4 characters a token).
LONG_INSTRUCTIONS = "You grade support answers strictly and fairly. " * 100


class Verdict(BaseModel):
    score: float


def _scorer(model: str) -> Any:
    return create_scorer(
        "cost-probe",
        judge=Judge(model=model, instructions=LONG_INSTRUCTIONS),
        score_range=(0, 1),
    ).generate_score(PromptStep("grade", lambda run: f"Grade: {run.output}", output_schema=Verdict))


def test_openai_cached_tokens_are_read_from_prompt_tokens_details(fake_llm: FakeLLMServer) -> None:
    """The second run with the same instructions (first in the prompt) reports them as cached."""
    scorer = _scorer("openai/gpt-4o-mini")
    first = scorer.run_sync(input="q", output="answer one")
    second = scorer.run_sync(input="q", output="answer two")
    u1 = first.judge["generate_score"].usage
    u2 = second.judge["generate_score"].usage
    assert u1.cached_input_tokens == 0
    assert u2.cached_input_tokens > 1000
    assert u2.cached_input_tokens < u2.input_tokens
    # OpenAI's instructions come first: the system message is the first message sent.
    body = fake_llm.requests[-1].body
    assert body["messages"][0]["role"] == "system"
    assert LONG_INSTRUCTIONS in body["messages"][0]["content"]
    # Priced with the cached share at the cached rate.
    price = DEFAULT_PRICES["openai/gpt-4o-mini"]
    assert price.cached_input is not None
    expected = (
        (u2.input_tokens - u2.cached_input_tokens) * price.input
        + u2.cached_input_tokens * price.cached_input
        + u2.output_tokens * price.output
    ) / 1e6
    assert price_usage("openai/gpt-4o-mini", u2) == pytest.approx(expected)
    assert price_usage("openai/gpt-4o-mini", u2) < price_usage(  # type: ignore[operator]
        "openai/gpt-4o-mini", JudgeUsage(input_tokens=u2.input_tokens, output_tokens=u2.output_tokens)
    )


def test_anthropic_marks_instructions_for_caching_and_reads_cache_tokens(fake_llm: FakeLLMServer) -> None:
    """cache_control sits on the system block; the first call writes the cache, the next reads it."""
    scorer = _scorer("anthropic/claude-sonnet-5-5")
    first = scorer.run_sync(input="q", output="answer one")
    second = scorer.run_sync(input="q", output="answer two")
    system = fake_llm.requests[0].body["system"]
    assert system[0]["cache_control"] == {"type": "ephemeral"}
    assert LONG_INSTRUCTIONS in system[0]["text"]
    u1 = first.judge["generate_score"].usage
    u2 = second.judge["generate_score"].usage
    assert u1.cache_write_input_tokens > 1000
    assert u1.cached_input_tokens == 0
    assert u2.cached_input_tokens == u1.cache_write_input_tokens
    assert u2.cache_write_input_tokens == 0
    # input_tokens is the whole prompt (Anthropic reports the cached parts apart from it).
    assert u1.input_tokens == u2.input_tokens
    price = DEFAULT_PRICES["anthropic/claude-sonnet-5-5"]
    write = (
        (u1.input_tokens - u1.cache_write_input_tokens) * price.input
        + u1.cache_write_input_tokens * (price.cache_write or 0)
        + u1.output_tokens * price.output
    ) / 1e6
    assert price_usage("anthropic/claude-sonnet-5-5", u1) == pytest.approx(write)
    cost1 = price_usage("anthropic/claude-sonnet-5-5", u1)
    cost2 = price_usage("anthropic/claude-sonnet-5-5", u2)
    assert cost1 is not None
    assert cost2 is not None
    assert cost2 < cost1


def test_short_instructions_are_not_cached(fake_llm: FakeLLMServer) -> None:
    """Below the provider's minimum nothing is cached (and existing usage stays as it was)."""
    scorer = create_scorer("short", judge=Judge(model="anthropic/claude-haiku-4-5")).generate_score(
        PromptStep("grade", lambda run: "Grade it", output_schema=Verdict)
    )
    for _ in range(2):
        usage = scorer.run_sync(input="q", output="a").judge["generate_score"].usage
        assert usage.cached_input_tokens == 0
        assert usage.cache_write_input_tokens == 0


def test_unknown_model_is_unpriced_not_free() -> None:
    """A model missing from the table costs None; no tokens cost 0 whatever the model."""
    assert price_usage("vllm/qwen", JudgeUsage(input_tokens=10, output_tokens=2)) is None
    assert price_usage("vllm/qwen", JudgeUsage()) == 0.0
    execution = JudgeExecution(
        step="generate_score",
        status="ok",
        prompt="p",
        model="vllm/qwen",
        provider="vllm",
        usage=JudgeUsage(input_tokens=5, output_tokens=5),
    )
    assert price_executions([execution]) is None


def test_dated_snapshots_find_their_model_and_overrides_apply() -> None:
    """A dated model id is priced as its model; a table passed in overrides the defaults."""
    assert find_price("anthropic/claude-sonnet-4-5-20250929") == DEFAULT_PRICES["anthropic/claude-sonnet-4-5"]
    assert find_price("openai/gpt-4o-mini-2024-07-18") == DEFAULT_PRICES["openai/gpt-4o-mini"]
    # Not a date suffix: no guessing from a longer name.
    assert find_price("openai/gpt-4o-mini-tts") is None
    table = {**DEFAULT_PRICES, "openai/gpt-4o-mini": ModelPrice(input=1.0, output=2.0)}
    usage = JudgeUsage(input_tokens=1_000_000, output_tokens=1_000_000, cached_input_tokens=500_000)
    assert price_usage("openai/gpt-4o-mini", usage, table) == pytest.approx(3.0)  # cached at input price
    assert math.isclose(
        price_usage("openai/gpt-4o-mini", usage) or 0, (500_000 * 0.15 + 500_000 * 0.075 + 1_000_000 * 0.6) / 1e6
    )
    assert PRICES_TAKEN.count("-") == 2


@pytest.mark.parametrize(
    ("model", "field"),
    [("openai/gpt-4o-mini", "usage.completion_tokens"), ("anthropic/claude-sonnet-5-5", "usage.output_tokens")],
)
def test_a_negative_token_count_is_a_judge_error_never_a_refund(
    fake_llm: FakeLLMServer, model: str, field: str
) -> None:
    """A backend that reports negative tokens (through the real SDK / HTTP path): the call is a
    JudgeResponseError naming the field, so no negative cost reaches the budgets."""
    fake_llm.script(Reply.auto(output_tokens=-5_000_000))
    with pytest.raises(ScorerRunError) as failed:
        _scorer(model).run_sync(input="q", output="answer")
    assert failed.value.error_type == "JudgeResponseError"
    assert f"{field} is -5000000, not a token count" in str(failed.value)


def test_usage_is_never_negative() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        JudgeUsage(input_tokens=-1)


def test_more_cached_tokens_than_the_prompt_are_no_more_than_the_prompt(fake_llm: FakeLLMServer) -> None:
    """An OpenAI-compatible server reporting `cached_tokens` above `prompt_tokens`: the record said
    50 of a 10-token prompt were cached (a dashboard's uncached share came out negative, while the
    price table, clamping, charged the 10 as cached). The cached share is at most the prompt."""
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 50}}
    answer = {"role": "assistant", "content": '{"score": 0.5}'}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini", "usage": usage}
    fake_llm.script(
        Reply.raw(json.dumps({**body, "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}))
    )
    result = _scorer("openai/gpt-4o-mini").run_sync(input="q", output="answer")
    assert result.judge["generate_score"].usage == JudgeUsage(input_tokens=10, output_tokens=5, cached_input_tokens=10)
