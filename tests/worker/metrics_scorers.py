"""Scorers for the metrics tests (``--scorers tests.worker.metrics_scorers``): one per outcome
the metrics count — scored, failed, not scorable, and a judge that retries a 429."""

from __future__ import annotations

import asyncio
from typing import Any

from scorers import Judge, PromptStep, create_scorer, not_scorable
from scorers.judge import StreamErrorRetryProcessor


def _text(output: Any) -> str:
    return " ".join(m.text for m in output or [])


async def _fast(run: Any) -> float:
    # Long enough that one child cannot take every message before the other asks for one.
    await asyncio.sleep(0.15)
    return min(1.0, len(_text(run.output)) / 100)


fast = create_scorer("fast", type="agent").generate_score(_fast)


def _broken(run: Any) -> float:
    raise ValueError("this scorer always fails")


broken = create_scorer("broken", type="agent").generate_score(_broken)

declines = create_scorer("declines", type="agent").generate_score(lambda run: not_scorable("nothing to grade"))

# Retries what the provider calls retryable (a 429 included), never a 401.
_JUDGE = Judge(
    model="openai/fake-judge",
    instructions="You grade an assistant's answers.",
    error_processors=[StreamErrorRetryProcessor(max_retries=2)],
    max_processor_retries=2,
)

judged = create_scorer("judged", type="agent", judge=_JUDGE).generate_score(
    PromptStep(description="one judge call", create_prompt=lambda run: f"SCORE this answer: {_text(run.output)}")
)


def _wedges(run: Any) -> float:
    """Stuck in a C call nothing can interrupt: the watchdog records a timeout and the process exits."""
    import time

    time.sleep(10**6)
    return 0.0


wedges = create_scorer("wedges", type="agent").generate_score(_wedges)


def _flaky(run: Any) -> float:
    """A connection error the first time any process runs it (a flag in the test's Redis), then
    a score: transient, so the run is left for the message's retry."""
    import os

    import redis

    client = redis.Redis.from_url(os.environ["TRACESCORE_REDIS_URL"])
    try:
        if client.set("tsmetrics:flaky:failed", 1, nx=True):
            raise ConnectionError("the scorer's own backend dropped the connection (test)")
    finally:
        client.close()
    return 0.5


flaky = create_scorer("flaky", type="agent").generate_score(_flaky)
