"""The score-sink contract: one backend that receives finished scores.

Stored score records are the outbox (``worker.store``): a worker drains it per sink, hands a
sink a batch of records and acknowledges each record by the outcome the sink returns. A sink
therefore never buffers, never retries on its own and never drops silently: ``deliver``
returns one ``Delivery`` per record, in order.

- ``Delivered``: the backend has it, by its own acknowledgement (a 2xx alone is not one: a
  proxy or a web app at the URL answers 2xx too; ``_http.unacknowledged``). A re-send of the
  same score must be an upsert: every sink keys the backend's object on ``ScoreRecord.score_id``.
- ``Retry``: try again later (backend down, 5xx, 429, a span the backend has not ingested yet);
  ``after_s`` is a hint (e.g. Retry-After), the drainer backs off at least that long.
- ``Refused``: the backend said no for good (4xx other than 408/409/425/429); ``detail`` is the
  backend's own answer, cut short and scrubbed of secrets, never the score's content.

``deliver`` itself raises only for a bug; network and HTTP failures are outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from scorers import scrub_secrets
from tracing._score_record import ScoreRecord

__all__ = ["Delivered", "Delivery", "Refused", "Retry", "ScoreSink", "shown_endpoint"]


@dataclass(frozen=True, slots=True)
class Delivered:
    pass


@dataclass(frozen=True, slots=True)
class Retry:
    reason: str
    after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    detail: str = ""


Delivery = Delivered | Retry | Refused


@runtime_checkable
class ScoreSink(Protocol):
    """A backend for scores. ``name`` keys its outbox, counters and dead letters
    (``otlp``, ``phoenix``, ``mlflow``, ``langfuse``, ``jsonl``, ``console``). A sink may also
    say where it writes, ``endpoint`` (``shown_endpoint``'s form: logs and summaries show it),
    so that two sinks of one backend are told apart; the built-in ones do."""

    @property
    def name(self) -> str: ...

    def deliver(self, records: Sequence[ScoreRecord]) -> list[Delivery]:
        """Write ``records`` (any spans, any traces) and say, per record, what happened."""
        ...

    def close(self) -> None: ...


def shown_endpoint(url: str) -> str:
    """Where a sink writes as a log line or a summary may show it: ``url`` without its query or
    fragment (a token may ride there under any name) and with its password masked."""
    parts = urlsplit(url)
    return scrub_secrets(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))
