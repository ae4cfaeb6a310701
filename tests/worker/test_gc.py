"""Cyclic-GC settings of a worker's processes: the main process (the consumer, whose guard decodes
every message body) is tuned once the worker is ready, as each child is when its runtime starts."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from celery import signals

import worker._app  # noqa: F401  # connects the app's signal handlers
from worker._gc import GC_THRESHOLD


@pytest.fixture
def default_gc() -> Iterator[None]:
    """The interpreter's defaults for the test, whatever earlier tests left; restored after."""
    previous = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)


@pytest.mark.usefixtures("default_gc")
def test_the_main_process_collects_rarely_and_skips_its_start_up_heap_once_the_worker_is_ready() -> None:
    # sender=None: the other worker_ready handler (the drainers) has no app to start.
    signals.worker_ready.send(sender=None)
    assert gc.get_threshold() == GC_THRESHOLD
    assert gc.get_freeze_count() > 0
