"""Tests for the prompt_alignment LLM scorer."""

from typing import Any

import pytest

from scorers import ScorerConfigError, ScorerRunError
from scorers.builtin import prompt_alignment
from scorers.judge import JudgeOutputError
from tests.builtin._judge import ANTHROPIC, OPENAI, fenced_blocks, score
from tests.fakellm import FakeLLMServer, Reply


def analysis(intent: float, requirements: float, completeness: float, fit: float) -> dict[str, Any]:
    """One prompt's four-dimension analysis as the judge would answer it."""
    return {
        "intent_alignment": {"score": intent, "primary_intent": "i", "is_addressed": True, "reasoning": "r"},
        "requirements_fulfillment": {
            "requirements": [{"requirement": "bullets", "is_fulfilled": False, "reasoning": "r"}],
            "overall_score": requirements,
        },
        "completeness": {"score": completeness, "missing_elements": [], "reasoning": "r"},
        "response_appropriateness": {
            "score": fit,
            "format_alignment": True,
            "tone_alignment": True,
            "reasoning": "r",
        },
        "overall_assessment": "ok",
    }


RUN_INPUT = {
    "input_messages": ["List three fruits as bullets."],
    "system_messages": ["Answer in English, politely."],
}


def test_both_prompts_weighted(fake_llm: FakeLLMServer) -> None:
    """0.7·user + 0.3·system, each with its own dimension weights: 0.7·0.85 + 0.3·0.65 = 0.79."""
    user = analysis(1.0, 0.5, 1.0, 1.0)  # 0.40·1 + 0.30·0.5 + 0.20·1 + 0.10·1 = 0.85
    system = analysis(0.0, 1.0, 1.0, 1.0)  # 0.35·0 + 0.35·1 + 0.15·1 + 0.15·1 = 0.65
    fake_llm.script(Reply.json({"user": user, "system": system}), Reply.text("Missed the bullets."))
    result = score(prompt_alignment(OPENAI), input=RUN_INPUT, output="Apple, pear, plum.")
    assert result.score == pytest.approx(0.79)
    blocks = fenced_blocks(fake_llm.requests[0].last_user_text)
    assert blocks["system prompt"] == "Answer in English, politely."
    assert blocks["user prompt"] == "List three fruits as bullets."


def test_user_mode_ignores_system(fake_llm: FakeLLMServer) -> None:
    """evaluation_mode='user': only the user analysis counts, asked with system set to null."""
    fake_llm.script(Reply.json({"user": analysis(0.5, 0.5, 0.5, 0.5), "system": None}), Reply.text("Half."))
    result = score(prompt_alignment(OPENAI, evaluation_mode="user"), input=RUN_INPUT, output="Apple.")
    assert result.score == pytest.approx(0.5)
    prompt = fake_llm.requests[0].last_user_text
    assert "Set system to null" in prompt
    assert "system prompt" not in fenced_blocks(prompt)


def test_both_mode_falls_back_to_the_prompt_present(fake_llm: FakeLLMServer) -> None:
    """A run with only a user message is judged on the user prompt alone."""
    fake_llm.script(Reply.json({"user": analysis(1, 1, 1, 1), "system": None}), Reply.text("Aligned."))
    assert score(prompt_alignment(OPENAI), input="List fruits.", output="Apple.").score == 1.0


def test_missing_prompts_are_not_scorable(fake_llm: FakeLLMServer) -> None:
    """system mode without system instructions, or an empty output: not scorable, no calls."""
    result = score(prompt_alignment(OPENAI, evaluation_mode="system"), input="List fruits.", output="Apple.")
    assert result.not_scorable is not None
    assert "system instructions" in result.not_scorable["reason"]
    assert score(prompt_alignment(OPENAI), input=RUN_INPUT, output="").not_scorable is not None
    assert fake_llm.count() == 0


def test_judge_leaving_out_an_analysis_fails_clearly(fake_llm: FakeLLMServer) -> None:
    """In both mode, an answer without an analysis the run asked for is a judge-output error
    (category invalid_output, naming the analysis), not an internal one."""
    fake_llm.script(Reply.json({"user": analysis(1, 1, 1, 1), "system": None}))
    with pytest.raises(ScorerRunError, match="left out the system-prompt analysis") as caught:
        score(prompt_alignment(OPENAI), input=RUN_INPUT, output="Apple.")
    assert isinstance(caught.value.cause, JudgeOutputError)
    assert caught.value.category == "invalid_output"
    assert caught.value.cause.model_id == OPENAI


@pytest.mark.parametrize(("mode", "left_out"), [("user", "user"), ("system", "system")])
def test_single_mode_requires_its_analysis(fake_llm: FakeLLMServer, mode: str, left_out: str) -> None:
    """In user or system mode the schema requires the analysis asked for: an answer setting it to
    null gets the one fallback call, then a judge-output error, with both calls recorded."""
    other = "system" if left_out == "user" else "user"
    fake_llm.script(Reply.json({left_out: None, other: None}), Reply.json({left_out: None, other: None}))
    with pytest.raises(ScorerRunError) as caught:
        score(prompt_alignment(OPENAI, evaluation_mode=mode), input=RUN_INPUT, output="Apple.")  # type: ignore[arg-type]
    assert isinstance(caught.value.cause, JudgeOutputError)
    assert caught.value.category == "invalid_output"
    assert caught.value.cause.model_id == OPENAI
    assert fake_llm.count() == 2


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
def test_single_mode_recovers_on_the_fallback(fake_llm: FakeLLMServer, model: str) -> None:
    """A fallback answer that has the analysis is scored as usual (the schema with an optional
    field left out goes to both providers)."""
    fake_llm.script(
        Reply.json({"user": None, "system": None}),
        Reply.json({"user": analysis(1, 1, 1, 1), "system": None}),
        Reply.text("Aligned."),
    )
    result = score(prompt_alignment(model, evaluation_mode="user"), input=RUN_INPUT, output="Apple.")
    assert result.score == 1.0


def test_bad_mode() -> None:
    """An unknown evaluation_mode is rejected at build time."""
    with pytest.raises(ScorerConfigError, match="evaluation_mode"):
        prompt_alignment(OPENAI, evaluation_mode="assistant")  # type: ignore[arg-type]
