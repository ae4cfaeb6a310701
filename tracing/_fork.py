"""What an object of ours does in a process forked from the one that built it."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

import structlog

__all__ = ["after_fork_in_child"]

# Bound methods to call in a forked child, held weakly: registering must not keep an exporter or
# a publisher alive, and one hook serves them all (os.register_at_fork cannot unregister, so a
# hook per object would pile up in a process that builds many).
_methods: list[weakref.WeakMethod[Callable[[], None]]] = []
_lock = threading.Lock()
_hooked = False


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Call the bound ``method`` in every child forked from this process, while its object lives."""
    global _hooked
    with _lock:
        if len(_methods) >= 64 and len(_methods) & (len(_methods) - 1) == 0:  # at powers of two: amortised
            _methods[:] = [ref for ref in _methods if ref() is not None]
        _methods.append(weakref.WeakMethod(method))
        if not _hooked:
            os.register_at_fork(after_in_child=_in_child)
            _hooked = True


def _in_child() -> None:
    global _lock
    # The parent's lock may have been held by another thread at the fork: the child's is new.
    _lock = threading.Lock()
    for ref in list(_methods):
        method = ref()
        if method is None:
            continue
        try:
            method()
        except Exception as exc:  # one object's reset must not keep the others' from theirs
            structlog.get_logger("tracescore.fork").error(
                "after_fork_reset_failed", target=type(getattr(method, "__self__", method)).__name__, error=repr(exc)
            )
