"""Which runs get scored, by which scorers: rules, and the trace-id sample every service shares."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tracing._run import TracedRun

__all__ = ["ScoringRule", "sampled"]

_SCALE = float(1 << 64)


def sampled(trace_id: str, rate: float) -> bool:
    """Whether a trace is in a ``rate`` sample: ``sha256(trace_id)`` as a number in [0, 1).

    ``trace_id`` is the 32-digit lowercase hex id; the first 8 bytes of its SHA-256, big-endian,
    divided by 2**64, are compared with ``rate``. Every service computing this agrees, so a
    trace is scored everywhere or nowhere.
    """
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    # UTF-8 is ASCII for a hex id; any other string (a malformed id read from a file) is
    # still sampled deterministically instead of raising in the middle of a backfill.
    digest = hashlib.sha256(trace_id.lower().encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE < rate


@dataclass(frozen=True, slots=True)
class ScoringRule:
    """Score runs with ``scorers`` (ids in the worker's registry).

    ``sample_rate`` keeps that fraction of traces (deterministic on the trace id); ``filter``
    (a function of the ``TracedRun``) keeps the runs it returns True for; ``delay_s`` holds
    the run back that long before it is sent (e.g. to let user feedback arrive first).

    A ``filter`` costs CPU in the application: it needs the run, so the exporter reads every
    trace the rule samples in the application's process (JSON parsing, validation), where
    without one the trace's spans travel unread and the worker reads them (4-5× less
    exporter CPU per trace; bench/exporter.py). Prefer ``sample_rate``, or a scorer that
    returns ``not_scorable`` for runs it should not judge.
    """

    scorers: Sequence[str]
    sample_rate: float = 1.0
    filter: Callable[[TracedRun], bool] | None = None
    delay_s: float = 0.0
    _ids: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.scorers, str):
            raise TypeError(f"ScoringRule.scorers must be a list of scorer ids, not the string {self.scorers!r}")
        ids = tuple(self.scorers)
        if not ids or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"ScoringRule.scorers must be a non-empty list of scorer ids, got {self.scorers!r}")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"ScoringRule.sample_rate must be within [0, 1], got {self.sample_rate!r}")
        if self.delay_s < 0:
            raise ValueError(f"ScoringRule.delay_s must be >= 0, got {self.delay_s!r}")
        if self.filter is not None and not callable(self.filter):
            raise TypeError("ScoringRule.filter must be a callable taking a TracedRun, or None")
        object.__setattr__(self, "_ids", ids)

    @property
    def scorer_ids(self) -> tuple[str, ...]:
        return self._ids
