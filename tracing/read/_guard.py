"""The loop guard: tracescore's own traffic is never scored. Its rules, written once:

- a span whose instrumentation scope or ``service.name`` starts with ``tracescore`` (the
  worker's own tracers) takes its whole trace out (``own_origin``);
- a span carrying ``tracescore.role = "judge"`` (``is_judge``; the worker wraps every judge
  call in one) excludes its subtree, or, when it is a root, the whole trace (``takes_trace``).

Two forms apply them: ``loop_guard`` over a whole trace's span records (backfill), and the
exporter's ``TraceBuffer`` span by span as the SDK hands them over (it caches ``own_origin``
per tracer). Both call these functions; they differ only in what a root is: for the exporter,
which sees one process's spans, a span whose parent is remote roots what it has; a stored
trace (backfill) holds every process's spans, so only a span without a parent is its root.
tests/tracing/test_loop_guard_forms.py checks the two verdicts over a table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tracing._markers import JUDGE_ROLE, OWN_PREFIX, ROLE_ATTRIBUTE
from tracing._run import SpanRecord

__all__ = ["OWN_TRACE", "is_judge", "loop_guard", "own_origin", "takes_trace"]

# ``loop_guard``'s answer for a trace that is tracescore's own: nothing in it is scored.
OWN_TRACE: frozenset[str] | None = None


def own_origin(scope_name: str | None, service_name: str | None) -> bool:
    """Whether spans of this instrumentation scope and ``service.name`` are tracescore's own."""
    return (scope_name is not None and scope_name.startswith(OWN_PREFIX)) or (
        service_name is not None and service_name.startswith(OWN_PREFIX)
    )


def is_judge(attributes: Mapping[str, object]) -> bool:
    """Whether a span with these attributes is a judge call's (what is under it is not scored)."""
    return attributes.get(ROLE_ATTRIBUTE) == JUDGE_ROLE


def takes_trace(own: bool, judge: bool, local_root: bool) -> bool:
    """Whether one span takes its whole trace out; a judge span that does not excludes only
    its subtree."""
    return own or (judge and local_root)


def loop_guard(records: Iterable[SpanRecord]) -> frozenset[str] | None:
    """``None`` when the trace is tracescore's own (skip it whole), else the judge span ids
    whose subtrees are left out (``plan_runs(exclude_under=...)``)."""
    judges: list[str] = []
    for record in records:
        judge = is_judge(record.attributes)
        # The trace's own root only: these records are the whole stored trace, all processes'
        # spans, so a parent id not among them is a span that was lost or sampled out, not
        # another process's (the exporter's local root; see the module docstring).
        if takes_trace(own_origin(record.scope_name, record.service_name), judge, record.parent_span_id is None):
            return OWN_TRACE
        if judge:
            judges.append(record.span_id)
    return frozenset(judges)
