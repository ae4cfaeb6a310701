"""FakeJudgeModel: scorers with judges tested in-process, no HTTP."""

from __future__ import annotations

import pytest

from scorers import Judge, PromptStep, ScorerRunError, create_scorer
from scorers.judge import JudgeProviderError, JudgeResponse, RetryDecision, StreamErrorRetryProcessor
from scorers.judge.testing import FakeJudgeModel, rate_limited, server_error
from tests.judge.helpers import Verdict, full_scorer, run


def test_scripted_replies_in_order() -> None:
    """Replies are used in order: structured dicts, then free text."""
    model = FakeJudgeModel({"verdict": "ok", "confidence": 0.9}, {"score": 0.8}, "Because.")
    result = run(full_scorer(Judge(model, "Judge well.")))
    assert result.analyze_step_result == {"verdict": "ok", "confidence": 0.9}
    assert (result.score, result.reason) == (0.8, "Because.")
    assert [r.mode for r in model.requests] == ["native", "native", "text"]
    assert model.requests[0].output_schema is not None
    assert model.requests[0].system.endswith("Judge well.")
    assert result.judge["generate_score"].provider == "fake"


def test_automatic_answers_fit_the_schema() -> None:
    """Without scripted replies the fake answers schema-valid values and a default reason."""
    model = FakeJudgeModel(default_text="Auto reason.")
    result = run(full_scorer(Judge(model)))
    assert result.analyze_step_result == {"verdict": "example", "confidence": 0.5}
    assert result.reason == "Auto reason."


def test_raised_errors_drive_retries(sleeps: list[float]) -> None:
    """Exceptions in the script are raised, so retry policies can be tested without HTTP."""
    model = FakeJudgeModel(rate_limited(retry_after_ms=20), server_error(503), {"score": 1})
    scorer = create_scorer("x", judge=Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=2)]))
    result = run(scorer.generate_score(PromptStep("s", lambda: "p")))
    assert result.score == 1
    assert sleeps == [0.02]  # the 5xx retry has no delay configured
    assert [a.status_code for a in result.judge["generate_score"].attempts] == [429, 503, None]


def test_custom_model_without_native_output_gets_inline_schema() -> None:
    """'auto' on a model without native structured output injects the schema inline."""
    model = FakeJudgeModel(supports_native_structured_output=False)
    result = run(full_scorer(Judge(model)))
    assert result.analyze_step_result == {"verdict": "example", "confidence": 0.5}
    assert model.requests[0].mode == "text"
    assert "```json" in model.requests[0].messages[-1].content


def test_unknown_exception_from_custom_model(sleeps: list[float]) -> None:
    """A custom model's own exception is an 'unknown' provider error, kept as __cause__."""
    model = FakeJudgeModel(RuntimeError("socket closed"), RuntimeError("again"))
    judge = Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=3)])
    with pytest.raises(ScorerRunError) as info:
        run(create_scorer("x", judge=judge).generate_score(PromptStep("s", lambda: "p")))
    cause = info.value.cause
    assert isinstance(cause, JudgeProviderError)
    assert cause.category == "unknown"
    assert isinstance(cause.__cause__, RuntimeError)
    assert len(model.requests) == 1

    model.replies[:] = [RuntimeError("once")]
    judge = Judge(model, error_processors=[lambda e, c: RetryDecision(c.retry_count < 1)])
    result = run(create_scorer("x", judge=judge).generate_score(PromptStep("s", lambda: "p")))
    assert result.score == 0.5


def test_callable_and_response_replies() -> None:
    """A reply may be a callable of the request or a ready JudgeResponse."""
    model = FakeJudgeModel(
        lambda request: {"verdict": request.schema_name, "confidence": 0},
        JudgeResponse(text='{"score": 0.1}'),
        "fine",
    )
    result = run(full_scorer(Judge(model)))
    assert result.analyze_step_result == {"verdict": Verdict.__name__, "confidence": 0}
    assert result.score == 0.1


def test_list_schema_is_wrapped_for_native_output() -> None:
    """A non-object schema is asked for natively under a 'value' key and unwrapped."""
    model = FakeJudgeModel({"value": ["a", "b"]})
    scorer = (
        create_scorer("x", judge=Judge(model))
        .preprocess(PromptStep("p", lambda: "list", output_schema={"type": "array", "items": {"type": "string"}}))
        .generate_score(lambda results: len(results.preprocess_step_result))
    )
    result = run(scorer)
    assert result.preprocess_step_result == ["a", "b"]
    assert result.score == 2
    assert model.requests[0].output_schema is not None
    assert model.requests[0].output_schema["required"] == ["value"]


def test_overloaded_without_status_is_retryable(sleeps: list[float]) -> None:
    """An 'overloaded' provider error without an HTTP status (e.g. a stream error) is retried."""
    overloaded = JudgeProviderError(
        "fake/judge: Overloaded", provider="fake", model_id="fake/judge", error_type="overloaded_error"
    )
    assert overloaded.category == "retryable"
    model = FakeJudgeModel(overloaded, {"score": 0.3})
    judge = Judge(model, error_processors=[StreamErrorRetryProcessor()])
    result = run(create_scorer("x", judge=judge).generate_score(PromptStep("s", lambda: "p")))
    assert result.score == 0.3
