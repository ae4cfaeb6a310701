"""What an object of ours does in a process forked from the one that built it."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

__all__ = ["after_fork_in_child"]


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Call the bound ``method`` in every child forked from this process, while its object lives
    (held weakly: registering must not keep an exporter or a publisher alive for good)."""
    ref = weakref.WeakMethod(method)

    def in_child() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=in_child)
