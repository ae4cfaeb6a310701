"""Submitting backfill batches to the Redis queue, without flooding it.

Before each send the queue's length (the Redis list kombu keeps per queue) is checked; above
``high_water`` batches the backfill waits until the workers bring it down to ``low_water``.
Progress comes from the per-job counters the workers keep in the score store.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from tracing._run import SCORE_TASK_NAME, ScoreBatch
from worker._app import configure_app
from worker._keys import job_key
from worker._settings import Settings

__all__ = ["RedisSubmitter"]


class RedisSubmitter:
    mode = "redis"

    def __init__(
        self,
        settings: Settings,
        *,
        high_water: int = 40,
        low_water: int | None = None,
        poll_s: float = 0.05,
    ) -> None:
        self.settings = settings
        self.queue = settings.queue
        self.high_water = max(1, high_water)
        self.low_water = max(0, self.high_water // 2 if low_water is None else low_water)
        self.poll_s = poll_s
        self.throttled_s = 0.0
        # A producer-only app of its own, so the process-wide app's configuration is untouched.
        self.app = Celery("tracescore-backfill", set_as_current=False)
        configure_app(self.app, settings)
        self._broker: Any = (
            redis.Redis.from_url(settings.broker_url) if settings.broker_url.startswith(("redis", "rediss")) else None
        )
        self.store: Any = redis.Redis.from_url(settings.store_url, decode_responses=True)

    def ping(self) -> None:
        """Raises ``redis.exceptions.ConnectionError`` when the broker or the store is down."""
        if self._broker is not None:
            self._broker.ping()
        self.store.ping()

    def pending(self) -> int:
        if self._broker is None:
            return 0
        return int(self._broker.llen(self.queue))

    def _wait_for_room(self) -> None:
        if self._broker is None or self.pending() <= self.high_water:
            return
        started = time.monotonic()
        while self.pending() > self.low_water:
            time.sleep(self.poll_s)
        self.throttled_s += time.monotonic() - started

    def submit(self, batch: ScoreBatch) -> None:
        self._wait_for_room()
        self.app.send_task(SCORE_TASK_NAME, args=[batch.model_dump(mode="json")], queue=self.queue)

    def progress(self, job_id: str) -> dict[str, int]:
        raw = self.store.hgetall(job_key(job_id))
        return {str(k): int(v) for k, v in raw.items()}

    def close(self) -> None:
        self.app.close()
        if self._broker is not None:
            self._broker.close()
        self.store.close()
