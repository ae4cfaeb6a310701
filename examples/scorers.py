"""Example scorer registry: `tracescore ... --scorers examples.scorers` loads SCORERS.

Function-only scorers, so the README's run command needs no API key.
"""

from __future__ import annotations

import re

from scorers import Scorer, StepResults, create_scorer, not_scorable
from scorers._run import ScorerRun
from scorers.agent import extract_tool_calls, get_assistant_message, get_user_message

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


def _tool_errors(run: ScorerRun) -> list[str]:
    calls = extract_tool_calls(run.output).tool_call_infos
    return [c.tool_name for c in calls if isinstance(c.result, dict) and "error" in c.result]


tool_health: Scorer = (
    create_scorer(
        "tool-health",
        description="1 when every tool call returned a result without an error, 0 otherwise.",
        type="agent",
        score_range=(0, 1),
    )
    .preprocess(lambda run: _tool_errors(run))
    .generate_score(lambda results: 0.0 if results.preprocess_step_result else 1.0)
    .generate_reason(
        lambda results: (
            f"tool errors in: {', '.join(results.preprocess_step_result)}"
            if results.preprocess_step_result
            else "no tool errors"
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

SCORERS = [question_overlap, tool_health, conciseness]

__all__ = ["SCORERS"]
