"""Celery workers that run the scorers, and the ``tracescore`` command line.

``from worker import app`` is the Celery app (``celery -A worker worker --scorers my.module``).
"""

from worker._app import app
from worker._task import score_batch_task

__all__ = ["app", "score_batch_task"]
