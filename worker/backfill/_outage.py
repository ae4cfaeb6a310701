"""Riding out Redis being away under a Redis backfill job: a restart, a failover.

The workers' clients reconnect for ``RECONNECT_S`` before they give up (``worker/_reconnect.py``);
the backfill's own calls (the queue's depth it reads before each publish, the publish, the job's
saves and reads, the workers' counters it follows) get the same budget here, each call counted
from the start of its first try that failed, so a job outlives what its workers outlive and, on a
Redis that takes connections and answers nothing, gives up no later than they do. It says when it
starts waiting and when Redis answers again (a job that paused without a word looked hung), and gives up, the
error raised as it was, once the budget is spent or a stop is asked (Ctrl-C, SIGTERM: the stop
must not wait for Redis).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

from worker._errors import caused_by
from worker._reconnect import RECONNECT_S

__all__ = ["RideOut"]

T = TypeVar("T")

# The first pause, doubled up to the cap: the workers' backoff (worker/_reconnect.py).
_FIRST_PAUSE_S = 0.1
_PAUSE_CAP_S = 1.0
# How often a pause looks at a stop asked: the stop is prompt.
_STOP_LOOK_S = 0.1

# What Redis being away raises, however kombu wraps it: the connection refused, reset or timed
# out, a restarted Redis still loading its data (``BusyLoadingError``, a ConnectionError), and a
# primary a failover demoted, refusing writes until the client follows the new one (as the
# workers' clients wait it out: worker/_reconnect.py).
_LOST = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    ConnectionError,
    TimeoutError,
)


def _lost_connection(exc: BaseException) -> BaseException | None:
    """The error in ``exc`` that says Redis is away, if any. A refused password is not one: no
    wait fixes it."""
    if caused_by(exc, redis.exceptions.AuthenticationError) is not None:
        return None
    return caused_by(exc, _LOST)


class RideOut:
    """Calls ``call()`` again while Redis is away, for up to ``budget_s`` from its first failure.
    ``should_stop()`` ends a wait (the error raised); ``on_away(text)`` is told when a wait
    starts and when it ends (never Redis's text: it may name the address)."""

    def __init__(
        self,
        budget_s: float = RECONNECT_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.budget_s = budget_s
        self.should_stop: Callable[[], bool] = lambda: False
        self.on_away: Callable[[str], None] = lambda text: None
        self._clock = clock
        self._sleep = sleep

    def __call__(self, what: str, call: Callable[[], T]) -> T:
        """``call()``; ``what`` says what it does ("reading the queue's length"), for the line."""
        away_since: float | None = None
        pause = _FIRST_PAUSE_S
        while True:
            tried_at = self._clock()
            try:
                result = call()
            except Exception as exc:
                lost = _lost_connection(exc)
                if lost is None or self.should_stop():
                    raise
                now = self._clock()
                if away_since is None:
                    # From the try's start: on a Redis that answers nothing a try takes its socket
                    # timeout (10 s), and counted from its end the wait reached 35 s (a worker's
                    # store call gives up at 25).
                    away_since = tried_at
                    away = (
                        "Redis refuses writes (ReadOnlyError: a read-only replica, a failover under way?)"
                        if isinstance(lost, redis.exceptions.ReadOnlyError)
                        else f"lost the connection to Redis ({type(lost).__name__})"
                    )
                    self.on_away(
                        f"{away} while {what}: waiting up to {self.budget_s:.0f} s for it to come back"
                        " (Ctrl-C stops the job, resumable)"
                    )
                left = away_since + self.budget_s - now
                if left <= 0:
                    self.on_away(f"Redis did not come back within {self.budget_s:.0f} s")
                    raise
                self._pause(min(pause, left))
                if self.should_stop():
                    # Not one call more: on a frozen Redis it waited out a socket timeout, and a
                    # publish sent a batch after the stop was asked.
                    raise
                pause = min(pause * 2, _PAUSE_CAP_S)
                continue
            if away_since is not None:
                self.on_away(f"Redis answers again after {self._clock() - away_since:.1f} s: going on")
            return result

    def _pause(self, seconds: float) -> None:
        end = self._clock() + seconds
        while (left := end - self._clock()) > 0 and not self.should_stop():
            self._sleep(min(left, _STOP_LOOK_S))
