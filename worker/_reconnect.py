"""Redis clients that survive a Redis restart, and the error they raise when Redis stays away.

Every asyncio Redis client the worker holds (score store, rate limiter) is built here: a
connection found dead (Redis restarted, a failover, an idle connection cut by a proxy) is
replaced and the command retried with exponential backoff for up to ``reconnect_s`` seconds;
only then does the caller see ``StoreUnavailableError``.

``StoreUnavailableError`` is a Celery ``Reject(requeue=True)``: escaping a task, it hands the
message back to the broker (or, with the broker down too, leaves it unacknowledged for the
visibility-timeout sweep) instead of the task failing and its message being acknowledged and
lost. It is also a ``redis.exceptions.ConnectionError``, so code catching Redis errors (the
CLI) keeps working.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

import redis.asyncio as aioredis
from celery.exceptions import Reject
from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from worker._errors import WorkerError

if TYPE_CHECKING:
    from scorers.judge import ErrorCategory

__all__ = [
    "CLI_PATIENCE",
    "COMMAND_SLACK_S",
    "DECODED",
    "RECONNECT_S",
    "Patience",
    "StoreUnavailableError",
    "reconnecting_client",
    "unavailable_as_error",
]

# For a worker: long enough for a Redis restart or a failover, short enough that a store call
# ends (StoreUnavailableError at RECONNECT_S + COMMAND_SLACK_S at the latest) before the task's
# own 30 s wait for it gives up with a plain TimeoutError, which would fail (and ack) the task.
RECONNECT_S = 15.0
# A command's own time on top of the reconnect budget, for the hard deadline of one store call
# (and how long one read waits for its answer).
COMMAND_SLACK_S = 10.0
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 1.0

# How every client of our keys decodes replies: text, and bytes that are not UTF-8 (only another
# program can have written them) replaced, so the value fails validation where it is read, by
# name, instead of the reply parser raising and failing every read of the keys around it.
DECODED: dict[str, Any] = {"decode_responses": True, "encoding_errors": "replace"}

C = TypeVar("C", bound=type)


class Patience(TypedDict):
    """How long a Redis client keeps reconnecting, and how long one read waits for its answer:
    keyword arguments of the Redis stores and clients (``RedisScoreStore``, ``RedisDeadLetters``,
    ``RedisOutbox``, the limiter, the ledger)."""

    reconnect_s: float
    command_s: float


# A command a person waits for (the CLI): it rides out a Redis that refuses connections for a
# moment, and says one that takes them and answers nothing is unreachable within about 3 s, as
# `status` says it of the broker (the stores' defaults, 2 s + a read's 10 s, kept `scores` and
# `dlq` silent 12.6 s).
CLI_PATIENCE: Patience = {"reconnect_s": 1.0, "command_s": 2.0}


class StoreUnavailableError(Reject, redis_errors.ConnectionError, WorkerError):
    """Redis (the score store) did not answer through every reconnect attempt."""

    _category: ClassVar[ErrorCategory] = "retryable"

    def __init__(self, message: str) -> None:
        super().__init__(message, True)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))


def _retries_for(seconds: float) -> int:
    """How many retries the backoff (0.1, 0.2, 0.4, 0.8, then 1 s each) needs to span ``seconds``."""
    waited, retries = 0.0, 0
    while waited < seconds:
        retries += 1
        waited += min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**retries)
    return retries


def reconnecting_client(
    url: str, *, max_connections: int, reconnect_s: float, command_s: float = COMMAND_SLACK_S
) -> Any:
    """An asyncio client on a blocking pool (callers beyond ``max_connections`` wait for a
    connection) that reconnects and retries for ``reconnect_s`` seconds before failing; a read
    waits ``command_s`` for its answer."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        **DECODED,
        retry=Retry(
            ExponentialBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S),
            _retries_for(reconnect_s),
            # A refused password is a ConnectionError to redis-py, but no retry fixes it: retried,
            # a missing one ended as a bare TimeoutError after the whole budget.
            is_retryable=lambda error: not isinstance(error, redis_errors.AuthenticationError),
        ),
        # ReadOnlyError: a failover, the connection still on the demoted primary (which refused
        # the write whole); a new connection finds the new primary behind the same endpoint.
        retry_on_error=[redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.ReadOnlyError],
        # A connection idle this long is checked (PING) before use: a stale one is replaced
        # before a command is sent on it.
        health_check_interval=15,
        socket_connect_timeout=2,
        socket_timeout=command_s,
        # TCP only: a Unix socket's connection takes no keepalive option (a TypeError).
        **({} if url.startswith("unix:") else {"socket_keepalive": True}),
    )
    return aioredis.Redis(connection_pool=pool)


def _translated(name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        reconnect_s = float(getattr(self, "reconnect_s", 0.0))
        deadline_s = reconnect_s + float(getattr(self, "command_s", COMMAND_SLACK_S))
        try:
            # Retries are counted, not timed (a connect that hangs takes its full timeout each
            # time): this deadline is what bounds one call.
            async with asyncio.timeout(deadline_s):
                return await method(self, *args, **kwargs)
        except StoreUnavailableError:
            raise
        except redis_errors.AuthenticationError as exc:
            # Not retried, but the call still takes its reconnect budget: a worker whose store
            # refuses its password must not requeue its message in a hot loop.
            await asyncio.sleep(reconnect_s)
            raise StoreUnavailableError(
                f"Redis refused the credentials: {name} ({type(exc).__name__}: {exc}); check the password in the URL"
            ) from exc
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError, TimeoutError) as exc:
            if type(exc) is TimeoutError and not str(exc):  # the deadline above: no text of its own
                raise StoreUnavailableError(
                    f"Redis is unreachable: {name} got no answer within {deadline_s:.0f} s"
                ) from exc
            raise StoreUnavailableError(
                f"Redis is unreachable: {name} failed after reconnecting for up to "
                f"{reconnect_s:.0f} s ({type(exc).__name__}: {exc})"
            ) from exc

    return call


def unavailable_as_error(cls: C) -> C:
    """Class decorator: every public coroutine method raises ``StoreUnavailableError`` when
    Redis stays unreachable (instead of redis-py's ConnectionError/TimeoutError)."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _translated(f"{cls.__name__}.{name}", member))
    return cls
