"""Tests for the catalogue of built-in scorers."""

from typing import Any

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


def test_markdown_table_lists_every_entry() -> None:
    """The README table has a header, a rule and one row per entry."""
    table = catalogue_markdown().splitlines()
    assert len(table) == 2 + len(CATALOGUE)
    assert (
        "| `check-tool-order` | `checks.tool_order` | code | 0–1 | higher is better"
        in table[2 + list(CATALOGUE).index("check-tool-order")]
    )
