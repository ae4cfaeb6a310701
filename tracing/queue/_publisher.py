"""The one publisher of score batches (kombu, no Celery app), and backpressure as a wrapper.

The exporter's ``CelerySink`` and the backfill both publish through ``Publisher``: the same
message (``task_message``), the same queue declaration, the same TLS handling. What differs is
configuration and who retries: the exporter fails fast (short timeouts; its sender thread retries
with backoff), the backfill rides out a broker restart (``worker.backfill``'s wait). ``Backpressure``
holds a producer back while the queue is above a high-water mark.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tracing._broker import BrokerTLS
from tracing._errors import QueueKeyError
from tracing._fork import after_fork_in_child
from tracing.queue._contract import MAX_BATCH_PAIRS, ScoreBatch, request_json
from tracing.queue._limits import DEFAULT_MAX_PAYLOAD_BYTES, MESSAGE_ENVELOPE_BYTES
from tracing.queue._wire import CONTENT_ENCODING, CONTENT_TYPE, task_message, wire_size

# QueueKeyError is the error Publisher raises; tracing.queue exports it from here.
__all__ = ["Backpressure", "BatchPublisher", "Publisher", "QueueKeyError"]


class BatchPublisher(Protocol):
    """What producers hand batches to."""

    max_payload_bytes: int

    def publish(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        """Deliver ``batch`` (its requests already JSON when ``requests_json`` is given) or raise."""

    def close(self) -> None: ...


def _refuse_past_pairs(batch: ScoreBatch) -> None:
    """``ValueError`` for a batch asking for more (run, scorer id) pairs than the workers take
    (``MAX_BATCH_PAIRS``; one built without the cutter): they would dead-letter it whole."""
    pairs = batch.pairs()
    if pairs > MAX_BATCH_PAIRS:
        raise ValueError(
            f"batch {batch.batch_id} asks for {pairs:,} (run, scorer id) pairs, at most {MAX_BATCH_PAIRS:,}"
            " (tracing.queue.MAX_BATCH_PAIRS): send fewer runs or scorers per batch"
            " (tracing.queue.RequestCutter cuts them by it)"
        )


class Publisher:
    """Publishes ``tracescore.score_batch`` messages to ``queue`` on ``broker_url`` with kombu.

    ``connect_timeout_s`` / ``publish_timeout_s`` bound a connect and a socket call (None: kombu's
    defaults). A publish is not retried: the caller retries (a failed one drops the connection,
    and the next connects again). A message over ``max_payload_bytes`` (the workers' ``TRACESCORE_MAX_PAYLOAD_BYTES``)
    is refused with ``ValueError`` before it is sent: a worker would dead-letter it whole; so is
    one asking for more (run, scorer id) pairs than ``MAX_BATCH_PAIRS`` (built without the
    cutter, which cuts under both). A key
    the queue needs that holds another Redis type raises ``QueueKeyError`` naming it.
    Thread-safe; ``close()`` refuses every later publish.
    """

    def __init__(
        self,
        broker_url: str,
        *,
        queue: str = "tracescore",
        origin: str = "tracescore",
        tls: BrokerTLS | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        connect_timeout_s: float | None = None,
        publish_timeout_s: float | None = None,
    ) -> None:
        if not broker_url:
            raise ValueError("a publisher needs a broker URL, e.g. redis://localhost:6379/0")
        problem = query_password_problem(broker_url)
        if problem:
            raise ValueError(f"the broker URL {problem}")
        if max_payload_bytes <= MESSAGE_ENVELOPE_BYTES:
            raise ValueError(
                f"max_payload_bytes must be over {MESSAGE_ENVELOPE_BYTES} (the message envelope), got"
                f" {max_payload_bytes}: pass the workers' TRACESCORE_MAX_PAYLOAD_BYTES"
            )
        self.broker_url = broker_url
        self.queue = queue
        self.max_payload_bytes = max_payload_bytes
        self._origin = origin
        self._connect_timeout = connect_timeout_s
        self._publish_timeout = publish_timeout_s
        # rediss:// verifies the certificate; default: TRACESCORE_BROKER_CA_FILE / _TLS_INSECURE
        self._ssl = (tls or BrokerTLS.from_env()).kombu_ssl(broker_url)
        self._lock = threading.Lock()
        self._conn: Any = None
        self._producer: Any = None
        self._closed = False
        after_fork_in_child(self._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: the parent's connection is the parent's (its socket shared; closing
        it here could end the parent's), and a publish under way there held the lock."""
        self._lock = threading.Lock()
        self._conn = self._producer = None

    def _connect(self) -> Any:
        from kombu import Connection, Exchange, Queue

        options: dict[str, Any] = {}
        if self._connect_timeout is not None:
            options["connect_timeout"] = self._connect_timeout
            options["transport_options"] = {
                "socket_timeout": self._publish_timeout,
                "socket_connect_timeout": self._connect_timeout,
                "max_retries": 0,
            }
        conn = Connection(self.broker_url, ssl=self._ssl or False, **options)
        # Kept before anything can fail, so a failed connect or declare is released by _close().
        self._conn = conn
        if self._connect_timeout is not None:
            conn.ensure_connection(max_retries=0, timeout=max(1, math.ceil(self._connect_timeout)))
        queue = Queue(self.queue, Exchange(self.queue, type="direct"), routing_key=self.queue)
        queue(conn.default_channel).declare()
        self._producer = conn.Producer(serializer="json")
        return self._producer

    def _close(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close; dropped anyway
                conn.release()

    def publish(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        _refuse_past_pairs(batch)
        if requests_json is None:
            requests_json = [request_json(request) for request in batch.requests]
        message = task_message(batch, self._origin, requests_json)
        size = wire_size(message.body)
        if size > self.max_payload_bytes:
            raise ValueError(
                f"batch {batch.batch_id} is {size} bytes, over max_payload_bytes={self.max_payload_bytes}:"
                " send fewer or smaller runs per batch (tracing.queue.RequestCutter cuts them by it)"
            )
        with self._lock:
            if self._closed:  # never reconnect once closed: a late publish must not reach the broker
                raise RuntimeError("the publisher is closed; this batch was not sent")
            try:
                producer = self._producer or self._connect()
                producer.publish(
                    message.body,
                    exchange="",  # the default exchange: straight to the queue, as Celery does
                    routing_key=self.queue,
                    headers=message.headers,
                    correlation_id=message.task_id,
                    content_type=CONTENT_TYPE,
                    content_encoding=CONTENT_ENCODING,
                    delivery_mode=2,
                    retry=False,
                )
            except Exception as exc:
                misplaced = self._misplaced_key(exc)
                self._close()
                if misplaced is not None:
                    raise misplaced from None
                raise
            self._release_if_closed()

    def _release_if_closed(self) -> None:
        # Closed while a publish held on (close stopped waiting for it): its connection goes now.
        if self._closed:
            self._close()

    def _misplaced_key(self, exc: Exception) -> QueueKeyError | None:
        """The queue's key, or kombu's binding set for it, holding another Redis type, when
        ``exc`` is Redis's WRONGTYPE answer (one TYPE per key, on this failing path only)."""
        if "WRONGTYPE" not in str(exc) or self._conn is None:
            return None
        try:
            client = self._conn.default_channel.client
            for key, expected in ((self.queue, "list"), (f"_kombu.binding.{self.queue}", "set")):
                found = client.type(key)
                found = found.decode() if isinstance(found, bytes) else str(found)
                if found not in ("none", expected):
                    return QueueKeyError(key, found, expected)
        except Exception:  # the connection failed meanwhile: the original error says enough
            return None
        return None

    def close(self) -> None:
        """Release the connection and refuse every later ``publish``. A publish under way is
        waited for, with timeouts for at most one connect plus one socket call: against a broker
        that answers each command slowly, an attempt's connect, declaration and publish took
        several socket timeouts in all. One still under way then ends on its own, and releases
        the connection when it does."""
        self._closed = True  # a publish that starts from now on refuses (it reads it under the lock)
        waited = (
            self._lock.acquire(timeout=self._connect_timeout + self._publish_timeout)
            if self._connect_timeout is not None and self._publish_timeout is not None
            else self._lock.acquire()
        )
        if not waited:
            return
        try:
            self._close()
        finally:
            self._lock.release()


_QUERY_PASSWORD = re.compile(r"[?&]password=", re.IGNORECASE)


def query_password_problem(url: str) -> str | None:
    """Why kombu cannot use ``url`` when its password is a query parameter (every connection
    fails with a TypeError naming no setting); None otherwise."""
    if _QUERY_PASSWORD.search(url):
        return (
            "carries the password as a query parameter; put it in the user-info part instead:"
            " redis://:PASSWORD@host:6379/0"
        )
    return None


class Backpressure:
    """``publisher`` held back while the queue is long: before each publish, above
    ``high_water`` waiting batches (``pending()``) it waits until the workers bring the queue
    down to ``low_water`` (default half). ``should_stop()`` ends a wait (KeyboardInterrupt);
    ``on_wait(pending)`` is called at each look while it waits (a progress line); ``throttled_s``
    is the time spent waiting."""

    def __init__(
        self,
        publisher: BatchPublisher,
        pending: Callable[[], int],
        *,
        high_water: int = 40,
        low_water: int | None = None,
        poll_s: float = 0.05,
    ) -> None:
        self.publisher = publisher
        self.max_payload_bytes = publisher.max_payload_bytes
        self.pending = pending
        self.high_water = max(1, high_water)
        self.low_water = max(0, self.high_water // 2 if low_water is None else low_water)
        self.poll_s = poll_s
        self.should_stop: Callable[[], bool] = lambda: False
        self.on_wait: Callable[[int], None] = lambda pending: None
        self.throttled_s = 0.0

    def wait_for_room(self) -> None:
        if self.pending() <= self.high_water:
            return
        started = time.monotonic()
        try:
            while (pending := self.pending()) > self.low_water:
                if self.should_stop():
                    raise KeyboardInterrupt
                self.on_wait(pending)
                time.sleep(self.poll_s)
        finally:
            self.throttled_s += time.monotonic() - started

    def publish(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        _refuse_past_pairs(batch)  # (before the wait: refused after it, it had waited for nothing)
        self.wait_for_room()
        self.publisher.publish(batch, requests_json)

    def close(self) -> None:
        self.publisher.close()
