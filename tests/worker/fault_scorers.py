"""``tests.worker.sample_scorers`` plus scorers for the fault-handling tests
(``--scorers tests.worker.fault_scorers``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis

from scorers import create_scorer
from tests.worker.sample_scorers import *  # noqa: F403  (every sample scorer, by the same ids)

BALLAST_MB = 300


async def _ballast(run: Any) -> float:
    """Holds BALLAST_MB of real (touched) memory for a moment, then scores 1: a large but
    legitimate run, far under a 1 GB memory limit."""
    ballast = bytearray(b"x" * (BALLAST_MB * 2**20))
    await asyncio.sleep(0.2)
    return 1.0 if ballast[-1:] == b"x" else 0.0


ballast = create_scorer("ballast", type="agent").generate_score(_ballast)


SPINNING_KEY = "tstest:spinning"


def _spin_flagged(run: Any) -> float:
    """Sets SPINNING_KEY, then blocks the event loop like ``spin`` (pure Python, interruptible):
    a test knows the loop is blocked once the key exists."""
    client = redis.Redis.from_url(os.environ["TRACESCORE_REDIS_URL"])
    client.set(SPINNING_KEY, "1")
    client.close()
    n = 0
    while True:
        n += 1


spin_flagged = create_scorer("spin_flagged", type="agent").generate_score(_spin_flagged)
