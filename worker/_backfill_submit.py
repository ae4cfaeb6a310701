"""Submitting backfill batches to the Redis queue, without flooding it.

Before each send the queue's length (the Redis list kombu keeps per queue) is checked; above
``high_water`` batches the backfill waits until the workers bring it down to ``low_water``.
Progress comes from the per-job counters the workers keep in the score store.

Messages are the exporter's (``tracing._task_message``): Celery's task protocol 2 in JSON.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu import Connection, Exchange, Queue

from tracing._run import ScoreBatch
from tracing._task_message import CONTENT_ENCODING, CONTENT_TYPE, task_message
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
        # Set by the CLI: a requested stop ends a backpressure wait (raises KeyboardInterrupt).
        self.should_stop: Callable[[], bool] = lambda: False
        self.throttled_s = 0.0
        self._origin = f"tracescore-backfill@{socket.gethostname()}"
        self._connection: Any = Connection(settings.broker_url)
        self._producer: Any = None
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
            if self.should_stop():
                raise KeyboardInterrupt
            time.sleep(self.poll_s)
        self.throttled_s += time.monotonic() - started

    def _producer_for(self) -> Any:
        if self._producer is None:
            queue = Queue(self.queue, Exchange(self.queue, type="direct"), routing_key=self.queue)
            queue(self._connection.default_channel).declare()
            self._producer = self._connection.Producer()
        return self._producer

    def submit(self, batch: ScoreBatch) -> None:
        self._wait_for_room()
        message = task_message(batch, self._origin)
        self._producer_for().publish(
            message.body,
            exchange="",
            routing_key=self.queue,
            headers=message.headers,
            correlation_id=message.task_id,
            content_type=CONTENT_TYPE,
            content_encoding=CONTENT_ENCODING,
            delivery_mode=2,
            retry=True,
            retry_policy={"max_retries": 5, "interval_start": 0.5, "interval_step": 1.0, "interval_max": 5.0},
        )

    def progress(self, job_id: str) -> dict[str, int]:
        raw = self.store.hgetall(job_key(job_id))
        return {str(k): int(v) for k, v in raw.items()}

    def close(self) -> None:
        self._connection.release()
        if self._broker is not None:
            self._broker.close()
        self.store.close()
