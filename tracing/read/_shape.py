"""Whether a trace's span tree can be walked at all."""

from __future__ import annotations

from collections.abc import Sequence

from tracing._records import _has_parent_cycle
from tracing._run import SpanRecord

__all__ = ["has_parent_cycle"]


def has_parent_cycle(records: Sequence[SpanRecord]) -> bool:
    """Whether some spans' parent ids never lead up to a root (a corrupt trace: the worker would
    record it as ``parent_cycle``). O(n)."""
    return _has_parent_cycle({r.span_id: r.parent_span_id for r in records})
