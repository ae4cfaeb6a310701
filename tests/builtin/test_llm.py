"""Tests for the shared LLM-builtin helpers: judge set-up, context, rounding, resume."""

import asyncio

import pytest

from scorers import Judge, ScorerConfigError, ScoreResult
from scorers.builtin import answer_relevancy
from scorers.builtin._llm import check_context_option, make_judge, rounded
from scorers.judge import StreamErrorRetryProcessor
from tests.builtin._judge import OPENAI
from tests.fakellm import FakeLLMServer, Reply


def test_make_judge_layers_options_over_model_and_instructions() -> None:
    """The user's Judge fields win; unset ones come from the scorer's model and instructions."""
    processor = StreamErrorRetryProcessor()
    judge = make_judge("s", OPENAI, "our instructions", Judge(error_processors=[processor], max_processor_retries=2))
    assert judge.model == OPENAI
    assert judge.instructions == "our instructions"
    assert judge.error_processors == (processor,)
    assert judge.max_processor_retries == 2
    assert make_judge("s", OPENAI, "ours", Judge(instructions="theirs")).instructions == "theirs"


def test_make_judge_rejects_bad_models() -> None:
    """A model must be 'provider/model' or a JudgeModel."""
    for bad in ("gpt-4o", "/gpt-4o", "openai/"):
        with pytest.raises(ScorerConfigError, match="provider/model"):
            make_judge("s", bad, "i", None)
    with pytest.raises(ScorerConfigError, match="JudgeModel"):
        make_judge("s", 42, "i", None)  # type: ignore[arg-type]


def test_context_option_shapes() -> None:
    """Lists are copied, callables kept, a bare string or empty list refused."""
    assert check_context_option("s", ("a", "b")) == ["a", "b"]
    assert check_context_option("s", None) is None
    with pytest.raises(ScorerConfigError, match="list of strings"):
        check_context_option("s", "just a string")
    assert check_context_option("s", ["a", " ", ""]) == ["a"]
    with pytest.raises(ScorerConfigError, match="empty list"):
        check_context_option("s", ["", "  "])


def test_rounded_clamps_scales_and_rounds() -> None:
    """Two decimals after scaling; values outside 0–1 are clamped first."""
    assert rounded(1 / 3, 1) == 0.33
    assert rounded(1 / 3, 10) == 3.33
    assert rounded(1.2, 2) == 2.0
    assert rounded(-0.1, 1) == 0.0


def test_resume_from_a_json_checkpoint(fake_llm: FakeLLMServer) -> None:
    """A checkpoint (step results as plain JSON) resumes without repeating judge calls."""
    checkpoint = ScoreResult(
        run_id="r1",
        scorer_id="answer-relevancy",
        preprocess_step_result={"statements": ["a", "b"]},
        analyze_step_result={
            "verdicts": [
                {"statement": "a", "verdict": "yes", "reason": "r"},
                {"statement": "b", "verdict": "no", "reason": "r"},
            ]
        },
        completed_steps=["preprocess", "analyze"],
    )
    fake_llm.script(Reply.text("Half relevant."))
    result = asyncio.run(answer_relevancy(OPENAI).run(input="q", output="a. b.", resume=checkpoint))
    assert result.score == 0.5
    assert result.reason == "Half relevant."
    assert fake_llm.count() == 1
