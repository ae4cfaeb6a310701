"""The loop guard over span records: tracescore's own traffic is never scored.

- a span carrying ``tracescore.role = "judge"`` (the worker wraps every judge call in one)
  excludes what is under it; when it is a trace's root, the whole trace;
- a span whose instrumentation scope or ``service.name`` starts with ``tracescore`` (the
  worker's own tracers) excludes its whole trace.
"""

from __future__ import annotations

from collections.abc import Iterable

from tracing._markers import JUDGE_ROLE, OWN_PREFIX, ROLE_ATTRIBUTE
from tracing._run import SpanRecord

__all__ = ["OWN_TRACE", "loop_guard"]

# ``loop_guard``'s answer for a trace that is tracescore's own: nothing in it is scored.
OWN_TRACE: frozenset[str] | None = None


def loop_guard(records: Iterable[SpanRecord]) -> frozenset[str] | None:
    """``None`` when the trace is tracescore's own (skip it whole), else the judge span ids
    whose subtrees are left out (``plan_runs(exclude_under=...)``)."""
    judges: list[str] = []
    for record in records:
        scope, service = record.scope_name, record.service_name
        if (scope is not None and scope.startswith(OWN_PREFIX)) or (
            service is not None and service.startswith(OWN_PREFIX)
        ):
            return OWN_TRACE
        if record.attributes.get(ROLE_ATTRIBUTE) == JUDGE_ROLE:
            if record.parent_span_id is None:
                return OWN_TRACE
            judges.append(record.span_id)
    return frozenset(judges)
