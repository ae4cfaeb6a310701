"""A soft time limit that reaches a prefork child outside a task is late: ignored.

The pool's time-limit timers run on the main process's event loop, which Celery's consumer holds
while it reconnects to a lost broker; the limit of a task that ended during the outage then
reaches a child that is idle or still writing that task's result. billiard's handler raised there:
the child died, and one cut mid-write left a corrupt message the main process exited on
(UnpicklingError)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from billiard.pool import soft_timeout_sighandler
from celery.exceptions import SoftTimeLimitExceeded

from worker import _task


@pytest.fixture
def billiards_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)  # what a prefork child has
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.usefixtures("billiards_handler")
def test_a_soft_limit_outside_a_task_is_ignored_and_one_inside_raises() -> None:
    _task._guard_soft_limit()
    assert signal.getsignal(signal.SIGUSR1) is _task._soft_limit_if_running
    os.kill(os.getpid(), signal.SIGUSR1)  # late: no task runs
    with _task._running(), pytest.raises(SoftTimeLimitExceeded):
        os.kill(os.getpid(), signal.SIGUSR1)  # (the handler runs before the next bytecode)
    assert not _task._task_running


def test_another_sigusr1_handler_is_left_alone() -> None:
    """The solo pool's process is the main one: its SIGUSR1 is Celery's, not billiard's."""

    def celerys(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGUSR1, celerys)
    try:
        _task._guard_soft_limit()
        assert signal.getsignal(signal.SIGUSR1) is celerys
    finally:
        signal.signal(signal.SIGUSR1, previous)
