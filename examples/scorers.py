"""Example scorer registry: `tracescore ... --scorers examples.scorers` loads SCORERS.

Two hand-written scorers (how to write your own) plus code-based built-ins, so the README's
run command needs no API key. Set TRACESCORE_JUDGE_MODEL (e.g. "openai/gpt-4o-mini", with
OPENAI_API_KEY) to add the LLM-judge built-ins.
"""

from __future__ import annotations

import os
import re

from scorers import Scorer, ScorerRun, StepResults, create_scorer, not_scorable
from scorers.agent import get_assistant_message, get_user_message
from scorers.builtin import (
    answer_relevancy,
    checks,
    completeness,
    faithfulness,
    hallucination,
    prompt_alignment,
    tone_consistency,
)

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "do",
        "does",
        "i",
        "you",
        "my",
        "me",
        "to",
        "of",
        "in",
        "on",
        "for",
        "what",
        "how",
        "when",
        "will",
        "it",
        "be",
        "at",
    ]
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def _answer(run: ScorerRun) -> str | object:
    answer = get_assistant_message(run.output) or ""
    return answer if answer.strip() else not_scorable("the agent gave no text answer")


question_overlap: Scorer = (
    create_scorer(
        "question-overlap",
        description="Share of the question's content words that the answer mentions.",
        type="agent",
        score_range=(0, 1),
    )
    .preprocess(lambda run: {"question": sorted(_words(get_user_message(run.input) or ""))})
    .analyze(
        lambda run, results: sorted(
            set(results.preprocess_step_result["question"]) & _words(get_assistant_message(run.output) or "")
        )
    )
    .generate_score(
        lambda results: len(results.analyze_step_result) / max(1, len(results.preprocess_step_result["question"]))
    )
    .generate_reason(
        lambda results, score: (
            f"answer mentions {', '.join(results.analyze_step_result) or 'none'} "
            f"of {len(results.preprocess_step_result['question'])} question words"
        )
    )
)


def _conciseness(results: StepResults) -> float:
    words: int = results.analyze_step_result
    return 1.0 if words <= 40 else max(0.0, 1 - (words - 40) / 160)


conciseness: Scorer = (
    create_scorer(
        "conciseness",
        description="1 for answers of at most 40 words, falling linearly to 0 at 200 words.",
        type="agent",
        score_range=(0, 1),
    )
    .preprocess(lambda run: _answer(run))
    .analyze(lambda results: len(str(results.preprocess_step_result).split()))
    .generate_score(_conciseness)
    .generate_reason(lambda results, score: f"{results.analyze_step_result} words")
)

SCORERS: list[Scorer] = [
    question_overlap,
    conciseness,
    completeness(),
    tone_consistency(),
    checks.all_of(
        checks.matches(r"\S", id="has-answer"),
        checks.excludes("as an AI", id="no-ai-disclaimer"),
        checks.no_tool_errors(),
        checks.max_tool_calls(5),
        id="answer-guard",
    ),
]
if model := os.environ.get("TRACESCORE_JUDGE_MODEL"):
    SCORERS += [answer_relevancy(model), faithfulness(model), hallucination(model), prompt_alignment(model)]

__all__ = ["SCORERS"]
