"""Scorers for the graceful-shutdown and probe tests (``--scorers tests.worker.shutdown_scorers``).

``paced`` sleeps (awaiting: the loop stays free) ``TSTEST_PACE_S`` × the number of words in the
run's answer, and appends ``start``/``done`` lines with the run id and pid to
``TSTEST_CALLS_FILE``: the test counts invocations that finished, not only stored scores.
``blocker`` blocks the event loop in a C call (``time.sleep``) that the watchdog cannot interrupt.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from scorers import create_scorer
from tests.worker.sample_scorers import length


def _log(kind: str, run_id: str) -> None:
    path = os.environ["TSTEST_CALLS_FILE"]
    # One short O_APPEND write per line: lines from several processes never interleave.
    with open(path, "a", encoding="utf-8") as calls:
        calls.write(f"{kind} {run_id} {os.getpid()}\n")


async def _paced(run: Any) -> float:
    words = sum(len(m.text.split()) for m in run.output or [])
    _log("start", run.run_id)
    await asyncio.sleep(float(os.environ.get("TSTEST_PACE_S", "0.3")) * words)
    _log("done", run.run_id)
    return float(words)


paced = create_scorer("paced", type="agent").generate_score(_paced)


def _blocker(run: Any) -> float:
    _log("start", run.run_id)
    time.sleep(float(os.environ.get("TSTEST_BLOCK_S", "3600")))
    return 1.0


blocker = create_scorer("blocker", type="agent").generate_score(_blocker)

SCORERS = [paced, blocker, length]
