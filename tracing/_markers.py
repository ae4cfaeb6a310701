"""The loop guard's markers: spans tracescore itself produced are never scored.

- A span carrying ``tracescore.role = "judge"`` (the worker wraps every judge call in one)
  and everything under it is excluded; when it is a trace's root, the whole trace is.
- A span whose instrumentation scope name or resource ``service.name`` starts with
  ``tracescore`` (the worker's own tracers, e.g. ``tracescore.score_writer`` in service
  ``tracescore-worker``) excludes its whole trace.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["JUDGE_ROLE", "OWN_PREFIX", "ROLE_ATTRIBUTE", "is_judge_span", "is_own_origin", "is_own_span"]

ROLE_ATTRIBUTE = "tracescore.role"
JUDGE_ROLE = "judge"
OWN_PREFIX = "tracescore"


def is_judge_span(span: ReadableSpan) -> bool:
    attrs = span.attributes
    return attrs is not None and attrs.get(ROLE_ATTRIBUTE) == JUDGE_ROLE


def is_own_span(span: ReadableSpan) -> bool:
    return is_own_origin(span.instrumentation_scope, span.resource)


def is_own_origin(scope: InstrumentationScope | None, resource: Resource | None) -> bool:
    """Whether spans of this instrumentation scope and resource are tracescore's own."""
    if scope is not None and scope.name.startswith(OWN_PREFIX):
        return True
    service = resource.attributes.get("service.name") if resource is not None else None
    return isinstance(service, str) and service.startswith(OWN_PREFIX)
