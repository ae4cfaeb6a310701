"""Function-only scorers for the backfill tests (stable, whatever examples/scorers.py becomes)."""

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


def _refuse_unsure(run: ScorerRun) -> float:
    if "not sure" in _answer(run):
        raise ValueError("the answer admits it is not sure")
    return 1.0


answer_words: Scorer = (
    create_scorer("answer-words", type="agent", description="Answer length in words, capped at 1 for 20+.")
    .generate_score(lambda run: min(1.0, len(_answer(run).split()) / 20))
    .generate_reason(lambda run, score: f"{len(_answer(run).split())} words")
)
mentions_city: Scorer = (
    create_scorer("mentions-city", type="agent", description="1 when the answer names the asked-about city.")
    .generate_score(_mentions_city)
    .generate_reason(lambda score: "names the city" if score else "does not name the city")
)
confident: Scorer = create_scorer("confident", type="agent").generate_score(_refuse_unsure)

SCORERS = [answer_words, mentions_city, confident]
