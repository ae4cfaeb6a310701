"""Scorers slow enough that a job is still scoring when a test interrupts it
(tests/backfill/test_interrupt.py): ``slow`` awaits 20 ms a run (as a judge call
waits), ``block`` holds the event loop for 2 ms a run (a sync step)."""

from __future__ import annotations

import asyncio
import time

from scorers import Scorer, create_scorer


async def _slow() -> float:
    await asyncio.sleep(0.02)
    return 1.0


def _block() -> float:
    time.sleep(0.002)
    return 0.5


slow: Scorer = create_scorer("slow").generate_score(lambda: _slow())
block: Scorer = create_scorer("block").generate_score(lambda: _block())

SCORERS = [slow, block]
