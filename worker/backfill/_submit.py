"""Submitting backfill batches to the Redis queue, without flooding it.

The message and its publisher are the exporter's (``tracing.queue.Publisher``: Celery's task
protocol 2 in JSON, over kombu), wrapped in ``tracing.queue.Backpressure``: above ``high_water``
waiting batches (the Redis list kombu keeps per queue) the backfill waits until the workers bring
it down to ``low_water``. Progress comes from the per-job counters the workers keep in the score
store. Each of these calls rides out Redis being away for the workers' reconnect budget
(``RideOut``), the publish too: kombu's own retry is off, for it neither heeds a stop asked nor
says that it waits.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

import redis

from tracing.queue import Backpressure, Publisher, ScoreBatch
from worker._errors import SettingsError
from worker._settings import Settings
from worker.backfill._outage import RideOut
from worker.backfill._state import BOUNDED, store_client
from worker.store import check_list, job_progress

__all__ = ["RedisSubmitter"]


class _RidingPublisher:
    """``Publisher.publish`` called again while the broker is away (each try reconnects: a failed
    publish drops its connection)."""

    def __init__(self, publisher: Publisher, ride_out: RideOut) -> None:
        self.publisher = publisher
        self.max_payload_bytes = publisher.max_payload_bytes
        self._ride_out = ride_out

    def publish(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        self._ride_out("publishing a batch", lambda: self.publisher.publish(batch, requests_json))

    def close(self) -> None:
        self.publisher.close()


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
        tls = settings.tls  # rediss:// verifies the certificate, as the workers do
        self.max_payload_bytes = settings.max_payload_bytes
        # Shared with the job's store (``RedisJobStore``): one budget, one stop, one word.
        self.ride_out = RideOut()
        self._broker: Any = (
            redis.Redis.from_url(settings.broker_redis_url, **tls.redis_kwargs(settings.broker_url), **BOUNDED)
            if settings.broker_url.startswith(("redis", "rediss"))
            else None
        )
        publisher = Publisher(
            settings.broker_url,
            queue=settings.queue,
            origin=f"tracescore-backfill@{socket.gethostname()}",
            tls=tls,
            max_payload_bytes=settings.max_payload_bytes,
            # Bounded as the backfill's other clients, and no retry of kombu's (``RideOut``'s):
            # kombu's default connect retried for seconds, deaf to a stop.
            connect_timeout_s=BOUNDED["socket_connect_timeout"],
            publish_timeout_s=BOUNDED["socket_timeout"],
        )
        self._publisher = Backpressure(
            _RidingPublisher(publisher, self.ride_out),
            self.pending,
            high_water=high_water,
            low_water=low_water,
            poll_s=poll_s,
        )
        self.store: Any = store_client(settings)

    @property
    def should_stop(self) -> Callable[[], bool]:
        """Set by the CLI: a requested stop ends a backpressure wait (raises KeyboardInterrupt)."""
        return self._publisher.should_stop

    @should_stop.setter
    def should_stop(self, value: Callable[[], bool]) -> None:
        self._publisher.should_stop = value
        self.ride_out.should_stop = value

    @property
    def on_wait(self) -> Callable[[int], None]:
        """Set by the CLI: called while a backpressure wait lasts, with the batches queued."""
        return self._publisher.on_wait

    @on_wait.setter
    def on_wait(self, value: Callable[[int], None]) -> None:
        self._publisher.on_wait = value

    @property
    def throttled_s(self) -> float:
        return self._publisher.throttled_s

    def ping_broker(self) -> None:
        """Raises a ``redis.exceptions.RedisError`` when the broker is down or refuses the URL,
        ``StoreKeyTypeError`` when the queue's key holds another Redis type, and
        ``SettingsError`` when it evicts keys when full. ``ping_store``: the same of the store."""
        from worker._guard import BrokerWrites

        if self._broker is not None:
            self._broker.ping()
            check_list(self._broker, self.queue)
            self._refuse_eviction(BrokerWrites.read(self._broker), "broker", self.settings.broker_url)

    def ping_store(self) -> None:
        from worker._guard import BrokerWrites

        self.store.ping()
        self._refuse_eviction(BrokerWrites.read(self.store), "score store", self.settings.store_url)

    @staticmethod
    def _refuse_eviction(writes: Any, what: str, url: str) -> None:
        problem = writes.eviction_problem(what, url) if writes is not None else None
        if problem:
            raise SettingsError(problem)

    def pending(self) -> int:
        if self._broker is None:
            return 0
        return self.ride_out("reading the queue's length", self._queue_length)

    def _queue_length(self) -> int:
        try:
            return int(self._broker.llen(self.queue))
        except redis.exceptions.ResponseError:
            check_list(self._broker, self.queue)  # names the key when it changed type meanwhile
            raise

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        """Publish ``batch`` (its requests already JSON when ``requests_json`` is given, in order,
        so nothing is serialized twice), after waiting for room in the queue."""
        self._publisher.publish(batch, requests_json)

    def progress(self, job_id: str) -> dict[str, int]:
        return self.ride_out("reading the job's counts", lambda: job_progress(self.store, job_id))

    def close(self) -> None:
        self._publisher.close()
        if self._broker is not None:
            self._broker.close()
        self.store.close()
