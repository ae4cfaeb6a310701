"""Ctrl-C and SIGTERM in the commands that work through many items (``backfill``, ``score``): the
first asks the command to stop at its next safe point, the second stops it at once."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

__all__ = ["StopSignal", "stop_on_signals"]


class StopSignal:
    """Whether a stop was asked (call it). The first signal only asks, so no Redis or broker
    call is cut in half (between input records, batches or chunks); a second one raises
    ``KeyboardInterrupt`` where the command is, except inside ``deferred`` (a third one does)
    and after ``finishing`` (the next but one does). Each stop at once is followed by finishing:
    the next signal asks, the one after quits without the summary. Run the work with ``run``: it
    catches that ``KeyboardInterrupt`` wherever it lands, up to the point where signals stop
    raising."""

    def __init__(self, unit: str) -> None:
        self.requested = False
        self._unit = unit
        self._again = False  # a signal came that did not raise
        self._interruptible = True
        self._finishing = False

    def __call__(self) -> bool:
        return self.requested

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self._finishing:  # (the work is over: a signal now only hurries the summing up)
            if self._again:
                raise KeyboardInterrupt
            self._again = True
            sys.stderr.write("\nfinishing up (press Ctrl-C again to quit at once, without the summary)\n")
            return
        if self.requested:
            if self._interruptible or self._again:  # (a third signal always: an escape hatch)
                self._stop_now()
            self._again = True
            sys.stderr.write("\nstopping once what is in hand is written (press Ctrl-C again to quit at once)\n")
            return
        self.requested = True
        sys.stderr.write(f"\nstopping after the current {self._unit} (press Ctrl-C again to stop at once)\n")

    def ask(self, why: str) -> None:
        """Ask the stop a first signal asks, for ``why`` (stdout's reader gone: ``| head``)."""
        if not self.requested:
            self.requested = True
            sys.stderr.write(f"\nstopping after the current {self._unit}: {why}\n")

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A second signal waits for the block's end (records written whole), then raises."""
        was, self._interruptible = self._interruptible, False
        try:
            yield
        finally:
            self._interruptible = was
        if was and self._again:
            self._stop_now()

    def _stop_now(self) -> NoReturn:
        # The work is over once this lands: what follows (closing, the summary) is finishing,
        # even where the KeyboardInterrupt reaches before ``finishing`` is called.
        self._finishing, self._again = True, False
        raise KeyboardInterrupt

    def run(self, work: Callable[[], object]) -> bool:
        """Run ``work``, then ``finishing``; True if a signal stopped it. A stop that lands as the
        work ends (the first line of ``finishing`` is a place a signal's handler runs) is caught
        here too: in the caller's ``try/finally`` it escaped the ``except`` and took the summary
        with it."""
        try:
            try:
                work()
            finally:
                self.finishing()
        except KeyboardInterrupt:
            return True
        return False

    def finishing(self) -> None:
        """The command is closing, summing up and leaving: a signal now raises only when one came
        before without raising."""
        self._finishing = True
        self._interruptible = False


@contextmanager
def stop_on_signals(unit: str) -> Iterator[StopSignal]:
    """SIGINT and SIGTERM handled by a ``StopSignal`` (``unit``: what the command finishes
    first, e.g. "batch") while the block runs."""
    stop = StopSignal(unit)
    try:
        previous = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals stay as they are
        yield stop
        return
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
