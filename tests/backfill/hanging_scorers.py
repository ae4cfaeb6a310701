"""Scorers that misbehave on one marked run, for tests/backfill/test_embedded_timeouts.py.

A run whose user message contains ``$TRAP_MARKER`` (default ``TRAP``) makes ``trap`` (sync
steps) or ``trap-async`` (async steps) do what ``$TRAP_MODE`` says: ``spin`` (a pure-Python
loop that never returns), ``sleep`` (a C call that never returns: cannot be interrupted),
``nap`` (a C call that returns after ``$TRAP_NAP_S`` seconds, past the run timeout),
``hog`` (allocates until the memory limit), ``stuck`` (awaits something that never happens);
``trap-async`` with ``late-sleep`` awaits a second (the other runs are recorded meanwhile), then
makes the never-ending C call; with ``late-nap``, a C call that returns after ``$TRAP_NAP_S``
seconds (its loop was replaced meanwhile), then scores 1.0.
Every other run scores 1.0; ``words`` scores every run normally; ``costly`` and ``plain`` are the
judge scorers of tests/worker/budget_scorers.py (a spent budget refuses one before any call).
"""

from __future__ import annotations

import asyncio
import os
import time

from scorers import Scorer, create_scorer
from scorers._run import ScorerRun
from scorers.agent import get_assistant_message, get_user_message
from tests.worker.budget_scorers import costly, plain


def _marked(run: ScorerRun) -> bool:
    return os.environ.get("TRAP_MARKER", "TRAP") in (get_user_message(run.input) or "")


def _trap(run: ScorerRun) -> float:
    if not _marked(run):
        return 1.0
    mode = os.environ.get("TRAP_MODE", "spin")
    if mode == "sleep":
        time.sleep(10**6)
    elif mode == "nap":
        time.sleep(float(os.environ.get("TRAP_NAP_S", "4")))
    elif mode == "hog":
        chunks = []
        while True:
            chunks.append(bytearray(64 * 1024 * 1024))
    else:
        n = 0
        while True:
            n += 1
    return 0.0


async def _trap_async(run: ScorerRun) -> float:
    if _marked(run):
        if os.environ.get("TRAP_MODE") == "late-sleep":  # once the batch's other runs are recorded
            await asyncio.sleep(1)
            time.sleep(10**6)  # noqa: ASYNC251  (the point: a C call blocking the loop)
        if os.environ.get("TRAP_MODE") == "late-nap":
            await asyncio.sleep(1)
            time.sleep(float(os.environ.get("TRAP_NAP_S", "8")))  # noqa: ASYNC251  (likewise)
            return 1.0
        await asyncio.Event().wait()
    return 1.0


trap: Scorer = create_scorer("trap", type="agent").generate_score(_trap)
trap_async: Scorer = create_scorer("trap-async", type="agent").generate_score(_trap_async)
words: Scorer = create_scorer("words", type="agent").generate_score(
    lambda run: min(1.0, len((get_assistant_message(run.output) or "").split()) / 10)
)

SCORERS = [trap, trap_async, words, costly, plain]
