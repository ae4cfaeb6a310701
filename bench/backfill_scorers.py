"""Function-only scorers for bench/backfill.py (workers load them with --scorers bench.backfill_scorers)."""

from __future__ import annotations

from scorers import Scorer, create_scorer
from scorers._run import ScorerRun
from scorers.agent import get_assistant_message, get_user_message


def _answer(run: ScorerRun) -> str:
    return get_assistant_message(run.output) or ""


def _mentions_city(run: ScorerRun) -> float:
    question = get_user_message(run.input) or ""
    city = question.rstrip("?").split(" in ")[-1].split()[0] if " in " in question else ""
    return 1.0 if city and city in _answer(run) else 0.0


answer_words: Scorer = (
    create_scorer("answer-words", type="agent")
    .generate_score(lambda run: min(1.0, len(_answer(run).split()) / 20))
    .generate_reason(lambda run, score: f"{len(_answer(run).split())} words")
)
mentions_city: Scorer = create_scorer("mentions-city", type="agent").generate_score(_mentions_city)

SCORERS = [answer_words, mentions_city]
