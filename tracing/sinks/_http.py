"""What the HTTP score sinks share: which answers are worth another try, and Retry-After.

The contract (``_sink.py``): 408/409/425/429 and every 5xx, connection errors and timeouts are
``Retry``; any other 4xx is ``Refused``.
"""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime

import httpx

from tracing.sinks._sink import Retry

__all__ = ["DETAIL_CHARS", "is_retryable", "retry_after", "transport_retry"]

_RETRYABLE = frozenset({408, 409, 425, 429})
# A backend asking for more than this is capped: the drainer's own backoff takes over.
_MAX_RETRY_AFTER_S = 600.0
# How much of a backend's answer a Refused keeps (enough to read the error, not a page of HTML).
DETAIL_CHARS = 300


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
