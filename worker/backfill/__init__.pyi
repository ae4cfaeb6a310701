"""The names ``worker.backfill`` exports, for type checkers; ``__init__.py`` loads each from the
module named here on first use."""

from ._driver import Backfill, Submitter
from ._job import EXIT_WAIT_TIMEOUT, BackfillJob, WaitTimeoutError, load_scorers, print_summary
from ._state import BackfillOptions, BackfillState, new_job_id
from ._submit import RedisSubmitter

__all__ = [
    "EXIT_WAIT_TIMEOUT",
    "Backfill",
    "BackfillJob",
    "BackfillOptions",
    "BackfillState",
    "RedisSubmitter",
    "Submitter",
    "WaitTimeoutError",
    "load_scorers",
    "new_job_id",
    "print_summary",
]
