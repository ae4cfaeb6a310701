"""Where the exporter hands its batches: the broker (producer side only) or a function.

A sink's ``send`` raises on failure; the exporter's sender thread retries with backoff. A sink
with a message cap (``EncodedSink``: ``CelerySink``) gets its batches cut by bytes: the exporter
encodes each request once, sizes the messages with it and hands the JSON over.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from tracing._broker import BrokerTLS
from tracing._run import ScoreBatch
from tracing._task_message import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    DEFAULT_MAX_PAYLOAD_BYTES,
    MESSAGE_ENVELOPE_BYTES,
    task_message,
    wire_size,
)

__all__ = ["CallbackSink", "CelerySink", "EncodedSink", "Sink"]


@runtime_checkable
class Sink(Protocol):
    def send(self, batch: ScoreBatch) -> None:
        """Deliver ``batch`` or raise (the exporter retries)."""


@runtime_checkable
class EncodedSink(Protocol):
    """A sink whose messages are capped at ``max_payload_bytes`` (the workers'
    ``TRACESCORE_MAX_PAYLOAD_BYTES``) and that takes its requests already encoded."""

    max_payload_bytes: int

    def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        """Deliver ``batch`` whose requests are ``requests_json`` (``model_dump_json()`` of each),
        or raise (the exporter retries)."""


class CallbackSink:
    """In-process sink: calls ``fn(batch)`` (the embedded mode scores right there; tests record)."""

    def __init__(self, fn: Callable[[ScoreBatch], object]) -> None:
        if not callable(fn):
            raise TypeError("CallbackSink needs a callable taking a ScoreBatch")
        self._fn = fn

    def send(self, batch: ScoreBatch) -> None:
        self._fn(batch)


class CelerySink:
    """Enqueue ``tracescore.score_batch`` tasks on the Celery broker, with kombu only.

    The message is Celery's task protocol 2, JSON: ``args=[batch.model_dump(mode="json")]``, so
    ``celery -A worker worker`` consumes it; the worker package is never imported here. Connect
    and socket timeouts are short so a down broker fails a send quickly (the exporter retries).
    ``max_payload_bytes`` is the workers' ``TRACESCORE_MAX_PAYLOAD_BYTES`` (the same default): the
    exporter cuts messages under it and drops a run that alone exceeds it (``dropped.too_large``).
    """

    def __init__(
        self,
        broker_url: str,
        *,
        queue: str = "tracescore",
        connect_timeout_s: float = 2.0,
        publish_timeout_s: float = 2.0,
        tls: BrokerTLS | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if not broker_url:
            raise ValueError("CelerySink needs a broker URL, e.g. redis://localhost:6379/0")
        if max_payload_bytes <= MESSAGE_ENVELOPE_BYTES:
            raise ValueError(
                f"max_payload_bytes must be over {MESSAGE_ENVELOPE_BYTES} (the message envelope), got"
                f" {max_payload_bytes}: pass the workers' TRACESCORE_MAX_PAYLOAD_BYTES"
            )
        self.max_payload_bytes = max_payload_bytes
        self.broker_url = broker_url
        self.queue = queue
        self._connect_timeout = connect_timeout_s
        self._publish_timeout = publish_timeout_s
        self._lock = threading.Lock()
        self._conn: Any = None
        self._producer: Any = None
        self._closed = False
        self._origin = f"tracescore-exporter@{socket.gethostname()}"
        # rediss:// verifies the certificate; default: TRACESCORE_BROKER_CA_FILE / _TLS_INSECURE
        self._ssl = (tls or BrokerTLS.from_env()).kombu_ssl(broker_url)

    def _connect(self) -> Any:
        from kombu import Connection, Exchange, Queue

        conn = Connection(
            self.broker_url,
            connect_timeout=self._connect_timeout,
            ssl=self._ssl or False,
            transport_options={
                "socket_timeout": self._publish_timeout,
                "socket_connect_timeout": self._connect_timeout,
                "max_retries": 0,
            },
        )
        # Kept before anything can fail, so a failed connect or declare is released by _close().
        self._conn = conn
        conn.ensure_connection(max_retries=0, timeout=max(1, math.ceil(self._connect_timeout)))
        queue = Queue(self.queue, Exchange(self.queue, type="direct"), routing_key=self.queue)
        producer = conn.Producer(serializer="json")
        queue(conn.default_channel).declare()
        self._producer = producer
        return producer

    def _close(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close; dropped anyway
                conn.release()

    def send(self, batch: ScoreBatch) -> None:
        self.send_encoded(batch, [request.model_dump_json() for request in batch.requests])

    def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        message = task_message(batch, self._origin, requests_json)
        size = wire_size(message.body)
        if size > self.max_payload_bytes:
            # A worker would dead-letter it whole (payload_too_large); retrying cannot help.
            raise ValueError(
                f"batch {batch.batch_id} is {size} bytes, over max_payload_bytes={self.max_payload_bytes}:"
                " send fewer or smaller runs per batch (ScoringSpanExporter cuts them by it)"
            )
        with self._lock:
            if self._closed:  # never reconnect once closed: a late send must not reach the broker
                raise RuntimeError("CelerySink is closed; this batch was not sent")
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
                    retry=False,
                    delivery_mode=2,
                )
            except Exception:
                self._close()
                raise

    def close(self) -> None:
        """Release the connection and refuse every later ``send`` (waits for one under way)."""
        with self._lock:
            self._closed = True
            self._close()
