"""Backfill: score stored traces through the same path as live traffic.

The job (``BackfillJob``: ``start`` / ``dry_run`` / ``resume``): read a source
(``tracing.sources``) → assemble traces → plan runs (``tracing.read``) → submit span-record
requests in byte-cut batches (``Backfill``, the driver) to the workers through the one
publisher with backpressure (``RedisSubmitter``) or to the embedded scorer → follow the job to
its summary. The state (``BackfillState``: options, checkpoint, counters) is saved in Redis, so
a job resumes.

The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Imported from their modules on first use (see __init__.pyi): ``tracescore status`` reads a
# job's state (``BackfillState``) without loading the driver, the job and the sources.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
