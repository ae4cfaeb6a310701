"""``RideOut``: the backfill's wait for a Redis that is away (worker/backfill/_outage.py)."""

from __future__ import annotations

import pytest
import redis

from tests.tracing._exporting import FakeClock
from worker.backfill._outage import RideOut


def test_a_stop_asked_during_the_wait_gives_up_without_calling_again() -> None:
    """Ctrl-C or SIGTERM during a pause: the job stops with the error it had, at once. The call
    was made once more after the pause, which on a frozen Redis waited out a 10 s socket timeout,
    and for a publish sent a batch after the stop was asked."""
    calls: list[int] = []
    stop = False
    ride_out = RideOut(budget_s=30)

    def away() -> None:
        calls.append(1)
        raise redis.exceptions.ConnectionError("Connection refused")

    def said(_: str) -> None:
        nonlocal stop
        stop = True  # asked as the wait begins

    ride_out.should_stop = lambda: stop
    ride_out.on_away = said
    with pytest.raises(redis.exceptions.ConnectionError):
        ride_out("publishing a batch", away)
    assert len(calls) == 1


def test_a_primary_demoted_by_a_failover_is_waited_for() -> None:
    """A failover leaves the job's connection on the old primary, now a replica: its writes are
    refused read-only until the client follows the new one. The workers wait that out; the job
    gave up at once (exit 1)."""
    demoted = redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
    answers: list[Exception | None] = [demoted, None]
    said: list[str] = []
    ride_out = RideOut(budget_s=30)
    ride_out.on_away = said.append

    def call() -> str:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return "saved"

    assert ride_out("saving the job's state", call) == "saved"
    assert len(said) == 2  # waiting, then answering again
    assert said[0].startswith("Redis refuses writes (ReadOnlyError: a read-only replica"), said  # (not "lost")


def _clock() -> FakeClock:
    """Time of the test's own from 0: a pause moves it on at once, as does a try."""
    clock = FakeClock()
    clock.now = 0.0
    return clock


def test_a_redis_that_answers_nothing_is_given_up_on_when_the_workers_give_up() -> None:
    """Each try on a Redis that takes connections and never answers takes the client's socket
    timeout (10 s). The budget was counted from the first try's end, so a call ended after
    three tries, about 35 s, where a worker's store call ends at 15 + 10 s; it is counted from
    that try's start."""
    from worker._reconnect import COMMAND_SLACK_S, RECONNECT_S

    clock, tries = _clock(), []

    def frozen() -> None:
        tries.append(clock.now)
        clock.advance(COMMAND_SLACK_S)
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    ride_out = RideOut(budget_s=RECONNECT_S, clock=clock, sleep=clock.advance)
    with pytest.raises(redis.exceptions.TimeoutError):
        ride_out("reading the queue's length", frozen)
    assert clock.now <= RECONNECT_S + COMMAND_SLACK_S, (clock.now, tries)
    assert len(tries) == 2, tries  # the second try starts within the budget: a Redis back by then is used


def test_a_restart_is_ridden_out_for_the_whole_budget() -> None:
    """A Redis that refuses connections (a restart) fails each try at once: tries go on for the
    whole budget from the first one, then the error is raised as it was."""
    clock, tries = _clock(), []

    def refused() -> None:
        tries.append(clock.now)
        raise redis.exceptions.ConnectionError("Connection refused")

    ride_out = RideOut(budget_s=15, clock=clock, sleep=clock.advance)
    with pytest.raises(redis.exceptions.ConnectionError):
        ride_out("publishing a batch", refused)
    assert 14 <= tries[-1] <= 15 <= clock.now, (clock.now, tries)
