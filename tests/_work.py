"""Work counted, not timed: complexity guards that cannot flake with the machine's speed.

``counted_lines`` counts the Python lines our packages (scorers/, tracing/, worker/) execute in a
block: the same code on the same input executes the same lines, however busy the machine. A walk
up from every span, or a mark per repeat, shows as lines a span; work inside a C call (a regex,
``bytes.find``) does not, so those guards count what the C call is given instead (``Spy``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
R = TypeVar("R")
_OURS = tuple(str(_ROOT / package) + "/" for package in ("scorers", "tracing", "worker"))


class _OverBudget(BaseException):
    """Raised inside the counted code once it passes its budget: a BaseException, so that no
    ``except Exception`` of the code under test absorbs it, and a quadratic regression fails in
    seconds instead of running for minutes under the tracer."""


@dataclass
class Lines:
    """The lines counted so far in a ``counted_lines`` block."""

    budget: int
    count: int = 0


@contextmanager
def counted_lines(budget: int = 50_000_000) -> Iterator[Lines]:
    """Count the lines of scorers/, tracing/ and worker/ the block executes (on this thread: what
    it runs on others is not counted); past ``budget`` the block is stopped and the test fails
    naming the budget."""
    lines = Lines(budget)

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line":
            lines.count += 1
            if lines.count > lines.budget:
                raise _OverBudget
        return local

    def call(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        # Other code (pydantic, the standard library) runs untraced: only our frames cost.
        return local if frame.f_code.co_filename.startswith(_OURS) else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        yield lines
    except _OverBudget:
        raise AssertionError(f"over the budget of {budget:,} lines: superlinear work") from None
    finally:
        sys.settrace(previous)


def lines_of(run: Callable[[], object], budget: int = 50_000_000) -> int:
    """The lines of our packages ``run()`` executes (see ``counted_lines``)."""
    with counted_lines(budget) as lines:
        run()
    return lines.count


def assert_linear(make: Callable[[int], T], run: Callable[[T], R], n: int, per_item: int = 200) -> R:
    """``run(make(n))`` executes about twice the lines ``run(make(n // 2))`` does (at most 2.25
    times: a walk from every item to the end does four), each within ``per_item`` lines an item
    (a quadratic regression stops there, in seconds). Both inputs are made before counting.
    Returns what ``run`` answered for ``n``."""
    half_input, whole_input = make(n // 2), make(n)
    half = lines_of(lambda: run(half_input), budget=per_item * (n // 2))
    answers: list[R] = []
    whole = lines_of(lambda: answers.append(run(whole_input)), budget=per_item * n)
    assert whole <= 2.25 * half, f"{whole:,} lines for {n:,} items, {half:,} for {n // 2:,}: not linear"
    return answers[0]


@dataclass
class Spy:
    """A stand-in for a compiled pattern that records each method call's name and how much text
    it was given (from its start offset on), then calls the real one."""

    real: Any
    calls: list[tuple[str, int]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.real, name)
        if not callable(method):
            return method

        def called(*args: Any, **kwargs: Any) -> Any:
            # The text is the longest argument (``sub(" ", text)``), from its start offset on.
            text = max((a for a in args if isinstance(a, str | bytes)), key=len, default=b"")
            start = next((a for a in args if isinstance(a, int)), 0)
            self.calls.append((name, len(text) - start))
            return method(*args, **kwargs)

        return called
