"""``not_scorable``: the signal a step uses to say "this run cannot be scored"."""

from __future__ import annotations

__all__ = ["NotScorable", "not_scorable"]


class NotScorable(Exception):
    """Returned (or raised) by a step to stop the run without an error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def not_scorable(reason: str) -> NotScorable:
    """Build the signal; a step returns it (or raises it) to end the run early.

    The result then has ``score=None`` and ``not_scorable={"step": ..., "reason": ...}``.
    """
    if not isinstance(reason, str) or not reason:
        raise TypeError("not_scorable(reason) needs a non-empty reason string")
    return NotScorable(reason)
