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


def test_rounded_takes_halves_up_as_mastra_does() -> None:
    """Python's round() takes halves to even: 1 of 8 statements was 0.12 where Mastra's
    ``Math.round((x + Number.EPSILON) * 100) / 100`` gives 0.13. The LLM builtins are version "2"."""
    assert [rounded(k / 8, 1) for k in (1, 3, 5, 7)] == [0.13, 0.38, 0.63, 0.88]
    assert rounded(0.285, 1) == 0.29  # 28.499999... in floating point: the epsilon lifts it, as in JS
    assert rounded(1 / 8, 10) == 1.25
    from scorers.builtin import bias, faithfulness, hallucination, toxicity

    for factory in (answer_relevancy, bias, faithfulness, hallucination, toxicity):
        assert factory("openai/gpt-4o-mini").version == "2"


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


@pytest.mark.parametrize("spelling", ["Yes", " yes", "YES\n"])
def test_a_verdict_in_another_case_counts_as_mastra_counts_it(spelling: str) -> None:
    """Mastra compares verdicts trimmed and lower-cased; here "Yes" failed the step after a paid
    fallback call (JudgeOutputError)."""
    from scorers.builtin import bias, toxicity
    from scorers.judge.testing import FakeJudgeModel

    verdicts = {"verdicts": [{"statement": "s", "opinion": "s", "verdict": spelling, "reason": "r"}]}
    for factory, first in ((answer_relevancy, {"statements": ["s"]}), (bias, {"opinions": ["s"]}), (toxicity, None)):
        model = FakeJudgeModel(*(a for a in (first, verdicts, "why") if a is not None))
        result = factory(model).run_sync(input="q?", output="a")
        assert result.score == 1.0
        assert len(model.requests) == (3 if first else 2)


def test_rounded_takes_any_scale_check_scale_allows() -> None:
    """A scale past 1e306 overflowed (OverflowError on every run) once rounding went through
    math.floor; there is nothing left to round there."""
    assert rounded(0.5, 1e307) == 5e306
    assert rounded(1.0, 1e308) == 1e308
