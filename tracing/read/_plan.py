"""The one planner of runs over span records: which spans of a trace are scored, and which
records each run's reading needs. The exporter, backfill and ``trace_to_run`` all choose runs
here (the worker reads the one it is sent)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from collections.abc import Set as AbstractSet
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
# string (kept by the thousands, and in Redis): flags ("A" when they held an agent span, "R" when
# they held a run), then the open ids: spans read that no run held and whose ancestors were all
# read (up to a root), none an agent or LLM span (a later span under one is top-level, as in a
# whole read); then the ids not read that spans read name as their parent (spans read before
# hang under them), each list comma-separated, "|" between. Past this many ids the parts are not
# summed up (None): a later part is then no run. (Most traces keep none: an agent root holds
# every span.)
MAX_OPEN_IDS = 16


def plan_runs(
    records: Sequence[SpanRecord],
    *,
    kinds: Sequence[SpanKind] | None = None,
    exclude_under: Collection[str] = (),
    span_ids: AbstractSet[str] | None = None,
) -> list[Run]:
    """The trace's runs, each as (target span, the records its transform reads), in start order.

    Targets are chosen as ``trace_to_run`` chooses them (top-level agent spans, else top-level
    LLM spans) from names and kind attributes only (``kinds``, when the caller classified the
    spans already); a target at or under a span id in ``exclude_under`` is left out (the loop
    guard). A run reads its target and the target's descendants: ancestors and unrelated spans
    are not shipped. ``span_ids``: the records' span ids, when the caller has them as a set.
    """
    return _plan(records, kinds, exclude_under, None, span_ids)[0]


class PartPlan(NamedTuple):
    """``plan_part``'s answer: the part's runs, those of its runs it cannot score (spans read
    before are under them: split by the window, lost), what a later part needs (``after``), and
    whether no part before held a run (``first``: the trace's first runs, if any)."""

    runs: list[Run]
    split: list[Run]
    after: str | None
    first: bool = True


def plan_part(records: Sequence[SpanRecord], before: str | None, *, exclude_under: Collection[str] = ()) -> PartPlan:
    """The runs of one part of a trace read in parts, and what a later part needs of it and the
    parts before (to pass as its ``before``; None when a later part can hold no run: nothing
    no run held was read, or too many such spans to keep).

    ``before`` None: the first part, planned as ``plan_runs`` plans it. Else a later part (its
    spans came after the parts before were read): a run of it is one a read of the whole trace
    would make that no part before held. Its target hangs under an open span (read, no run held
    it, and all its ancestors read: none is an agent or LLM span) or under no span, it is an
    agent span or the trace has none, and no span read before is, or may yet turn out to be,
    under it (its run is whole): while a span read before hangs under a span not read, which
    may come under it, no run of a later part is whole. Spans under a run of a part before, or
    under a span not read (an agent sent last, say), are no run.
    """
    agent, any_run, open_ids, below = _unpack(before)
    kinds = [classify(r.name, r.attributes) for r in records]
    plans, free = _plan(records, kinds, exclude_under, before)
    if free is None:  # a parent cycle: no top-level span to tell apart
        return PartPlan(plans, [], None, not any_run)
    parent_of = {r.span_id: r.parent_span_id for r in records}
    if before is None:
        # Every span read hangs under these, not read: a later part may bring them, anywhere.
        dangling = {p for p in parent_of.values() if p is not None and p not in parent_of}
    else:
        # Spans read before hang under the ids of ``below`` this part brings: they now hang
        # under the parent of the span of this part those reach up to, unless it is open.
        tops = {_top_parent(b, parent_of) for b in below if b in parent_of}
        dangling = {p for p in tops if p is not None and p not in open_ids}
    unread = below.difference(parent_of)
    whole, split = list[Run](), list[Run]()
    for plan in plans:
        if below.intersection(m.span_id for m in plan[1]):
            split.append(plan)
        elif before is None or not (unread or dangling):  # (else spans read before may come under it)
            whole.append(plan)
    after_open, after_below = open_ids.difference(parent_of) | free, unread | dangling
    first = not any_run
    if not (after_open or after_below) or len(after_open) + len(after_below) > MAX_OPEN_IDS:
        return PartPlan(whole, split, None, first)
    flags = ("A" if agent or "agent" in kinds else "") + ("R" if any_run or whole else "")
    after = "|".join((flags, ",".join(sorted(after_open)), ",".join(sorted(after_below))))
    return PartPlan(whole, split, after, first)


def _top_parent(span_id: str, parent_of: dict[str, str | None]) -> str | None:
    """The parent of the span of ``parent_of`` that ``span_id``'s ancestors there reach up to
    (None: a root). ``parent_of`` has no cycle."""
    parent = parent_of[span_id]
    while parent is not None and parent in parent_of:
        parent = parent_of[parent]
    return parent


def _unpack(before: str | None) -> tuple[bool, bool, frozenset[str], frozenset[str]]:
    if before is None:
        return False, False, frozenset(), frozenset()
    flags, open_ids, below = before.split("|")
    return (
        "A" in flags,
        "R" in flags,
        frozenset(filter(None, open_ids.split(","))),
        frozenset(filter(None, below.split(","))),
    )


# A span's owner in the walk: the run holding it (its target's id), or neither of these.
_FREE = ""  # no run holds it
_CLAIMED = None  # excluded by the loop guard, or under a run read before or a span not read


def _plan(
    records: Sequence[SpanRecord],
    kinds: Sequence[SpanKind] | None,
    exclude_under: Collection[str],
    before: str | None,
    span_ids: AbstractSet[str] | None = None,
) -> tuple[list[Run], set[str] | None]:
    """The runs, and the spans no run holds whose ancestors were all read (up to a root, or an
    open span of ``before``): a later span under one is top-level. None: a parent cycle.
    ``span_ids``: the records' span ids, when the caller has them as a set."""
    if kinds is None:
        kinds = [classify(r.name, r.attributes) for r in records]
    if before is None and not exclude_under and kinds.count("agent") == 1:
        # The common case, cheaply: one agent span, and it is the trace's only (local) root.
        root = records[kinds.index("agent")]
        ids = {r.span_id for r in records} if span_ids is None else span_ids
        if [r for r in records if r.parent_span_id not in ids] == [root]:
            return [(root, records if isinstance(records, list) else list(records))], set()
    kind_of = {r.span_id: k for r, k in zip(records, kinds, strict=True)}
    parent_of = {r.span_id: r.parent_span_id for r in records}
    if _has_parent_cycle(parent_of):
        if before is not None:  # (a later part: its spans are late, no run to tell apart)
            return [], None
        # Walking up from a span in a cycle never reaches a root: no top-level span can be told
        # apart. Ship the whole trace as one run so the worker reads it and records its
        # TraceReadError (parent_cycle) where it can be seen, instead of dropping it here.
        first = next((r for r, k in zip(records, kinds, strict=True) if k in ("agent", "llm")), None)
        return ([] if first is None else [(first, list(records))]), None

    # One walk down from the local roots, carrying whether an agent (or, with no agents in
    # the trace, an LLM span) is above, whether an excluded span is, the run above, and whether
    # all ancestors were read: linear whatever the depth (walking up from every span was
    # quadratic on a deep chain).
    agent_before, _, open_ids, _ = _unpack(before)
    want = "agent" if agent_before or "agent" in kind_of.values() else "llm"
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for span_id, parent in parent_of.items():
        if parent is None or parent not in parent_of:
            roots.append(span_id)
        else:
            children.setdefault(parent, []).append(span_id)
    owner_of: dict[str, str | None] = {}
    free: set[str] = set()
    # A local root of a first part is top-level, as in ``plan_runs``; of a later part, only
    # under no span or an open one (else under a run read before, or a span not read: claimed).
    stack: list[tuple[str, bool, bool, str | None, bool]] = []
    for root_id in roots:
        parent = parent_of[root_id]
        placed = parent is None or parent in open_ids
        top = before is None or placed
        stack.append((root_id, not top, False, _FREE if top else _CLAIMED, placed))
    while stack:
        span_id, blocked, excluded, owner, placed = stack.pop()
        kind = kind_of[span_id]
        excluded = excluded or span_id in exclude_under
        if kind == want and not blocked and not excluded:
            owner = span_id
        owner = owner_of[span_id] = _CLAIMED if excluded and owner == _FREE else owner
        if placed and owner == _FREE:
            free.add(span_id)
        below = blocked or kind == want
        stack.extend((child, below, excluded, owner, placed) for child in children.get(span_id, ()))
    targets = [r for r in records if owner_of.get(r.span_id) == r.span_id]
    if not targets:
        return [], free
    if len(targets) == 1 and roots == [targets[0].span_id]:  # the common case: one run owns the whole trace
        return [(targets[0], list(records))], free
    groups: dict[str, list[SpanRecord]] = {t.span_id: [] for t in targets}
    for r in records:
        owner = owner_of.get(r.span_id)
        if owner:
            groups[owner].append(r)
    targets.sort(key=lambda t: (t.start_time_ns or 0, t.span_id))
    return [(t, groups[t.span_id]) for t in targets], free
