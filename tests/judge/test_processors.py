"""Input, output and error processors are applied around the judge call."""

from __future__ import annotations

import dataclasses
import re

import pytest

from scorers import Judge, ScorerConfigError, ScorerRunError
from scorers.judge import (
    ErrorContext,
    JudgeCallInfo,
    JudgeMessage,
    JudgeProcessorError,
    JudgeProviderError,
    JudgeResponse,
    RetryDecision,
)
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import full_scorer, run, score_scorer

EMAIL = re.compile(r"[\w.]+@[\w.]+")


class Redact:
    """An input processor object: hides e-mail addresses from the judge."""

    def __init__(self) -> None:
        self.seen: list[JudgeCallInfo] = []

    def process_input(self, messages: list[JudgeMessage], info: JudgeCallInfo) -> list[JudgeMessage]:
        self.seen.append(info)
        return [JudgeMessage(m.role, EMAIL.sub("[email]", m.content)) for m in messages]


def test_input_processor_redacts_before_the_call(fake_llm: FakeLLMServer) -> None:
    """The server never sees what an input processor removed; the record shows the sent prompt."""
    redact = Redact()
    result = run(score_scorer(Judge("openai/gpt-4o-mini", input_processors=[redact])), output="mail bob@example.com")
    (req,) = fake_llm.requests
    assert "bob@example.com" not in req.user_text
    assert "[email]" in req.user_text
    assert "[email]" in result.judge["generate_score"].prompt
    assert redact.seen[0].step == "generate_score"
    assert redact.seen[0].model_id == "openai/gpt-4o-mini"


def test_async_callable_processors(fake_llm: FakeLLMServer) -> None:
    """Plain (async) callables work as input and output processors, in list order."""
    order: list[str] = []

    async def add_note(messages: list[JudgeMessage], info: JudgeCallInfo) -> list[JudgeMessage]:
        order.append("input")
        return [*messages[:-1], JudgeMessage("user", messages[-1].content + "\nNOTE")]

    def double(response: JudgeResponse, info: JudgeCallInfo) -> JudgeResponse:
        order.append("output1")
        return dataclasses.replace(response, text=response.text.replace("0.5", "0.25"), parsed=None)

    def tag(response: JudgeResponse, info: JudgeCallInfo) -> JudgeResponse:
        order.append("output2")
        return response

    judge = Judge("anthropic/claude-3-5-haiku-latest", input_processors=[add_note], output_processors=[double, tag])
    result = run(score_scorer(judge))
    assert fake_llm.requests[0].user_text.endswith("NOTE")
    assert result.score == 0.25
    assert order == ["input", "output1", "output2"]


def test_output_processor_transforms_free_text(fake_llm: FakeLLMServer) -> None:
    """An output processor rewrites generate_reason's text; raw_output keeps the model's."""

    def shout(response: JudgeResponse, info: JudgeCallInfo) -> JudgeResponse:
        return dataclasses.replace(response, text=response.text.upper()) if info.step == "generate_reason" else response

    result = run(full_scorer(Judge("openai/gpt-4o-mini", output_processors=[shout])))
    assert result.reason == "THIS IS THE FAKE JUDGE'S ANSWER."
    assert result.judge["generate_reason"].output == "THIS IS THE FAKE JUDGE'S ANSWER."
    assert result.judge["generate_reason"].raw_output == "This is the fake judge's answer."


def test_failing_processor_fails_the_step(fake_llm: FakeLLMServer) -> None:
    """A processor that raises fails the step with JudgeProcessorError and the original cause."""

    def broken(messages: list[JudgeMessage], info: JudgeCallInfo) -> list[JudgeMessage]:
        raise RuntimeError("redaction service down")

    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge("openai/gpt-4o-mini", input_processors=[broken])))
    cause = info.value.cause
    assert isinstance(cause, JudgeProcessorError)
    assert isinstance(cause.__cause__, RuntimeError)
    assert "redaction service down" in str(cause)
    assert info.value.partial.judge["generate_score"].status == "error"
    assert fake_llm.count() == 0


def test_custom_error_processor(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """A user error processor sees the provider error and the retry count, and decides."""
    calls: list[tuple[int | None, int]] = []

    def decide(error: JudgeProviderError, context: ErrorContext) -> RetryDecision | None:
        calls.append((error.status_code, context.retry_count))
        return RetryDecision(retry=error.status_code == 418, delay_ms=5)

    fake_llm.script(Reply.error(418, "teapot"), Reply.error(418, "teapot"))
    result = run(score_scorer(Judge("openai/gpt-4o-mini", error_processors=[decide])))
    assert result.score == 0.5
    assert calls == [(418, 0), (418, 1)]
    assert sleeps == [0.005, 0.005]


def test_processor_none_defers_to_the_next(fake_llm: FakeLLMServer, sleeps: list[float]) -> None:
    """An error processor returning None lets the next one decide."""
    fake_llm.script(Reply.error(500, "x"))
    result = run(
        score_scorer(
            Judge(
                "openai/gpt-4o-mini",
                error_processors=[lambda e, c: None, lambda e, c: RetryDecision(True)],
            )
        )
    )
    assert result.score == 0.5
    assert fake_llm.count() == 2


def test_processors_are_checked_at_construction() -> None:
    """A processor that is neither callable nor has the method is rejected by Judge()."""
    with pytest.raises(ScorerConfigError, match="process_input"):
        Judge("openai/gpt-4o-mini", input_processors=[42])
    with pytest.raises(ScorerConfigError, match="list of processors"):
        Judge("openai/gpt-4o-mini", error_processors="retry")  # type: ignore[arg-type]


def test_error_processor_raising_a_judge_error_keeps_the_record(fake_llm: FakeLLMServer) -> None:
    """An error processor that re-raises the provider error still leaves the step's judge record."""

    def reraise(error: JudgeProviderError, context: ErrorContext) -> RetryDecision | None:
        raise error

    fake_llm.script(Reply.error(500, "boom"))
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge("openai/gpt-4o-mini", error_processors=[reraise])))
    assert isinstance(info.value.cause, JudgeProviderError)
    execution = info.value.partial.judge["generate_score"]
    assert execution.status == "error"
    assert execution.attempt_count == 1
