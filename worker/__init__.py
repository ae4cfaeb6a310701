"""Celery workers that run the scorers, and the ``tracescore`` command line.

``from worker import app`` is the Celery app (``celery -A worker worker --scorers my.module``).
``score_batch`` is the scoring core the task, the embedded mode and tests share.
"""

from worker._app import app, score_batch_task
from worker._embedded import EmbeddedScorer, embedded_sink
from worker._limiter import RedisRateLimiter
from worker._registry import Registry, RegistryError, UnknownScorerError, load_registry
from worker._scoring import BatchReport, ScoringDeps, score_batch
from worker._settings import ModelRateLimit, Settings, SettingsError, get_settings, load_settings
from worker.store import DeadLetter, MemoryScoreStore, RedisScoreStore, ScoreStore

__all__ = [
    "BatchReport",
    "DeadLetter",
    "EmbeddedScorer",
    "MemoryScoreStore",
    "ModelRateLimit",
    "RedisRateLimiter",
    "RedisScoreStore",
    "Registry",
    "RegistryError",
    "ScoreStore",
    "ScoringDeps",
    "Settings",
    "SettingsError",
    "UnknownScorerError",
    "app",
    "embedded_sink",
    "get_settings",
    "load_registry",
    "load_settings",
    "score_batch",
    "score_batch_task",
]
