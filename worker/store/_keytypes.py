"""Keys of ours that hold another Redis type, handled one way on every path of the store.

A key may hold another type than the store keeps there (an operator's mistake, an older version,
another program on the same DB); Redis answers WRONGTYPE, which is neither a connection error
(requeue) nor the message's fault, so left alone it made a message fail on every delivery. Each
key is checked against what it should hold, and:

- *repaired* when it holds state the store owns and can rebuild (claims, checkpoints, counters,
  indexes, delivery marks): deleted, counted (``tracescore_store_key_repairs_total``) and logged
  (``store_keys_repaired``), then the call is made again;
- *refused* when deleting it could lose what someone needs (the dead-letter list, a sink's
  queue of undelivered scores and its dead letters) or make a job count again what it counted
  (its hash of counters, with the mark of its end, and its sets of counted skips and uncounted
  records): left exactly as it is, and the call raises
  ``StoreKeyTypeError`` naming the key (category ``config``: an operator has to move it aside).

Scripts check their keys first (``checked_script`` over ``LUA_CHECK``: a TYPE per key, before
anything is written, so a call is done whole or not at all) and answer a ``TRACESCORE_KEYTYPE``
error naming them; plain commands are checked only once Redis answered WRONGTYPE (``_MEND``).
Either way a call that succeeds costs no extra round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import structlog
from redis.exceptions import NoScriptError, ResponseError

from worker._errors import StoreKeyTypeError

__all__ = [
    "JOB_COUNTER_AGAIN",
    "JOB_COUNTER_ASIDE",
    "JOB_COUNTER_KEPT",
    "JOB_COUNTER_TIMES",
    "LUA_CHECK",
    "RELEASE_OWNED",
    "Check",
    "StoreKeyTypeError",
    "checked",
    "checked_async",
    "checked_script",
    "pipeline_replies",
]

log = structlog.get_logger("tracescore.worker.store")

T = TypeVar("T")

# Where a job's count that is no integer is kept once a script met it, its value as found: the
# first at ``<prefix><field>``, the next ones (damaged again before the operator repaired it) at
# ``<prefix><field><JOB_COUNTER_AGAIN><n>``, each written once, up to ``JOB_COUNTER_KEPT`` values
# (damaged in a loop, it would grow Redis without bound); ``<prefix><field><JOB_COUNTER_TIMES>``
# counts them all. The job's progress refuses while one is there (``tracescore_job_counters``).
JOB_COUNTER_ASIDE = "unreadable:"
JOB_COUNTER_KEPT = 8
JOB_COUNTER_AGAIN = "#"
JOB_COUNTER_TIMES = JOB_COUNTER_AGAIN + "count"

# (key, the type the store keeps there, keep: True when it may hold what someone needs)
Check = tuple[str, str, bool]

_MARK = "TRACESCORE_KEYTYPE"
# Calls made again after a repair before giving up (another program rewriting the key meanwhile).
_TRIES = 3


# A function for the top of every script: ``tracescore_check({key, type, 'k'|'r', ...})``
# returns nil when each key is absent or of its type. Otherwise nothing is written but the
# repair: with any 'k' key wrong it returns an error naming the first one (and deletes nothing);
# else it deletes the wrong 'r' keys and returns an error naming them (the caller calls again).
# Fields are tab-separated: Redis turns newlines in an error into spaces.
LUA_CHECK = (
    """
local function tracescore_check(checks)
  local wrong = {}
  for i = 1, #checks, 3 do
    local found = redis.call('TYPE', checks[i])['ok']
    if found ~= 'none' and found ~= checks[i + 1] then
      if checks[i + 2] == 'k' then
        local named = checks[i] .. '\\t' .. found .. '\\t' .. checks[i + 1]
        return redis.error_reply('TRACESCORE_KEYTYPE refused\\t' .. named)
      end
      wrong[#wrong + 1] = checks[i]
    end
  end
  if #wrong == 0 then
    return nil
  end
  for _, key in ipairs(wrong) do
    redis.call('DEL', key)
  end
  return redis.error_reply('TRACESCORE_KEYTYPE repaired\\t' .. table.concat(wrong, '\\t'))
end
-- ``tracescore_check_counters({key, ...}, fields, how)``, after ``tracescore_check``: the hashes of
-- counters a script adds to (HINCRBY). A field holding what HINCRBY cannot add to (not an integer,
-- or one an increment could overflow) failed the script at that HINCRBY, after its earlier writes
-- (a score stored, its counts not). Repaired as a key is, before anything else is written: a total
-- summed again from its parts' fields, another field deleted (its count starts over) or, with
-- ``how.aside``, kept aside under that prefix (``tracescore_keep_aside``), each named '<key>
-- <field>'. ``how`` (nil: plain counters, each field its own): ``totals``, a total's field -> its
-- parts' prefix; ``marks``, fields that are no counters; ``aside``, the prefix a field that is no
-- counter is moved under (a field under it is a mark too); ``float``: the fields are
-- HINCRBYFLOAT's (a finite decimal, not too large to add to), not integers. With ``fields`` only
-- those are read (a hash of a counter per queued id; the fields a call adds to), the whole hash
-- only to sum a total again.
-- ``tracescore_job_counters``: a job's ('failed' and 'skipped' are totals of 'failed:<reason>',
-- 'skipped:<reason>'; 'finished' is a mark). A count of its that is no integer is kept aside,
-- not deleted: its count starts over, so the job's counts are unknown (its progress refuses while
-- a field aside is there: worker.store._jobs), but its puts still write and count (refused,
-- every message of the job would end as a dead letter, and any other whose record replaces one
-- of the job's retryable failures).
local tracescore_job_counters = {
  totals = {failed = 'failed:', skipped = 'skipped:'}, marks = {finished = true}, aside = '"""
    + JOB_COUNTER_ASIDE
    + """'
}
local function tracescore_counter(value, float)
  if not float then
    local digits = string.match(value, '^%-?([1-9]%d*)$')
    return value == '0' or (digits ~= nil and #digits <= 18)
  end
  local n = tonumber(value)
  return n ~= nil and n == n and math.abs(n) < 1e300 and string.find(value, '^[%+%-]?[%d%.]+[eE]?[%+%-]?%d*$') ~= nil
end
-- ``value`` kept at ``kept`` (a field's first value aside) or the first of ``kept#2`` .. that is
-- free, never over one kept before; past them only their count grows. A count that is no integer
-- (a mark: no script repairs it) is taken for the values kept.
local function tracescore_keep_aside(key, kept, value)
  local slot = 0
  for i = 1, """
    + str(JOB_COUNTER_KEPT)
    + """ do
    if redis.call('HSETNX', key, i == 1 and kept or kept .. '"""
    + JOB_COUNTER_AGAIN
    + """' .. i, value) == 1 then
      slot = i
      break
    end
  end
  local counted = kept .. '"""
    + JOB_COUNTER_TIMES
    + """'
  local times = redis.call('HGET', key, counted)
  times = times and tracescore_counter(times) and tonumber(times) + 1 or 0
  redis.call('HSET', key, counted, math.max(times, slot > 0 and slot or """
    + str(JOB_COUNTER_KEPT + 1)
    + """))
end
local function tracescore_check_counters(keys, fields, how)
  how = how or {}
  local totals, marks, aside = how.totals or {}, how.marks or {}, how.aside
  local function mark(field)
    return marks[field] or (aside ~= nil and string.sub(field, 1, #aside) == aside)
  end
  local named, seen = {}, {}
  for _, key in ipairs(keys) do
    if not seen[key] and redis.call('TYPE', key)['ok'] == 'hash' then
      seen[key] = true
      local raw, bad, good, value = {}, {}, {}, {}
      if fields == nil then
        raw = redis.call('HGETALL', key)
      end
      for i = 1, #(fields or {}), 4000 do
        local last = math.min(i + 3999, #fields)
        local values = redis.call('HMGET', key, unpack(fields, i, last))
        for j = i, last do
          if values[j - i + 1] then
            local n = #raw
            raw[n + 1], raw[n + 2] = fields[j], values[j - i + 1]
          end
        end
      end
      for i = 1, #raw, 2 do
        if mark(raw[i]) or tracescore_counter(raw[i + 1], how.float) then
          good[raw[i]] = tonumber(raw[i + 1])
        else
          bad[#bad + 1] = raw[i]
          value[raw[i]] = raw[i + 1]
        end
      end
      for _, field in ipairs(bad) do
        local prefix = totals[field]
        if prefix then
          local sum, all = 0, good
          if fields ~= nil then  -- (only some fields were read: the parts are read now)
            all = {}
            local whole = redis.call('HGETALL', key)
            for i = 1, #whole, 2 do
              if tracescore_counter(whole[i + 1], how.float) then
                all[whole[i]] = tonumber(whole[i + 1])
              end
            end
          end
          for other, n in pairs(all) do
            if string.sub(other, 1, #prefix) == prefix and not mark(other) then
              sum = sum + n
            end
          end
          -- (a float's digits as Redis keeps them: HINCRBYFLOAT adds to this text)
          redis.call('HSET', key, field, how.float and string.format('%.17g', sum) or sum)
        else
          if aside then
            tracescore_keep_aside(key, aside .. field, value[field])
          end
          redis.call('HDEL', key, field)
        end
        named[#named + 1] = key .. ' ' .. field
      end
    end
  end
  if #named == 0 then
    return nil
  end
  return redis.error_reply('TRACESCORE_KEYTYPE repaired\\t' .. table.concat(named, '\\t'))
end
"""
)


def checked_script(checks: str, body: str) -> str:
    """A script that checks its keys before ``body`` runs and answers the check's error instead
    when one is wrong. ``checks``: a Lua table of (key, type, 'k' to keep | 'r' to repair)
    triples, e.g. ``"{KEYS[1], 'zset', 'k'}"``."""
    return f"{LUA_CHECK}local bad = tracescore_check({checks})\nif bad then\n  return bad\nend\n{body}"


# KEYS: a key holding its owner's token (a claim, a dlq hold). ARGV: the caller's token. Deleted
# only while it is the caller's: one that lapsed may be another caller's by now.
RELEASE_OWNED = checked_script(
    "{KEYS[1], 'string', 'r'}",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)


# For plain commands, after Redis answered WRONGTYPE. KEYS: the keys; ARGV: per key its type
# and 'k' or 'r'. Returns 0 when every key is fine (the WRONGTYPE was not about them).
_MEND = (
    LUA_CHECK
    + """
local checks = {}
for i = 1, #KEYS do
  checks[#checks + 1] = KEYS[i]
  checks[#checks + 1] = ARGV[2 * i - 1]
  checks[#checks + 1] = ARGV[2 * i]
end
local bad = tracescore_check(checks)
if bad then
  return bad
end
return 0
"""
)


def _mend_args(checks: Sequence[Check]) -> tuple[list[str], list[str]]:
    return [k for k, _, _ in checks], [a for _, kind, keep in checks for a in (kind, "k" if keep else "r")]


def _repaired(exc: ResponseError) -> list[str] | None:
    """The keys a check repaired (the call may be made again); raises ``StoreKeyTypeError`` for a
    refused key; None when ``exc`` is not a check's answer."""
    text = str(exc)
    at = text.find(_MARK)
    if at < 0:
        return None
    verdict, *fields = text[at + len(_MARK) :].strip(" ").split("\t")
    if verdict == "refused" and len(fields) >= 3:
        raise StoreKeyTypeError(fields[0], fields[1], fields[2]) from None
    return fields


def _note(where: str, keys: Sequence[str]) -> None:
    if keys:
        # Imported here: worker.metrics reads the store at scrape time (a cycle at import). A
        # pool child's count reaches its node's /metrics through the multiprocess files.
        from worker.metrics import observe_key_repairs

        observe_key_repairs(where, len(keys))
        # Key names only (ids, never a value): what an operator looks for in Redis.
        log.warning("store_keys_repaired", where=where, keys=len(keys), names=list(keys[:5]))


def _wrong_type(exc: ResponseError) -> bool:
    return _MARK in str(exc) or "WRONGTYPE" in str(exc)


def _mend_verdict(exc: ResponseError, answer: ResponseError | None) -> list[str]:
    """The keys repaired, from the answer of ``_MEND`` run after ``exc`` (None: it answered 0,
    every key was fine, so ``exc`` was about another key and is raised as it came); raises
    ``StoreKeyTypeError`` for a refused key."""
    if answer is None:
        raise exc
    keys = _repaired(answer)
    if keys is None:
        raise answer
    return keys


# A lock no holder can ever release: a key of another type, or a value without expiry (every
# lock of kombu's expires; an older kombu set the value and its expiry in two commands). Or one
# set to outlive ARGV[1] ms, which no worker of ours does: kombu's own default (300 s), left by a
# sweeper killed mid-sweep (or by Redis going down under it), held off every sweep, and so the
# redelivery of every message a dead worker held, for 5 minutes. Deleted in one step, so a lock
# taken meanwhile is never the one deleted. Returns 1 when it was.
_RELEASE_STUCK_LOCK = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind == 'string' then
  local left = redis.call('PTTL', KEYS[1])
  if left ~= -1 and left <= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('DEL', KEYS[1])
return 1
"""

# How long a sweep's lock (kombu's ``unacked_mutex``) lives: a sweep takes milliseconds, and a
# sweeper that dies holding it holds off the others (their messages' redelivery) this long.
# Concurrent sweeps would be safe anyway: each message is put back in a WATCH transaction. (A
# sweep holds it for one slice, SWEEP_SLICE_S in worker/_guard.py, then releases it: whole, a
# large backlog outlived it, 100,000 messages due taking 22-50 s.)
UNACKED_MUTEX_EXPIRE_S = 15


def release_stuck_lock(client: Any, where: str, key: str) -> bool:
    """Delete lock ``key`` (kombu's ``unacked_mutex``) when nobody can ever take it again, or it
    outlives ``UNACKED_MUTEX_EXPIRE_S``, as a repair (counted, logged with ``where``); it guards
    no data. One EVAL, synchronous client."""
    if client.eval(_RELEASE_STUCK_LOCK, 1, key, UNACKED_MUTEX_EXPIRE_S * 1000):
        _note(where, [key])
        return True
    return False


def check_list(client: Any, key: str) -> None:
    """Raises ``StoreKeyTypeError`` when ``key`` holds another Redis type than a list (absent is
    fine): for lists that hold messages (the broker's queue), which are never repaired. One TYPE,
    with the synchronous client."""
    found = client.type(key)
    found = found.decode() if isinstance(found, bytes) else str(found)
    if found not in ("none", "list"):
        raise StoreKeyTypeError(key, found, "list")


def checked(client: Any, where: str, checks: Iterable[Check], call: Callable[[], T]) -> T:
    """``call()`` (synchronous), with a wrong-typed key among ``checks`` repaired or refused."""
    names, args = _mend_args(list(checks))
    for attempt in range(_TRIES):
        try:
            return call()
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            keys = _repaired(exc)
            if keys is None:
                answer = None
                try:
                    client.eval(_MEND, len(names), *names, *args)
                except ResponseError as mend_error:
                    answer = mend_error
                keys = _mend_verdict(exc, answer)
            _note(where, keys)
            if attempt == _TRIES - 1:  # repaired each time: another program keeps rewriting it
                raise
    raise AssertionError("unreachable")


async def checked_async(client: Any, where: str, checks: Iterable[Check], call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``: ``checked`` for the asyncio client."""
    names, args = _mend_args(list(checks))
    for attempt in range(_TRIES):
        try:
            return await call()
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            keys = _repaired(exc)
            if keys is None:
                answer = None
                try:
                    await client.eval(_MEND, len(names), *names, *args)
                except ResponseError as mend_error:
                    answer = mend_error
                keys = _mend_verdict(exc, answer)
            _note(where, keys)
            if attempt == _TRIES - 1:  # repaired each time: another program keeps rewriting it
                raise
    raise AssertionError("unreachable")


def pipeline_replies(where: str, replies: Sequence[Any]) -> list[int]:
    """The positions among a pipeline's ``replies`` (run with ``raise_on_error=False``) to send
    again: scripts whose check repaired keys (noted once for the pipeline), or that Redis no
    longer had (``NoScriptError``). Raises ``StoreKeyTypeError`` for a refused key and any other
    error as it came."""
    again: list[int] = []
    repaired: list[str] = []
    try:
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                again.append(i)
            elif isinstance(reply, ResponseError):
                keys = _repaired(reply)
                if keys is None:
                    raise reply
                repaired += keys
                again.append(i)
    finally:  # what was deleted is told, whatever a later reply raises
        _note(where, repaired)
    return again
