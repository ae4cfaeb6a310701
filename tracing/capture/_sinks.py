"""Where the exporter hands its batches: the broker (producer side only) or a function.

A sink's ``send`` raises on failure; the exporter's sender thread retries with backoff, except
a ``ValueError`` or ``TypeError``: the sink refuses that batch for good (counted as
``send_failed``, logged once, never tried again). A sink
with a message cap (``EncodedSink``: ``CelerySink``) gets its batches cut by bytes: the exporter
encodes each request once, sizes the messages with it and hands the JSON over.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from tracing._broker import BrokerTLS
from tracing.queue import DEFAULT_MAX_PAYLOAD_BYTES, Publisher, ScoreBatch

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
    """Enqueue ``tracescore.score_batch`` tasks on the Celery broker through the one publisher
    (``tracing.queue.Publisher``: kombu, Celery's task protocol 2 in JSON), so ``celery -A worker
    worker`` consumes them and the worker package is never imported here. Connect and socket
    timeouts are short and nothing is retried here, so a down broker fails a send quickly (the
    exporter's sender retries). ``max_payload_bytes`` is the workers' ``TRACESCORE_MAX_PAYLOAD_BYTES``
    (the same default): the exporter cuts messages under it and drops a run that alone exceeds
    it (``dropped.too_large``).
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
        self.publisher = Publisher(
            broker_url,
            queue=queue,
            origin=f"tracescore-exporter@{socket.gethostname()}",
            tls=tls,
            max_payload_bytes=max_payload_bytes,
            connect_timeout_s=connect_timeout_s,
            publish_timeout_s=publish_timeout_s,
        )
        self.max_payload_bytes = max_payload_bytes
        self.broker_url = broker_url
        self.queue = queue

    def send(self, batch: ScoreBatch) -> None:
        self.publisher.publish(batch)

    def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        self.publisher.publish(batch, requests_json)

    def close(self) -> None:
        """Release the connection and refuse every later ``send``; a send under way is waited
        for at most ``connect_timeout_s`` + ``publish_timeout_s`` (``Publisher.close``)."""
        self.publisher.close()
