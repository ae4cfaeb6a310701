"""tests.backfill.scorers' answer-words at version 2 (same logic): a job whose workers still run
version 1 (tests/backfill/test_redis.py)."""

from __future__ import annotations

from scorers import Scorer, create_scorer
from tests.backfill.scorers import _answer

answer_words: Scorer = create_scorer(
    "answer-words", type="agent", description="Answer length in words, capped at 1 for 20+.", version="2"
).generate_score(lambda run: min(1.0, len(_answer(run).split()) / 20))

SCORERS = [answer_words]
