"""The ``tracescore`` command line: thin click commands over the worker's functions.

One module per command (``_worker``, ``_status``, ``_scores``, ``_dlq``, ``_sinks``, ``_score``,
``_compare``, ``_backfill``, ``_probe``); ``_common`` holds what they share: the
one-line error contract, the exit codes, and the options that mean the same everywhere
(``--broker``, ``--json``). Errors print one clear line (``--verbose`` adds the traceback)
and exit non-zero.

``main`` is the console script (``tracescore = "worker.cli:main"``) and ``cli`` the click group.
They load on first use, so ``worker.backfill`` (which the backfill command imports) may import
``CliError``, the expected failure printed as one line, ``cli_settings``, ``unreachable`` (the
line for a Redis it could not use) and ``names_an_input`` (an ``--out`` that is an input file)
without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.cli._common import CliError, cli_settings, names_an_input, unreachable

if TYPE_CHECKING:
    from worker.cli._main import cli, main

__all__ = ["CliError", "cli", "cli_settings", "main", "names_an_input", "unreachable"]


def __getattr__(name: str) -> Any:
    if name in ("cli", "main"):
        from worker.cli import _main

        return getattr(_main, name)
    raise AttributeError(f"module 'worker.cli' has no attribute {name!r}")
