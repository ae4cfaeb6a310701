"""Scorers for the dashboard integration tests (``--scorers tests.integration.phoenix_scorers``).

One of each kind a sink must show: a code scorer, an LLM-judged scorer (the judge is the fake
LLM server: ``OPENAI_BASE_URL`` points at ``tests/fakellm``), a run declared not scorable and a
scorer that fails.
"""

from __future__ import annotations

from scorers import Judge, PromptStep, ScorerRun, create_scorer, not_scorable
from scorers.agent import get_assistant_message

FAILURE_MESSAGE = "answer index out of range"


def _length(run: ScorerRun) -> float:
    return min(1.0, len(get_assistant_message(run.output) or "") / 200)


answer_length = (
    create_scorer("answer-length", type="agent", score_range=(0, 1))
    .generate_score(_length)
    .generate_reason(lambda run: f"{len(get_assistant_message(run.output) or '')} characters")
)

judged_helpfulness = (
    create_scorer(
        "judged-helpfulness",
        type="agent",
        judge=Judge(model="openai/fake-judge", instructions="You grade a support agent's answers."),
    )
    .generate_score(PromptStep(description="rate", create_prompt=lambda run: "Rate this answer from 0 to 1."))
    .generate_reason(lambda score: f"the judge rated it {score:.2f}")
)


def _never(run: ScorerRun) -> float:
    raise not_scorable("no ground truth to compare with")


needs_ground_truth = create_scorer("needs-ground-truth", type="agent").generate_score(_never)


def _fail(run: ScorerRun) -> float:
    raise IndexError(FAILURE_MESSAGE)


always_fails = create_scorer("always-fails", type="agent").generate_score(_fail)

SCORERS = [answer_length, judged_helpfulness, needs_ground_truth, always_fails]
# Their ids, as the tests expect them on every scored run.
SCORER_IDS = ("answer-length", "judged-helpfulness", "needs-ground-truth", "always-fails")
