"""Span records → runs: which runs a trace holds (the one planner) and which traffic is
tracescore's own (the one loop guard), for the exporter, backfill and the worker alike.

``loop_guard(records)`` says whether a trace is tracescore's own and which judge spans'
subtrees are excluded; the exporter's buffer applies the same rules span by span
(``own_origin``, ``is_judge``, ``takes_trace``). ``plan_runs(records, exclude_under=...)``
gives each run as its target span and the records its reading needs; ``plan_part`` plans a
trace read in parts (a backfill's late spans), each part's runs those no part before held.
"""

from tracing.read._guard import is_judge, loop_guard, own_origin, takes_trace
from tracing.read._plan import PartPlan, Run, has_parent_cycle, plan_part, plan_runs

__all__ = [
    "PartPlan",
    "Run",
    "has_parent_cycle",
    "is_judge",
    "loop_guard",
    "own_origin",
    "plan_part",
    "plan_runs",
    "takes_trace",
]
