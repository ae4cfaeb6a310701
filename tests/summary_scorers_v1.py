"""Scorers for the summary / compare CLI tests: version 1 (see summary_scorers_v2.py).

Runs are plain strings: ``{"run_id": ..., "input": "...", "output": "..."}``.
"""

from __future__ import annotations

from scorers import Scorer, create_scorer, not_scorable


def _length(output: object) -> float | object:
    text = str(output)
    if not text:
        return not_scorable("empty output")
    return min(1.0, len(text) / 10)


length: Scorer = (
    create_scorer("length", description="Output length / 10, capped at 1.", score_range=(0, 1))
    .generate_score(lambda run: _length(run.output))
    .generate_reason(lambda run, score: f"v1: {len(str(run.output))} chars")
)
# Lower is better: its worst runs are its highest scores.
shouting: Scorer = (
    create_scorer("shouting", description="Share of upper-case letters.", score_range=(0, 1), direction="lower")
    .generate_score(lambda run: sum(c.isupper() for c in str(run.output)) / max(1, len(str(run.output))))
    .generate_reason(lambda run: f"shouts {sum(c.isupper() for c in str(run.output))} letters")
)


def _boom(run: object) -> float:
    raise ValueError("this scorer always fails")


broken: Scorer = create_scorer("broken").generate_score(_boom)

SCORERS = [length, shouting, broken]
