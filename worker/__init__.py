"""Celery workers that run the scorers, and the ``tracescore`` command line.

``from worker import app`` is the Celery app (``celery -A worker worker --scorers my.module``).
``score_batch`` is the scoring core the task, the embedded mode and tests share.
The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Each name is imported from its module on first use (the list, which type checkers read too, is
# __init__.pyi): the CLI's probes, which Kubernetes runs every few seconds, and its Redis commands
# do not build the Celery app.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
