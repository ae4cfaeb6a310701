"""Backfill: score stored traces through the same path as live traffic.

The job (``BackfillJob``: ``start`` / ``dry_run`` / ``resume``): read a source
(``tracing.sources``) → assemble traces → plan runs (``tracing.read``) → submit span-record
requests in byte-cut batches (``Backfill``, the driver) to the workers through the one
publisher with backpressure (``RedisSubmitter``) or to the embedded scorer → follow the job to
its summary. The state (``BackfillState``: options, checkpoint, counters) is saved in Redis, so
a job resumes.
"""

from worker._progress import ProgressReporter
from worker.backfill._driver import Backfill, Submitter
from worker.backfill._job import EXIT_WAIT_TIMEOUT, BackfillJob, WaitTimeoutError, load_scorers, print_summary
from worker.backfill._state import BackfillOptions, BackfillState, new_job_id
from worker.backfill._submit import RedisSubmitter

__all__ = [
    "EXIT_WAIT_TIMEOUT",
    "Backfill",
    "BackfillJob",
    "BackfillOptions",
    "BackfillState",
    "ProgressReporter",
    "RedisSubmitter",
    "Submitter",
    "WaitTimeoutError",
    "load_scorers",
    "new_job_id",
    "print_summary",
]
