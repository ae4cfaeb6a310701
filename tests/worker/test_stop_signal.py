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
