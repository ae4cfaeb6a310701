"""ScoreResult.judge records every execution, and survives a JSON round trip."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from scorers import Judge, ScoreResult, ScorerRunError
from scorers.judge import StreamErrorRetryProcessor
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import full_scorer, run


def test_each_prompt_step_is_recorded(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """Status, prompt, raw output, model, provider, usage, attempts and duration per step."""
    fake_llm.rule(Reply.rate_limited(retry_after_ms="10"), user_contains="Verdict", times=1)
    fake_llm.rule(Reply.json({"score": 0.75}, input_tokens=100, output_tokens=7), user_contains="Verdict")
    result = run(full_scorer(Judge("openai/gpt-4o-mini", error_processors=[StreamErrorRetryProcessor()])))
    assert set(result.judge) == {"analyze", "generate_score", "generate_reason"}
    score = result.judge["generate_score"]
    assert score.status == "ok"
    assert score.prompt == result.generate_score_prompt
    assert score.raw_output == '{"score": 0.75}'
    assert score.output == {"score": 0.75}
    assert (score.model, score.provider) == ("openai/gpt-4o-mini", "openai")
    assert (score.usage.input_tokens, score.usage.output_tokens) == (100, 7)
    assert score.attempt_count == 2
    first, second = score.attempts
    assert (first.status, first.status_code, first.retry_delay_ms) == ("error", 429, 10)
    assert first.request_id == fake_llm.requests[1].request_id
    assert (second.status, second.request_id) == ("ok", fake_llm.requests[2].request_id)
    assert score.duration_ms >= second.duration_ms > 0
    assert result.judge["analyze"].output == {"verdict": "fake", "confidence": 0.5}
    assert result.judge["generate_reason"].output == result.reason


def test_score_result_json_round_trip(fake_llm: FakeLLMServer) -> None:
    """A ScoreResult with judge records round-trips through JSON exactly."""
    result = run(full_scorer(Judge("anthropic/claude-3-5-haiku-latest")))
    again = ScoreResult.model_validate_json(result.model_dump_json())
    assert again == result
    assert again.judge["analyze"].attempts[0].prompt_injection == "native"


def test_failed_execution_round_trips(fake_llm: FakeLLMServer) -> None:
    """The partial result of a failed run, with its error record, round-trips through JSON."""
    fake_llm.rule(Reply.error(401, "bad key"))
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge("openai/gpt-4o-mini")))
    partial = info.value.partial
    assert partial.judge["analyze"].status == "error"
    assert "401" in (partial.judge["analyze"].error or "")
    assert ScoreResult.model_validate_json(partial.model_dump_json()) == partial


def test_async_run_on_fresh_loops_closes_its_clients(fake_llm: FakeLLMServer) -> None:
    """Scoring with asyncio.run on two fresh loops works and leaks no connection."""
    scorer = full_scorer(Judge("openai/gpt-4o-mini"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            result = asyncio.run(scorer.run(input="q", output="a"))
            assert result.score == 0.5
    assert fake_llm.count() == 6
