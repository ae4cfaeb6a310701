"""What the HTTP score sinks share: which answers are worth another try, Retry-After, and
sending one request per score a few at a time.

The contract (``_sink.py``): 408/409/425/429 and every 5xx, connection errors and timeouts are
``Retry``; any other 4xx is ``Refused``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from typing import TypeVar

import httpx

from tracing.sinks._sink import Delivery, Refused, Retry

__all__ = ["DETAIL_CHARS", "JSON", "deliver_each", "is_retryable", "json_body", "retry_after", "transport_retry"]

T = TypeVar("T")

_RETRYABLE = frozenset({408, 409, 425, 429})
# A backend asking for more than this is capped: the drainer's own backoff takes over.
_MAX_RETRY_AFTER_S = 600.0
# How much of a backend's answer a Refused keeps (enough to read the error, not a page of HTML).
DETAIL_CHARS = 300
JSON = {"Content-Type": "application/json"}
# A str holds a surrogate only when it is lone (a pair is one code point): not encodable as UTF-8.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_body(payload: object) -> bytes:
    """``payload`` as UTF-8 JSON. A lone surrogate (``json.loads`` of a judge's or an agent's
    ``"\\ud800"`` makes one) becomes U+FFFD: as it is, the encoding would fail on every retry."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def is_retryable(status: int) -> bool:
    return status in _RETRYABLE or status >= 500


def retry_after(response: httpx.Response) -> float:
    """Retry-After in seconds (delta or HTTP date), 0 when absent or unreadable."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
    if not math.isfinite(seconds):
        return 0.0
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def transport_retry(backend: str, exc: httpx.TransportError) -> Retry:
    """The Retry for a request that got no answer; names the error type, never its text (which
    may quote the URL and its credentials)."""
    if isinstance(exc, httpx.TimeoutException):
        return Retry(f"{backend} did not answer in time ({type(exc).__name__})")
    return Retry(f"{backend} unreachable ({type(exc).__name__})")


def deliver_each(
    items: Sequence[T | Refused],
    attempt: Callable[[T], tuple[Delivery, bool]],
    pool: ThreadPoolExecutor,
    width: int,
) -> list[Delivery]:
    """One outcome per item, in order, for backends that take one score per request.

    A ``Refused`` item (a record the sink cannot send) is its own outcome. The others go through
    ``attempt`` ``width`` at a time on ``pool`` (the backend's round trip, not our CPU, is what a
    batch waits for). ``attempt`` answers the outcome and whether it holds for every score (no
    answer at all, credentials refused, no such API at the URL): then the items not sent yet get
    it without a request each, so a down backend costs one round of timeouts per batch.
    """
    outcomes: list[Delivery | None] = [item if isinstance(item, Refused) else None for item in items]
    todo = [(i, item) for i, item in enumerate(items) if not isinstance(item, Refused)]
    for_all: Delivery | None = None
    for start in range(0, len(todo), width):
        chunk = todo[start : start + width]
        if for_all is not None:
            for i, _ in chunk:
                outcomes[i] = for_all
            continue
        for (i, _), (outcome, everyone) in zip(chunk, pool.map(attempt, [item for _, item in chunk]), strict=True):
            outcomes[i] = outcome
            if everyone and for_all is None:
                for_all = outcome
    done = [o for o in outcomes if o is not None]
    if len(done) != len(items):  # every path above assigns one outcome per item
        raise AssertionError("deliver_each left an item without an outcome")
    return done
