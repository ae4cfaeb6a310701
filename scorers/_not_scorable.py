"""``not_scorable``: the signal a step uses to say "this run cannot be scored"."""

from __future__ import annotations

__all__ = ["NO_REASON", "NotScorable", "not_scorable"]

# What the result records when a step gives no reason (Mastra's reason is optional too); a
# fixed string keeps ``not_scorable["reason"]`` a str for everything that reads it.
NO_REASON = "no reason given"


class NotScorable(Exception):
    """Returned (or raised) by a step to stop the run without an error."""

    def __init__(self, reason: str = NO_REASON) -> None:
        super().__init__(reason)
        self.reason = reason


def not_scorable(reason: str | None = None) -> NotScorable:
    """Build the signal; a step returns it (or raises it) to end the run early.

    The result then has ``score=None`` and ``not_scorable={"step": ..., "reason": ...}``. The
    reason is optional, as in Mastra; without one (or with an empty one) it reads
    ``"no reason given"``.
    """
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"not_scorable(reason) takes a string or nothing, got {type(reason).__name__}")
    return NotScorable(reason or NO_REASON)
