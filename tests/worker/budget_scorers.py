"""Judge scorers for the budget and call-cap tests (the worker's env points OPENAI_BASE_URL at
tests/fakellm; ``openai/fake-judge`` is priced by the test through TRACESCORE_PRICES)."""

from __future__ import annotations

from typing import Any

from scorers import Judge, PromptStep, create_scorer
from scorers.agent import get_assistant_message
from scorers.judge import StreamErrorRetryProcessor


def _text(output: Any) -> str:
    return get_assistant_message(output) or ""


costly = create_scorer(
    "costly", type="agent", judge=Judge(model="openai/fake-judge", instructions="You grade answers.")
).generate_score(
    PromptStep(
        description="one judge call", create_prompt=lambda run: f"SCORE this answer from 0 to 1: {_text(run.output)}"
    )
)

# Four attempts per delivery (the first and three retries), as the 503 example.
retrying = create_scorer(
    "retrying",
    type="agent",
    judge=Judge(
        model="openai/fake-judge",
        instructions="You grade answers.",
        error_processors=[StreamErrorRetryProcessor(max_retries=3)],
        max_processor_retries=3,
    ),
).generate_score(
    PromptStep(
        description="one judge call", create_prompt=lambda run: f"RETRY this answer from 0 to 1: {_text(run.output)}"
    )
)
