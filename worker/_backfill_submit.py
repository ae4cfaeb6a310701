"""Submitting backfill batches to the Redis queue, without flooding it.

Before each send the queue's length (the Redis list kombu keeps per queue) is checked; above
``high_water`` batches the backfill waits until the workers bring it down to ``low_water``.
Progress comes from the per-job counters the workers keep in the score store.

Messages are the exporter's (``tracing._task_message``): Celery's task protocol 2 in JSON.
The backfill sizes its batches to fit the workers' message cap (``max_batch_bytes``) and hands
over the requests' JSON it measured (``submit_encoded``), so nothing is serialized twice.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from kombu import Connection, Exchange, Queue

from tracing._run import ScoreBatch
from tracing._task_message import CONTENT_ENCODING, CONTENT_TYPE, TaskMessage, task_message
from worker._keys import job_key
from worker._settings import Settings

__all__ = ["MESSAGE_ENVELOPE_BYTES", "RedisSubmitter", "wire_size"]

# Room kept in a message for what surrounds the requests' JSON: the task envelope
# ``[[{"batch_id": ..., "requests": [...]}], {}, {callbacks...}]`` (~150 bytes) and slack.
MESSAGE_ENVELOPE_BYTES = 1024


def wire_size(encoded: str) -> int:
    """An upper bound of the size of JSON text ``encoded`` however a worker measures it: its
    UTF-8 bytes, or ``json.dumps`` with ASCII escapes (a non-ASCII character of k UTF-8 bytes
    becomes a 6- or 12-character escape, at most 5 more per extra byte)."""
    length = len(encoded)
    if encoded.isascii():
        return length
    return length + 5 * (len(encoded.encode("utf-8", "surrogatepass")) - length)


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
        tls = settings.tls  # rediss:// verifies the certificate, as the workers do
        self._connection: Any = Connection(settings.broker_url, ssl=tls.kombu_ssl(settings.broker_url) or False)
        self._producer: Any = None
        self._broker: Any = (
            redis.Redis.from_url(settings.broker_url, **tls.redis_kwargs(settings.broker_url))
            if settings.broker_url.startswith(("redis", "rediss"))
            else None
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

    @property
    def max_batch_bytes(self) -> int:
        """Room for the requests' JSON in one message under the workers' cap."""
        return max(1, self.settings.max_payload_bytes - MESSAGE_ENVELOPE_BYTES)

    def submit(self, batch: ScoreBatch) -> None:
        self._wait_for_room()
        self._publish(task_message(batch, self._origin))

    def submit_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        """Publish ``batch`` whose requests are already JSON (``model_dump_json`` of each, in
        order): the same message ``submit`` sends, without serializing the requests again."""
        self._wait_for_room()
        empty = ScoreBatch.model_construct(batch_id=batch.batch_id, requests=[])
        shell = task_message(empty, self._origin)
        empty_json = empty.model_dump_json()  # {"batch_id":"...","requests":[]}
        if not (shell.body.startswith("[[" + empty_json) and empty_json.endswith("[]}")):
            raise AssertionError("the task message layout changed; update RedisSubmitter.submit_encoded")
        body = "[[" + empty_json[:-2] + ",".join(requests_json) + "]}" + shell.body[2 + len(empty_json) :]
        headers = {**shell.headers, "argsrepr": f"(<ScoreBatch {batch.batch_id}: {len(batch.requests)} runs>,)"}
        self._publish(TaskMessage(shell.task_id, body, headers))

    def _publish(self, message: TaskMessage) -> None:
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
