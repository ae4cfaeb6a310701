"""Tests for the catalogue of built-in scorers."""

from typing import Any

import pytest

from scorers import Scorer
from scorers.builtin import CATALOGUE, catalogue_markdown, checks


def test_entries_match_the_scorers_they_build() -> None:
    """Each code entry's factory builds a scorer with that id, range and direction."""
    samples: dict[str, dict[str, Any]] = {
        "tool-call-accuracy": {"expected_tool": "x"},
        "check-includes": {"expected": "x"},
        "check-excludes": {"unwanted": "x"},
        "check-equals": {"expected": "x"},
        "check-matches": {"pattern": "x"},
        "check-called-tool": {"tool_name": "x"},
        "check-did-not-call": {"tool_name": "x"},
        "check-tool-order": {"expected_order": ["x"]},
        "check-max-tool-calls": {"limit": 1},
    }
    for entry in CATALOGUE.values():
        if entry.kind != "code":
            continue
        if entry.id in ("check-all", "check-any"):
            scorer = entry.factory(checks.includes("x"))
        else:
            scorer = entry.factory(**samples.get(entry.id, {}))
        assert isinstance(scorer, Scorer)
        assert scorer.id == entry.id
        assert scorer.score_range == entry.score_range
        assert scorer.direction == entry.direction
        assert scorer.description


def test_llm_entries_build_with_a_model_and_scale() -> None:
    """Each LLM entry builds with a model; its range follows scale and it has a judge."""
    required: dict[str, dict[str, Any]] = {
        "noise-sensitivity": {"baseline_response": "b", "noisy_query": "q"},
        "tool-call-accuracy-llm": {"available_tools": ["search"]},
    }
    llm = [e for e in CATALOGUE.values() if e.kind == "llm"]
    assert len(llm) == 11
    for entry in llm:
        scorer = entry.factory("openai/gpt-4o-mini", scale=5, **required.get(entry.id, {}))
        assert scorer.id == entry.id
        assert scorer.score_range == (0.0, 5.0)
        assert scorer.direction == entry.direction
        assert scorer.judge is not None
        assert scorer.judge.model == "openai/gpt-4o-mini"
        assert scorer.has_judge_steps


def test_markdown_table_lists_every_entry() -> None:
    """The README table has a header, a rule and one row per entry."""
    table = catalogue_markdown().splitlines()
    assert len(table) == 2 + len(CATALOGUE)
    assert (
        "| `check-tool-order` | `checks.tool_order` | code | 0–1 | higher is better"
        in table[2 + list(CATALOGUE).index("check-tool-order")]
    )


def test_an_infinite_scale_is_refused_naming_the_option() -> None:
    """scale=inf passed the positive check and was refused as a score_range the caller never gave."""
    from scorers import ScorerConfigError
    from scorers.builtin import bias
    from scorers.judge.testing import FakeJudgeModel

    with pytest.raises(ScorerConfigError, match=r"scorer 'bias': scale must be a finite positive number, got inf"):
        bias(FakeJudgeModel(), scale=float("inf"))
