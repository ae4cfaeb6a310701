"""Dead letters: queue messages that could not be scored, kept (with their payload) to retry.

A message is dead-lettered at most once: each letter carries the key of its queue message, and
the seen-check, the push and the count by reason are one step (a Lua script in Redis, a lock in
memory), so a redelivery of the same message (a consumer restarted before its ack) never makes
a second letter. A stored entry that no longer validates (damaged, or written by another
version) is listed as an ``unreadable_dead_letter`` of its own id, not retryable, instead of
failing the command that reads the list.

The list is bounded (``max_letters``, ``TRACESCORE_DLQ_MAX_LETTERS``; ``max_bytes``,
``TRACESCORE_DLQ_MAX_BYTES``): a producer whose every message is refused makes a letter of each,
with its message, and an unbounded list grew until Redis refused every write, the scores' too.
A bound on the letters' number alone left their size unbounded (a letter keeps up to 1 MiB of
message: 100,000 of them are 125 GiB of Redis). Past either bound the oldest letters go, in
the push, counted as dropped by their reason (``dropped``). The letters' bytes are a counter
beside the list (``dlq_bytes_key``), moved in step by every push, drop and take; one lost or
damaged is summed again from the list at the next push (``_BYTES_READ``). Both a step at a
time: Redis serves nobody else while a script runs, so no script moves more than a few MiB or a
thousand letters; the push calls again until both bounds hold (``_STEP_LUA``).
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import redis
import structlog
from pydantic import BaseModel, Field, ValidationError

from worker import _keys
from worker._logs import CountedLog
from worker._reconnect import COMMAND_SLACK_S, unavailable_as_error
from worker._settings import DEFAULT_DLQ_MAX_BYTES, DEFAULT_DLQ_MAX_LETTERS
from worker.store._keytypes import RELEASE_OWNED, Check, checked, checked_async, checked_script
from worker.store._redis import OnRedis, RedisConnection, failed_fields, known_counters

__all__ = [
    "DeadLetter",
    "DeadLetters",
    "RedisDeadLetters",
    "SyncRedisDeadLetters",
    "dead_letter_id",
    "letter_bytes",
    "letters_bytes",
]

log = structlog.get_logger("tracescore.worker.store")


class DeadLetter(BaseModel):
    """A queue message that could not be scored: why, and the message itself (to retry)."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    reason: str
    error: str = ""
    batch_id: str | None = None
    task_name: str = ""
    attempts: int = 0
    failed_at: float = Field(default_factory=time.time)
    # The task's argument as received (JSON); None when it was too large or unreadable to keep.
    payload: Any = None
    retryable: bool = True
    # Identifies the queue message (delivery tag or task id + retry): a redelivery of the same
    # message is not dead-lettered twice. None: never deduplicated.
    message_key: str | None = None
    # The runs ("trace_id:span_id") this letter is about, when it is about particular runs
    # (a run that killed its worker is dead-lettered alone).
    run_ids: list[str] = Field(default_factory=list)


# A message key is remembered this long after its dead letter (longer than any redelivery).
DLQ_SEEN_TTL_S = 7 * 24 * 3600
# A take's nonce is kept this long after it removed its letter: far past the longest one call
# of a store keeps retrying (RECONNECT_S + COMMAND_SLACK_S), short enough that `dlq drop --all`
# of 100,000 letters leaves no lasting keys.
TAKEN_TTL_S = 600


def dead_letter_id(message_key: str) -> str:
    """The letter id for a message key: the same message always makes the same letter."""
    return hashlib.sha256(message_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def letter_bytes(letter: DeadLetter) -> int:
    """The bytes ``letter`` takes on the list (its JSON, as pushed): what the byte bound counts."""
    return len(letter.model_dump_json().encode("utf-8", "surrogatepass"))


@runtime_checkable
class DeadLetters(Protocol):
    """The dead-letter list."""

    async def push(self, letter: DeadLetter) -> bool:
        """Add ``letter`` unless its ``message_key`` was dead-lettered before; True if added."""
        ...

    async def counts(self) -> dict[str, int | None]:
        """Dead letters on the list, by reason (None: its count in Redis is no number)."""
        ...

    async def dropped(self) -> dict[str, int | None]:
        """Dead letters dropped past the list's bound, by reason (None: no number in Redis)."""
        ...

    async def latest(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` letters, newest first."""
        ...

    def each(self) -> AsyncIterator[DeadLetter]:
        """Every letter, oldest first, read a page at a time; the caller may ``take`` each as it
        goes. It reads as many letters as the list held when it began: one pushed meanwhile is
        not read; one another caller took first is read if it was there when its page was."""
        ...

    async def take(self, letter_id: str) -> DeadLetter | None:
        """Remove and return one dead letter by id, an unreadable one too (None if it is not
        there)."""
        ...

    async def hold(self, letter_id: str, ttl_s: float) -> bool:
        """Reserve the letter for one caller about to send it back, for ``ttl_s`` seconds (a
        caller that dies leaves it listed); False if another caller holds it."""
        ...

    async def release(self, letter_id: str) -> None:
        """End this caller's own hold (its send failed); another caller's is left alone."""
        ...

    async def size(self) -> int: ...

    async def size_bytes(self) -> int | None:
        """The letters' bytes (their JSON), as the byte bound counts them; None while that count
        is lost or damaged in Redis (the next push sums it again from the list)."""
        ...

    async def close(self) -> None: ...


# The letters' byte count as its key holds it: a whole number, or nil (missing, damaged: no
# count to move, nor to trust).
_BYTES_READ = """
local function tracescore_dlq_bytes(raw)
  if raw and #raw <= 15 and string.match(raw, '^%d+$') then
    return tonumber(raw)
  end
  return nil
end
"""

# ``tracescore_dlq_step(list, reasons, dropped, bytes, sum, max_letters, max_bytes, budget)``: the
# next step towards both bounds, moving at most ``budget`` bytes of letters through Lua (and at
# most _STEP_LETTERS letters; at least one): Redis serves nobody else while a script runs, and a
# list of 256 MiB summed in one held it 0.7 s and copied every letter into Lua's heap. Returns
# {letters dropped, 1 when more steps are needed (the caller calls ``_TRIM``), else 0}.
#
# While the bytes are summed again (``sum`` holds ``read``: the oldest letters summed so far, and
# their ``sum``; the count ``bytes`` is gone meanwhile, ``size_bytes`` None), a step reads the
# next oldest letters, a page at a time, and drops nothing: a push adds on the newest side, which
# leaves ``read`` true, and ``_TAKE`` takes a letter summed off ``sum`` too. Once every letter is
# read ``bytes`` is ``sum``. A step that finds no count and no sum under way (either lost between
# two steps: by hand, or a key repaired for its type), or a ``read`` or ``sum`` that is no count
# of this list (damaged), sums again from the oldest: a count read as 0 was written back that
# low, the byte bound unheld for good; a negative ``read`` read past the list's far end and asked
# for more steps forever. Then the oldest go (a dropped letter's reason read from the head of its
# JSON, not decoded: the id first, then the reason, DeadLetter's field order) until both bounds
# hold, but the newest stays: one larger than the byte bound is kept alone, the count its own. A
# step that stops past the bound marks the count ``trusted`` (right, only not yet within it), so
# the push meanwhile does not sum it again. Each step leaves the list, the counts by reason, the
# dropped counts and the bytes in step: a caller gone between two loses and counts nothing twice.
_STEP_LUA = """
local function tracescore_dlq_step(list, reasons, dropped, bytes, sum, max_letters, max_bytes, budget)
  local spent, letters, gone = 0, 0, 0
  local function left()
    return letters < %(letters)d and spent < budget
  end
  local read = redis.call('HGET', sum, 'read')
  if read and redis.call('EXISTS', bytes) == 1 then
    -- (a count written meanwhile, by a push of the release before, which sums in one script and
    -- drops the oldest, those already read: its count stands, the sum under way does not)
    redis.call('HDEL', sum, 'read', 'sum')
    read = nil
  end
  local listed = redis.call('LLEN', list)
  local total
  if read then
    read, total = tracescore_dlq_bytes(read), tracescore_dlq_bytes(redis.call('HGET', sum, 'sum'))
    if read == nil or total == nil or read > listed then
      read, total = 0, 0  -- (damaged by hand: started over)
    end
  elseif tracescore_dlq_bytes(redis.call('GET', bytes)) == nil then
    -- (lost or damaged since the push, or the sum's state lost: summed again, not read as 0)
    redis.call('DEL', bytes, sum)
    read, total = 0, 0
  end
  if read then
    while read < listed and left() do
      local page = redis.call('LRANGE', list, -(read + %(page)d), -(read + 1))
      if #page == 0 then
        break
      end
      for _, letter in ipairs(page) do
        total, spent = total + #letter, spent + #letter
      end
      read, letters = read + #page, letters + #page
    end
    if read < listed then
      redis.call('HSET', sum, 'read', read, 'sum', string.format('%%d', total))
      return {0, 1}
    end
    redis.call('DEL', sum)
    redis.call('SET', bytes, string.format('%%d', total))
  end
  total = tracescore_dlq_bytes(redis.call('GET', bytes))
  while true do
    local listed = redis.call('LLEN', list)
    if listed <= 1 or (listed <= max_letters and total <= max_bytes) then
      break
    end
    if not left() then
      redis.call('SET', bytes, string.format('%%d', total))
      redis.call('HSET', sum, 'trusted', 1)
      return {gone, 1}
    end
    local oldest = redis.call('RPOP', list)
    local reason = string.match(string.sub(oldest, 1, 512), '^{"id":"[^"]*","reason":"([^"\\]+)"')
    if reason and tonumber(redis.call('HGET', reasons, reason) or '0') > 0 then
      if redis.call('HINCRBY', reasons, reason, -1) <= 0 then
        redis.call('HDEL', reasons, reason)
      end
    end
    redis.call('HINCRBY', dropped, reason or 'unreadable_dead_letter', 1)
    total, spent, letters, gone = math.max(0, total - #oldest), spent + #oldest, letters + 1, gone + 1
  end
  if redis.call('LLEN', list) == 1 then
    total = #redis.call('LINDEX', list, 0)  -- (alone: its own bytes, whatever the count was)
  end
  redis.call('SET', bytes, string.format('%%d', total))
  redis.call('DEL', sum)
  return {gone, 0}
end
"""

# Letters a step moves through Lua at most (see ``_STEP_LUA``), and letters read at once.
_STEP_LETTERS = 1000
_STEP_PAGE = 2
# Bytes of letters a step moves through Lua: 2 MiB (a page of letters of 1 MiB may pass it by 2).
STEP_BYTES = 2 * 1024 * 1024

_STEP = _BYTES_READ + _STEP_LUA % {"letters": _STEP_LETTERS, "page": _STEP_PAGE}

_PUSH_CHECKS = (
    "{KEYS[1], 'list', 'k', KEYS[2], 'string', 'r', KEYS[3], 'hash', 'r', KEYS[4], 'hash', 'r',"
    " KEYS[5], 'string', 'r', KEYS[6], 'hash', 'r'}"
)

# KEYS: dlq list, seen key, reasons hash, dropped hash, bytes count, bytes summed again. ARGV:
# letter json, reason, push nonce, seen ttl, the list's bounds: letters, bytes, the step's bytes.
# Seen-check, push and count in one step: two deliveries of one message make one letter; then a
# step of the bounds (``tracescore_dlq_step``). The list is never deleted for being of another
# type (worker.store._keytypes): it holds letters. Returns {0: seen before, 1: pushed, 2: pushed
# and letters dropped; 1 when more steps are needed (``_TRIM``)}. Our own try sent again (its
# reply lost) takes a step too: the steps the lost reply asked for are still to do.
#
# The bytes count is summed again from the list when it is nil, or more than the bound (every
# push leaves it within the bound unless the letter is alone, or the count is ``trusted``: a
# count past it is wrong, or the bound was lowered, or it is a lone letter's larger than the
# bound, read again once: one letter). Trusted, a count too high would drop every letter but the
# new one (a lone letter within the bound too); a lost one read as 0 would leave the list over
# the bound by all it held. A count left too low by a hand edit is not seen (seeing it takes
# reading the whole list at each push): the list holds more than the bound until it is down to
# one letter or the count key is deleted.
_PUSH = checked_script(
    _PUSH_CHECKS,
    _STEP
    + """
local bad = tracescore_check_counters({KEYS[3], KEYS[4]})
if bad then
  return bad
end
local max_letters, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'EX', tonumber(ARGV[4])) then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then
    return {0, 0}
  end
  -- Our own earlier try (its reply lost, the client retried) pushed this very letter: the steps
  -- its reply asked for are still to do (answered "done", the push ended past the bounds).
  local stepped = tracescore_dlq_step(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], max_letters, max_bytes,
    tonumber(ARGV[7]))
  return {stepped[1] > 0 and 2 or 1, stepped[2]}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('HDEL', KEYS[6], 'read', 'sum')  -- (a count written meanwhile stands: see the step)
end
if redis.call('HEXISTS', KEYS[6], 'read') == 0 then
  local total = tracescore_dlq_bytes(redis.call('GET', KEYS[5]))
  if total == nil or (total > max_bytes and redis.call('LLEN', KEYS[1]) > 0
      and redis.call('HEXISTS', KEYS[6], 'trusted') == 0) then
    redis.call('DEL', KEYS[5], KEYS[6])
    redis.call('HSET', KEYS[6], 'read', 0, 'sum', 0)  -- summed again, a step at a time
  else
    redis.call('SET', KEYS[5], string.format('%d', total + #ARGV[1]))
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local stepped = tracescore_dlq_step(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], max_letters, max_bytes,
  tonumber(ARGV[7]))
return {stepped[1] > 0 and 2 or 1, stepped[2]}
""",
)

# KEYS: dlq list, reasons hash, dropped hash, bytes count, bytes summed again. ARGV: the list's
# bounds: letters, bytes, the step's bytes. The next step of the bounds after a push that needs
# more (``tracescore_dlq_step``). Returns {letters dropped, 1 when more steps are needed}.
_TRIM = checked_script(
    "{KEYS[1], 'list', 'k', KEYS[2], 'hash', 'r', KEYS[3], 'hash', 'r', KEYS[4], 'string', 'r', KEYS[5], 'hash', 'r'}",
    _STEP
    + """
local bad = tracescore_check_counters({KEYS[2], KEYS[3]})
if bad then
  return bad
end
return tracescore_dlq_step(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]))
""",
)

# KEYS: dlq list, reasons hash, bytes count, bytes summed again, the letter's taken key. ARGV:
# letter json, reason ('' when the entry is no letter: the reason it was counted under is
# unknown), the take's nonce, the taken key's TTL (ms). The same call sent again by the client
# (its reply lost to a Redis restart) finds its own nonce and answers 1 again, moving nothing:
# read as "not there", ``dlq retry <id>`` said another caller had taken a letter it had sent and
# taken, and a second copy of the same bytes would have gone too. The copy nearest the
# oldest goes (``each`` reads from there: LREM from the newest scanned the whole list, 7 ms a
# take of 100,000 letters). An emptied list counts nothing, whatever its damaged entries were
# counted under. A bytes count that is nil is left so (the next push sums it again); it never goes
# below 0. While the bytes are summed again, a letter already summed is taken off the sum.
_TAKE = checked_script(
    "{KEYS[1], 'list', 'k', KEYS[2], 'hash', 'r', KEYS[3], 'string', 'r', KEYS[4], 'hash', 'r',"
    " KEYS[5], 'string', 'r'}",
    _BYTES_READ
    + """
local bad = tracescore_check_counters({KEYS[2]})
if bad then
  return bad
end
if redis.call('GET', KEYS[5]) == ARGV[3] then
  return 1
end
local read = tonumber(redis.call('HGET', KEYS[4], 'read') or '')
if read and read > 0 then
  local at = redis.call('LPOS', KEYS[1], ARGV[1], 'RANK', -1)
  if at and redis.call('LLEN', KEYS[1]) - at <= read then
    local summed = tonumber(redis.call('HGET', KEYS[4], 'sum')) or 0
    redis.call('HSET', KEYS[4], 'read', read - 1, 'sum', string.format('%d', math.max(0, summed - #ARGV[1])))
  end
end
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then
  return 0
end
redis.call('SET', KEYS[5], ARGV[3], 'PX', tonumber(ARGV[4]))
if ARGV[2] ~= '' and redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
local total = tracescore_dlq_bytes(redis.call('GET', KEYS[3]))
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[4])
  redis.call('SET', KEYS[3], '0')
elseif total ~= nil then
  redis.call('SET', KEYS[3], string.format('%d', math.max(0, total - #ARGV[1])))
end
return 1
""",
)

# KEYS: dlq list, bytes count. The letters' bytes; 0 for an empty list whatever the count; nil
# while the count is (the next push sums it again: a whole list is not read here).
_BYTES = checked_script(
    "{KEYS[1], 'list', 'k', KEYS[2], 'string', 'r'}",
    _BYTES_READ
    + """
local total = tracescore_dlq_bytes(redis.call('GET', KEYS[2]))
if redis.call('LLEN', KEYS[1]) == 0 then
  return 0
end
return total
""",
)

# KEYS: dlq list. ARGV: the newest letter ``each`` read and left, how many it left. How many
# letters lie from the list's oldest up to that one: as many as it left, unless some of them went.
# A letter gone too means those older went as well (the bound drops the oldest first) or one of
# them was taken: from the oldest then, which ``each`` may read again.
_AFTER = checked_script(
    "{KEYS[1], 'list', 'k'}",
    """
local kept = tonumber(ARGV[2])
if redis.call('LINDEX', KEYS[1], -kept) == ARGV[1] then
  return kept
end
local at = redis.call('LPOS', KEYS[1], ARGV[1], 'RANK', -1)
if not at then
  return 0
end
return redis.call('LLEN', KEYS[1]) - at
""",
)

# KEYS: the hold key. ARGV: milliseconds, the holder's token. A hold of another type, or
# without a TTL (no caller of ours wrote it), would keep the letter from every retry for good:
# it goes (repaired).
_HOLD = checked_script(
    "{KEYS[1], 'string', 'r'}",
    """
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('DEL', KEYS[1])
end
return redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', tonumber(ARGV[1])) and 1 or 0
""",
)


_LIST: list[Check] = [(_keys.dlq_key(), "list", True)]
# Letters ``each`` reads at once (each up to 1 MiB).
_PAGE = 200
# Letters ``take`` (looking for one by its id) and ``latest`` read at once (each up to 1 MiB:
# 4 MiB a command).
_FIND_PAGE = 4


def _push_args(letter: DeadLetter, max_letters: int, max_bytes: int) -> tuple[list[str], list[str]]:
    """Keys and arguments of ``_PUSH`` for ``letter``."""
    seen = _keys.dlq_seen_key(letter.message_key or f"letter:{letter.id}")
    return (
        [
            _keys.dlq_key(),
            seen,
            _keys.dlq_reasons_key(),
            _keys.dlq_dropped_key(),
            _keys.dlq_bytes_key(),
            _keys.dlq_bytes_sum_key(),
        ],
        # A fresh nonce per push: the client's own retry of this push sends the same one.
        [
            letter.model_dump_json(),
            letter.reason,
            uuid.uuid4().hex,
            str(DLQ_SEEN_TTL_S),
            str(max_letters),
            str(max_bytes),
            str(STEP_BYTES),
        ],
    )


def _trim_args(max_letters: int, max_bytes: int) -> list[str]:
    """Keys and arguments of ``_TRIM``."""
    keys = [_keys.dlq_key(), _keys.dlq_reasons_key(), _keys.dlq_dropped_key(), _keys.dlq_bytes_key()]
    return [*keys, _keys.dlq_bytes_sum_key(), str(max_letters), str(max_bytes), str(STEP_BYTES)]


def _dropped_log() -> CountedLog:
    # At the bound every push drops the oldest, for as long as a producer's every message is
    # refused: a line each was a line per refused message.
    return CountedLog("dead_letters_dropped_past_bound", logger=log, count_key="pushes")


def _said_if_dropped(pushed: Any, said: CountedLog, max_letters: int, max_bytes: int) -> bool:
    """Whether ``_PUSH`` pushed; a push that dropped the oldest letters is logged (no content,
    a line a minute)."""
    if pushed == 2:
        said.note(
            max_letters=max_letters,
            max_bytes=max_bytes,
            setting="TRACESCORE_DLQ_MAX_LETTERS, TRACESCORE_DLQ_MAX_BYTES",
        )
    return bool(pushed)


# The reason of a stored letter that no longer validates.
UNREADABLE = "unreadable_dead_letter"


def _stored(raw: str | bytes) -> DeadLetter:
    """A letter read back from the list; one that fails validation stands in as an unreadable
    letter (its id: a hash of its bytes, stable from one listing to the next; nothing of it shown)."""
    try:
        return DeadLetter.model_validate_json(raw)
    except ValidationError as exc:
        return DeadLetter(
            id=hashlib.sha256(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw).hexdigest()[:32],
            reason=UNREADABLE,
            error=f"the stored dead letter is not one (damaged, or from another version): {failed_fields(exc)}",
            failed_at=0,
            retryable=False,
        )


@unavailable_as_error
class RedisDeadLetters(OnRedis):
    """The dead-letter list in Redis (``redis.asyncio``), shared by every worker and the CLI."""

    def __init__(
        self,
        url: str,
        *,
        reconnect_s: float = 2.0,
        command_s: float = COMMAND_SLACK_S,
        connection: RedisConnection | None = None,
        max_letters: int = DEFAULT_DLQ_MAX_LETTERS,
        max_bytes: int = DEFAULT_DLQ_MAX_BYTES,
    ) -> None:
        self._redis = connection or RedisConnection(
            url, max_connections=8, reconnect_s=reconnect_s, command_s=command_s
        )
        self._holds: dict[str, str] = {}  # letter id -> the token of this caller's hold
        self.max_letters = max_letters
        self.max_bytes = max_bytes
        self._dropped = _dropped_log()
        self._read: dict[str, Any] = {}  # the page ``oldest`` read last: letter id -> its bytes
        self._gone = 0  # letters of a page ``take`` found off the list

    async def push(self, letter: DeadLetter) -> bool:
        pushed, more = await self._push_step(letter)
        while more:  # (the bounds a step at a time: see _STEP_LUA)
            dropped, more = await self._trim_step()
            pushed = 2 if dropped else pushed
        return _said_if_dropped(pushed, self._dropped, self.max_letters, self.max_bytes)

    async def _push_step(self, letter: DeadLetter) -> tuple[int, bool]:
        """``_PUSH``: (0 seen before, 1 pushed, 2 and letters dropped; more steps needed)."""
        keys, args = _push_args(letter, self.max_letters, self.max_bytes)
        (reply,) = await self._redis.evalsha_many(_PUSH, len(keys), [(*keys, *args)], where="dead_letter_push")
        return int(reply[0]), bool(int(reply[1]))

    async def _trim_step(self) -> tuple[int, bool]:
        """``_TRIM``: (letters dropped, more steps needed)."""
        (reply,) = await self._redis.evalsha_many(
            _TRIM, 5, [_trim_args(self.max_letters, self.max_bytes)], where="dead_letter_push"
        )
        return int(reply[0]), bool(int(reply[1]))

    async def counts(self) -> dict[str, int | None]:
        return await self._counters(_keys.dlq_reasons_key(), "dlq_reasons", "dead_letter_counts")

    async def dropped(self) -> dict[str, int | None]:
        return await self._counters(_keys.dlq_dropped_key(), "dlq_dropped", "dead_letter_dropped")

    async def _counters(self, key: str, name: str, where: str) -> dict[str, int | None]:
        """The hash ``key`` of counts by reason (``name`` in the log of a count that is no number,
        ``where`` in the log of a key repaired: as the metrics' scrape names them)."""
        client = self._redis.client
        raw = await checked_async(client, where, [(key, "hash", False)], lambda: client.hgetall(key))
        return {k: n for k, n in known_counters(raw, key, name).items() if n is None or n > 0}

    async def latest(self, limit: int = 100) -> list[DeadLetter]:
        # A page at a time (``_FIND_PAGE``): ``dlq list``'s 50 letters of 1 MiB were 50 MiB in one
        # command's reply. A letter pushed meanwhile moves the others down one: one read twice is
        # listed once.
        client = self._redis.client
        letters: dict[str, DeadLetter] = {}
        start = 0
        while len(letters) < limit:
            end = start + min(_FIND_PAGE, limit - len(letters)) - 1
            read = functools.partial(client.lrange, _keys.dlq_key(), start, end)
            page: list[Any] = await checked_async(client, "dead_letters", _LIST, read)
            for raw in page:
                letter = _stored(raw)
                letters.setdefault(letter.id, letter)
            if len(page) < end - start + 1:
                break
            start += len(page)
        return list(letters.values())[:limit]

    async def each(self) -> AsyncIterator[DeadLetter]:
        # Pushes go on the left: counted from the right, the letters not yet read stay where
        # they were, but for those of a page the caller left (``kept``) or found gone
        # (``_gone``). A letter left may go meanwhile (the bound's push drops the oldest, another
        # caller takes one): the next page then starts after the newest letter left (``_AFTER``),
        # wherever it now is. It ends at as many letters as the list held when it began: a `dlq
        # retry --all` whose requeued messages come back as new letters read them for good.
        kept, left, newest = 0, await self.size(), None
        shown: set[str] = set()  # the ids of the letters left: one read again is not yielded again
        while left > 0 and (page := await self.oldest(kept, min(_PAGE, left))):
            gone = self._gone
            for letter in page:
                if letter.id not in shown:
                    left -= 1
                    yield letter
            kept += len(page) - (self._gone - gone)
            shown.update(self._read)  # (those the caller left)
            newest = next(reversed(self._read.values()), newest)
            if kept and newest is not None:
                (kept,) = await self._redis.evalsha_many(
                    _AFTER, 1, [(_keys.dlq_key(), newest, str(kept))], where="dead_letters"
                )

    async def oldest(self, skip: int, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` letters, oldest first, past the ``skip`` oldest; ``take`` removes
        each by the bytes read here. (``each``'s page: public so that the class's decorator turns
        Redis being away into ``StoreUnavailableError`` here too, which an async generator misses.)"""
        client = self._redis.client
        read = functools.partial(client.lrange, _keys.dlq_key(), -(skip + limit), -(skip + 1))
        page: list[Any] = await checked_async(client, "dead_letters", _LIST, read)
        self._read.clear()
        letters = []
        for raw in reversed(page):
            letter = _stored(raw)
            self._read[letter.id] = raw
            letters.append(letter)
        return letters

    async def take(self, letter_id: str) -> DeadLetter | None:
        # The bytes of the page being read: one read of the list per letter made taking every
        # letter cost the list's size squared.
        raw: Any = self._read.pop(letter_id, None)
        paged = raw is not None
        if raw is None:
            raw = await self._find(letter_id)
            if raw is None:
                return None
        letter = _stored(raw)
        reason = "" if letter.reason == UNREADABLE else letter.reason
        keys = (
            _keys.dlq_key(),
            _keys.dlq_reasons_key(),
            _keys.dlq_bytes_key(),
            _keys.dlq_bytes_sum_key(),
            _keys.dlq_taken_key(letter.id),
        )
        # A fresh nonce per take: the client's own retry of this call sends the same one.
        args = (raw, reason, uuid.uuid4().hex, str(TAKEN_TTL_S * 1000))
        (removed,) = await self._redis.evalsha_many(_TAKE, len(keys), [(*keys, *args)], where="dead_letter_take")
        if paged or removed:
            # Off the list either way (another caller's take of it, too; a second copy of the same
            # bytes, found by the whole read): counted as still on it, the next page would skip a
            # letter not read.
            self._gone += 1
        return letter if removed else None

    async def _find(self, letter_id: str) -> Any:
        """The stored bytes of the letter ``letter_id``, read a page at a time from the newest
        (``_FIND_PAGE``): the whole list in one LRANGE held Redis 154 ms for 256 MiB of letters
        and grew its memory by as much again for the reply. A letter another caller takes
        meanwhile moves the older ones up one: one of them may be missed (None: not taken)."""
        client = self._redis.client
        start = 0
        while True:
            read = functools.partial(client.lrange, _keys.dlq_key(), start, start + _FIND_PAGE - 1)
            page: list[Any] = await checked_async(client, "dead_letters", _LIST, read)
            found = next((r for r in page if _stored(r).id == letter_id), None)
            if found is not None or len(page) < _FIND_PAGE:
                return found
            start += len(page)

    async def hold(self, letter_id: str, ttl_s: float) -> bool:
        key, token = _keys.dlq_held_key(letter_id), uuid.uuid4().hex
        (held,) = await self._redis.evalsha_many(
            _HOLD, 1, [(key, str(int(ttl_s * 1000)), token)], where="dead_letter_hold"
        )
        if held:
            self._holds[letter_id] = token
        return bool(held)

    async def release(self, letter_id: str) -> None:
        token = self._holds.pop(letter_id, None)
        if token is not None:  # only ours: a hold that lapsed may be another caller's by now
            key = _keys.dlq_held_key(letter_id)
            await self._redis.evalsha_many(RELEASE_OWNED, 1, [(key, token)], where="dead_letter_release")

    async def size(self) -> int:
        client = self._redis.client
        return int(await checked_async(client, "dead_letters", _LIST, lambda: client.llen(_keys.dlq_key())))

    async def size_bytes(self) -> int | None:
        (total,) = await self._redis.evalsha_many(
            _BYTES, 2, [(_keys.dlq_key(), _keys.dlq_bytes_key())], where="dead_letters"
        )
        return None if total is None else int(total)


def letters_bytes(client: redis.Redis) -> int | None:
    """``RedisDeadLetters.size_bytes`` on a synchronous client (the metrics' scrape): the same
    script, so the gauge and ``tracescore status`` read the total alike."""
    script = client.register_script(_BYTES)
    keys = [_keys.dlq_key(), _keys.dlq_bytes_key()]
    total = checked(client, "dead_letters", [], lambda: script(keys=keys))
    return None if total is None else int(total)


class SyncRedisDeadLetters:
    """``push`` for a caller without an event loop (the consumer's guard, a plain thread):
    the same script as ``RedisDeadLetters.push``, on a synchronous client."""

    def __init__(
        self, url: str, *, max_letters: int = DEFAULT_DLQ_MAX_LETTERS, max_bytes: int = DEFAULT_DLQ_MAX_BYTES
    ) -> None:
        self.url = url
        self.max_letters = max_letters
        self.max_bytes = max_bytes
        self._dropped = _dropped_log()
        self._client: redis.Redis | None = None
        self._script: Any = None
        self._trim: Any = None

    def push(self, letter: DeadLetter) -> bool:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=10)
            self._script = self._client.register_script(_PUSH)
            self._trim = self._client.register_script(_TRIM)
        client = self._client
        keys, args = _push_args(letter, self.max_letters, self.max_bytes)
        # The script checks its own keys (no checks to pass): ``checked`` turns its answer into a
        # repair and another try, or ``StoreKeyTypeError``.
        reply = checked(client, "dead_letter_push", [], lambda: self._script(keys=keys, args=args))
        pushed, more = int(reply[0]), int(reply[1])
        trim = _trim_args(self.max_letters, self.max_bytes)
        while more:  # (the bounds a step at a time: see _STEP_LUA)
            step = checked(client, "dead_letter_push", [], lambda: self._trim(keys=trim[:5], args=trim[5:]))
            pushed, more = (2 if int(step[0]) else pushed), int(step[1])
        return _said_if_dropped(pushed, self._dropped, self.max_letters, self.max_bytes)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
