"""What each Ctrl-C / SIGTERM does to a command working through many items (worker/_interrupt.py)."""

from __future__ import annotations

import signal

import pytest

from worker._interrupt import StopSignal


def test_the_first_asks_and_the_second_raises_where_the_command_is() -> None:
    stop = StopSignal("batch")
    stop.handle(signal.SIGINT, None)
    assert stop()
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)


def test_inside_deferred_the_second_waits_for_the_blocks_end() -> None:
    """A chunk's records are written whole: the second signal raises once they are."""
    stop = StopSignal("chunk")
    stop.handle(signal.SIGTERM, None)
    written: list[str] = []

    def write_the_chunk() -> None:
        with stop.deferred():
            stop.handle(signal.SIGINT, None)
            written.append("the rest of the chunk")

    with pytest.raises(KeyboardInterrupt):
        write_the_chunk()
    assert written == ["the rest of the chunk"]


def test_while_finishing_a_signal_raises_only_after_one_that_did_not() -> None:
    """Closing, draining the sinks and printing the summary are not cut by one more signal."""
    stop = StopSignal("batch")
    stop.handle(signal.SIGINT, None)
    stop.finishing()
    stop.handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)


def test_once_a_signal_stopped_the_work_the_next_only_hurries_the_finish() -> None:
    """The stop at once is the work's end: what follows (closing, the summary) is finishing,
    even before ``finishing`` is called, so a third signal only asks and a fourth raises."""
    stop = StopSignal("batch")
    stop.handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)
    stop.handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)


def test_run_catches_a_stop_that_lands_as_the_work_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal's handler runs where Python next checks for one: the first line of ``finishing``
    is such a place. The stop landing there escaped the command's ``except`` (no summary, in 9
    of 15 embedded backfills stopped by two Ctrl-C 0.01 s apart)."""
    stop = StopSignal("batch")
    finishing = stop.finishing

    def lands_first() -> None:
        stop.handle(signal.SIGINT, None)
        finishing()

    monkeypatch.setattr(stop, "finishing", lands_first)
    work_done: list[bool] = []
    stop.handle(signal.SIGINT, None)  # the first: the work ends at its next safe point
    assert stop.run(lambda: work_done.append(True)) is True
    assert work_done == [True]
    stop.handle(signal.SIGINT, None)  # the summing up goes on


def test_run_says_whether_a_signal_stopped_the_work() -> None:
    assert StopSignal("chunk").run(lambda: None) is False
    stop = StopSignal("chunk")

    def stopped_at_once() -> None:
        stop.handle(signal.SIGINT, None)
        stop.handle(signal.SIGINT, None)
        raise AssertionError("the second signal did not stop the work")

    assert stop.run(stopped_at_once) is True

    def fails() -> None:
        raise ValueError("the work's own error")

    with pytest.raises(ValueError):
        StopSignal("chunk").run(fails)
