"""``worker._loop``'s grace period on its own: ``run_draining`` lets a coroutine finish within it,
cancels it when it ends (its cleanup runs before the waiter hears ``GraceExpired``) and refuses
new work afterwards. Each case runs in a forked child: a shutdown, once begun, is for the life of
its process, and this pytest process must not be shutting down."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from tests.worker._workers import wait_for
from worker._loop import GraceExpired, begin_shutdown, run_draining, shutting_down, within_cleanup


def _in_child(case: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    results: Any = context.Queue()

    def target() -> None:
        try:
            results.put(case())
        except BaseException as exc:  # reported to the parent, never swallowed
            results.put({"crashed": repr(exc)})

    child = context.Process(target=target)
    child.start()
    try:
        outcome: dict[str, Any] = results.get(timeout=60)
    finally:
        child.join(10)
    assert "crashed" not in outcome, outcome["crashed"]
    return outcome


def _finishes_within_grace() -> dict[str, Any]:
    async def quick() -> str:
        await asyncio.sleep(0.2)
        return "scored"

    begin_shutdown(5.0)
    return {"value": run_draining(quick(), timeout=10), "shutting_down": shutting_down()}


def test_a_run_that_finishes_within_the_grace_period_returns_normally() -> None:
    """Shutdown begun, grace 5 s, a 0.2 s coroutine: its value comes back."""
    assert _in_child(_finishes_within_grace) == {"value": "scored", "shutting_down": True}


def _cut_off() -> dict[str, Any]:
    events: list[str] = []
    waits = 0

    def on_wait() -> None:
        nonlocal waits
        waits += 1

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
            return "scored"
        finally:
            await asyncio.sleep(0.1)  # the claims' release: awaited, not abandoned
            events.append("cleaned up")

    began = time.monotonic()
    assert begin_shutdown(0.5)
    assert not begin_shutdown(0.5)  # a second SIGTERM changes nothing
    try:
        run_draining(slow(), timeout=20, on_wait=on_wait)
    except GraceExpired:
        events.append("grace expired")
    took = time.monotonic() - began

    async def never_started() -> str:
        events.append("started after the grace period")
        return "scored"

    try:
        run_draining(never_started(), timeout=5)
    except GraceExpired:
        events.append("refused")
    return {"events": events, "took": took, "waits": waits}


def test_the_grace_period_cancels_the_run_after_its_cleanup_and_refuses_new_work() -> None:
    """Grace 0.5 s, a 30 s coroutine: GraceExpired about 0.5 s in, after the coroutine's finally
    ran; the waiter's on_wait was called meanwhile; a coroutine handed over afterwards never runs."""
    outcome = _in_child(_cut_off)
    assert outcome["events"] == ["cleaned up", "grace expired", "refused"]
    assert 0.4 <= outcome["took"] < 5.0
    assert outcome["waits"] >= 1


def _no_shutdown() -> dict[str, Any]:
    async def value() -> int:
        await asyncio.sleep(0.05)
        return 7

    async def failing() -> int:
        await asyncio.sleep(0.05)
        raise TimeoutError("the store timed out")  # the coroutine's own error, not the wait's

    result: dict[str, Any] = {"value": run_draining(value(), timeout=5), "shutting_down": shutting_down()}
    try:
        run_draining(failing(), timeout=5)
    except TimeoutError as exc:
        result["error"] = str(exc)
    return result


def test_without_a_shutdown_it_is_run_coro() -> None:
    """No SIGTERM: the value, and the coroutine's own TimeoutError passes through unchanged."""
    assert _in_child(_no_shutdown) == {"value": 7, "shutting_down": False, "error": "the store timed out"}


def _cleanup_time() -> dict[str, Any]:
    before = within_cleanup(2.0)
    begin_shutdown(0.0, cleanup_s=0.3)  # no grace: the cleanup time starts now
    during = within_cleanup(2.0)
    ran_out = wait_for(lambda: within_cleanup(2.0) == 0.0, 5.0)
    return {"before": before, "during": 0.0 < during <= 0.3, "ran_out": ran_out}


def test_a_wait_after_the_grace_ends_by_the_cleanup_deadline() -> None:
    """A wait of its own (2 s) is kept before a shutdown, cut to what is left of the cleanup time
    (0.3 s) once it began, and 0 past the deadline."""
    assert _in_child(_cleanup_time) == {"before": 2.0, "during": True, "ran_out": True}
