"""Celery workers that run the scorers, and the ``tracescore`` command line."""
