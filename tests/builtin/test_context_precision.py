"""Tests for the context_precision LLM scorer."""

import pytest

from scorers import ScorerConfigError
from scorers.builtin import context_precision
from scorers.builtin._context_precision import mean_average_precision
from tests.builtin._judge import OPENAI, fenced_blocks, score
from tests.builtin._runs import agent_output, call
from tests.fakellm import FakeLLMServer, Reply

RAG = agent_output(
    call("search", "Doc A: Oslo is Norway's capital.", call_id="1"),
    call("search", "Doc B: Bergen has rain.", call_id="2"),
    call("search", "Doc C: Oslo has 700k people.", call_id="3"),
    text="Oslo is the capital of Norway and has about 700k people.",
)


def verdict(index: int, relevant: bool) -> dict[str, object]:
    return {"context_index": index, "verdict": "yes" if relevant else "no", "reason": "r"}


def test_mean_average_precision_by_hand() -> None:
    """[yes, no, yes] → (1/1 + 2/3) / 2 = 0.8333; nothing relevant → 0."""
    assert mean_average_precision([True, False, True]) == pytest.approx((1 + 2 / 3) / 2)
    assert mean_average_precision([False, True]) == pytest.approx(0.5)
    assert mean_average_precision([False, False]) == 0.0


def test_context_precision_from_tool_results(fake_llm: FakeLLMServer) -> None:
    """Verdicts arrive out of order and are ranked by index: [yes, no, yes] → 0.83."""
    fake_llm.script(
        Reply.json({"verdicts": [verdict(3, True), verdict(1, True), verdict(2, False)]}),
        Reply.text("Useful pieces mostly first."),
    )
    result = score(context_precision(OPENAI), input="Tell me about Oslo", output=RAG)
    assert result.score == pytest.approx(0.83)
    blocks = fenced_blocks(fake_llm.requests[0].last_user_text)
    assert blocks["context 2"] == "search: Doc B: Bergen has rain."
    assert "exactly 3 verdicts" in fake_llm.requests[0].last_user_text


def test_context_precision_needs_context(fake_llm: FakeLLMServer) -> None:
    """No tool results and no option: not scorable, no judge call; [] is a config error."""
    result = score(context_precision(OPENAI), input="q", output="plain answer")
    assert result.not_scorable is not None
    assert fake_llm.count() == 0
    with pytest.raises(ScorerConfigError, match="empty list"):
        context_precision(OPENAI, context=[])
