"""Refusing hostile or broken queue messages before Celery touches them.

Celery decodes a message and builds its request before any task code runs, and several bad
messages (a string body, a wrong argument list, a non-JSON Redis entry) crash the whole worker
there, while others are only logged, body included. So every message is screened twice, at the
two places where it still is raw bytes:

- ``GuardedRedisTransport``: the Redis list entry (kombu's JSON envelope) is checked for size
  *before* it is decoded, and an entry kombu could not turn into a message (not JSON, no
  properties, a body encoding it cannot undo) is replaced by a small stand-in that carries only
  the refusal reason;
- ``GuardedConsumer``: the body (size first, then content type, encoding, JSON, depth, the
  ``[args, kwargs, embed]`` shape) and the headers (task name, ETA, time limits, retries) are
  checked before Celery's own handler sees the message.

Broadcasts (Celery's remote control on Redis pub/sub) are screened where the channel reads them
(``screen_broadcast``): refused ones are logged and counted, never dead-lettered. A message is
taken off its list and recorded as unacknowledged in one script (``_TAKE``, in place of kombu's
BRPOP), so no reply lost with Redis loses it; kombu's own keys and that record are kept whole
(``check_broker_keys`` at start, ``_GuardedQoS`` while running). The queue's list of another
Redis type is never touched: the worker refuses to start, or stops (its wait for a message), and
a message to put back stays in the unacked record until the key is moved aside. A
broker that refuses writes (out of memory, or a read-only replica in a failover) is a lost
connection to kombu and Celery (``BrokerUnwritableError``): the worker takes nothing more and
reconnects with backoff until it takes writes again.

A refused message is acked and becomes exactly one dead letter (reason + what was wrong, never
the body: it holds agent content); a redelivery of the same message (same delivery tag) finds its
letter already there. Only tracescore's own tasks run: Celery's built-in tasks, callbacks, chains
and chords, and far-future ETAs are refused.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import re
import string
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from queue import Empty
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import redis
import structlog
from celery.exceptions import CPendingDeprecationWarning, WorkerShutdown
from celery.worker.consumer import Consumer
from kombu.transport import redis as _kombu_redis
from kombu.transport import virtual as _kombu_virtual
from kombu.utils import json as kombu_json

from tracing import redact
from tracing.queue import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PLAIN_ID_PATTERN,
    PLAIN_ID_RULE,
    SCORE_TASK_NAME,
    parse_json,
    plain_id,
)
from worker._errors import WorkerError
from worker._logs import CountedLog
from worker._settings import MAX_TRIES, Settings
from worker.metrics import observe_broadcast_refused
from worker.store import (
    UNACKED_MUTEX_EXPIRE_S,
    DeadLetter,
    StoreKeyTypeError,
    SyncRedisDeadLetters,
    check_list,
    checked,
    dead_letter_id,
    release_stuck_lock,
)

if TYPE_CHECKING:
    from scorers.judge import ErrorCategory
    from worker._app import TracescoreApp

# The broker transport option carrying envelope_limit(max_payload_bytes) to the channel.
MAX_ENTRY_BYTES_OPTION = "tracescore_max_entry_bytes"

__all__ = [
    "BODY_BYTES_HEADER",
    "MAX_ENTRY_BYTES_OPTION",
    "MAX_JSON_DEPTH",
    "MAX_RETRIES",
    "MAX_TRIES",
    "STORE_WAITS_HEADER",
    "BrokerUnwritableError",
    "BrokerWrites",
    "GuardedConsumer",
    "GuardedRedisTransport",
    "Refusal",
    "check_broker_keys",
    "check_message",
    "envelope_limit",
    "hand_back_held",
    "screen_broadcast",
    "screen_envelope",
]

# The header the screen adds to a message it passed: the body's size in bytes, as measured.
BODY_BYTES_HEADER = "tracescore_body_bytes"
# Counts, on a message, how many of its retries were waits for a store refusing writes (or for
# an operator to move a dead-letter list of another type aside; worker._task): not tries of its
# own, so a store full for longer than the retry budget does not leave the message at its last
# try once it takes writes again. A producer setting it only gives its message the tries it
# could have had with a lower retries header.
STORE_WAITS_HEADER = "tracescore_store_waits"
# The screen's bounds on a message's count of deliveries: its tries (retries less store waits)
# at most MAX_TRIES (the settings keep the retry budget, and the tries spent waiting for a
# claimed score, within it); its retries, waits included, at most MAX_RETRIES, past any store
# outage (a wait a second for 30 years). They keep a forged count out of the task's arithmetic
# and logs. (One bound of 1000 on the retries dead-lettered every message in flight through a
# store refusing writes for 8 hours.)
MAX_RETRIES = 10**9

# kombu's Redis transport has no type information for what is subclassed here.
kombu_redis: Any = _kombu_redis
kombu_virtual: Any = _kombu_virtual

log = structlog.get_logger("tracescore.worker.guard")
# kombu's ack/reject helpers log through a stdlib logger.
_stdlog = logging.getLogger("tracescore.worker.guard")

# Nesting deeper than this is refused: real runs stay far below it, and decoding, validating or
# serialising deeper input risks RecursionError in the worker (100k-deep JSON is a known attack).
MAX_JSON_DEPTH = 100
# The header that marks a stand-in envelope (see screen_envelope), and the one with its sentence.
REFUSED_HEADER = "x-tracescore-refused"
_DETAIL_HEADER = "x-tracescore-refused-detail"
# The transport screen's sentences, by reason: each slot is filled with what ``_SLOTS`` allows
# (which entry, a number, an exception's class, a ``_token``). A stand-in comes back to the
# consumer from Redis (a requeue stores it as it is), where a producer can write the same
# headers: a sentence that is none of these, so filled, is a producer's (``_screen_refusal``).
_SCREEN_DETAILS: dict[str, dict[str, str]] = {
    "payload_too_large": {
        "": "the {what} is {size} bytes, over the {limit} a message of TRACESCORE_MAX_PAYLOAD_BYTES can take; "
        "send fewer runs per batch"
    },
    "not_json": {"": "the {what} is not a JSON envelope kombu can read ({error})"},
    "bad_envelope": {"": "the {what} has no properties.delivery_tag (not written by kombu)"},
    "too_deep": {"": "the envelope nests deeper than {limit} levels"},
    "compression_refused": {"": "compressed bodies are refused (unbounded inflation)"},
    "bad_encoding": {
        "headers": "the envelope's headers are not an object",
        "delivery_info": "properties.delivery_info is not an object",
        "priority": "properties.priority is not an integer from 0 to 255",
        "body": "the envelope's body is not a string",
        "body_encoding": "body_encoding {token} is not base64",
        "base64": "kombu could not decode the body ({error})",
    },
}
_SLOTS = {
    "what": r"queue entry|broadcast",
    "size": r"[0-9]{1,20}",
    "limit": r"[0-9]{1,20}",
    "error": r"[A-Za-z_][A-Za-z0-9_]{0,99}",
    "token": rf"{PLAIN_ID_PATTERN}|\(not shown\)",  # (what ``_token`` shows: a plain id)
}


_REFUSED_CONTENT_TYPE = "application/x-tracescore-refused"
# A kombu envelope is the body in base64 (4/3 of it) plus headers and properties.
_ENVELOPE_OVERHEAD = 64 * 1024


_EMBED_KEYS = frozenset({"callbacks", "errbacks", "chain", "chord"})
# How long the consumer pauses after failing to record a refusal (the store is unreachable).
_STORE_DOWN_PAUSE_S = 1.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is refused: a short reason (the dead letter's ``reason``) and a sentence."""

    reason: str
    detail: str


def _token(value: Any) -> str:
    """``value`` for a dead letter or a log line only when it is a short plain token."""
    return value if plain_id(value) else "(not shown)"


def _sentence_pattern(template: str) -> str:
    """A regular expression of ``template``'s sentence, each slot what ``_SLOTS`` allows there."""
    return "".join(
        re.escape(text) + (f"(?:{_SLOTS[slot]})" if slot is not None else "")
        for text, slot, _, _ in string.Formatter().parse(template)
    )


_SCREEN_SAID = {
    reason: re.compile("|".join(f"(?:{_sentence_pattern(t)})" for t in templates.values()))
    for reason, templates in _SCREEN_DETAILS.items()
}


def _screen_detail(reason: str, which: str = "", **slots: object) -> str:
    """The screen's sentence ``which`` for ``reason``, its slots filled."""
    return _SCREEN_DETAILS[reason][which].format(**slots)


def _screen_refusal(reason: object, detail: object) -> Refusal | None:
    """The refusal a stand-in's headers hold when they are one of the screen's own reasons and
    sentences, else None."""
    if not isinstance(reason, str) or not isinstance(detail, str):
        return None
    said = _SCREEN_SAID.get(reason)
    return Refusal(reason, detail) if said is not None and said.fullmatch(detail) else None


def envelope_limit(max_payload_bytes: int) -> int:
    """The largest Redis list entry that can hold a body of ``max_payload_bytes``."""
    return max_payload_bytes * 4 // 3 + _ENVELOPE_OVERHEAD


def _stand_in(reason: str, detail: str, tag: str, routing_key: str) -> bytes:
    envelope = {
        "body": "",
        "content-type": _REFUSED_CONTENT_TYPE,
        "content-encoding": "binary",
        "headers": {REFUSED_HEADER: reason, _DETAIL_HEADER: detail},
        "properties": {
            "delivery_tag": tag,
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": routing_key},
            "priority": 0,
        },
    }
    return json.dumps(envelope).encode()


class _Refused(Exception):
    """``_read_envelope``'s answer for an entry kombu must not see (``tag``: its delivery tag, if read)."""

    def __init__(self, reason: str, detail: str, tag: str | None = None) -> None:
        super().__init__(reason)
        self.refusal = Refusal(reason, detail)
        self.tag = tag


def _read_envelope(item: bytes, max_bytes: int, what: str) -> dict[str, Any]:
    """kombu's JSON envelope of ``item`` (``what``: "queue entry" or "broadcast", for the
    messages), when kombu can make a message of it; raises ``_Refused``. The size is checked
    first, so an oversized entry is never decoded."""
    if len(item) > max_bytes:
        raise _Refused(
            "payload_too_large", _screen_detail("payload_too_large", what=what, size=len(item), limit=max_bytes)
        )
    try:
        # kombu's own reading, which the message is then built from: the screen sees what kombu
        # sees. (JSON's own parsers read more: a UTF-8 BOM, UTF-16, and objects of exactly
        # "__type__" and "__value__", which kombu decodes into values and whose errors escaped
        # the channel: the consumer crashed on such an entry each time it came back.)
        envelope = kombu_redis.loads(kombu_redis.bytes_to_str(item))
    except Exception as exc:  # ValueError, TypeError, decimal's errors, RecursionError...
        raise _Refused("not_json", _screen_detail("not_json", what=what, error=type(exc).__name__)) from None
    properties = envelope.get("properties") if isinstance(envelope, dict) else None
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    if not isinstance(tag, str) or not tag:
        raise _Refused("bad_envelope", _screen_detail("bad_envelope", what=what))
    assert isinstance(envelope, dict)
    assert isinstance(properties, dict)
    body = envelope.get("body")
    encoding = properties.get("body_encoding")
    if _too_deep(envelope, MAX_JSON_DEPTH):  # kombu re-encodes the envelope (unacked copy)
        raise _Refused("too_deep", _screen_detail("too_deep", limit=MAX_JSON_DEPTH), tag)
    headers = envelope.get("headers")
    if isinstance(headers, dict) and headers.get("compression") is not None:
        # kombu would inflate it, without a bound, while building the message.
        raise _Refused("compression_refused", _screen_detail("compression_refused"), tag)
    problem = None  # (its sentence's name in _SCREEN_DETAILS)
    if not isinstance(headers, dict | None):
        problem = "headers"
    elif not isinstance(properties.get("delivery_info", {}), dict):
        problem = "delivery_info"
    elif not _priority_ok(properties.get("priority")):
        # kombu reads it with int() when it puts the message back: an infinity there failed the
        # restore, which logged the whole envelope and dropped the message.
        problem = "priority"
    elif body is not None and not isinstance(body, str):
        problem = "body"
    elif encoding not in (None, "base64"):
        problem = "body_encoding"
    # (Broken base64 in a queue entry is caught where kombu decodes it: _ScreenedMessage.)
    if problem is not None:
        raise _Refused("bad_encoding", _screen_detail("bad_encoding", problem, token=_token(encoding)), tag)
    return envelope


def _count(value: Any, most: int) -> bool:
    """Whether ``value`` is an integer (not a bool) from 0 to ``most``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _priority_ok(priority: Any) -> bool:
    return priority is None or _count(priority, 255)


def screen_envelope(item: bytes, max_bytes: int, routing_key: str = "") -> dict[str, Any]:
    """The envelope kombu reads of ``item`` when kombu can make a message of it, else a stand-in
    envelope (same delivery tag when it has one) that the consumer refuses. The size is checked
    first, so an oversized entry is never decoded."""
    try:
        return _read_envelope(item, max_bytes, "queue entry")
    except _Refused as refused:
        tag = refused.tag or hashlib.sha256(item).hexdigest()
        envelope: dict[str, Any] = json.loads(
            _stand_in(refused.refusal.reason, refused.refusal.detail, tag, routing_key)
        )
        return envelope


def _control_commands() -> frozenset[str]:
    from celery.worker.control import Panel

    return frozenset(Panel.data)


def screen_broadcast(item: bytes, max_bytes: int, exchange: str) -> Refusal | None:
    """Why a fanout message must not reach kombu and Celery, else None.

    The one broadcast a tracescore worker listens to is Celery's remote control (``ping`` for
    ``tracescore status``, ``celery inspect``/``control``) on ``<app>.pidbox``. kombu logs a
    broadcast it cannot parse with its raw bytes, and a malformed one reaches Celery's
    handlers, which log tracebacks of what they were sent. Nothing is dead-lettered: a
    broadcast reaches every worker and is no queue's message. Only JSON bodies, and on the
    control exchange only Celery's own commands in their own shape.
    """
    try:
        envelope = _read_envelope(item, max_bytes, "broadcast")
    except _Refused as refused:
        return refused.refusal
    if envelope.get("content-type") != "application/json":
        return Refusal(
            "content_type_refused",
            f"content type {_token(envelope.get('content-type'))} refused: JSON is the only serializer",
        )
    if str(envelope.get("content-encoding") or "").lower() not in ("utf-8", "utf8"):
        return Refusal("bad_encoding", f"content encoding {_token(envelope.get('content-encoding'))} is not utf-8")
    try:
        raw = envelope.get("body") or ""
        # kombu's JSON reading, as its serializer decodes the body for the pidbox
        body = kombu_json.loads(
            base64.b64decode(raw, validate=True) if envelope["properties"].get("body_encoding") else raw
        )
    except RecursionError:
        return Refusal("too_deep", f"the body nests deeper than the decoder allows (limit {MAX_JSON_DEPTH})")
    except Exception:  # binascii.Error, UnicodeDecodeError; a "__type__" object kombu cannot decode
        return Refusal("not_json", "the body is not UTF-8 JSON kombu can read")
    if not isinstance(body, dict):
        return Refusal("bad_body", f"the body is a JSON {type(body).__name__}, not an object")
    if _too_deep(body, MAX_JSON_DEPTH):
        return Refusal("too_deep", f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    if not exchange.endswith(".pidbox"):
        return None
    method = body.get("method")
    if method not in _control_commands():
        return Refusal("unknown_command", f"{_token(method)} is not one of Celery's remote-control commands")
    problem = _control_shape_problem(body, envelope.get("headers") or {})
    return None if problem is None else Refusal("bad_body", f"the {method} command's {problem}")


def _control_shape_problem(body: dict[str, Any], headers: dict[str, Any]) -> str | None:
    """What kombu's pidbox would trip over (it passes the body as keyword arguments)."""
    destination, reply_to, clock = body.get("destination"), body.get("reply_to"), headers.get("clock")
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict) or not all(plain_id(k) for k in arguments):
        # (a key the command does not take is named in Celery's error line)
        return "arguments is not an object of plain names"
    if destination is not None and not (isinstance(destination, list) and all(isinstance(d, str) for d in destination)):
        return "destination is not a list of node names"
    if not isinstance(body.get("pattern"), str | None) or body.get("matcher") not in (None, "glob", "pcre"):
        return "pattern and matcher are not a glob or pcre pattern"
    if reply_to is not None and not (
        isinstance(reply_to, dict)
        and isinstance(reply_to.get("exchange"), str)
        and isinstance(reply_to.get("routing_key"), str)
    ):
        return "reply_to is not an exchange and a routing key"
    if not isinstance(body.get("ticket"), str | None):
        return "ticket is not a string"
    if clock is not None and (not isinstance(clock, int) or isinstance(clock, bool) or not 0 <= clock < 2**63):
        # (past 64 bits: where a Lamport clock never gets)
        return "clock header is not an integer of 64 bits"
    return None


# A broker with less room than this under maxmemory counts as full when the consumer
# (re)connects: more than the memory a reconnect itself takes (client buffers), far less than
# any real maxmemory, so a worker never waits while Redis could still take its writes.
_ROOM_BYTES = 1024 * 1024


class BrokerUnwritableError(redis.exceptions.ConnectionError, WorkerError):
    """The broker's Redis refuses writes for now. ``reason`` is ``full`` (used memory at
    ``maxmemory`` with ``noeviction``, as deployed: it refuses every write, and every command
    inside MULTI) or ``read_only`` (the endpoint is a replica: a failover under way, until the
    endpoint leads to the new primary). A connection error to kombu and Celery: the consumer takes
    nothing more and reconnects with backoff, instead of ending the worker with "Unrecoverable
    error" after taking a message off the list that it could not record as unacknowledged."""

    _category: ClassVar[ErrorCategory] = "retryable"

    def __init__(self, reason: Literal["full", "read_only"], command: str = "") -> None:
        self.reason, self.command = reason, command
        why = (
            "its used memory is at maxmemory; waiting for room (deliver or drop the sinks' backlog, or raise maxmemory)"
            if reason == "full"
            else "the endpoint is a read-only replica (a failover under way?); waiting for a primary"
        )
        self.message = f"the broker's Redis refused {command or 'a write'}: {why}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.command))


def _unwritable(exc: redis.exceptions.ResponseError, command: str = "") -> BrokerUnwritableError:
    # (raised from None by the callers: redis-py's text quotes the command, a message with it)
    return BrokerUnwritableError("read_only" if isinstance(exc, redis.exceptions.ReadOnlyError) else "full", command)


# Redis' answers that mean "no writes for now", not "this command is wrong".
_REFUSALS = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


# INFO replication's role of a read-only replica (only these: a Redis-compatible server may name
# its primary otherwise).
_REPLICA_ROLES = ("slave", "replica")


@dataclass(frozen=True, slots=True)
class BrokerWrites:
    """What a Redis' INFO says of its writes: a read-only replica or not, and its memory against
    ``maxmemory`` (refused writes only with ``noeviction``: other policies evict instead)."""

    read_only: bool
    used_bytes: int
    max_bytes: int | None  # None: no maxmemory
    noeviction: bool
    policy: str = "noeviction"  # maxmemory-policy

    @classmethod
    def read(cls, client: Any) -> BrokerWrites | None:
        """From ``client``'s INFO; None when INFO is not allowed (some managed Redis)."""
        try:
            role = client.info("replication").get("role")
            memory = client.info("memory")
        except redis.exceptions.ResponseError:
            return None
        limit = int(memory.get("maxmemory") or 0)
        return cls(
            role in _REPLICA_ROLES,
            int(memory.get("used_memory") or 0),
            limit or None,
            memory.get("maxmemory_policy") == "noeviction",
            str(memory.get("maxmemory_policy") or "noeviction"),
        )

    @property
    def evicts(self) -> bool:
        """Whether Redis drops keys when full: score records (what keeps a redelivery from
        scoring again), claims, queued messages and job states would go without a word."""
        return not self.noeviction and self.max_bytes is not None

    def eviction_problem(self, what: str, url: str) -> str | None:
        """The one line refusing a Redis that evicts, naming ``what`` (broker, score store)."""
        if not self.evicts:
            return None
        return (
            f"the {what} at {redact(url)} evicts keys when full (maxmemory-policy {self.policy}): it would drop"
            " score records, claims and queued runs without a word (scores lost or made twice); set"
            " maxmemory-policy to noeviction (CONFIG SET maxmemory-policy noeviction, or a managed"
            " Redis' parameter group)"
        )

    def full(self, room_bytes: int = 0) -> bool:
        """Whether Redis refuses writes for want of memory, or has less than ``room_bytes`` left."""
        return self.noeviction and self.max_bytes is not None and self.used_bytes > self.max_bytes - room_bytes


class _BrokerPipeline(redis.client.Pipeline):
    """kombu's pipelines and transactions, with Redis' refusals as ``BrokerUnwritableError``."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return super().execute(raise_on_error)
        except _REFUSALS as exc:
            raise _unwritable(exc) from None


class _BrokerRedis(redis.Redis):
    """kombu's client, with Redis refusing writes (full, or a read-only replica) as
    ``BrokerUnwritableError``, a connection error to kombu and Celery."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> _BrokerPipeline:
        return _BrokerPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    def ping(self, **kwargs: Any) -> Any:
        """kombu's check of a new channel: inside MULTI (a full Redis refuses any command queued
        there), on a primary, and with ``noeviction`` a little room to spare (``_ROOM_BYTES``). A
        broker that cannot take writes counts as not connected, and Celery retries with its
        backoff. (kombu declares the queue inside MULTI too: a consumer that connected at a
        moment of room failed there at once, and restarted many times a second while the memory
        hovered at the limit.)"""
        with self.pipeline() as pipe:
            pipe.ping()
            pong = pipe.execute()[0]
        writes = BrokerWrites.read(self)  # (None: INFO not allowed here, the MULTI check alone)
        if writes is not None and writes.read_only:
            raise BrokerUnwritableError("read_only", "a new connection")
        if writes is not None and writes.full(_ROOM_BYTES):
            raise BrokerUnwritableError("full", "a new connection")
        return pong

    def parse_response(self, connection: Any, command_name: str | bytes, **options: Any) -> Any:
        try:
            response = super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]
        except _REFUSALS as exc:
            name = command_name.decode(errors="replace") if isinstance(command_name, bytes) else str(command_name)
            raise _unwritable(exc, name.split(" ", 1)[0].upper()) from None
        return response


class _ScreenedMessage(kombu_virtual.Message):  # type: ignore[misc]  # Any base
    """kombu's message; one it cannot build (a body that is not valid base64) becomes a
    stand-in the consumer refuses, instead of an exception that ends the worker."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        try:
            super().__init__(payload, channel=channel, **kwargs)
        except Exception as exc:
            properties = payload.get("properties") if isinstance(payload, dict) else None
            tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
            if not isinstance(tag, str) or not tag:
                tag = hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()
            detail = _screen_detail("bad_encoding", "base64", error=type(exc).__name__)
            stand_in = _stand_in("bad_encoding", detail, tag, "")
            super().__init__(json.loads(stand_in), channel=channel, **kwargs)


# How a message is taken off its queue: one script reads it, records it as unacknowledged under a
# tag of the taker's (the take tag) and only then pops it, so whatever Redis did is in Redis. With
# kombu's BRPOP, Redis dying after the pop and before its reply reached the worker lost the
# message: off the list, in no record, in no memory. The record is written before the pop, so a
# Redis that refuses writes (full: ZADD is refused; read-only) changes nothing. The pop is an
# LTRIM: RPOP would hand the entry to Lua once more, and each pass of a large entry is copies
# (bench/take.py). KEYS: the queues' lists in kombu's order, then the unacked hash and its index;
# ARGV: the take tag, the time, then each list's queue name as JSON. The record is kombu's
# ``[payload, exchange, routing key]`` with the anonymous exchange, which routes back to that
# queue; built from the entry as it is, so a hostile entry that is not JSON makes a record that
# is not JSON either (``_taken_record`` reads it).
_TAKE = """
local lists = #KEYS - 2
for i = 1, lists do
  local raw = redis.call('LINDEX', KEYS[i], -1)
  if raw then
    redis.call('ZADD', KEYS[lists + 2], ARGV[2], ARGV[1])
    redis.call('HSET', KEYS[lists + 1], ARGV[1], '[' .. raw .. ', "", ' .. ARGV[2 + i] .. ']')
    redis.call('LTRIM', KEYS[i], 0, -2)
    return {raw, i}
  end
end
return false
"""

# Take tags whose message may sit in the unacked record under that tag, and that no consumer is
# delivering any more: the take's reply or the record's rename (``_GuardedQoS.append``) did not
# come back. Requeued by the next channel that reaches Redis (``_GuardedChannel._requeue_taken``),
# else by the visibility sweep. (Only failed takes: another consumer of the process must never
# requeue a message being delivered.)
_taken: list[str] = []
# The take tag of each message taken and being delivered (not yet renamed), by its delivery tag.
_take_of: dict[str, str] = {}
_taken_lock = threading.Lock()
_REFUSED = object()  # _requeue_taken's answer when Redis refused the writes (full, read-only)
# The visibility sweep runs on the consumer's event loop, where the worker also takes, acks and
# answers: one call of it holds the loop at most SWEEP_SLICE_S (plus one message's restore), and a
# pass over a backlog goes on SWEEP_PAUSE_S later, the loop serving its own work in between.
# Whole, a sweep of 100,000 due messages held it 49.7 s (10,000: 4.5 s), after a mass outage.
SWEEP_SLICE_S = 0.1
SWEEP_PAUSE_S = 0.01
SWEEP_PAGE = 100  # tags read a command; kombu's own page when its unacked_restore_limit is set
_TAKEN_RECORD = re.compile(rb'\A\[(.*), "", ("(?:[^"\\]|\\.)*")\]\Z', re.DOTALL)


def _remember_take(take: str) -> None:
    with _taken_lock:
        _taken.append(take)


def _forget_take(take: str) -> None:
    with _taken_lock:
        if take in _taken:
            _taken.remove(take)


def _taken_record(raw: bytes) -> tuple[bytes, str] | None:
    """The queue entry and its queue in a take's record of an entry kombu cannot restore (not
    JSON, or not an object: see ``_TAKE``)."""
    match = _TAKEN_RECORD.match(raw)
    if match is None:
        return None
    queue = json.loads(match.group(2))
    return (match.group(1), queue) if isinstance(queue, str) else None


def _unreachable(exc: BaseException) -> str:
    """The reason logged for a broker write that failed on the connection: ``unanswered:``
    when it timed out (sent, perhaps applied, no answer), else ``unreachable:`` (not applied)."""
    timed_out = isinstance(exc, redis.exceptions.TimeoutError | TimeoutError)
    return f"{'unanswered' if timed_out else 'unreachable'}:{type(exc).__name__}"


class _GuardedQoS(kombu_redis.QoS):  # type: ignore[misc]  # Any base
    """kombu's record of unacknowledged messages (the ``unacked`` hash and its index), where kombu
    could lose a message:

    - a key of another Redis type there (hand-edited) failed that record, so the worker exited
      and the message was gone, and failed the start-up restore too: such a key holds no
      message of kombu's, so it is repaired (``store_keys_repaired``, where ``unacked``) on
      every path that writes or reads the record, and the command made again;
    - a message is taken with its record under a take tag (``_TAKE``); ``append`` moves the
      record to the message's own delivery tag, in one transaction. Redis going away or refusing
      writes (``BrokerUnwritableError``: full, or a read-only replica) before that leaves it
      under the take tag (``message_held_for_requeue``), and no more is taken until it is back
      in its queue (``_brpop_start``);
    - an ack or a requeue Redis refuses leaves the message in the hash for the sweep
      (``message_left_unacked``), as does a requeue while Redis is away.

    The sweep (``restore_visible``) is kombu's, in slices of ``SWEEP_SLICE_S``: see there.
    """

    # The sweep's pass under way: the oldest score it puts back (what was due when it began),
    # how many due records it has left in the index (held), and whether its next slice is
    # scheduled on the event loop.
    _sweep_ceil: float | None = None
    _sweep_left = 0
    _sweep_scheduled = False

    def _checked(self, call: Callable[[], Any]) -> Any:
        checks = [(self.unacked_key, "hash", False), (self.unacked_index_key, "zset", False)]
        return checked(self.channel.client, "unacked", checks, call)

    def append(self, message: Any, delivery_tag: str) -> None:
        with _taken_lock:
            take = _take_of.pop(delivery_tag, None)
        if take is None:  # not taken by the script (kombu's basic_get): kombu's own record
            self._checked(lambda: super(_GuardedQoS, self).append(message, delivery_tag))
            return
        info = message.delivery_info or {}
        record = kombu_redis.dumps([message._raw, info.get("exchange", ""), info.get("routing_key", "")])

        def rename() -> None:
            with self.pipe_or_acquire() as pipe:
                pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
                pipe.hset(self.unacked_key, delivery_tag, record)
                pipe.zrem(self.unacked_index_key, take)
                pipe.hdel(self.unacked_key, take)
                pipe.execute()

        try:
            self._checked(rename)
        except self.channel.connection_errors:
            _remember_take(take)  # (a rename that did reach Redis leaves nothing under it: no-op)
            log.warning("message_held_for_requeue", delivery_tag=_token(delivery_tag), held=len(_taken))
            raise
        kombu_virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        try:
            self._checked(lambda: super(_GuardedQoS, self).ack(delivery_tag))
        except BrokerUnwritableError as exc:
            self._left_unacked(delivery_tag, "ack", exc.reason)
        except self.channel.connection_errors as exc:
            self._left_unacked(delivery_tag, "ack", _unreachable(exc))

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            self._checked(lambda: super(_GuardedQoS, self).reject(delivery_tag, requeue=requeue))
        except BrokerUnwritableError as exc:
            self._left_unacked(delivery_tag, "reject", exc.reason)
        except self.channel.connection_errors as exc:
            # Redis away (a worker stopped during an outage hands its batches back): the record
            # stays for the sweep, as above. Raised, kombu logged "Couldn't reject" at CRITICAL
            # with a traceback per message, read as a crash that lost it.
            self._left_unacked(delivery_tag, "reject", _unreachable(exc))

    def _left_unacked(self, delivery_tag: str, after: str, reason: str) -> None:
        """Redis refused the write (full, read-only) or did not answer it, so the message stays in
        its unacked record: the sweep brings it back once Redis takes writes (whatever was stored
        of it is skipped then). Forgotten here, or its prefetch slot stayed taken and the worker
        took nothing more. (An ack on a connection a failover left half-open timed out, and the
        worker, its one slot taken, never waited for a message again: nothing told Celery to
        reconnect, and kombu checks only a wait that is under way.)

        A write that timed out (``unanswered:``) may have been applied before its answer was lost
        (a Redis that stalled after it, a reply that never came back): then the message is gone,
        acked (or back in its queue), and the sweep finds nothing. Its line says the outcome is
        unknown (``message_outcome_unknown``): "left unacked" sent operators looking for (or
        putting back) a message that was done."""
        kombu_virtual.QoS.ack(self, delivery_tag)
        event = "message_outcome_unknown" if reason.startswith("unanswered:") else "message_left_unacked"
        log.warning(event, delivery_tag=_token(delivery_tag), after=after, reason=reason)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """kombu's sweep: every due message (taken more than the visibility timeout ago) back to
        its queue, each in its own WATCH transaction (``restore_by_tag``), under kombu's
        ``unacked_mutex``, newest first; kombu's ``interval`` throttle. kombu read and restored
        every due message in one call, on the event loop: after a mass outage the worker took,
        acked and answered nothing for as long (49.7 s for 100,000). A pass now restores for
        ``SWEEP_SLICE_S`` a call, releases the lock, and goes on ``SWEEP_PAUSE_S`` later on the
        worker's event loop (``_sweep_on``), or at the next call without one (kombu's
        ``drain_events``). The records it leaves (held: ``message_restore_held``) are counted
        and skipped, so a page of them never stops the pass; one skipped by a count that another
        sweeper's restores shifted is the next pass's. Each message is still restored once:
        the transaction finds it gone if another sweeper (or slice) restored it meanwhile."""
        if self._sweep_ceil is None:  # no pass under way: kombu's throttle
            self._vrestore_count += 1
            if (self._vrestore_count - 1) % (interval or 1):
                return
        elif self._sweep_scheduled:
            return  # the pass goes on from the loop
        self._sweep_slice(num or SWEEP_PAGE)

    def _sweep_slice(self, page: int) -> None:
        try:
            # A lock nobody can take turned the sweep off for good, without a word.
            with self.channel.conn_or_acquire() as client:
                release_stuck_lock(client, "unacked_mutex", self.unacked_mutex_key)
            more = self._checked(partial(self._sweep, page))
        except BrokerUnwritableError:
            # Nothing can be put back while Redis refuses writes: the next sweep tries again. (A
            # connection error here failed the consumer's reconnect, many times a second.)
            return
        loop = getattr(self.channel.connection, "sweep_loop", None)
        if more and loop is not None:
            self._sweep_scheduled = True
            loop.call_later(SWEEP_PAUSE_S, self._sweep_on, page)

    def _sweep_on(self, page: int) -> None:
        """The pass's next slice, from the event loop. A connection error leaves the pass to the
        next call of kombu's timer (which reconnects meanwhile); the channel closed ends it."""
        self._sweep_scheduled = False
        if self._sweep_ceil is None or self.channel.closed:
            return
        try:
            self._sweep_slice(page)
        except self.channel.connection_errors:
            return
        except Exception as exc:  # (raised into the loop, it would stop the consumer)
            self._sweep_ceil = None
            log.warning("sweep_failed", error=type(exc).__name__)

    def _sweep(self, page: int) -> bool:
        """One slice of the pass (one begun if none is); True when due records remain."""
        deadline = time.monotonic() + SWEEP_SLICE_S
        if self._sweep_ceil is None:
            self._sweep_ceil, self._sweep_left = time.time() - self.visibility_timeout, 0
        with self.channel.conn_or_acquire() as client:
            try:
                with kombu_redis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    while time.monotonic() < deadline:
                        # as kombu's (ZRANGE ... BYSCORE REV); past what this pass left in place
                        due = client.zrange(
                            self.unacked_index_key, self._sweep_ceil, 0,
                            desc=True, byscore=True, offset=self._sweep_left, num=page,
                        )  # fmt: skip
                        if not due:
                            self._sweep_ceil = None
                            return False
                        for tag in due:
                            if not self.restore_by_tag(tag, client):
                                self._sweep_left += 1
                            if time.monotonic() >= deadline:
                                break
            except kombu_redis.MutexHeld:
                self._sweep_ceil = None  # another worker sweeps: as kombu's, this one stops
                return False
        return True

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> bool:
        """kombu's, except that a message whose queue key holds another Redis type stays in the
        unacked record (``message_restore_held``) for a later sweep: kombu took it out of the
        record and then failed to push it, in one transaction, and the message was gone. A take's
        record of an entry that is not JSON (``_TAKE``) puts the entry back as it was, for the
        screen to refuse when it is taken again. False when the record stays (held)."""
        channel: _GuardedChannel = self.channel
        held = False

        def restore_transaction(pipe: Any) -> None:
            nonlocal held
            held = False  # (run again when a watched key changed)
            raw = pipe.hget(self.unacked_key, tag)
            entry: tuple[bytes, str] | None = None
            if raw:
                try:
                    payload, exchange, routing_key = kombu_redis.loads(kombu_redis.bytes_to_str(raw))  # as kombu's
                except Exception:  # a hostile entry: ValueError, TypeError, decimal's errors...
                    payload = None
                if not isinstance(payload, dict):  # (kombu would log it whole, then drop it)
                    entry = _taken_record(raw)
                    if entry is None:
                        log.warning("message_restore_held", delivery_tag=_token(tag), error="unreadable_record")
                        held = True
                        return
                    payload, exchange, routing_key = {}, "", entry[1]
                why = channel._cannot_restore(pipe, payload, exchange, routing_key, watch=True)
                if why is not None:
                    log.warning("message_restore_held", delivery_tag=_token(tag), **why)
                    held = True
                    return
            pipe.multi()
            self._remove_from_indices(tag, pipe)
            if entry is not None:
                pipe.lpush(entry[1], entry[0]) if leftmost else pipe.rpush(entry[1], entry[0])
            elif raw:
                channel._do_restore_message(payload, exchange, routing_key, pipe, leftmost)

        with channel.conn_or_acquire(client) as client:
            client.transaction(restore_transaction, self.unacked_key)
        return not held


def _refused_list(client: Any, keys: list[str]) -> StoreKeyTypeError | None:
    """Why the first of ``keys`` (kombu's queue lists) holding another Redis type is refused."""
    try:
        for key in keys:
            check_list(client, key)
    except StoreKeyTypeError as exc:
        return exc
    return None


def hand_back_held(app: Any) -> None:
    """At a worker's exit: the messages whose record is still under its take tag (Redis was away
    or refused writes) go back to their queue through a new channel. Those that cannot (Redis
    still away or full) stay in the unacked record, for the visibility sweep to requeue
    (``held_messages_left_for_sweep``)."""
    if not _taken:
        return
    error = ""
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=0)  # one try: the worker is on its way out
            channel = connection.channel()
            try:
                channel._requeue_taken()
            finally:
                channel.close()
    except Exception as exc:
        error = type(exc).__name__
    if _taken:
        log.warning("held_messages_left_for_sweep", messages=len(_taken), error=error or "refused")


def check_broker_keys(client: redis.Redis, queue: str) -> None:
    """kombu's keys on the broker as kombu keeps them, before a worker consumes: one of another
    Redis type ended the worker with "Unrecoverable error: ResponseError" and a traceback.
    ``queue``'s list holds messages: of another type it is refused (``StoreKeyTypeError``, for
    the operator to move aside); the binding tables and the unacked record hold no message when
    of another type, and kombu rebuilds them: repaired (``store_keys_repaired``)."""
    check_list(client, queue)
    channel = kombu_redis.Channel
    rebuilt = [
        *((channel.keyprefix_queue % exchange, "set") for exchange in (queue, "celery.pidbox")),
        *((channel.keyprefix_binding_permanent % exchange, "set") for exchange in (queue, "celery.pidbox")),
        (channel.keyprefix_binding_deadlines, "zset"),
        (channel.unacked_key, "hash"),
        (channel.unacked_index_key, "zset"),
    ]

    def read_each() -> None:  # a read of each key's own type: WRONGTYPE names a key to repair
        pipe = client.pipeline(transaction=False)
        for key, kind in rebuilt:
            {"set": pipe.scard, "hash": pipe.hlen, "zset": pipe.zcard}[kind](key)
        pipe.execute()

    checked(client, "kombu_keys", [(key, kind, False) for key, kind in rebuilt], read_each)


class _GuardedChannel(kombu_redis.Channel):  # type: ignore[misc]  # Any base
    Message = _ScreenedMessage
    QoS = _GuardedQoS
    unacked_mutex_expire = UNACKED_MUTEX_EXPIRE_S  # (kombu's 300 s: see the constant)

    @cached_property
    def _take_script(self) -> Any:
        return self.client.register_script(_TAKE)

    def _brpop_start(self, timeout: Any = None) -> Any:
        """Wait for a message on the first queue's list (``_brpop_read`` then takes one from any
        of them, so another queue or priority waits at most ``brpop_timeout``). The wait is a
        rotation of the list onto itself, which leaves it as it was: Redis has no blocking read
        of a list that pops nothing. kombu's BRPOP when the keys carry a global prefix (never set
        by tracescore)."""
        if _taken and self._requeue_taken() is _REFUSED:
            # Redis is up but takes no writes: take nothing more off the list, which it could not
            # record either. kombu calls this again on its next poll (within a second).
            return None
        if self.global_keyprefix:
            return super()._brpop_start(timeout)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        key = self._q_for_pri(queues[0], self.priority_steps[0])
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self.client.connection.send_command(
            "BLMOVE", key, key, "RIGHT", "RIGHT", self.brpop_timeout if timeout is None else timeout
        )
        return None

    def close(self) -> None:
        if _taken:
            try:
                self._requeue_taken()  # (a consumer restarting, or stopping: a chance to hand them back)
            except Exception as exc:  # never in the way of the close
                log.warning("held_messages_not_requeued", held=len(_taken), error=type(exc).__name__)
        super().close()

    def _requeue_taken(self) -> object:
        """Put the messages recorded under a take tag back to their queue; ``_REFUSED`` when Redis
        refused the writes (they stay). Redis away: they stay too, and the wait that follows
        fails over to Celery's reconnect."""
        with _taken_lock:
            takes = list(_taken)
        done = 0
        try:
            with self.conn_or_acquire() as client:

                def requeue(take: str) -> bool:
                    recorded = bool(client.hexists(self.unacked_key, take))  # (or never taken, or renamed)
                    self.qos.restore_by_tag(take, client)
                    return recorded

                for take in takes:
                    recorded = self.qos._checked(partial(requeue, take))
                    _forget_take(take)
                    done += recorded
        except self.connection_errors as exc:
            return _REFUSED if isinstance(exc, BrokerUnwritableError) else None
        finally:
            if done:
                log.info("held_messages_requeued", messages=done, still_held=len(_taken))
        return None

    def _take(self) -> tuple[dict[str, Any], str] | None:
        """One message off the active queues' lists (kombu's order: by priority, then queue),
        recorded as unacknowledged under a fresh take tag; None when they are empty."""
        queues = self._queue_cycle.consume(len(self.active_queues))
        pairs = [(self._q_for_pri(queue, pri), queue) for pri in self.priority_steps for queue in queues]
        take = uuid.uuid4().hex
        keys = [key for key, _ in pairs] + [self.unacked_key, self.unacked_index_key]
        args = [take, time.time(), *(json.dumps(queue) for _, queue in pairs)]
        checks = [(self.unacked_key, "hash", False), (self.unacked_index_key, "zset", False)]
        try:
            answer = checked(self.client, "unacked", checks, lambda: self._take_script(keys, args))
        except (BrokerUnwritableError, redis.ResponseError):
            raise  # Redis answered, refusing before the pop: nothing was taken
        except self.connection_errors:
            _remember_take(take)  # the reply may be lost after the script ran
            raise
        if not answer:
            return None
        raw, index = answer
        queue = pairs[int(index) - 1][1]
        payload = screen_envelope(raw if isinstance(raw, bytes) else str(raw).encode(), self._entry_limit(), queue)
        with _taken_lock:
            _take_of[payload["properties"]["delivery_tag"]] = take
        self._queue_cycle.rotate(queue)
        return payload, queue

    def _cannot_restore(
        self, client: Any, payload: dict[str, Any], exchange: str, routing_key: str, *, watch: bool = False
    ) -> dict[str, str] | None:
        """Why ``payload`` cannot go back to its queue now (None: it can), as log fields. kombu
        would take it out of the unacked record and push it nowhere (no queue bound, a queue key
        of another Redis type), or log it whole: it stays where it is. ``watch``: inside a
        transaction, a change of the queue keys before EXEC makes redis-py run it again."""
        try:
            priority = self._get_message_priority(payload, reverse=False)
            keys = [self._q_for_pri(queue, priority) for queue in self._lookup(exchange, routing_key)]
        except self.connection_errors:
            raise
        except Exception as exc:
            return {"error": type(exc).__name__}
        if not keys:
            return {"error": "no_queue_bound"}
        if watch:
            client.watch(*keys)
        refused = _refused_list(client, keys)
        return None if refused is None else {"key": refused.key, "found": refused.found}

    def _brpop_read(self, **options: Any) -> Any:
        """After the wait, one message taken and delivered (``_take``); kombu's with a global key
        prefix. A queue key of another Redis type (set while the queue was empty) stops the worker
        as it would have refused to start: one line, the key kept, the running tasks finished (a
        warm shutdown). It ended with "Unrecoverable error" and a traceback."""
        try:
            if self.global_keyprefix:
                return super()._brpop_read(**options)
            try:
                try:
                    self.client.parse_response(self.client.connection, "BLMOVE", **options)
                    taken = self._take()
                except self.connection_errors:
                    self.client.connection.disconnect()  # (as kombu: the next poll reconnects)
                    raise
                if taken is None:
                    raise Empty()
                payload, queue = taken
                try:
                    self.connection._deliver(payload, queue)
                except BaseException:
                    with _taken_lock:  # (not recorded by kombu: its take's record is the message's)
                        take = _take_of.pop(payload["properties"]["delivery_tag"], None)
                    if take is not None:
                        _remember_take(take)
                    raise
                return True
            finally:
                self._in_poll = None
                self._flush_brpop_reauth()
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in self.active_queues]
            with self.conn_or_acquire() as client:
                refused = _refused_list(client, keys)
            if refused is None:
                raise  # (moved aside meanwhile: kombu's own error, and Celery's restart)
            log.critical("worker_stopped", reason="queue_key_wrong_type", key=refused.key, found=refused.found)
            sys.stderr.write(f"tracescore worker stopped: the broker's queue: {refused}\n")
            raise WorkerShutdown(1) from None

    def _entry_limit(self) -> int:
        # the app's settings, through its broker transport options (see configure_app)
        limit = self.connection.client.transport_options.get(MAX_ENTRY_BYTES_OPTION)
        return limit if isinstance(limit, int) else envelope_limit(DEFAULT_MAX_PAYLOAD_BYTES)

    def _get_client(self) -> Any:
        client = super()._get_client()
        if client is not redis.Redis:
            return client  # a global_keyprefix client: kombu's own (refusals stay kombu's errors)
        return _BrokerRedis

    def _handle_message(self, client: Any, response: Any) -> Any:
        """A broadcast (Redis pub/sub) as kombu reads it; a refused one becomes a reply kombu
        skips (its type is no ``message``)."""
        payload = super()._handle_message(client, response)
        kind, data = payload.get("type"), payload.get("data")
        if kind not in (b"message", b"pmessage", "message", "pmessage") or not data:
            return payload
        channel = payload["channel"]
        channel = channel.decode(errors="replace") if isinstance(channel, bytes) else str(channel)
        # as kombu reads it: "/<db>.<exchange>/<routing key>"
        exchange = (channel.partition(".")[2] if channel.startswith("/") else channel).split("/", 1)[0]
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8", "surrogatepass")
        try:
            refusal = screen_broadcast(raw, self._entry_limit(), exchange)
        except Exception as exc:  # the screen itself must never take the consumer down
            refusal = Refusal("unreadable", f"the broadcast could not be screened ({type(exc).__name__})")
        if refusal is None:
            return payload
        log.warning(
            "broadcast_refused", reason=refusal.reason, detail=refusal.detail, exchange=_token(exchange), size=len(raw)
        )
        observe_broadcast_refused(refusal.reason)
        return {**payload, "type": b"refused", "data": None}

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            # On a broker disconnect Celery's consumer collects the connection (kombu drops
            # transport.client) and then closes it once more. That close restores the unacked
            # messages through a new client, and kombu read the dropped client's host name: an
            # AttributeError Celery does not ignore, and the worker exited. A connection error is
            # ignored; the messages stay in Redis' unacked hash, which the visibility-timeout
            # sweep restores. A channel closed with its connection (a task publishing its retry
            # as the broker went away) has none at all: the same connection error, which the
            # publisher retries, instead of an AttributeError.
            raise redis.exceptions.ConnectionError("the broker connection was closed after a disconnect")
        return super()._connparams(asynchronous)


class GuardedRedisTransport(kombu_redis.Transport):  # type: ignore[misc]  # Any base
    """kombu's Redis transport (``redis://`` and ``rediss://``) with entries screened."""

    Channel = _GuardedChannel
    sweep_loop: Any = None  # the worker's event loop (a kombu Hub), where the sweep goes on

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        self.sweep_loop = loop  # (before kombu's, whose first sweep it schedules)
        super().register_with_event_loop(connection, loop)


def _parse_time(value: Any) -> dt.datetime:
    if not isinstance(value, str):
        raise ValueError("not an ISO 8601 string")
    when = dt.datetime.fromisoformat(value)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests deeper than ``limit``: one level at a time, the
    cheapest walk in Python (this runs on every message)."""
    level = [value]
    for _ in range(limit):
        deeper: list[Any] = []
        for node in level:
            children = node.values() if node.__class__ is dict else node
            deeper += [c for c in children if c.__class__ is dict or c.__class__ is list]
        if not deeper:
            return False
        level = deeper
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> bool:
    """Whether decoded JSON ``value`` holds a string (or key) with a lone surrogate in it."""
    stack = [value]
    while stack:
        node = stack.pop()
        if node.__class__ is str:
            if _SURROGATE.search(node):
                return True
        elif node.__class__ is dict:
            stack += node.keys()
            stack += node.values()
        elif node.__class__ is list:
            stack += node
    return False


_KOMBU_TYPED_KEYS = {"__type__", "__value__"}


def _kombu_typed(value: Any) -> bool:
    """Whether decoded JSON ``value`` holds an object kombu's JSON reader turns into a value."""
    stack = [value]
    while stack:
        node = stack.pop()
        if node.__class__ is dict:
            if node.keys() == _KOMBU_TYPED_KEYS:
                return True
            stack += node.values()
        elif node.__class__ is list:
            stack += node
    return False


def _check_headers(headers: dict[str, Any], settings: Settings, allowed: frozenset[str]) -> Refusal | None:
    name = headers.get("task")
    if not isinstance(name, str) or name not in allowed:  # a list or an object: not even hashable
        return Refusal(
            "unknown_task",
            f"task {_token(name)} is not one of tracescore's ({', '.join(sorted(allowed))}); "
            "Celery's built-in tasks and other apps' tasks do not run on tracescore workers",
        )
    task_id = headers.get("id")
    # Celery logs it ("Task <name>[<id>] received"), and so does the task: a UUID, or a plain id.
    if not plain_id(task_id):
        return Refusal("bad_headers", f"the id header is not a plain id ({PLAIN_ID_RULE})")
    if headers.get("shadow") is not None:
        # Celery logs a task by this name in place of its own; tracescore's producers send none.
        return Refusal("bad_headers", "the shadow header is set; tracescore tasks run under their own name")
    retries = headers.get("retries", 0)
    if not _count(retries, MAX_RETRIES):
        return Refusal("bad_headers", f"the retries header is not an integer from 0 to {MAX_RETRIES}")
    waits = headers.get(STORE_WAITS_HEADER, 0)
    if not _count(waits, retries):
        return Refusal("bad_headers", f"the {STORE_WAITS_HEADER} header is not an integer from 0 to the retries header")
    if retries - waits > MAX_TRIES:
        return Refusal(
            "bad_headers", f"the retries header less {STORE_WAITS_HEADER} (the message's tries) is over {MAX_TRIES}"
        )
    if headers.get("expires") is not None:
        # Celery would drop an expired task with no trace; runs are never meant to expire.
        return Refusal("bad_headers", "the expires header is set; tracescore tasks do not expire")
    if headers.get("eta") is not None:
        try:
            when = _parse_time(headers["eta"])
        except ValueError:
            return Refusal("bad_headers", "the eta header is not an ISO 8601 time")
        ahead = when.timestamp() - time.time()
        if ahead > settings.max_eta_seconds:
            return Refusal(
                "eta_too_far",
                f"eta is {ahead:.0f} s ahead, over TRACESCORE_MAX_ETA_SECONDS ({settings.max_eta_seconds:g})",
            )
    limits = headers.get("timelimit")
    if limits is not None:
        ours = (settings.task_soft_time_limit, settings.task_time_limit)
        if (
            not isinstance(limits, list | tuple)
            or len(limits) != 2
            or any(
                v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= cap)
                for v, cap in zip(limits, ours[::-1], strict=True)
            )
        ):
            return Refusal(
                "bad_headers",
                f"timelimit must be [hard, soft] seconds within the worker's ({ours[1]:g}, {ours[0]:g}) or null",
            )
    for field in ("group", "root_id", "parent_id"):
        if headers.get(field) is not None and not isinstance(headers.get(field), str):
            return Refusal("bad_headers", f"the {field} header is not a string")
    return None


def check_message(message: Any, settings: Settings, allowed: frozenset[str]) -> tuple[Refusal | None, Any]:
    """Screen one kombu message; returns (refusal or None, the decoded body when it got that far).
    A message that passes carries its body's size in bytes in the ``BODY_BYTES_HEADER`` header."""
    headers = message.headers
    if isinstance(headers, dict) and REFUSED_HEADER in headers:
        refusal = _screen_refusal(headers.get(REFUSED_HEADER), headers.get(_DETAIL_HEADER))
        if refusal is None:
            # A producer's: its reason would be a dead letter's (a metric's label) of its choosing,
            # its sentence the letter's error, shown by `tracescore dlq list`.
            why = f"the {REFUSED_HEADER} header is set by the workers' own screen only, never by a producer"
            return Refusal("bad_headers", why), None
        return refusal, None
    if not isinstance(headers, dict) or "task" not in headers:
        return Refusal("not_a_task", "no task header: only Celery task messages (protocol 2) are accepted"), None
    refusal = _check_headers(headers, settings, allowed)
    if refusal is not None:
        return refusal, None
    body = message.body
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if not isinstance(raw, bytes | bytearray | memoryview):
        return Refusal("bad_body", "the body is not bytes"), None
    if len(raw) > settings.max_payload_bytes:
        return Refusal(
            "payload_too_large",
            f"message is {len(raw)} bytes; TRACESCORE_MAX_PAYLOAD_BYTES is {settings.max_payload_bytes}"
            " — send fewer runs per batch",
        ), None
    if message.content_type != "application/json":
        return Refusal(
            "content_type_refused",
            f"content type {_token(message.content_type)} refused: JSON (application/json) is the only serializer",
        ), None
    if str(message.content_encoding or "").lower() not in ("utf-8", "utf8"):
        return Refusal("bad_encoding", f"content encoding {_token(message.content_encoding)} is not utf-8"), None
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        return Refusal("bad_encoding", f"the body is not valid UTF-8 (byte {exc.start})"), None
    try:
        decoded = parse_json(text)
    except RecursionError:
        return Refusal("too_deep", f"the body nests deeper than the decoder allows (limit {MAX_JSON_DEPTH})"), None
    except ValueError as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        return Refusal("not_json", f"the body is not JSON{where}"), None
    if ("\\ud" in text or "\\uD" in text) and _lone_surrogate(decoded):
        # No store, log or sink can write it as UTF-8: the task's letter, and its fallback, failed
        # to be written, and the message was requeued for ever. (A pair escaped is a character.)
        return Refusal(
            "bad_encoding",
            "the body holds a lone surrogate (a \\ud800-\\udfff escape that is no character); producers write"
            " U+FFFD in its place (tracing.queue.request_json)",
        ), None
    if ("__type__" in text or "\\u" in text) and _kombu_typed(decoded):
        # The pool's child reads the body with kombu's JSON reader, which makes a value of such
        # an object (bytes, a UUID, a Decimal) or fails; no producer sends one. (Its key may be
        # written with escapes, "\u005f_type__": the walk then too.)
        return Refusal(
            "bad_body", 'the body holds an object of exactly "__type__" and "__value__", which kombu decodes'
        ), None
    if not (
        isinstance(decoded, list)
        and len(decoded) == 3
        and isinstance(decoded[0], list)
        and isinstance(decoded[1], dict)
        and isinstance(decoded[2], dict | None)
    ):
        return Refusal(
            "bad_body", f"the body is a JSON {type(decoded).__name__}, not the [args, kwargs, embed] of a task"
        ), decoded
    args, kwargs, embed = decoded
    if len(args) != 1 or kwargs or not isinstance(args[0], dict):
        return Refusal(
            "bad_arguments",
            f"{headers['task']} takes exactly one argument, a ScoreBatch object "
            f"(got {len(args)} positional, {len(kwargs)} keyword)",
        ), decoded
    batch_id = args[0].get("batch_id")
    if isinstance(batch_id, str) and not plain_id(batch_id):
        # The task logs a batch's id (and keeps it in its letter): text of any length or content
        # there, agent content or a secret by a producer's mistake, would go to the log as is.
        # (An id of another type is the task's invalid_payload letter, payload kept.)
        return Refusal(
            "invalid_payload",
            f"not a ScoreBatch: batch_id is not a plain id ({PLAIN_ID_RULE})",
        ), decoded
    if embed and any(embed.get(k) for k in _EMBED_KEYS):
        return Refusal(
            "callbacks_refused", "callbacks, errbacks, chains and chords do not run on tracescore workers"
        ), decoded
    if embed and not embed.keys() <= _EMBED_KEYS:
        # Celery copies every embed key onto the task's request, over the screened headers
        # (retries, the body size noted below): only the four protocol keys are allowed.
        extra = sorted(k for k in embed if k not in _EMBED_KEYS)
        return Refusal(
            "bad_body",
            f"the embed holds {len(extra)} key(s) besides callbacks, errbacks, chain and chord "
            f"({', '.join(_token(k) for k in extra[:3])})",
        ), decoded
    if _too_deep(args[0], MAX_JSON_DEPTH):
        return Refusal("too_deep", f"the batch nests deeper than {MAX_JSON_DEPTH} levels"), decoded
    # Set here, after the screen, so a producer's own value never gets through: the task reads
    # the size measured here instead of serializing the batch again to measure it.
    headers[BODY_BYTES_HEADER] = len(raw)
    return None, decoded


class GuardedConsumer(Consumer):
    """Celery's consumer with every task message screened (``check_message``) before Celery's
    handler, and Celery's own bad-message handlers (which log the body) replaced by refusals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No gossip and no mingle, however the worker is started: they listen to every other
        # worker's events and replies (a heartbeat without a hostname restarted the consumer),
        # and tracescore uses neither (its state is in Redis; it revokes nothing).
        kwargs["worker_options"] = {**(kwargs.get("worker_options") or {}), "without_gossip": True,
                                    "without_mingle": True}  # fmt: skip
        super().__init__(*args, **kwargs)
        app: TracescoreApp = self.app  # type: ignore[assignment]  # worker_consumer of create_app's apps
        self._settings = app.settings
        self._dead_letters = SyncRedisDeadLetters(
            self._settings.store_url,
            max_letters=self._settings.dlq_max_letters,
            max_bytes=self._settings.dlq_max_bytes,
        )
        # While the dead letters' Redis is away, every refused message comes back once a pause:
        # a line a minute with the count, not one a second.
        self._not_recorded = CountedLog("message_refusal_not_recorded", logger=log, count_key="messages", level="error")

    def _allowed(self) -> frozenset[str]:
        return frozenset(name for name in self.app.tasks if name.startswith("tracescore."))

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        # Celery warns at every reconnect (eight lines) that its default for cancelling the
        # running tasks changes in 6.0; configure_app sets ours.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CPendingDeprecationWarning)
            super().on_connection_error_after_connected(exc)

    def create_task_handler(self, promise: Any = None) -> Callable[[Any], Any]:
        handle = super().create_task_handler() if promise is None else super().create_task_handler(promise)
        settings, allowed = self._settings, self._allowed() or frozenset({SCORE_TASK_NAME})
        consumer: Any = self  # celery-types does not list the consumer's error tuples
        passthrough = tuple(consumer.connection_errors) + tuple(consumer.channel_errors)

        def on_task_received(message: Any) -> Any:
            try:
                refusal, decoded = check_message(message, settings, allowed)
            except Exception as exc:  # the screen itself must never take the consumer down
                refusal = Refusal("unreadable", f"the message could not be screened ({type(exc).__name__})")
                decoded = None
            if refusal is not None:
                return self.refuse(message, refusal, decoded)
            # Celery decodes the body again to tell the protocol apart: hand it ours. Its logs
            # show these reprs; they must never carry the batch's content.
            message._decoded_cache = decoded
            message.headers["argsrepr"] = "(<ScoreBatch>,)"
            message.headers["kwargsrepr"] = "{}"
            try:
                return handle(message)
            except passthrough:
                raise
            except Exception as exc:
                return self.refuse(message, Refusal("unreadable", f"Celery could not read it ({type(exc).__name__})"))

        return on_task_received

    def _connection_errors(self) -> tuple[type[BaseException], ...]:
        consumer: Any = self
        return tuple(consumer.connection_errors)

    def refuse(self, message: Any, refusal: Refusal, decoded: Any = None) -> None:
        """Dead-letter ``message`` once (by delivery tag) and ack it; never log its body."""
        headers = message.headers if isinstance(message.headers, dict) else {}
        tag = message.delivery_tag
        # kombu's tag is a UUID; a producer's own, of any text, is kept as its digest.
        plain = plain_id(tag)
        key = (
            f"msg:{tag}"
            if plain
            else f"msg:sha256:{hashlib.sha256(str(tag).encode('utf-8', 'surrogatepass')).hexdigest()}"
        )
        batch_id = None
        if isinstance(decoded, list) and decoded and isinstance(decoded[0], list) and decoded[0]:
            first = decoded[0][0]
            if isinstance(first, dict):
                batch_id = _token(first.get("batch_id")) if first.get("batch_id") is not None else None
        body = message.body
        size = len(body) if isinstance(body, bytes | str) else -1
        letter = DeadLetter(
            id=dead_letter_id(key),
            reason=refusal.reason,
            error=refusal.detail[:2000],
            batch_id=batch_id,
            task_name=_token(headers.get("task")),
            attempts=1,
            payload=None,
            retryable=False,
            message_key=key,
        )
        try:
            pushed = self._dead_letters.push(letter)
        except Exception as exc:
            # Not recorded: the message goes back to the queue rather than being lost unseen.
            # A dead-letter list of another Redis type waits for an operator: name it.
            named = {"key": exc.key, "found": exc.found} if isinstance(exc, StoreKeyTypeError) else {}
            self._not_recorded.note(reason=refusal.reason, letter=letter.id, error=type(exc).__name__, **named)
            self._dead_letters.close()
            message.reject_log_error(_stdlog, self._connection_errors(), requeue=True)
            # The message comes straight back: do not spin on it while the store is away.
            time.sleep(_STORE_DOWN_PAUSE_S)
            return
        self._not_recorded.flush()  # (the count since the last line, once the store is back)
        log.warning(
            "message_refused",
            reason=refusal.reason,
            letter=letter.id,
            task_id=_token(headers.get("id")),
            size=size,
            duplicate=not pushed,
        )
        message.ack_log_error(_stdlog, self._connection_errors())

    # Celery's handlers for what slipped past the screen: they log the body and drop the message.
    def on_unknown_message(self, body: Any, message: Any) -> None:
        self.refuse(message, Refusal("not_a_task", "not a Celery task message"))

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self.refuse(message, Refusal("unknown_task", "no such task on tracescore workers"))

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self.refuse(message, Refusal("invalid_task", f"Celery refused it ({type(exc).__name__})"))

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self.refuse(message, Refusal("not_json", f"the body could not be decoded ({type(exc).__name__})"))

    def shutdown(self) -> None:
        super().shutdown()
        self._dead_letters.close()
