"""Tests for the faithfulness LLM scorer."""

import pytest

from scorers import Judge, ScorerConfigError
from scorers.builtin import faithfulness
from scorers.judge.testing import FakeJudgeModel
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.builtin._runs import agent_output, call
from tests.fakellm import FakeLLMServer, Reply

CLAIMS = {"claims": ["Oslo is 12°C.", "Oslo is sunny.", "Oslo has 700k people."]}
VERDICTS = {
    "verdicts": [
        {"claim": "Oslo is 12°C.", "verdict": "yes", "reason": "tool says 12"},
        {"claim": "Oslo is sunny.", "verdict": "no", "reason": "tool says rain"},
        {"claim": "Oslo has 700k people.", "verdict": "unsure", "reason": "not in context"},
    ]
}
WEATHER = agent_output(
    call("get_weather", {"city": "Oslo", "temp_c": 12, "sky": "rain"}),
    text="Oslo is 12°C and sunny, a city of 700k people.",
)


def test_context_from_tool_results(fake_llm: FakeLLMServer) -> None:
    """1 supported claim of 3 → 0.33; the tool result is the fenced context."""
    fake_llm.script(Reply.json(CLAIMS), Reply.json(VERDICTS), Reply.text("One of three supported."))
    result = score(faithfulness(OPENAI), input="Weather in Oslo?", output=WEATHER)
    assert result.score == pytest.approx(0.33)
    blocks = fenced_blocks(fake_llm.requests[1].last_user_text)
    assert blocks["context 1"] == 'get_weather: {"city": "Oslo", "temp_c": 12, "sky": "rain"}'
    assert blocks["claim 2"] == "Oslo is sunny."


def test_context_option_and_scale(fake_llm: FakeLLMServer) -> None:
    """An explicit context list replaces tool results; scale 5 → 1/3·5 = 1.67."""
    fake_llm.script(Reply.json(CLAIMS), Reply.json(VERDICTS), Reply.text("Reason."))
    scorer = faithfulness(OPENAI, context=["Oslo: 12°C, rain."], scale=5)
    result = score(scorer, input="Weather in Oslo?", output=WEATHER)
    assert result.score == pytest.approx(1.67)
    assert fenced_blocks(fake_llm.requests[1].last_user_text)["context 1"] == "Oslo: 12°C, rain."


def test_context_function_and_judge_model() -> None:
    """context may be a function of the run; model may be a JudgeModel; judge options apply."""
    model = FakeJudgeModel(
        {"claims": ["A"]}, {"verdicts": [{"claim": "A", "verdict": "yes", "reason": "r"}]}, "All good."
    )
    scorer = faithfulness(
        model,
        context=lambda run: [f"ctx for {run.run_id}"],
        judge=Judge(instructions="Be strict about dates."),
    )
    result = score(scorer, input="q", output="A.", run_id="r1")
    assert result.score == 1.0
    assert "ctx for r1" in model.requests[1].messages[-1].content
    assert "Be strict about dates." in (model.requests[0].system or "")


def test_missing_context_is_not_scorable(fake_llm: FakeLLMServer) -> None:
    """No context option and no tool results: not scorable, and no judge call is made."""
    result = score(faithfulness(OPENAI), input="q", output="Plain answer without tools.")
    assert result.score is None
    assert result.not_scorable is not None
    assert "no context" in result.not_scorable["reason"]
    assert fake_llm.count() == 0


def test_no_claims_is_not_scorable(fake_llm: FakeLLMServer) -> None:
    """An output without factual claims has nothing to check: one judge call, then not scorable."""
    fake_llm.script(Reply.json({"claims": []}))
    result = score(faithfulness(OPENAI, context=["c"]), input="q", output="Hello! How can I help?")
    assert result.score is None
    assert result.not_scorable is not None
    assert result.not_scorable["step"] == "analyze"
    assert fake_llm.count() == 1


def test_empty_context_list_is_rejected() -> None:
    """context=[] is a configuration error that names the alternative."""
    with pytest.raises(ScorerConfigError, match="leave it None"):
        faithfulness(OPENAI, context=[])
