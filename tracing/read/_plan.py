"""The one planner of runs over span records: which spans of a trace are scored, and which
records each run's reading needs. The exporter, backfill and ``trace_to_run`` all choose runs
here (the worker reads the one it is sent)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

from tracing._formats import SpanKind, classify
from tracing._run import SpanRecord

__all__ = ["PartPlan", "has_parent_cycle", "plan_part", "plan_runs"]


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


Run = tuple[SpanRecord, list[SpanRecord]]

# What a later part of a trace needs of the parts read before it (``plan_part``), as one short
# string (kept by the thousands, and in Redis): "A" when they held an agent span, then the span
# ids a later span may hang under and still be top-level (spans no run held, and the parents
# their top-level spans named but were not read), then those parents alone (a later span with
# one of these ids has spans read before under it), each list comma-separated, "|" between.
# Past this many ids the parts are not summed up (None): a later part is then no run. (Most
# traces keep none: an agent root holds every span.)
MAX_OPEN_IDS = 16


def plan_runs(
    records: Sequence[SpanRecord],
    *,
    kinds: Sequence[SpanKind] | None = None,
    exclude_under: Collection[str] = (),
) -> list[Run]:
    """The trace's runs, each as (target span, the records its transform reads), in start order.

    Targets are chosen as ``trace_to_run`` chooses them (top-level agent spans, else top-level
    LLM spans) from names and kind attributes only (``kinds``, when the caller classified the
    spans already); a target at or under a span id in ``exclude_under`` is left out (the loop
    guard). A run reads its target and the target's descendants: ancestors and unrelated spans
    are not shipped.
    """
    return _plan(records, kinds, exclude_under, None)[0]


class PartPlan(NamedTuple):
    """``plan_part``'s answer: the part's runs, those of its runs it cannot score (spans read
    before are under them: split by the window, lost), and what a later part needs (``before``)."""

    runs: list[Run]
    split: list[Run]
    after: str | None


def plan_part(records: Sequence[SpanRecord], before: str | None, *, exclude_under: Collection[str] = ()) -> PartPlan:
    """The runs of one part of a trace read in parts, and what a later part needs of it and the
    parts before (to pass as its ``before``; None when a later part can hold no run: nothing
    no run held was read, or too many such spans to keep).

    ``before`` None: the first part, planned as ``plan_runs`` plans it. Else a later part (its
    spans came after the parts before were read): a run of it is one a read of the whole trace
    would make that no part before held. Its target hangs under a span no run of the parts
    before held (or under no span read), it is an agent span or the trace has none, and no span
    read before is under it (its run is whole). Spans under a run of a part before belong to
    that run, which was read without them: they are no run.
    """
    if before is not None and has_parent_cycle(records):  # (no top-level span to tell apart)
        return PartPlan([], [], None)
    kinds = [classify(r.name, r.attributes) for r in records]
    plans, owner_of = _plan(records, kinds, exclude_under, before)
    agent, open_ids, below = _unpack(before)
    held = {r.span_id for r in records}
    # The parents the part's top-level spans name and it does not hold (of its claimed ones,
    # spans read before: nothing new).
    named = {
        r.parent_span_id
        for r in records
        if r.parent_span_id is not None
        and r.parent_span_id not in held
        and (owner_of is None or owner_of[r.span_id] is not _CLAIMED)
    }
    free = set() if owner_of is None else {span_id for span_id, owner in owner_of.items() if owner == _FREE}
    # (A parent already open was read before, or named before: not new below.)
    after_open, after_below = open_ids | free | named, (below - held) | (named - open_ids)
    whole, split = plans, list[Run]()
    if below:
        # A run of a later part is whole only if no span read before is under it.
        whole = []
        for plan in plans:
            (split if below.intersection(m.span_id for m in plan[1]) else whole).append(plan)
    if not after_open or len(after_open) + len(after_below) > MAX_OPEN_IDS:
        return PartPlan(whole, split, None)
    agent = agent or "agent" in kinds
    after = "|".join(("A" if agent else "", ",".join(sorted(after_open)), ",".join(sorted(after_below))))
    return PartPlan(whole, split, after)


def _unpack(before: str | None) -> tuple[bool, frozenset[str], frozenset[str]]:
    if before is None:
        return False, frozenset(), frozenset()
    agent, open_ids, below = before.split("|")
    return agent == "A", frozenset(filter(None, open_ids.split(","))), frozenset(filter(None, below.split(",")))


# A span's owner in the walk: the run holding it (its target's id), or neither of these.
_FREE = ""  # no run holds it: a later span under it may be a run
_CLAIMED = None  # excluded by the loop guard, or under a run of a part read before


def _plan(
    records: Sequence[SpanRecord],
    kinds: Sequence[SpanKind] | None,
    exclude_under: Collection[str],
    before: str | None,
) -> tuple[list[Run], dict[str, str | None] | None]:
    """The runs, and each span's owner (None: the common case, one run owning the trace)."""
    if kinds is None:
        kinds = [classify(r.name, r.attributes) for r in records]
    if before is None and not exclude_under and kinds.count("agent") == 1:
        # The common case, cheaply: one agent span, and it is the trace's only (local) root.
        root = records[kinds.index("agent")]
        ids = {r.span_id for r in records}
        if [r for r in records if r.parent_span_id not in ids] == [root]:
            return [(root, records if isinstance(records, list) else list(records))], None
    kind_of = {r.span_id: k for r, k in zip(records, kinds, strict=True)}
    parent_of = {r.span_id: r.parent_span_id for r in records}
    if _has_parent_cycle(parent_of):
        # Walking up from a span in a cycle never reaches a root: no top-level span can be told
        # apart. Ship the whole trace as one run so the worker reads it and records its
        # TraceReadError (parent_cycle) where it can be seen, instead of dropping it here.
        first = next((r for r, k in zip(records, kinds, strict=True) if k in ("agent", "llm")), None)
        return ([] if first is None else [(first, list(records))]), None

    # One walk down from the local roots, carrying whether an agent (or, with no agents in
    # the trace, an LLM span) is above, whether an excluded span is, and the run above: linear
    # whatever the depth (walking up from every span was quadratic on a deep chain).
    agent_before, open_ids, _ = _unpack(before)
    want = "agent" if agent_before or "agent" in kind_of.values() else "llm"
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for span_id, parent in parent_of.items():
        if parent is None or parent not in parent_of:
            roots.append(span_id)
        else:
            children.setdefault(parent, []).append(span_id)
    owner_of: dict[str, str | None] = {}
    # A local root of a later part hanging under a span read before that a run held is claimed
    # by that run (blocked, no run of its own).
    stack: list[tuple[str, bool, bool, str | None]] = []
    for root_id in roots:
        parent = parent_of[root_id]
        top = before is None or parent is None or parent in open_ids
        stack.append((root_id, not top, False, _FREE if top else _CLAIMED))
    while stack:
        span_id, blocked, excluded, owner = stack.pop()
        kind = kind_of[span_id]
        excluded = excluded or span_id in exclude_under
        if kind == want and not blocked and not excluded:
            owner = span_id
        owner_of[span_id] = _CLAIMED if excluded and owner == _FREE else owner
        below = blocked or kind == want
        stack.extend((child, below, excluded, owner) for child in children.get(span_id, ()))
    targets = [r for r in records if owner_of.get(r.span_id) == r.span_id]
    if not targets:
        return [], owner_of
    if len(targets) == 1 and roots == [targets[0].span_id]:  # the common case: one run owns the whole trace
        return [(targets[0], list(records))], owner_of
    groups: dict[str, list[SpanRecord]] = {t.span_id: [] for t in targets}
    for r in records:
        owner = owner_of.get(r.span_id)
        if owner:
            groups[owner].append(r)
    targets.sort(key=lambda t: (t.start_time_ns or 0, t.span_id))
    return [(t, groups[t.span_id]) for t in targets], owner_of
