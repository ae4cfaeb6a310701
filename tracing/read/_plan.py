"""The one planner of runs over span records: which spans of a trace are scored, and which
records each run's reading needs. The exporter, backfill and ``trace_to_run`` all choose runs
here (the worker reads the one it is sent)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tracing._formats import SpanKind, classify
from tracing._run import SpanRecord

__all__ = ["has_parent_cycle", "plan_runs"]


def has_parent_cycle(records: Sequence[SpanRecord]) -> bool:
    """Whether some spans' parent ids never lead up to a root (a corrupt trace: reading it is a
    ``parent_cycle`` error). O(n)."""
    return _has_parent_cycle({r.span_id: r.parent_span_id for r in records})


def _has_parent_cycle(parent_of: dict[str, str | None]) -> bool:
    """Whether some span ids never lead up to a root (so they sit in or under a cycle). O(n)."""
    children: dict[str, list[str]] = {}
    stack: list[str] = []
    for span_id, parent in parent_of.items():
        if parent is None or parent not in parent_of:
            stack.append(span_id)
        else:
            children.setdefault(parent, []).append(span_id)
    reached = 0
    while stack:
        reached += 1
        stack.extend(children.get(stack.pop(), ()))
    return reached != len(parent_of)


def plan_runs(
    records: Sequence[SpanRecord],
    *,
    kinds: Sequence[SpanKind] | None = None,
    exclude_under: Collection[str] = (),
) -> list[tuple[SpanRecord, list[SpanRecord]]]:
    """The trace's runs, each as (target span, the records its transform reads), in start order.

    Targets are chosen as ``trace_to_run`` chooses them (top-level agent spans, else top-level
    LLM spans) from names and kind attributes only (``kinds``, when the caller classified the
    spans already); a target at or under a span id in ``exclude_under`` is left out (the loop
    guard). A run reads its target and the target's descendants: ancestors and unrelated spans
    are not shipped.
    """
    if kinds is None:
        kinds = [classify(r.name, r.attributes) for r in records]
    if not exclude_under and kinds.count("agent") == 1:
        # The common case, cheaply: one agent span, and it is the trace's only (local) root.
        root = records[kinds.index("agent")]
        ids = {r.span_id for r in records}
        if [r for r in records if r.parent_span_id not in ids] == [root]:
            return [(root, records if isinstance(records, list) else list(records))]
    kind_of = {r.span_id: k for r, k in zip(records, kinds, strict=True)}
    parent_of = {r.span_id: r.parent_span_id for r in records}
    if _has_parent_cycle(parent_of):
        # Walking up from a span in a cycle never reaches a root: no top-level span can be told
        # apart. Ship the whole trace as one run so the worker reads it and records its
        # TraceReadError (parent_cycle) where it can be seen, instead of dropping it here.
        first = next((r for r, k in zip(records, kinds, strict=True) if k in ("agent", "llm")), None)
        return [] if first is None else [(first, list(records))]

    # One walk down from the local roots, carrying whether an agent (or, with no agents in
    # the trace, an LLM span) is above, whether an excluded span is, and the run above: linear
    # whatever the depth (walking up from every span was quadratic on a deep chain).
    want = "agent" if "agent" in kind_of.values() else "llm"
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for span_id, parent in parent_of.items():
        if parent is None or parent not in parent_of:
            roots.append(span_id)
        else:
            children.setdefault(parent, []).append(span_id)
    owner_of: dict[str, str | None] = {}
    stack: list[tuple[str, bool, bool, str | None]] = [(r, False, False, None) for r in roots]
    while stack:
        span_id, blocked, excluded, owner = stack.pop()
        kind = kind_of[span_id]
        excluded = excluded or span_id in exclude_under
        if kind == want and not blocked and not excluded:
            owner = span_id
        owner_of[span_id] = owner
        below = blocked or kind == want
        stack.extend((child, below, excluded, owner) for child in children.get(span_id, ()))
    targets = [r for r in records if owner_of.get(r.span_id) == r.span_id]
    if not targets:
        return []
    if len(targets) == 1 and roots == [targets[0].span_id]:  # the common case: one run owns the whole trace
        return [(targets[0], list(records))]
    groups: dict[str, list[SpanRecord]] = {t.span_id: [] for t in targets}
    for r in records:
        owner = owner_of.get(r.span_id)
        if owner is not None:
            groups[owner].append(r)
    targets.sort(key=lambda t: (t.start_time_ns or 0, t.span_id))
    return [(t, groups[t.span_id]) for t in targets]
