"""Quick checks: 0/1 scorers for common assertions, combinable with ``all_of`` / ``any_of``.

from scorers.builtin import checks
guard = checks.all_of(
    checks.called_tool("get_weather"),
    checks.no_tool_errors(),
    checks.excludes("as an AI", id="no-disclaimer"),
    id="weather-guard",
)
"""

from scorers.builtin._checks import (
    all_of,
    any_of,
    called_tool,
    did_not_call,
    equals,
    excludes,
    includes,
    matches,
    max_tool_calls,
    no_tool_errors,
    tool_order,
)

__all__ = [
    "all_of",
    "any_of",
    "called_tool",
    "did_not_call",
    "equals",
    "excludes",
    "includes",
    "matches",
    "max_tool_calls",
    "no_tool_errors",
    "tool_order",
]
