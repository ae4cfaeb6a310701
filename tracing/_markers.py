"""The loop guard's markers: what tracescore puts on its own spans so that they are never scored.

- ``tracescore.role = "judge"`` (``ROLE_ATTRIBUTE``, ``JUDGE_ROLE``) on the span the worker
  wraps every judge call in;
- instrumentation scope names and ``service.name`` starting with ``tracescore`` (``OWN_PREFIX``:
  e.g. ``tracescore.score_writer`` in service ``tracescore-worker``).

The rules that read them are ``tracing.read._guard``'s.
"""

from __future__ import annotations

__all__ = ["JUDGE_ROLE", "OWN_PREFIX", "ROLE_ATTRIBUTE"]

ROLE_ATTRIBUTE = "tracescore.role"
JUDGE_ROLE = "judge"
OWN_PREFIX = "tracescore"
