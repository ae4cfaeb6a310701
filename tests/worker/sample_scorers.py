"""Scorers the worker tests load by module name (``--scorers tests.worker.sample_scorers``).

Side effects the tests observe go to Redis (db from TRACESCORE_REDIS_URL) under ``tstest:``:
- ``tstest:calls:<scorer>:<step>`` counts step executions,
- ``tstest:fail:<scorer>:<step>`` set → that step raises once (the flag is consumed),
- ``tstest:judge_calls`` sorted set of judge-call timestamps (the rate-limit test).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

from scorers import Judge, PromptStep, create_scorer
from scorers.judge import get_judge_hooks

_clients: dict[int, Any] = {}


def _redis() -> Any:
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        url = os.environ.get("TRACESCORE_REDIS_URL") or os.environ["TRACESCORE_BROKER_URL"]
        client = _clients[id(loop)] = aioredis.Redis.from_url(url, decode_responses=True)
    return client


def _text(output: Any) -> str:
    return " ".join(m.text for m in output or [])


async def _counted(scorer: str, step: str) -> None:
    client = _redis()
    await client.incr(f"tstest:calls:{scorer}:{step}")
    if await client.delete(f"tstest:fail:{scorer}:{step}"):
        raise RuntimeError(f"{scorer}.{step} failed on purpose (test flag)")


def _length(output: Any) -> float:
    return min(1.0, len(_text(output)) / 100)


# Function-only, no Redis: the fast path.
length = create_scorer("length", type="agent").generate_score(lambda run: _length(run.output))


async def _slow_score(run: Any) -> float:
    await asyncio.sleep(float(os.environ.get("TSTEST_SLOW_S", "0.3")))
    await _counted("slow", "generate_score")
    return _length(run.output)


slow = create_scorer("slow", type="agent").generate_score(_slow_score)


async def _pre(run: Any) -> dict[str, Any]:
    await _counted("steps", "preprocess")
    return {"chars": len(_text(run.output))}


async def _score(results: Any) -> float:
    await _counted("steps", "generate_score")
    return min(1.0, results.preprocess_step_result["chars"] / 100)


async def _reason(score: float) -> str:
    await _counted("steps", "generate_reason")
    return f"score {score:.2f}"


steps = (
    create_scorer("steps", type="agent", label=lambda s: "long" if s >= 0.5 else "short")
    .preprocess(_pre)
    .generate_score(_score)
    .generate_reason(_reason)
)


async def _limited(run: Any) -> float:
    """A stand-in judge call: takes a slot from the installed limiter, records the time."""
    limiter = get_judge_hooks().limiter
    assert limiter is not None, "the worker installs its rate limiter at start"
    async with limiter.slot("fake/judge", 100):
        await _redis().zadd("tstest:judge_calls", {uuid.uuid4().hex: time.time()})
        await asyncio.sleep(0.01)
    return 1.0


limited = create_scorer("limited", type="agent").generate_score(_limited)


async def _flaky_once(run: Any) -> float:
    """Times out on its first call for each run (a judge's passing outage), then scores 1."""
    if await _redis().incr(f"tstest:flaky_once:{run.run_id}") == 1:
        raise TimeoutError("a passing outage (test)")
    return 1.0


flaky_once = create_scorer("flaky_once", type="agent").generate_score(_flaky_once)


async def _broken(run: Any) -> float:
    raise ValueError("this scorer always fails")


broken = create_scorer("broken", type="agent").generate_score(_broken)


# --- LLM-judge scorers (the worker's env points OPENAI_BASE_URL at tests/fakellm) ---------

_JUDGE = Judge(model="openai/fake-judge", instructions="You grade an assistant's answers.")

judged = create_scorer("judged", type="agent", judge=_JUDGE).generate_score(
    PromptStep(
        description="one judge call",
        create_prompt=lambda run: f"SCORE this answer from 0 to 1: {_text(run.output)}",
    )
)

judged_steps = (
    create_scorer("judged_steps", type="agent", judge=_JUDGE)
    .preprocess(
        PromptStep(
            description="topic",
            create_prompt=lambda run: f"PRE: name the topic of: {_text(run.output)}",
            output_schema={"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]},
        )
    )
    .generate_score(
        PromptStep(description="score", create_prompt=lambda run, results: f"SCORE: rate {_text(run.output)}")
    )
    .generate_reason(PromptStep(description="reason", create_prompt=lambda score: f"REASON: explain {score}"))
)


def _crash(run: Any) -> float:
    """Kills the process scoring it (a stand-in for an OOM kill or a segfault)."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0


crash = create_scorer("crash", type="agent").generate_score(_crash)


# --- Runs that hit the worker's limits (tests/worker/test_timeouts.py) ----------------------


def _spin(run: Any) -> float:
    """A sync step that never returns and never awaits: it blocks the event loop (pure Python,
    so the loop watchdog's exception can reach it)."""
    n = 0
    while True:
        n += 1


spin = create_scorer("spin", type="agent").generate_score(_spin)


def _sleep_forever(run: Any) -> float:
    """A sync step stuck in a C call that never returns: nothing can interrupt it in-process."""
    time.sleep(10**6)
    return 0.0


sleep_forever = create_scorer("sleep_forever", type="agent").generate_score(_sleep_forever)


async def _stuck(run: Any) -> float:
    """An async step that never returns (awaits something that never happens)."""
    await asyncio.Event().wait()
    return 0.0


stuck = create_scorer("stuck", type="agent").generate_score(_stuck)


def _hog(run: Any) -> float:
    """Allocates until the process's memory limit stops it."""
    chunks = []
    while True:
        chunks.append(bytearray(64 * 1024 * 1024))


hog = create_scorer("hog", type="agent").generate_score(_hog)


# --- A run that kills any process scoring it (tests/worker/test_poison.py) -------------------

POISON_MARKER = "POISON-RUN-7f3a"


def _poison(run: Any) -> float:
    """SIGKILLs its own process for a run whose output holds ``POISON_MARKER`` (a stand-in for
    a segfault or an OOM kill caused by one run); scores every other run like ``length``."""
    if POISON_MARKER in _text(run.output):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return _length(run.output)


poison = create_scorer("poison", type="agent").generate_score(_poison)


def _exits(run: Any) -> float:
    """Calls ``sys.exit`` for a run whose output holds ``POISON_MARKER`` (a library's command-line
    error path does); scores every other run like ``length``."""
    if POISON_MARKER in _text(run.output):
        sys.exit(2)
    return _length(run.output)


exits = create_scorer("exits", type="agent").generate_score(_exits)
