"""Fixtures for judge tests: recorded (not real) retry sleeps, and installed hooks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks


@pytest.fixture
def sleeps() -> Iterator[list[float]]:
    """Retry waits are recorded here (seconds) instead of slept."""
    recorded: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        recorded.append(seconds)

    previous = get_judge_hooks()
    set_judge_hooks(JudgeHooks(limiter=previous.limiter, call_context=previous.call_context, sleep=fake_sleep))
    try:
        yield recorded
    finally:
        set_judge_hooks(previous)
