"""Version 2 of summary_scorers_v1.length: half the score for outputs that end without a period."""

from __future__ import annotations

from scorers import Scorer, create_scorer

length: Scorer = (
    create_scorer("length", description="v1, halved without a final period.", score_range=(0, 1), version="2")
    .generate_score(lambda run: min(1.0, len(str(run.output)) / 10) * (1.0 if str(run.output).endswith(".") else 0.5))
    .generate_reason(lambda run, score: f"v2: {len(str(run.output))} chars, period={str(run.output).endswith('.')}")
)

SCORERS = [length]
