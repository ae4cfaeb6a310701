"""Judge scorers for the budget and call-cap tests (the worker's env points OPENAI_BASE_URL at
tests/fakellm; ``openai/fake-judge`` is priced by the test through TRACESCORE_PRICES)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

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


# A neighbour that crashes its batch once another run's judge has failed (tests/worker/test_budget.py).
CRASHED_ONCE_KEY = "tstest:crashed_once"


async def _crash_after_failed_calls(run: Any) -> float:
    """SIGKILLs its process once the judge calls counted in Redis (every run's, all versions)
    reach TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN: a batch that crashes after its neighbour paid.
    Only the first time (CRASHED_ONCE_KEY); later deliveries score 1."""
    import asyncio
    import os
    import signal
    import time

    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(os.environ["TRACESCORE_REDIS_URL"], decode_responses=True)
    try:
        if await client.exists(CRASHED_ONCE_KEY):
            return 1.0
        want = int(os.environ["TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            failed = 0
            async for key in client.scan_iter(match="tracescore:judge_calls:*"):
                counts = await client.hgetall(key)
                failed += sum(int(v) for f, v in counts.items() if not f.endswith(":error"))
            if failed >= want:
                break
            await asyncio.sleep(0.05)
        else:
            return 0.0  # never reached: the test sees no split
        if await client.set(CRASHED_ONCE_KEY, "1", nx=True):
            os.kill(os.getpid(), signal.SIGKILL)
        return 1.0
    finally:
        await client.aclose()


crash_after_failed_calls = create_scorer("crash_after_failed_calls", type="agent").generate_score(
    _crash_after_failed_calls
)

# A judge scorer no budget names (tests/worker/test_budget_retry.py: the refused run's neighbour).
plain = create_scorer(
    "plain", type="agent", judge=Judge(model="openai/fake-judge", instructions="You grade answers.")
).generate_score(
    PromptStep(
        description="one judge call", create_prompt=lambda run: f"PLAIN this answer from 0 to 1: {_text(run.output)}"
    )
)


class _Claims(BaseModel):
    claims: list[str]


# The first of two judge steps, both scorers' below.
_list_claims = PromptStep(
    description="list the claims",
    output_schema=_Claims,
    create_prompt=lambda run: f"CLAIMS of this answer: {_text(run.output)}",
)

# Two judge steps (tests/worker/test_budget_backfill.py: a retry resumes after the answered one).
two_steps = (
    create_scorer("two-steps", type="agent", judge=Judge(model="openai/fake-judge", instructions="You grade answers."))
    .preprocess(_list_claims)
    .generate_score(
        PromptStep(description="grade them", create_prompt=lambda run, results: "GRADE the claims from 0 to 1")
    )
)

# A judge per step, the second model without a price in tests/worker/_budget.PRICES
# (tests/worker/test_budget_job_spend.py: spend per model called, not per run's models).
two_models = (
    create_scorer("two-models", type="agent", judge=Judge(model="openai/fake-judge", instructions="You grade answers."))
    .preprocess(_list_claims)
    .generate_score(
        PromptStep(
            description="grade them",
            judge=Judge(model="openai/fake-judge-2", instructions="You grade claims."),
            create_prompt=lambda run, results: "GRADE the claims from 0 to 1",
        )
    )
)
