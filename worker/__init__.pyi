"""The names ``worker`` exports, for type checkers; ``__init__.py`` loads each from the module
named here on first use."""

# The subpackages: attributes of the package (as when it imported them all), loaded on first use.
from . import backfill, cli, metrics, store
from ._app import app, create_app, score_batch_task
from ._embedded import EmbeddedScorer, embedded_sink
from ._limiter import RedisRateLimiter
from ._registry import Registry, RegistryError, UnknownScorerError, load_registry
from ._scoring import BatchReport, ScoringDeps, score_batch
from ._settings import ModelRateLimit, Settings, SettingsError, get_settings, load_settings
from .store import DeadLetter, MemoryScoreStore, RedisScoreStore, ScoreStore

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
    "backfill",
    "cli",
    "create_app",
    "embedded_sink",
    "get_settings",
    "load_registry",
    "load_settings",
    "metrics",
    "score_batch",
    "score_batch_task",
    "store",
]
