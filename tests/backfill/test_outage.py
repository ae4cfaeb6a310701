"""``RideOut``: the backfill's wait for a Redis that is away (worker/backfill/_outage.py)."""

from __future__ import annotations

import pytest
import redis

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
