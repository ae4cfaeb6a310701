"""Helpers for exporter tests: a clock the test moves, a recording sink, waiting with a deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tracing import ScoreBatch, ScoreRequest, TracedRun, trace_to_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recording:
    """A CallbackSink target that keeps every batch."""

    def __init__(self) -> None:
        self.batches: list[ScoreBatch] = []
        self._lock = threading.Lock()

    def __call__(self, batch: ScoreBatch) -> None:
        with self._lock:
            self.batches.append(batch)

    @property
    def requests(self) -> list[ScoreRequest]:
        with self._lock:
            return [r for b in self.batches for r in b.requests]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until true or the deadline; the assertion is on the condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def read(request: ScoreRequest) -> TracedRun:
    """The run a worker scores for ``request`` of one run: through the JSON message, read from
    its spans (raises ``TraceReadError`` as the worker would see it)."""
    (run,) = read_runs(request)
    return run


def read_runs(request: ScoreRequest) -> list[TracedRun]:
    """The runs a worker scores for ``request``, one per target in order: through the JSON
    message, each read from its own records as the worker reads it."""
    received = ScoreRequest.model_validate_json(request.model_dump_json())
    by_target = received.run_spans()
    return [trace_to_run(by_target[t], t) for t in received.target_span_ids]
