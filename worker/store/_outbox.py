"""The outbox: stored score records waiting for each configured sink.

Recording a score (``ScoreStore.put_records``) also queues its id for every sink, in the same
atomic step, so a score is never stored without being owed to its sinks. Each sink has its own
queue (a sorted set of score ids by when each is due), counters and dead letters, so one sink
down never holds up another.

A drainer takes due ids with a *lease*: their due time moves ``lease_s`` ahead and the lease's
token is that new due time. While its delivery is in flight the drainer renews the lease
(``renew``: a new token, the same ids), so a slow backend is never handed the same batch by a
second drainer; a drainer that dies mid-delivery leaves its ids to come due again when the
lease runs out (delivery is at least once; sinks upsert by score id). Settling an id
(``ack``, ``retry``, ``dead``, ``drop``) only applies while the id still carries the caller's
token: a later lease, or a newer record of the same score queued meanwhile, is left alone.

Attempts are counted per id when it is leased (a drainer killed by a record counts too). After
``max_attempts`` (checked when leased too, so a record that kills its drainer every time still
ends), a ``Refused`` from the backend, or a stored record that no longer reads as one (``read``),
the id becomes the sink's dead letter (the
reason and the backend's answer, never the score's content), which ``redrive`` queues again and
``drop_dead_letters`` removes for good. An id whose record is gone (its TTL ran out before the
sink took it) is dropped and counted.

A sink's dead letters are bounded (``max_dead_letters``, ``TRACESCORE_SINK_MAX_DEAD_LETTERS``): a
sink that refuses every score (a deleted project, a revoked key) makes a letter of each, and the
letters have no TTL, so Redis grew until it refused every write. Past the bound the oldest letter
goes in the step that buries a new one, counted per sink (``dead_letters_dropped``) and logged a
line a minute. In Redis the letters are a hash (id → letter), which has no order: a sorted set of
their ids by ``failed_at`` beside it gives the oldest, kept in step by every script that adds or
removes a letter. Letters a release before it wrote have no entry there: they are listed, counted,
redriven and dropped as the others, and ordered by their ``failed_at`` (older than every letter
buried since) the first time the bound needs them.

The Redis outbox is synchronous (its users are drainer threads and the CLI); the in-memory twin
serves the embedded mode and tests.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import redis
import structlog
from pydantic import BaseModel, Field, ValidationError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tracing import ScoreRecord
from worker import _keys
from worker._logs import CountedLog
from worker._reconnect import COMMAND_SLACK_S, DECODED
from worker._settings import DEFAULT_SINK_MAX_DEAD_LETTERS
from worker.store._keytypes import Check, checked, checked_script, pipeline_replies
from worker.store._redis import failed_fields, known_counters

__all__ = ["Lease", "MemoryOutbox", "Outbox", "RedisOutbox", "SinkCounts", "SinkDeadLetter", "SinkState"]

T = TypeVar("T")

log = structlog.get_logger("tracescore.worker.store")

# "none": not queued for the sink and no delivery recorded (never owed to it, or dropped).
SinkState = Literal["pending", "failed", "delivered", "none"]


class SinkDeadLetter(BaseModel):
    """A score one sink refused or never took: ids and the backend's answer, no score content."""

    score_id: str
    sink: str
    reason: str
    detail: str = ""
    attempts: int = 0
    failed_at: float = Field(default_factory=time.time)
    trace_id: str = ""
    span_id: str = ""
    scorer_id: str = ""


@dataclass(frozen=True)
class SinkCounts:
    """One sink's state: ``pending`` (queued or leased), ``failed`` (its dead letters now),
    ``delivered`` / ``dropped`` (record gone) / ``retried`` / ``dead_letters_dropped`` (dead
    letters dropped past the bound, the oldest first) since the counters began (None: unknown,
    its counter in Redis is no number until the drainer's next settle starts it over)."""

    delivered: int | None = 0
    pending: int = 0
    failed: int = 0
    dropped: int | None = 0
    retried: int | None = 0
    dead_letters_dropped: int | None = 0

    def as_dict(self) -> dict[str, int | None]:
        return {
            "delivered": self.delivered,
            "pending": self.pending,
            "failed": self.failed,
            "dropped": self.dropped,
            "retried": self.retried,
            "dead_letters_dropped": self.dead_letters_dropped,
        }


@dataclass(frozen=True)
class Lease:
    """Ids taken for one delivery attempt: ``attempts`` per id (this one included); ``token``
    proves the lease when settling."""

    sink: str
    token: int
    attempts: dict[str, int] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return list(self.attempts)


@runtime_checkable
class Outbox(Protocol):
    """What drainers and the CLI do with the outbox."""

    def register(self, sinks: Iterable[str]) -> None:
        """Remember these sink names (``counts`` lists them even before their first score)."""
        ...

    def enqueue(self, sink: str, score_ids: Sequence[str]) -> None:
        """Queue ``score_ids`` for ``sink`` now (``put_records`` does this for new records)."""
        ...

    def lease(self, sink: str, limit: int, lease_s: float) -> Lease:
        """Up to ``limit`` due ids of ``sink``, each pushed ``lease_s`` ahead and counted as an attempt."""
        ...

    def records(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        """The stored records among ``score_ids`` (those gone or unreadable are left out)."""
        ...

    def read(self, score_ids: Sequence[str]) -> tuple[dict[str, ScoreRecord], dict[str, str]]:
        """The stored records among ``score_ids``, and why each unreadable one is (a stored
        record that fails validation: named by its errors' places and kinds, never its content)."""
        ...

    def renew(self, lease: Lease, lease_s: float) -> Lease:
        """Push the ids still under ``lease`` ``lease_s`` ahead (a delivery still in flight);
        the returned lease (its new token) holds those ids."""
        ...

    def ack(self, lease: Lease, score_ids: Sequence[str]) -> int:
        """The sink has these: off the queue, counted delivered; returns how many were still leased."""
        ...

    def retry(self, lease: Lease, delays: Mapping[str, float]) -> int:
        """Due again after each id's delay in seconds."""
        ...

    def dead(self, lease: Lease, letters: Sequence[SinkDeadLetter]) -> int:
        """Off the queue, kept as the sink's dead letters."""
        ...

    def drop(self, lease: Lease, score_ids: Sequence[str]) -> int:
        """Off the queue without delivery (the record is gone), counted dropped."""
        ...

    def counts(self) -> dict[str, SinkCounts]:
        """Every registered sink's counts."""
        ...

    def dead_letters(self, sink: str, limit: int = 100) -> list[SinkDeadLetter]:
        """Up to ``limit`` of the sink's dead letters, newest first (among the first 10,000 read);
        one that no longer parses is listed by its id with reason ``unreadable_dead_letter``."""
        ...

    def redrive(self, sink: str, score_ids: Sequence[str] | None = None) -> int:
        """Queue dead letters again (all of the sink's when ``score_ids`` is None), attempts
        reset; returns how many."""
        ...

    def drop_dead_letters(
        self, sink: str, score_ids: Sequence[str] | None = None, *, reason: str | None = None
    ) -> Iterator[SinkDeadLetter]:
        """Remove dead letters for good: those of ``score_ids``, else every one (of ``reason``
        when given, as ``dead_letters`` lists it); yields each as it is removed, a page at a time
        (a generator: nothing goes until it is iterated). Not counted as dropped past the bound."""
        ...

    def states(self, sink: str, score_ids: Sequence[str]) -> dict[str, SinkState]:
        """Where each id stands for ``sink``: still queued, a dead letter, acknowledged by the
        sink (kept ``delivered_keep_s``), or none of these."""
        ...

    def close(self) -> None: ...


# Ids per command when asking about many (a large backfill's scores).
_CHUNK = 5000
# Dead letters read for a listing at most (newest first among them).
_LETTERS_READ = 10_000
_UNREADABLE = "the stored dead letter is not one (corrupt, or from another version); its id can be retried"


def _now_ms() -> int:
    return int(time.time() * 1000)


# A full Redis (maxmemory, noeviction) refuses a script whose first write may take memory, but
# not one that has written already (it never stops a script halfway). The sinks' backlog is what
# fills Redis, so a drainer must be able to lease and settle while it is full: a write that
# frees (a no-op ZREM) comes first. What the lease then writes is in place (a score, a counter).
_WRITES_WHEN_FULL = "redis.call('ZREM', KEYS[1], '')\n"

# KEYS: queue, attempts. ARGV: now ms, lease ms, limit. Returns {token, id1, attempts1, ...}.
_LEASE = checked_script(
    "{KEYS[1], 'zset', 'k', KEYS[2], 'hash', 'r'}",
    _WRITES_WHEN_FULL
    + """
local due = tonumber(ARGV[1]) + tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local bad = tracescore_check_counters({KEYS[2]}, ids)
if bad then
  return bad
end
local out = {due}
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', due, id)
  table.insert(out, id)
  table.insert(out, redis.call('HINCRBY', KEYS[2], id, 1))
end
return out
""",
)

# KEYS: queue. ARGV: old token, new due ms, ids... Returns the ids renewed.
_RENEW = checked_script(
    "{KEYS[1], 'zset', 'k'}",
    _WRITES_WHEN_FULL
    + """
local out = {}
for i = 3, #ARGV do
  local current = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if current and tonumber(current) == tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[2]), ARGV[i])
    table.insert(out, ARGV[i])
  end
end
return out
""",
)


def _unreadable(exc: ValidationError) -> str:
    return f"stored record fails validation: {failed_fields(exc)}"


def _parse(values: Mapping[str, str | None]) -> tuple[dict[str, ScoreRecord], dict[str, str]]:
    found: dict[str, ScoreRecord] = {}
    bad: dict[str, str] = {}
    for score_id, value in values.items():
        if value is None:
            continue
        try:
            found[score_id] = ScoreRecord.model_validate_json(value)
        except ValidationError as exc:
            bad[score_id] = _unreadable(exc)
    return found, bad


# ``tracescore_sink_bound(dead, order, counts, max, limit)``: a sink's dead letters past ``max``
# go, the oldest by their order first, at most ``limit`` of them (``_BOUND_STEP``), counted in
# ``counts``' dead_letters_dropped. Returns {dropped, 1 when letters without an order entry (a
# previous release's) are there and the letters are still past the bound, else 0, 1 when more
# are past the bound than ``limit`` let go, else 0}: the caller orders them (``_ORDER``), or
# calls ``_BOUND`` again, until they are within it; until they are ordered the ordered ones are
# not dropped in their place (they are newer). An order entry whose letter went by another way
# than ours (redis-cli) is popped, not counted, but it is one of the step's ``limit``: a hundred
# thousand of them older than every letter were popped in one script.
_BOUND_LUA = """
local function tracescore_sink_bound(dead, order, counts, max, limit)
  local dropped, unordered, more, popped = 0, 0, 0, 0
  if redis.call('HLEN', dead) > redis.call('ZCARD', order) then
    unordered = 1
  else
    while redis.call('HLEN', dead) > max do
      if popped >= limit then
        more = 1
        break
      end
      local oldest = redis.call('ZPOPMIN', order)
      if #oldest == 0 then
        unordered = 1
        break
      end
      popped = popped + 1
      dropped = dropped + redis.call('HDEL', dead, oldest[1])
    end
  end
  if dropped > 0 then
    redis.call('HINCRBY', counts, 'dead_letters_dropped', dropped)
  end
  if redis.call('HLEN', dead) <= max then
    unordered = 0
  end
  return {dropped, unordered, more}
end
"""

# KEYS: queue, attempts, counts, dead, delivered, dead letters' order. ARGV: id, token, action,
# next due ms, letter json, now ms, how long delivered ids are kept (ms), the dead letters' bound,
# the letter's failed_at (ms), the letters the bound drops at most (``_BOUND_STEP``). Only while the
# id still carries this lease's token (see the module docstring). Returns 1 when settled, 0 when
# not; a letter buried: {1, dropped, unordered, more} (see ``tracescore_sink_bound``).
_SETTLE = checked_script(
    "{KEYS[1], 'zset', 'k', KEYS[2], 'hash', 'r', KEYS[3], 'hash', 'r', KEYS[4], 'hash', 'k', KEYS[5], 'zset', 'r',"
    " KEYS[6], 'zset', 'r'}",
    _WRITES_WHEN_FULL
    + _BOUND_LUA
    + """
local bad = tracescore_check_counters({KEYS[3]})
if bad then
  return bad
end
local current = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not current or tonumber(current) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == 'retry' then
  redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[4]), ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'retried', 1)
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == 'ack' then
  redis.call('HINCRBY', KEYS[3], 'delivered', 1)
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('ZADD', KEYS[5], tonumber(ARGV[6]), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', tonumber(ARGV[6]) - tonumber(ARGV[7]))
elseif ARGV[3] == 'dead' then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[5])
  redis.call('ZADD', KEYS[6], tonumber(ARGV[9]), ARGV[1])
  local bounded = tracescore_sink_bound(KEYS[4], KEYS[6], KEYS[3], tonumber(ARGV[8]), tonumber(ARGV[10]))
  return {1, bounded[1], bounded[2], bounded[3]}
else
  redis.call('HINCRBY', KEYS[3], 'dropped', 1)
end
return 1
""",
)

# KEYS: queue, attempts, dead, dead letters' order. ARGV: id, now ms.
_REDRIVE = checked_script(
    "{KEYS[1], 'zset', 'k', KEYS[2], 'hash', 'r', KEYS[3], 'hash', 'k', KEYS[4], 'zset', 'r'}",
    """
redis.call('ZREM', KEYS[4], ARGV[1])
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]), ARGV[1])
return 1
""",
)

# KEYS: queue, attempts, dead, delivered, dead letters' order. ARGV: now ms, ids... Owed anew (as
# put_records does): no longer dead, delivered, or counting attempts. A script (not MULTI) so that
# a key of the wrong type stops it before anything is written: MULTI would drop dead letters and
# then fail the queue.
_ENQUEUE = checked_script(
    "{KEYS[1], 'zset', 'k', KEYS[2], 'hash', 'r', KEYS[3], 'hash', 'k', KEYS[4], 'zset', 'r', KEYS[5], 'zset', 'r'}",
    """
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
  redis.call('ZREM', KEYS[4], ARGV[i])
  redis.call('ZREM', KEYS[5], ARGV[i])
end
return #ARGV - 1
""",
)

# KEYS: dead, dead letters' order. ARGV: id, failed_at ms, ... Letters a previous release wrote
# (no order entry) ordered by when they failed; an id no longer a letter is left out. A write that
# frees first (see _WRITES_WHEN_FULL): a Redis filled by a previous release's letters is where
# they must be ordered, so that the bound can drop them.
_ORDER = checked_script(
    "{KEYS[1], 'hash', 'k', KEYS[2], 'zset', 'r'}",
    """
redis.call('ZREM', KEYS[2], '')
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], 'NX', tonumber(ARGV[i + 1]), ARGV[i])
  end
end
return 0
""",
)

# KEYS: dead, dead letters' order, counts. ARGV: the bound, the letters it drops at most. The bound
# once the letters are ordered, or its next step.
_BOUND = checked_script(
    "{KEYS[1], 'hash', 'k', KEYS[2], 'zset', 'r', KEYS[3], 'hash', 'r'}",
    _BOUND_LUA
    + """
local bad = tracescore_check_counters({KEYS[3]})
if bad then
  return bad
end
return tracescore_sink_bound(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]))
""",
)

# KEYS: dead, dead letters' order. ARGV: 'any', id, ... (each one's letter, whatever it is) or
# 'same', id, letter json, ... (only while it is still the letter read: one buried again meanwhile,
# of another reason, stays). Returns {id, letter json, ...} of those removed.
_DISCARD = checked_script(
    "{KEYS[1], 'hash', 'k', KEYS[2], 'zset', 'r'}",
    """
local out = {}
local step = ARGV[1] == 'same' and 2 or 1
for i = 2, #ARGV, step do
  local id = ARGV[i]
  local letter = redis.call('HGET', KEYS[1], id)
  if letter and (step == 1 or letter == ARGV[i + 1]) then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    out[#out + 1] = id
    out[#out + 1] = letter
  elseif not letter then
    redis.call('ZREM', KEYS[2], id)
  end
end
return out
""",
)


def delivered_key(sink: str) -> str:
    """Sorted set: score id → when (epoch ms) ``sink`` acknowledged it; trimmed to
    ``delivered_keep_s`` (a score's default TTL and a day), so "delivered" is a positive fact."""
    return f"{_keys.outbox_key(sink)}:delivered"


# Delivered ids are kept a day past a score's default TTL (TRACESCORE_SCORE_TTL_SECONDS, 7 days).
DELIVERED_KEEP_S = 8 * 24 * 3600


def _sink_keys(sink: str) -> list[str]:
    return [
        _keys.outbox_key(sink),
        _keys.outbox_attempts_key(sink),
        _keys.outbox_counts_key(sink),
        _keys.outbox_dead_key(sink),
        delivered_key(sink),
        _keys.outbox_dead_order_key(sink),
    ]


# Letters read or removed at once (HSCAN's COUNT, ids per script): a page of up to ~1.3 KB each.
_DEAD_PAGE = 500
# Letters the bound drops in one script at most: Redis serves nobody else while a script runs, and
# a bound lowered from 100,000 to 1,000 dropped 99,000 in one (252 ms; 2.5 ms a step of 1,000,
# bench/store_scripts.py). The drainer calls again until the letters are within the bound; each
# step leaves the letters, their order and the count dropped in step.
_BOUND_STEP = 1000
# Letters a previous release wrote are looked for (a scan of the whole hash) at most this often
# per sink and outbox: while a worker of that release still buries letters, there would be new
# ones on every bury.
_ORDER_EVERY_S = 60.0

# Per sink, one line a minute per process while it drops letters past the bound (both outboxes).
_dropped_logs: dict[str, CountedLog] = {}
_dropped_logs_lock = threading.Lock()


def _said_dropped(sink: str, dropped: int, bound: int | None) -> None:
    """``dropped`` letters of ``sink`` went past its bound: logged by count (no letter's content),
    a line a minute per sink."""
    if dropped <= 0:
        return
    with _dropped_logs_lock:
        said = _dropped_logs.get(sink)
        if said is None:
            said = _dropped_logs[sink] = CountedLog(
                "sink_dead_letters_dropped_past_bound", logger=log, count_key="dropped"
            )
    said.note(dropped, sink=sink, max_dead_letters=bound, setting="TRACESCORE_SINK_MAX_DEAD_LETTERS")


def _letter(sink: str, score_id: str, value: str) -> SinkDeadLetter:
    """A stored letter; one that no longer parses stands as its id with reason
    ``unreadable_dead_letter`` (still the sink's letter: counted, redrivable and droppable by id)."""
    try:
        return SinkDeadLetter.model_validate_json(value)
    except ValidationError:
        return SinkDeadLetter(
            score_id=score_id, sink=sink, reason="unreadable_dead_letter", detail=_UNREADABLE, failed_at=0
        )


class RedisOutbox:
    """The outbox in Redis, on a synchronous client of its own (one per drainer thread)."""

    def __init__(
        self,
        url: str,
        *,
        reconnect_s: float = 15.0,
        command_s: float = COMMAND_SLACK_S,
        delivered_keep_s: int = DELIVERED_KEEP_S,
        max_dead_letters: int = DEFAULT_SINK_MAX_DEAD_LETTERS,
    ) -> None:
        """``reconnect_s``: how long a call keeps reconnecting to a Redis that refuses or drops
        its connections; ``command_s``: how long one read waits for its answer (a drainer's calls
        may move many ids; ``tracescore sinks`` passes ``CLI_PATIENCE``).
        ``max_dead_letters``: each sink's bound (``TRACESCORE_SINK_MAX_DEAD_LETTERS``)."""
        self.url = url
        self.delivered_keep_s = delivered_keep_s
        self.max_dead_letters = max_dead_letters
        self._ordered_at: dict[str, float] = {}  # sink -> when its old letters were last ordered
        retries = max(1, int(reconnect_s / 0.5))
        self._client: Any = redis.Redis.from_url(
            url,
            **DECODED,
            socket_connect_timeout=2,
            socket_timeout=command_s,
            # A read that timed out is not sent again: it has had its wait, and a Redis that
            # takes connections and never answers cost each call every retry's wait over (a
            # paused Redis kept `tracescore sinks` 52 s, a drainer's call minutes). The caller
            # says unreachable, or (a drainer) tries again at its next poll.
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries, supported_errors=(redis.ConnectionError,)),
            # (ReadOnlyError: a failover; a new connection finds the new primary, see _reconnect)
            retry_on_error=[redis.ConnectionError, redis.exceptions.ReadOnlyError],
        )
        self._lease = self._client.register_script(_LEASE)
        self._settle = self._client.register_script(_SETTLE)
        self._redrive = self._client.register_script(_REDRIVE)
        self._renew = self._client.register_script(_RENEW)
        self._enqueue = self._client.register_script(_ENQUEUE)
        self._order = self._client.register_script(_ORDER)
        self._bound = self._client.register_script(_BOUND)
        self._discard = self._client.register_script(_DISCARD)

    def _checked(self, where: str, checks: Sequence[Check], call: Callable[[], T]) -> T:
        return checked(self._client, f"outbox_{where}", checks, call)

    def _scripts(self, where: str, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """``script`` once per (keys, args) in one pipeline; a call whose key check repaired keys
        is sent again (``worker.store._keytypes``)."""
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(3):
            pipe = self._client.pipeline(transaction=False)
            for i in pending:
                keys, args = calls[i]
                script(keys=keys, args=args, client=pipe)
            got = pipe.execute(raise_on_error=False)
            for i, reply in zip(pending, got, strict=True):
                replies[i] = reply
            again = pipeline_replies(f"outbox_{where}", got)
            if not again:
                return replies
            pending = [pending[j] for j in again]
        raise RuntimeError("Redis keeps retyping the outbox's keys")

    def register(self, sinks: Iterable[str]) -> None:
        names = list(sinks)
        if names:
            key = _keys.outbox_sinks_key()
            self._checked("register", [(key, "set", False)], lambda: self._client.sadd(key, *names))

    def enqueue(self, sink: str, score_ids: Sequence[str]) -> None:
        if score_ids:
            keys = [
                _keys.outbox_key(sink),
                _keys.outbox_attempts_key(sink),
                _keys.outbox_dead_key(sink),
                delivered_key(sink),
                _keys.outbox_dead_order_key(sink),
            ]
            self._scripts("enqueue", self._enqueue, [(keys, [_now_ms(), *score_ids])])

    def lease(self, sink: str, limit: int, lease_s: float) -> Lease:
        raw = self._checked(
            "lease",
            [],  # the script checks its keys
            lambda: self._lease(
                keys=[_keys.outbox_key(sink), _keys.outbox_attempts_key(sink)],
                args=[_now_ms(), int(lease_s * 1000), max(1, limit)],
            ),
        )
        token = int(raw[0])
        return Lease(sink, token, {str(raw[i]): int(raw[i + 1]) for i in range(1, len(raw), 2)})

    def records(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        return self.read(score_ids)[0]

    def read(self, score_ids: Sequence[str]) -> tuple[dict[str, ScoreRecord], dict[str, str]]:
        if not score_ids:
            return {}, {}
        values = self._client.mget([_keys.record_key(s) for s in score_ids])
        return _parse(dict(zip(score_ids, values, strict=True)))

    def renew(self, lease: Lease, lease_s: float) -> Lease:
        due = _now_ms() + int(lease_s * 1000)
        if not lease.attempts:
            return Lease(lease.sink, due, {})
        renewed = self._checked(
            "renew", [], lambda: self._renew(keys=[_keys.outbox_key(lease.sink)], args=[lease.token, due, *lease.ids])
        )
        kept = {str(x) for x in renewed}
        return Lease(lease.sink, due, {s: n for s, n in lease.attempts.items() if s in kept})

    def _apply(self, lease: Lease, calls: Sequence[tuple[str, str, int, str, int]]) -> int:
        if not calls:
            return 0
        keys = _sink_keys(lease.sink)
        now, keep, bound = _now_ms(), self.delivered_keep_s * 1000, self.max_dead_letters
        replies = self._scripts(
            "settle",
            self._settle,
            [
                (keys, [score_id, lease.token, action, due, letter, now, keep, bound, failed_ms, _BOUND_STEP])
                for score_id, action, due, letter, failed_ms in calls
            ],
        )
        settled = dropped = unordered = more = 0
        for (_, action, *_), reply in zip(calls, replies, strict=True):
            if isinstance(reply, list):  # a letter buried: {1, dropped past the bound, unordered, more}
                settled, dropped = settled + int(reply[0]), dropped + int(reply[1])
                unordered |= int(reply[2])
                more |= int(reply[3])
            else:
                settled += int(reply)
                # A bury answered "not settled" may be this very bury sent again by the client's
                # retry (Redis restarted after running it, its reply unread): the first try's step
                # of the bound ran, and its "more" and "unordered" went with the reply, which left
                # the letters past the bound until the next bury: a step of the bound finds both
                # again (within it, one O(1) script). What that first step dropped is counted in
                # Redis but not logged, and the settle is answered "not settled" (0): the drainer
                # reads no answer, and an id settled twice is not counted twice (its token is gone).
                more |= action == "dead"
        if more and not unordered:
            went, unordered = self._bound_dead_letters(lease.sink)
            dropped += went
        if unordered:
            dropped += self._order_old_letters(lease.sink)
        _said_dropped(lease.sink, dropped, bound)
        return settled

    def _bound_step(self, sink: str) -> tuple[int, bool, bool]:
        """One step of the sink's bound (at most ``_BOUND_STEP`` letters dropped): (dropped,
        unordered letters are there, more are past the bound)."""
        keys = [_keys.outbox_dead_key(sink), _keys.outbox_dead_order_key(sink), _keys.outbox_counts_key(sink)]
        (reply,) = self._scripts("bound_dead_letters", self._bound, [(keys, [self.max_dead_letters, _BOUND_STEP])])
        return int(reply[0]), bool(int(reply[1])), bool(int(reply[2]))

    def _bound_dead_letters(self, sink: str) -> tuple[int, bool]:
        """The sink's bound, a step at a time until its letters are within it or some are found
        unordered; returns how many went, and whether unordered letters are there (to order)."""
        dropped, more, unordered = 0, True, False
        while more:  # (a step that finds unordered letters says no more)
            step, unordered, more = self._bound_step(sink)
            dropped += step
        return dropped, unordered

    def _order_old_letters(self, sink: str) -> int:
        """Order the sink's letters a previous release wrote (no order entry) by their
        ``failed_at``, a page at a time, then bound them; returns how many went past the bound.
        At most once a minute per sink (``_ORDER_EVERY_S``)."""
        last = self._ordered_at.get(sink)
        if last is not None and time.monotonic() - last < _ORDER_EVERY_S:
            return 0
        self._ordered_at[sink] = time.monotonic()
        dead, order = _keys.outbox_dead_key(sink), _keys.outbox_dead_order_key(sink)
        for page in self._dead_pages(sink, "order_dead_letters"):
            args: list[Any] = []
            for score_id, value in page:
                # (one that no longer parses: the oldest, so the first to go)
                args += [score_id, int(_letter(sink, score_id, value).failed_at * 1000)]
            self._scripts("order_dead_letters", self._order, [([dead, order], args)])
        # (letters still unordered, a previous release's worker burying meanwhile: the next time)
        return self._bound_dead_letters(sink)[0]

    def _dead_pages(self, sink: str, where: str) -> Iterator[list[tuple[str, str]]]:
        """The sink's dead letters (id, stored JSON), a page (HSCAN) at a time: never all at once.
        A letter there from start to end is read at least once; one added or removed meanwhile
        may or may not be."""
        key = _keys.outbox_dead_key(sink)
        cursor = 0
        while True:
            read = functools.partial(self._client.hscan, key, cursor, count=_DEAD_PAGE)
            cursor, page = self._checked(where, [(key, "hash", True)], read)
            if page:
                yield list(page.items())
            if int(cursor) == 0:
                return

    def ack(self, lease: Lease, score_ids: Sequence[str]) -> int:
        return self._apply(lease, [(s, "ack", 0, "", 0) for s in score_ids])

    def retry(self, lease: Lease, delays: Mapping[str, float]) -> int:
        now = _now_ms()
        return self._apply(lease, [(s, "retry", now + int(d * 1000), "", 0) for s, d in delays.items()])

    def dead(self, lease: Lease, letters: Sequence[SinkDeadLetter]) -> int:
        return self._apply(
            lease, [(x.score_id, "dead", 0, x.model_dump_json(), int(x.failed_at * 1000)) for x in letters]
        )

    def drop(self, lease: Lease, score_ids: Sequence[str]) -> int:
        return self._apply(lease, [(s, "drop", 0, "", 0) for s in score_ids])

    def counts(self) -> dict[str, SinkCounts]:
        key = _keys.outbox_sinks_key()
        sinks = sorted(self._checked("counts", [(key, "set", False)], lambda: self._client.smembers(key)))

        def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for sink in sinks:
                pipe.hgetall(_keys.outbox_counts_key(sink))
                pipe.zcard(_keys.outbox_key(sink))
                pipe.hlen(_keys.outbox_dead_key(sink))
            return list(pipe.execute())

        checks = [
            c
            for sink in sinks
            for c in (
                (_keys.outbox_counts_key(sink), "hash", False),
                (_keys.outbox_key(sink), "zset", True),
                (_keys.outbox_dead_key(sink), "hash", True),
            )
        ]
        got = self._checked("counts", checks, read)
        out: dict[str, SinkCounts] = {}
        for i, sink in enumerate(sinks):
            pending, failed = got[3 * i + 1], got[3 * i + 2]
            counters = known_counters(got[3 * i], _keys.outbox_counts_key(sink), "outbox_counts")
            out[sink] = SinkCounts(
                delivered=counters.get("delivered", 0),
                pending=int(pending),
                failed=int(failed),
                dropped=counters.get("dropped", 0),
                retried=counters.get("retried", 0),
                dead_letters_dropped=counters.get("dead_letters_dropped", 0),
            )
        return out

    def dead_letters(self, sink: str, limit: int = 100) -> list[SinkDeadLetter]:
        letters: list[SinkDeadLetter] = []
        # Paged (HSCAN), and at most _LETTERS_READ of them: a sink down for a day can hold
        # hundreds of thousands. Newest first among those read.
        key = _keys.outbox_dead_key(sink)
        read = self._checked(
            "dead_letters",
            [(key, "hash", True)],
            lambda: list(islice(self._client.hscan_iter(key, count=500), _LETTERS_READ)),
        )
        # (a letter that no longer parses is listed as unreadable by that reason, not a crash)
        letters = [_letter(sink, score_id, value) for score_id, value in read]
        letters.sort(key=lambda x: x.failed_at, reverse=True)
        return letters[:limit]

    def redrive(self, sink: str, score_ids: Sequence[str] | None = None) -> int:
        dead = _keys.outbox_dead_key(sink)
        ids = (
            list(score_ids)
            if score_ids is not None
            else list(self._checked("redrive", [(dead, "hash", True)], lambda: self._client.hkeys(dead)))
        )
        if not ids:
            return 0
        keys = [_keys.outbox_key(sink), _keys.outbox_attempts_key(sink), dead, _keys.outbox_dead_order_key(sink)]
        now = _now_ms()
        return sum(
            int(x) for x in self._scripts("redrive", self._redrive, [(keys, [score_id, now]) for score_id in ids])
        )

    def drop_dead_letters(
        self, sink: str, score_ids: Sequence[str] | None = None, *, reason: str | None = None
    ) -> Iterator[SinkDeadLetter]:
        keys = [_keys.outbox_dead_key(sink), _keys.outbox_dead_order_key(sink)]
        if score_ids is not None:
            ids = list(dict.fromkeys(score_ids))
            for i in range(0, len(ids), _DEAD_PAGE):
                yield from self._discarded(sink, (keys, ["any", *ids[i : i + _DEAD_PAGE]]))
            return
        # Every letter (of the reason): a page read, its letters removed while still the letters
        # read, then the next page. Removing during HSCAN is safe: a letter there throughout is read.
        for page in self._dead_pages(sink, "drop_dead_letters"):
            chosen: list[str] = []
            for score_id, value in page:
                if reason is None or _letter(sink, score_id, value).reason == reason:
                    chosen += [score_id, value]
            if chosen:
                yield from self._discarded(sink, (keys, ["same", *chosen]))

    def _discarded(self, sink: str, call: tuple[Sequence[str], Sequence[Any]]) -> Iterator[SinkDeadLetter]:
        (removed,) = self._scripts("drop_dead_letters", self._discard, [call])
        for i in range(0, len(removed), 2):
            yield _letter(sink, str(removed[i]), removed[i + 1])

    def states(self, sink: str, score_ids: Sequence[str]) -> dict[str, SinkState]:
        out: dict[str, SinkState] = {}
        for start in range(0, len(score_ids), _CHUNK):
            chunk = list(score_ids[start : start + _CHUNK])

            def read(chunk: list[str] = chunk) -> list[Any]:
                pipe = self._client.pipeline(transaction=False)
                pipe.zmscore(_keys.outbox_key(sink), chunk)
                pipe.hmget(_keys.outbox_dead_key(sink), chunk)
                pipe.zmscore(delivered_key(sink), chunk)
                return list(pipe.execute())

            checks = [
                (_keys.outbox_key(sink), "zset", True),
                (_keys.outbox_dead_key(sink), "hash", True),
                (delivered_key(sink), "zset", False),
            ]
            queued, dead, delivered = self._checked("states", checks, read)
            for s, q, d, a in zip(chunk, queued, dead, delivered, strict=True):
                out[s] = (
                    "pending" if q is not None else "failed" if d is not None else "none" if a is None else "delivered"
                )
        return out

    def close(self) -> None:
        self._client.close()


class MemoryOutbox:
    """The outbox in memory, over a ``MemoryScoreStore``'s records (``store.outbox``)."""

    def __init__(
        self,
        records: Callable[[Sequence[str]], dict[str, ScoreRecord]],
        sinks: Iterable[str] = (),
        *,
        max_dead_letters: int | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._records = records
        # A bounded store's app runs for weeks: a sink refusing every score would otherwise keep
        # a letter per score for good. Past ``max_dead_letters`` a sink's oldest letter is
        # dropped, counted as in Redis (``dead_letters_dropped``).
        self.max_dead_letters = max_dead_letters
        self.sinks: tuple[str, ...] = ()
        self._due: dict[str, dict[str, int]] = {}
        self._attempts: dict[str, Counter[str]] = {}
        self._counts: dict[str, Counter[str]] = {}
        self._dead: dict[str, dict[str, SinkDeadLetter]] = {}
        self._delivered: dict[str, set[str]] = {}
        self.register(sinks)

    def register(self, sinks: Iterable[str]) -> None:
        with self._lock:
            for sink in sinks:
                if sink not in self._due:
                    self._due[sink], self._attempts[sink], self._counts[sink] = {}, Counter(), Counter()
                    self._dead[sink], self._delivered[sink] = {}, set()
                    self.sinks += (sink,)

    def enqueue(self, sink: str, score_ids: Sequence[str]) -> None:
        self.register([sink])
        now = _now_ms()
        with self._lock:
            for score_id in score_ids:
                # Owed anew (a replaced record): no longer dead, delivered, or counting attempts.
                self._due[sink][score_id] = now
                self._dead[sink].pop(score_id, None)
                self._attempts[sink].pop(score_id, None)
                self._delivered[sink].discard(score_id)

    def enqueue_all(self, score_ids: Sequence[str]) -> None:
        """Queue ``score_ids`` for every registered sink (the store's part of ``put_records``)."""
        for sink in self.sinks:
            self.enqueue(sink, score_ids)

    def owes(self, score_id: str) -> bool:
        """Whether a sink has yet to take ``score_id`` (queued, or leased and not settled)."""
        with self._lock:
            return any(score_id in due for due in self._due.values())

    def forget(self, score_id: str) -> None:
        """The store dropped the record (its TTL, or its bound): no state of it is kept but a
        dead letter, which stays for the operator (up to ``max_dead_letters``)."""
        with self._lock:
            for sink in self.sinks:
                self._delivered[sink].discard(score_id)

    def lease(self, sink: str, limit: int, lease_s: float) -> Lease:
        self.register([sink])
        now = _now_ms()
        token = now + int(lease_s * 1000)
        taken: dict[str, int] = {}
        with self._lock:
            due = self._due[sink]
            # Ids were queued in time order (a dict keeps it): the first due ones, without sorting
            # the whole queue on every lease (a large in-process backfill).
            for score_id in list(islice((s for s, t in due.items() if t <= now), max(1, limit))):
                due[score_id] = token
                self._attempts[sink][score_id] += 1
                taken[score_id] = self._attempts[sink][score_id]
        return Lease(sink, token, taken)

    def records(self, score_ids: Sequence[str]) -> dict[str, ScoreRecord]:
        return self._records(score_ids)

    def read(self, score_ids: Sequence[str]) -> tuple[dict[str, ScoreRecord], dict[str, str]]:
        # In memory a record is a validated object: none is unreadable.
        return self._records(score_ids), {}

    def renew(self, lease: Lease, lease_s: float) -> Lease:
        token = _now_ms() + int(lease_s * 1000)
        kept: dict[str, int] = {}
        with self._lock:
            due = self._due.get(lease.sink, {})
            for score_id, attempts in lease.attempts.items():
                if due.get(score_id) == lease.token:
                    due[score_id] = token
                    kept[score_id] = attempts
        return Lease(lease.sink, token, kept)

    def _settle(self, lease: Lease, score_ids: Iterable[str], action: Callable[[str], None]) -> int:
        done = 0
        with self._lock:
            due = self._due[lease.sink]
            for score_id in score_ids:
                if due.get(score_id) == lease.token:
                    action(score_id)
                    done += 1
        return done

    def _remove(self, sink: str, score_id: str, counter: str | None) -> None:
        del self._due[sink][score_id]
        self._attempts[sink].pop(score_id, None)
        if counter:
            self._counts[sink][counter] += 1

    def ack(self, lease: Lease, score_ids: Sequence[str]) -> int:
        def delivered(score_id: str) -> None:
            self._remove(lease.sink, score_id, "delivered")
            self._dead[lease.sink].pop(score_id, None)
            self._delivered[lease.sink].add(score_id)

        return self._settle(lease, score_ids, delivered)

    def retry(self, lease: Lease, delays: Mapping[str, float]) -> int:
        now = _now_ms()

        def later(score_id: str) -> None:
            self._due[lease.sink][score_id] = now + int(delays[score_id] * 1000)
            self._counts[lease.sink]["retried"] += 1

        return self._settle(lease, delays, later)

    def dead(self, lease: Lease, letters: Sequence[SinkDeadLetter]) -> int:
        by_id = {x.score_id: x for x in letters}
        bound, dropped = self.max_dead_letters, 0

        def bury(score_id: str) -> None:
            nonlocal dropped
            self._remove(lease.sink, score_id, None)
            dead = self._dead[lease.sink]
            dead[score_id] = by_id[score_id]
            while bound is not None and len(dead) > bound:
                del dead[next(iter(dead))]  # (buried in order: the oldest first)
                self._counts[lease.sink]["dead_letters_dropped"] += 1
                dropped += 1

        settled = self._settle(lease, by_id, bury)
        _said_dropped(lease.sink, dropped, bound)
        return settled

    def drop(self, lease: Lease, score_ids: Sequence[str]) -> int:
        return self._settle(lease, score_ids, lambda s: self._remove(lease.sink, s, "dropped"))

    def counts(self) -> dict[str, SinkCounts]:
        with self._lock:
            return {
                sink: SinkCounts(
                    delivered=self._counts[sink]["delivered"],
                    pending=len(self._due[sink]),
                    failed=len(self._dead[sink]),
                    dropped=self._counts[sink]["dropped"],
                    retried=self._counts[sink]["retried"],
                    dead_letters_dropped=self._counts[sink]["dead_letters_dropped"],
                )
                for sink in sorted(self.sinks)
            }

    def dead_letters(self, sink: str, limit: int = 100) -> list[SinkDeadLetter]:
        with self._lock:
            return list(islice(reversed(self._dead.get(sink, {}).values()), limit))  # (buried in order)

    def redrive(self, sink: str, score_ids: Sequence[str] | None = None) -> int:
        now = _now_ms()
        done = 0
        with self._lock:
            dead = self._dead.get(sink, {})
            for score_id in list(dead) if score_ids is None else score_ids:
                if dead.pop(score_id, None) is not None:
                    self._attempts[sink].pop(score_id, None)
                    self._due[sink][score_id] = now
                    done += 1
        return done

    def drop_dead_letters(
        self, sink: str, score_ids: Sequence[str] | None = None, *, reason: str | None = None
    ) -> Iterator[SinkDeadLetter]:
        with self._lock:
            dead = self._dead.get(sink, {})
            if score_ids is not None:
                ids = list(dict.fromkeys(score_ids))
            else:
                ids = [s for s, x in dead.items() if reason is None or x.reason == reason]
            gone = [dead.pop(s) for s in ids if s in dead]
        yield from gone

    def states(self, sink: str, score_ids: Sequence[str]) -> dict[str, SinkState]:
        with self._lock:
            due, dead, done = self._due.get(sink, {}), self._dead.get(sink, {}), self._delivered.get(sink, set())
            return {
                s: "pending" if s in due else "failed" if s in dead else "delivered" if s in done else "none"
                for s in score_ids
            }

    def next_due_s(self) -> float | None:
        """Seconds until the earliest queued id of any sink is due (None: nothing queued)."""
        with self._lock:
            times = [t for due in self._due.values() for t in due.values()]
        return None if not times else max(0.0, (min(times) - _now_ms()) / 1000)

    def close(self) -> None:
        return None
