"""Judge spend: what each score cost, daily budgets shared by every worker, a backfill job's
``--max-cost``, and the cap on judge calls per run across redeliveries.

How a budget holds (``BudgetGuard``, installed as the judge's ``JudgeGuard``): before every
judge call the day's spend of the run's scorer, of the call's model and in total (and the
job's spend, for a backfill job with ``--max-cost``) is read from the ledger and compared with
``TRACESCORE_BUDGETS``; after a successful call its real cost (by the price table) is added
(Redis ``HINCRBYFLOAT``, atomic across workers). A call finding a budget spent is refused: the
run ends as a retryable ``budget_exhausted`` record (never dropped; ``tracescore dlq retry`` or
a later delivery after the budget resets at 00:00 UTC replaces it). Overshoot is bounded: a
budget can be passed by the calls that had passed the check when it ran out — one per run in
progress (``model_concurrency`` runs per gating model and process for prompt-step scorers,
``run_concurrency`` for judges inside function steps) × the cost of one call, summed over the
models a budget covers — plus calls whose spend could not be written (Redis away; logged).

The call cap bounds what a run whose judge keeps failing pays across its deliveries. A judge
call that fails (an error answer, a timeout: a request really sent) is counted in Redis per run
and scorer version (``judge_calls:<trace>:<span>:<scorer>`` hash, field = version, TTL
``calls_ttl_s``; ``tracescore dlq retry`` deletes it); successful calls, answers the judge could
not use that reported their usage (paid for: counted as answers) and calls never sent (refused,
cancelled while waiting for the rate limiter) are not. A redelivered run reads the
count before each judge call and is refused once it reaches
``TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN`` (default ``default_attempt_cap``: one delivery's
attempts, Σ over the prompt steps of 1 + max_processor_retries, plus one per retry delivery,
``TRACESCORE_RETRY_BUDGET``); the refused run gets a retryable record naming its last judge
error. So one transient failure is retried by the worker as before, and a judge that always
answers 503 to a scorer with 3 retries costs 4 + 3 = 7 requests, not 4 × 4 = 16. A first
delivery reads nothing: its own attempts stay within the default cap (a cap set lower is held
by counting that delivery's failures in the process). A run split from a batch that crashed
its worker (``worker._task``) is not on a first delivery, though its message is new: it reads
what the batch's deliveries failed.

Days are UTC dates of the worker's clock. Spend is kept per day for ``SPEND_TTL_S`` and per
job until the job's keys expire. A job's spend hash also counts every judge call sent for it
(``calls``: failed ones too, in the write that counts the failure) and its unpriced calls per
model, by the model called: ``job_spend`` reads it as the job's summary shows it, the same tally
``MemoryLedger`` keeps in process (``score``, a backfill without a broker) for those commands.
Each write that counts a call marks itself done (``_ONCE``): sent again by the reconnecting
client after Redis ran it and its reply was lost, it adds nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import os
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python
from redis.exceptions import ResponseError as RedisResponseError

from scorers import JudgeUsage, Scorer
from scorers.judge import (
    DEFAULT_PRICES,
    JUDGE_SYSTEM_PREAMBLE,
    JudgeCallRefused,
    ModelPrice,
    find_price,
    get_judge_hooks,
    price_usage,
    set_judge_hooks,
)
from worker import _keys
from worker._errors import StoreKeyTypeError
from worker._reconnect import COMMAND_SLACK_S, StoreUnavailableError, reconnecting_client, unavailable_as_error
from worker._summary import Spend
from worker.store import checked, checked_async, checked_script

__all__ = [
    "SPEND_TTL_S",
    "BudgetGuard",
    "Budgets",
    "CostEstimate",
    "Ledger",
    "MemoryLedger",
    "RedisLedger",
    "default_attempt_cap",
    "enter_run",
    "install_local_guard",
    "job_spend",
    "parse_budgets",
    "parse_prices",
    "price_table",
    "run_key",
    "run_scope",
    "set_job_limit",
    "spend_report",
    "utc_day",
]

log = structlog.get_logger("tracescore.worker.budget")

SPEND_TTL_S = 35 * 24 * 3600
TOTAL = "total"
# A job's spend hash counts its judge calls here (every call sent: failed, unpriced, free too).
JOB_CALLS = "calls"
# Set in a job's spend hash an earlier release wrote (spend, no count of calls) when this one first
# counts a call in it: the count then holds the calls since, not all (``Spend.of_job``: unknown).
JOB_CALLS_UNKNOWN = "calls_unknown"
_ANY_PRICE = ModelPrice(input=0, output=0)  # (a name matched, whatever its price)
_PROVIDERS = sorted({model_id.partition("/")[0] for model_id in DEFAULT_PRICES})


# Numbers only: lax mode read `true` as a budget of 1 USD.
_Usd = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number of US dollars (NaN and Infinity are not allowed)")


def _load_json(raw: str | Mapping[str, Any]) -> Any:
    # json.loads takes NaN/Infinity/-Infinity by default: refuse them where they are read.
    return json.loads(raw, parse_constant=_no_constant) if isinstance(raw, str) else dict(raw)


class Budgets(BaseModel):
    """``TRACESCORE_BUDGETS``: USD per UTC day, per scorer id, per judge model id, and/or in
    total, e.g. ``{"scorers": {"relevancy": 5}, "models": {"openai/gpt-4o": 20}, "total": 50}``."""

    # No NaN (never ≥ a limit: a budget never enforced) and no Infinity (write "no budget").
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    scorers: dict[str, _Usd] = Field(default_factory=dict)
    models: dict[str, _Usd] = Field(default_factory=dict)
    total: _Usd | None = None

    def limits(self) -> dict[str, float]:
        """Ledger field → USD per day."""
        out = {f"scorer:{k}": v for k, v in self.scorers.items()}
        out.update({f"model:{k}": v for k, v in self.models.items()})
        if self.total is not None:
            out[TOTAL] = self.total
        return out


def parse_budgets(raw: str | Mapping[str, Any] | None) -> Budgets:
    """``TRACESCORE_BUDGETS`` (JSON); a bad value raises ``ValueError`` saying what is expected."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return Budgets()
    try:
        budgets = Budgets.model_validate(_load_json(raw))
        _check_model_ids(budgets.models, "models.")
    except (ValueError, ValidationError) as exc:
        raise ValueError(
            "TRACESCORE_BUDGETS must be JSON like "
            '{"scorers": {"relevancy": 5}, "models": {"openai/gpt-4o-mini": 20}, "total": 50} '
            f"(USD per UTC day): {_one_line(exc)}"
        ) from None
    return budgets


def parse_prices(raw: str | Mapping[str, Any] | None) -> dict[str, ModelPrice]:
    """The default price table overridden by ``TRACESCORE_PRICES`` (JSON: model id →
    ``{"input": .., "output": .., "cached_input": .., "cache_write": ..}`` USD per million
    tokens); a bad value raises ``ValueError``."""
    table = dict(DEFAULT_PRICES)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return table
    try:
        data = _load_json(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        for model_id, price in data.items():
            try:
                table[str(model_id)] = ModelPrice.model_validate(price)
            except ValidationError as exc:  # said with the model it is for
                raise ValueError(f"{model_id}: {_one_line(exc).removeprefix('(root): ')}") from None
        _check_model_ids(data, "")
    except (ValueError, ValidationError) as exc:
        raise ValueError(
            'TRACESCORE_PRICES must be JSON like {"openai/gpt-4o-mini": {"input": 0.15, "output": 0.6, '
            f'"cached_input": 0.075}}}} (USD per million tokens): {_one_line(exc)}'
        ) from None
    return table


def _check_model_ids(names: Mapping[str, Any], where: str) -> None:
    """Refuse a model named without its provider where the provider's name is a model we know:
    the built-in judges' ids are ``provider/model``, so ``gpt-4o-mini`` matched no call, and
    its budget went unenforced without a word. A custom ``JudgeModel``'s id names its provider
    too (``azure/gpt-4o-mini``); any other name is taken as that id."""
    for name in names:
        if "/" in name:
            continue
        known = [f"{p}/{name}" for p in _PROVIDERS if find_price(f"{p}/{name}") is not None]
        if known:
            raise ValueError(
                f"{where}{name}: a judge model id names its provider: {known[0]!r} for the built-in"
                f" judge, or a custom JudgeModel's own (e.g. 'azure/{name}'); {name!r} alone would"
                " match no built-in call"
            )


def _one_line(exc: Exception) -> str:
    """A parse error on one line (pydantic's text spans several, with a link): where and what,
    for each problem."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)
    )


@lru_cache(maxsize=8)
def _table(raw: str) -> dict[str, ModelPrice]:
    return parse_prices(raw)


def price_table() -> dict[str, ModelPrice]:
    """The price table of the environment (``TRACESCORE_PRICES`` over the defaults), for what is
    given no ``Settings``: an application's embedded sink, ``ScoringDeps`` built by hand. The
    worker and the commands pass ``parse_prices(settings.prices)`` instead."""
    try:
        return _table(os.environ.get("TRACESCORE_PRICES", ""))
    except ValueError as exc:  # set after start-up (a worker refuses it at start): say so, use the defaults
        log.warning("prices_unreadable", error=str(exc)[:300])
        return dict(DEFAULT_PRICES)


def _unreadable(where: str) -> None:
    """A value read back from Redis that was not a number (a hand-edited or hostile key): skipped
    (read as 0) and counted in ``tracescore_store_unreadable_values``, never the reason a judge
    call or a scrape fails."""
    # Imported here: worker.metrics reads the ledger at scrape time (a cycle at import). A pool
    # child's count reaches its node's /metrics through the multiprocess files.
    from worker.metrics import observe_unreadable

    observe_unreadable(where)


def _number(raw: Any, where: str) -> float:
    value = _known(raw, where)
    return 0.0 if value is None else value


def _known(raw: Any, where: str) -> float | None:
    """``raw`` as a number (None as 0), or None when it is none (counted and logged)."""
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if math.isfinite(value):
        return value
    _unreadable(where)
    log.warning("ledger_value_unreadable", key=where)
    return None


def _count(raw: Any, where: str) -> int:
    value = _number(raw, where)
    return int(value) if abs(value) < 2**53 else 0


def utc_day(now: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y-%m-%d")


def default_attempt_cap(scorer: Scorer, retry_deliveries: int) -> int:
    """Failed judge calls one run may make across its deliveries: what one delivery may make
    (per prompt step, the first try and its retries; a schema fallback call is made only after
    an answer, so it adds no failure) and one call for each of ``retry_deliveries`` more. 0 (no
    cap) for a scorer without prompt steps: judges called inside function steps are not known."""
    one_delivery = sum(
        1 + (j.effective_max_processor_retries if j is not None else 0) for j in scorer.step_judges().values()
    )
    return one_delivery + max(0, retry_deliveries) if one_delivery else 0


class Ledger(Protocol):
    """Where spend and call counts live (Redis for workers, memory for an in-process backfill)."""

    async def add(
        self, day: str, fields: list[str], cost: float, job_id: str | None = None, job_fields: Sequence[str] = ()
    ) -> None:
        """One judge call: ``cost`` added to the day's ``fields`` and, for a job, to its
        ``job_fields``, and the call counted in its ``calls``."""
        ...

    async def read(self, day: str, fields: list[str], job_id: str | None) -> tuple[list[float], float, float | None]:
        """The day's spend of ``fields``, the job's spend and the job's limit."""
        ...

    async def failed_calls(self, run_key: str, version: str) -> tuple[int, str | None]:
        """Failed judge calls of one run and scorer version so far, and the last one's error."""
        ...

    async def note_failure(self, run_key: str, version: str, error: str, ttl_s: int, job_id: str | None = None) -> None:
        """One failed call of a run, counted for its cap and (a job's) in the job's ``calls``."""
        ...

    async def reset_calls(self, run_keys: list[str]) -> None: ...

    async def spent(self, day: str) -> dict[str, float | None]:
        """The day's spend by field, None for a field that is no number (read only: the judge's
        next check or add repairs it)."""
        ...


# A spend hash's fields are HINCRBYFLOAT's; its ``total`` is the sum of its ``scorer:`` fields
# (every priced call adds its cost to its scorer's, its model's and the total).
_SPEND = "{float = true, totals = {total = 'scorer:'}}"
# What was spent, and a job's limit, cannot be rebuilt: a key of another type is refused
# (StoreKeyTypeError, naming it), never deleted, which would let the spend start again. A field
# that is no number is repaired before it is read or added to (tracescore_check_counters): read
# as 0, it let every call past its budget all day, and an add to it failed, the spend uncounted.
# A write's mark (KEYS[1] of the scripts that count a call, a random name per call): the client
# sends a command again after reconnecting, also one Redis ran whose reply was lost (Redis killed
# after its fsync, a connection cut), and the call was counted twice, its cost too. Set once the
# keys are checked (a write sent again after a repair still counts), kept past the reconnect
# budget of one store call.
WRITE_MARK_TTL_S = 60
_ONCE = f"if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', {WRITE_MARK_TTL_S}) then return 0 end"
_SPEND_KEYS = (
    "(#KEYS == 2 and {KEYS[1], 'string', 'r', KEYS[2], 'hash', 'k'}"
    " or {KEYS[1], 'string', 'r', KEYS[2], 'hash', 'k', KEYS[3], 'hash', 'k'})"
)
# Before a job's hash first counts a call: one holding spend already (an earlier release's) is
# marked, its calls before uncounted.
_CALLS_COUNTED = f"""
local function tracescore_count_calls(key)
  if redis.call('HEXISTS', key, '{JOB_CALLS}') == 0 and redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, '{JOB_CALLS_UNKNOWN}', 1)
  end
end
"""

# KEYS: the write's mark, then the spend hashes written (the day's when it has fields, then the
# job's, if any). ARGV: the cost, then per hash its TTL, its number of fields and its fields. A
# job's `calls` field counts the call (1, whatever it cost). A hash is given its TTL whenever it
# has none, asked here (no round trip): a process that gave it once per key left a hash deleted
# or expired, and then written again, with none, kept for good.
_ADD = checked_script(
    _SPEND_KEYS,
    _CALLS_COUNTED
    + f"""
local plan, hashes, at = {{}}, {{unpack(KEYS, 2)}}, 2
for k = 1, #hashes do
  local n = tonumber(ARGV[at + 1])
  plan[k] = {{ttl = ARGV[at], fields = {{unpack(ARGV, at + 2, at + 1 + n)}}}}
  at = at + 2 + n
end
for k, key in ipairs(hashes) do
  local bad = tracescore_check_counters({{key}}, plan[k].fields, {_SPEND})
  if bad then return bad end
end
{_ONCE}
for k, key in ipairs(hashes) do
  if plan[k].fields[#plan[k].fields] == '{JOB_CALLS}' then
    tracescore_count_calls(key)
  end
  for _, field in ipairs(plan[k].fields) do
    redis.call('HINCRBYFLOAT', key, field, field == '{JOB_CALLS}' and 1 or ARGV[1])
  end
  if redis.call('TTL', key) == -1 then
    redis.call('EXPIRE', key, plan[k].ttl)
  end
end
return 0
""",
)

# KEYS: the day's spend, then (a job's) its spend and its limit. ARGV: the day's fields to read.
# Returns {the fields' values, the job's total, the job's limit}.
_READ = checked_script(
    "(#KEYS == 1 and {KEYS[1], 'hash', 'k'} or {KEYS[1], 'hash', 'k', KEYS[2], 'hash', 'k', KEYS[3], 'string', 'k'})",
    f"""
-- (only the fields read: the whole hash only to sum a total again)
local bad = tracescore_check_counters({{KEYS[1]}}, ARGV, {_SPEND})
  or (#KEYS == 3 and tracescore_check_counters({{KEYS[2]}}, {{'total'}}, {_SPEND}))
if bad then return bad end
local out = {{#ARGV > 0 and redis.call('HMGET', KEYS[1], unpack(ARGV)) or {{}}}}
if #KEYS == 3 then
  out[2] = redis.call('HGET', KEYS[2], 'total')
  out[3] = redis.call('GET', KEYS[3])
end
return out
""",
)

# KEYS: the write's mark, a run's failed-call hash, then (a job's call) the job's spend. ARGV:
# version, error, TTL, then the job spend's TTL (given when it has none, as ``_ADD`` gives it).
# Its count is rebuilt from zero if it must be: a key of another type, or a count that is no
# integer (its HINCRBY failed, and with it the judge's failure hook), is repaired. The job's
# spend counts the call (no cost) in the same script.
_NOTE_FAILURE = checked_script(
    "(#KEYS == 2 and {KEYS[1], 'string', 'r', KEYS[2], 'hash', 'r'}"
    " or {KEYS[1], 'string', 'r', KEYS[2], 'hash', 'r', KEYS[3], 'hash', 'k'})",
    _CALLS_COUNTED
    + f"""
local bad = tracescore_check_counters({{KEYS[2]}}, {{ARGV[1]}})
  or (#KEYS == 3 and tracescore_check_counters({{KEYS[3]}}, {{'{JOB_CALLS}'}}, {_SPEND}))
if bad then return bad end
{_ONCE}
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('HSET', KEYS[2], ARGV[1] .. ':error', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if #KEYS == 3 then
  tracescore_count_calls(KEYS[3])
  redis.call('HINCRBYFLOAT', KEYS[3], '{JOB_CALLS}', 1)
  if redis.call('TTL', KEYS[3]) == -1 then
    redis.call('EXPIRE', KEYS[3], ARGV[4])
  end
end
return 0
""",
)


def _write_mark() -> str:
    """A fresh mark for one call's write (``_ONCE``)."""
    return _keys.spend_write_key(uuid.uuid4().hex)


@unavailable_as_error
class RedisLedger:
    """``Ledger`` in Redis: ``spend:<day>`` and ``spend:job:<id>`` hashes (field → USD; a job's
    ``calls`` and ``unpriced:<model>`` → calls),
    ``budget:job:<id>`` (a job's limit), ``judge_calls:<trace>:<span>:<scorer>`` hashes (field
    ``<version>``: failed calls, ``<version>:error``: the last one's error)."""

    def __init__(self, url: str, *, reconnect_s: float = 2.0, command_s: float = COMMAND_SLACK_S) -> None:
        self.url = url
        self.reconnect_s = reconnect_s
        self.command_s = command_s
        self._client: Any = None
        self._loop: Any = None

    def _redis(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = reconnecting_client(
                self.url, max_connections=32, reconnect_s=self.reconnect_s, command_s=self.command_s
            )
            self._loop = loop
            self._add = self._client.register_script(_ADD)
            self._read = self._client.register_script(_READ)
            self._note_failure = self._client.register_script(_NOTE_FAILURE)
        return self._client

    async def add(
        self, day: str, fields: list[str], cost: float, job_id: str | None = None, job_fields: Sequence[str] = ()
    ) -> None:
        writes = [(_keys.spend_key(day), list(fields))] if fields else []
        if job_id:
            writes.append((_keys.job_spend_key(job_id), [*job_fields, JOB_CALLS]))
        if not writes:
            return
        client = self._redis()
        keys = [key for key, _ in writes]
        # One round trip, no MULTI; the fields it adds to checked first (only those: a call's
        # cost is one script of a few commands in Redis).
        args: list[Any] = [repr(float(cost))]
        for _, written in writes:
            args += [SPEND_TTL_S, len(written), *written]
        marked = [_write_mark(), *keys]
        await checked_async(client, "spend_add", [], lambda: self._add(keys=marked, args=args))

    async def read(self, day: str, fields: list[str], job_id: str | None) -> tuple[list[float], float, float | None]:
        client = self._redis()
        keys = [_keys.spend_key(day)]
        if job_id:
            keys += [_keys.job_spend_key(job_id), _keys.job_budget_key(job_id)]
        out = list(await checked_async(client, "spend_read", [], lambda: self._read(keys=keys, args=fields)))
        values = [_number(v, f"spend:{f}") for f, v in zip(fields, out.pop(0), strict=True)]
        if not job_id:
            return values, 0.0, None
        # An unreadable job limit reads as 0: the job's calls are refused (logged), not unbounded.
        return values, _number(out[0], "job_spend"), _number(out[1], "job_limit") if out[1] is not None else None

    async def failed_calls(self, run_key: str, version: str) -> tuple[int, str | None]:
        client, key = self._redis(), _keys.judge_calls_key(run_key)
        # A run's failed-call count is rebuilt from zero if it must be: repaired (deleted, counted).
        count, error = await checked_async(
            client, "judge_calls", [(key, "hash", False)], lambda: client.hmget(key, [version, f"{version}:error"])
        )
        return _count(count, "judge_calls"), str(error) if error is not None else None

    async def note_failure(self, run_key: str, version: str, error: str, ttl_s: int, job_id: str | None = None) -> None:
        client, keys = self._redis(), [_write_mark(), _keys.judge_calls_key(run_key)]
        args: list[Any] = [version, error, ttl_s]
        if job_id:
            keys.append(_keys.job_spend_key(job_id))
            args.append(SPEND_TTL_S)
        await checked_async(client, "judge_calls", [], lambda: self._note_failure(keys=keys, args=args))

    async def reset_calls(self, run_keys: list[str]) -> None:
        if run_keys:
            await self._redis().delete(*(_keys.judge_calls_key(k) for k in run_keys))

    async def spent(self, day: str) -> dict[str, float | None]:
        raw = await self._redis().hgetall(_keys.spend_key(day))
        return {k: _known(v, f"spend:{k}") for k, v in raw.items()}

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose(close_connection_pool=True)


def set_job_limit(client: Any, job_id: str, usd: float) -> None:
    """Write a backfill job's ``--max-cost`` where ``RedisLedger.read`` finds it, with the
    job's spend TTL (``client``: a sync Redis client; written before the job's first message,
    which ``BudgetGuard`` relies on to remember jobs without one)."""
    client.set(_keys.job_budget_key(job_id), repr(float(usd)), ex=SPEND_TTL_S)


def job_spend(client: Any, job_id: str) -> Spend:
    """A backfill job's judge spend as its workers' ledgers counted it, call by call, over all
    its deliveries and resumes (``client``: a sync Redis client; a key of another type raises
    ``StoreKeyTypeError``, a field that is no number is left out, counted as unreadable)."""
    key = _keys.job_spend_key(job_id)
    raw = checked(client, "job_spend", [(key, "hash", True)], lambda: client.hgetall(key))
    fields = {k.decode() if isinstance(k, bytes) else str(k): v for k, v in raw.items()}
    return Spend.of_job({k: _known(v, f"job_spend:{k}") for k, v in fields.items()})


# Runs' counts of failed judge calls a ``MemoryLedger`` keeps, the newest touched: without a
# bound, `tracescore score` of a file of millions of runs through a judge's outage kept one
# entry per failing run for as long as it ran. A run's tries come within minutes of each other,
# far inside this many other runs' failures.
MEMORY_CALLS_KEPT = 100_000


class MemoryLedger:
    """``Ledger`` in this process (no TTLs: it lives as long as the backfill that owns it; the
    counts of failed calls are bounded instead, ``MEMORY_CALLS_KEPT``). ``spend`` is every judge
    call made here by scorer and model, and what the answered ones cost (the guard's
    ``on_usage`` and ``on_failure``): the judge spend the command that owns it shows, the calls
    of a run that got no record too."""

    def __init__(self) -> None:
        self.days: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.jobs: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.job_limits: dict[str, float] = {}
        self.calls: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.errors: dict[tuple[str, str], str] = {}
        self.spend = Spend()

    def answered(self, scorer_id: str, model_id: str, usage: JudgeUsage, cost: float | None) -> None:
        """One answered judge call, at the cost the guard adds to the budgets (None: no price)."""
        self.spend.add_call(scorer_id, model_id, cost)

    def failed(self, scorer_id: str, model_id: str) -> None:
        """One judge call sent that failed: a call, nothing paid."""
        self.spend.add_call(scorer_id, model_id, 0.0)

    async def add(
        self, day: str, fields: list[str], cost: float, job_id: str | None = None, job_fields: Sequence[str] = ()
    ) -> None:
        for f in fields:
            self.days[day][f] += cost
        if job_id:
            for f in job_fields:
                self.jobs[job_id][f] += cost
            self.jobs[job_id][JOB_CALLS] += 1

    async def read(self, day: str, fields: list[str], job_id: str | None) -> tuple[list[float], float, float | None]:
        values = [self.days[day].get(f, 0.0) for f in fields]
        if not job_id:
            return values, 0.0, None
        return values, self.jobs[job_id].get(TOTAL, 0.0), self.job_limits.get(job_id)

    async def failed_calls(self, run_key: str, version: str) -> tuple[int, str | None]:
        return self.calls.get((run_key, version), 0), self.errors.get((run_key, version))

    async def note_failure(self, run_key: str, version: str, error: str, ttl_s: int, job_id: str | None = None) -> None:
        if job_id:
            self.jobs[job_id][JOB_CALLS] += 1
        key = (run_key, version)
        self.calls[key] = self.calls.get(key, 0) + 1
        self.calls.move_to_end(key)
        self.errors[key] = error
        if len(self.calls) > MEMORY_CALLS_KEPT:
            oldest, _ = self.calls.popitem(last=False)
            self.errors.pop(oldest, None)

    async def reset_calls(self, run_keys: list[str]) -> None:
        keys = set(run_keys)
        for key in [k for k in self.calls if k[0] in keys]:
            self.calls.pop(key, None)
            self.errors.pop(key, None)

    async def spent(self, day: str) -> dict[str, float | None]:
        return dict(self.days.get(day, {}))


def run_key(trace_id: str, span_id: str, scorer_id: str) -> str:
    """The key a run's failed judge calls are counted under (one field per scorer version, so
    a new version starts from zero); ``tracescore dlq retry`` resets it from the message alone."""
    return f"{trace_id}:{span_id}:{scorer_id}"


@dataclass
class _Run:
    run_key: str
    scorer_id: str
    job_id: str | None
    max_calls: int
    version: str = ""
    # A redelivery (a split batch's run included) reads the run's count kept by its earlier
    # deliveries; a first delivery counts its own failures here (no read: what one delivery
    # makes is within the default cap).
    redelivery: bool = True
    failed_here: int = 0
    last_here: str | None = None


_current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("tracescore_budget_run", default=None)


def enter_run(
    run_key: str, scorer_id: str, job_id: str | None, max_calls: int, *, version: str = "", redelivery: bool = True
) -> None:
    """``run_scope`` for the rest of the current task (for a coroutine that is a task of its own)."""
    _current.set(_Run(run_key, scorer_id, job_id, max_calls, version, redelivery))


@contextmanager
def run_scope(
    run_key: str, scorer_id: str, job_id: str | None, max_calls: int, *, version: str = "", redelivery: bool = True
) -> Iterator[None]:
    """The judge calls made inside belong to this run (its scorer's budget, its job's
    ``--max-cost``, its cap on failed calls; ``max_calls`` 0 means no cap)."""
    token = _current.set(_Run(run_key, scorer_id, job_id, max_calls, version, redelivery))
    try:
        yield
    finally:
        _current.reset(token)


class BudgetGuard:
    """The worker's ``JudgeGuard``: budgets, spend accounting and the per-run call cap."""

    def __init__(
        self,
        ledger: Ledger,
        budgets: Budgets,
        *,
        prices: Mapping[str, ModelPrice] | None = None,
        calls_ttl_s: int = 3600,
        on_usage: Callable[[str, str, JudgeUsage, float | None], None] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.budgets = budgets
        self._prices = prices
        self.calls_ttl_s = calls_ttl_s
        # (scorer, model, usage, cost or None if unpriced) of every answered call: the
        # worker's metrics, counted where the ledger counts the spend.
        self.on_usage = on_usage
        # (scorer, model) of every call sent that failed (an error answer, a timeout).
        self.on_failure = on_failure
        # Judge models seen answering with usage the price table cannot price (a model that
        # reports none, a local one, costs 0 and is never here).
        self._unpriced: set[str] = set()

    @property
    def prices(self) -> Mapping[str, ModelPrice]:
        return self._prices if self._prices is not None else price_table()

    def _model_field(self, model_id: str) -> str:
        """The ledger field of ``model_id``'s spend: its own, else that of the model a budget
        names when ``model_id`` is a dated snapshot of it (priced as that model, so capped as it:
        a budget on ``openai/gpt-4o-mini`` let ``openai/gpt-4o-mini-2024-07-18`` through)."""
        own = f"model:{model_id}"
        limits = self.budgets.limits()
        if own not in limits:
            for field in limits:  # (find_price's rule, on a table of one: the same names match)
                if field.startswith("model:") and find_price(model_id, {field[6:]: _ANY_PRICE}) is not None:
                    return field
        return own

    async def before_call(self, model_id: str, scorer_id: str) -> None:
        run = _current.get()
        scorer = run.scorer_id if run is not None else scorer_id
        job_id = run.job_id if run is not None else None
        limits = self.budgets.limits()
        fields = [f for f in (f"scorer:{scorer}", self._model_field(model_id), TOTAL) if f in limits]
        # A job's limit is read before each of its calls, even for a job found without one:
        # `--resume JOB --max-cost` gives it one, which a process that had remembered it
        # without one never read (the job paid on past it, the spend before its stop uncounted).
        if fields or job_id:
            try:
                values, job_spent, job_limit = await self.ledger.read(utc_day(), fields, job_id)
            except StoreKeyTypeError as exc:
                # No call without knowing what was spent: refused as a spent budget is (a
                # retryable record; the message is kept to score once the key is moved aside).
                raise JudgeCallRefused(str(exc), error_type="store_key_refused") from None
            for field, spent in zip(fields, values, strict=True):
                if spent >= limits[field]:
                    raise JudgeCallRefused(
                        f"the daily budget of {field.replace(':', ' ')} is spent "
                        f"({spent:.4f} of {limits[field]:.4f} USD today, UTC); set in TRACESCORE_BUDGETS",
                        error_type="budget_exhausted",
                    )
            if job_limit is not None and job_spent >= job_limit:
                raise JudgeCallRefused(
                    f"backfill job {job_id} reached its --max-cost ({job_spent:.4f} of {job_limit:.4f} USD)",
                    error_type="budget_exhausted",
                )
            if model_id in self._unpriced and find_price(model_id, self.prices) is None:
                # Its spend cannot count against them: each call would pass every budget.
                held = [f.replace(":", " ") for f in fields] + ([f"job {job_id}'s --max-cost"] if job_limit else [])
                if held:
                    raise JudgeCallRefused(
                        f"judge model {model_id} has no price, so its spend cannot be held against "
                        f"{', '.join(held)}; add it to TRACESCORE_PRICES",
                        error_type="unpriced_model",
                    )
        if run is not None and run.max_calls > 0:
            if run.redelivery:
                failed, last = await self.ledger.failed_calls(run.run_key, run.version)
            else:
                failed, last = run.failed_here, run.last_here
            if failed >= run.max_calls:
                # The record names the run's real failure (the last judge error), not the cap.
                kind, _, message = (last or "").partition(": ")
                raise JudgeCallRefused(
                    f"{failed} judge call(s) of this run failed across its deliveries "
                    f"(TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN: {run.max_calls}); no more are made for it"
                    + (f"; the last failed with {kind}: {message}" if last else ""),
                    error_type=kind if last else "judge_attempts_exhausted",
                )

    async def call_failed(self, model_id: str, scorer_id: str, error: Exception) -> None:
        # Called only for a request really sent (the provider's error answer, or its timeout).
        run = _current.get()
        scorer = run.scorer_id if run is not None else scorer_id
        if self.on_failure is not None:
            self.on_failure(scorer, model_id)
        if run is None:
            return
        if run.max_calls <= 0:
            # A call of the job all the same (one write: a failure's, not every call's).
            if run.job_id:
                await self._count(scorer, model_id, 0.0, lambda: self.ledger.add(utc_day(), [], 0.0, run.job_id))
            return
        run.failed_here += 1
        run.last_here = f"{type(error).__name__}: {str(error)[:500]}"
        try:  # (the job's calls counted in the same write)
            await self.ledger.note_failure(run.run_key, run.version, run.last_here, self.calls_ttl_s, run.job_id)
        except (StoreUnavailableError, StoreKeyTypeError, asyncio.CancelledError) as exc:
            # The run fails as transient (its cap needs the count), and the job's count of
            # calls misses this one: said so, as an answer's is.
            if run.job_id:
                _not_counted(scorer, model_id, 0.0, exc)
            raise

    async def after_call(self, model_id: str, scorer_id: str, usage: JudgeUsage) -> None:
        cost = price_usage(model_id, usage, self.prices)
        run = _current.get()
        scorer = run.scorer_id if run is not None else scorer_id
        if self.on_usage is not None:
            self.on_usage(scorer, model_id, usage, cost)
        job_id = run.job_id if run is not None else None
        if cost is None:
            # No price: nothing to hold against a budget, but counted (calls), so status
            # can say the spend shown leaves these out; from now on a budget that applies
            # refuses this model's calls (before_call).
            if model_id not in self._unpriced:
                self._unpriced.add(model_id)
                log.warning("judge_model_unpriced", model=model_id, hint="add it to TRACESCORE_PRICES")
            unpriced = [f"unpriced:{model_id}"]
            await self._count(
                scorer, model_id, None, lambda: self.ledger.add(utc_day(), unpriced, 1.0, job_id, unpriced)
            )
        elif cost or job_id:  # (a free call is written for a job alone: its calls)
            day = [f"scorer:{scorer}", self._model_field(model_id), TOTAL] if cost else []
            # A job's spend per model is by the model called (the day's, by the budget's name).
            job = [f"scorer:{scorer}", f"model:{model_id}", TOTAL] if cost else []
            await self._count(scorer, model_id, cost, lambda: self.ledger.add(utc_day(), day, cost, job_id, job))

    @staticmethod
    async def _count(scorer: str, model_id: str, cost: float | None, add: Callable[[], Awaitable[None]]) -> None:
        try:
            await add()
        except (StoreUnavailableError, StoreKeyTypeError, RedisResponseError, asyncio.CancelledError) as exc:
            # The answer is paid for: keep it rather than fail the run and pay again on its
            # redelivery. The spend goes uncounted (the budget may be passed by this much);
            # a ResponseError is a spend field that is not a number (counted as unreadable).
            # The run stopped (its timeout, a shutdown) while the write waited for Redis is
            # stopped all the same, its spend uncounted and said so: it went by without a word.
            if isinstance(exc, RedisResponseError):
                _unreadable("spend_add")
            _not_counted(scorer, model_id, cost, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise


def _not_counted(scorer: str, model_id: str, cost: float | None, exc: BaseException) -> None:
    """A judge call the ledger may not have counted: its write got no answer (a write Redis ran,
    its reply lost, is counted all the same), so its job's ``judge_calls`` and spend are short by
    it at most."""
    log.warning("judge_spend_not_counted", scorer=scorer, model=model_id, cost_usd=cost, error=type(exc).__name__)


async def spend_report(ledger: Ledger, budgets: Budgets, day: str | None = None) -> dict[str, Any]:
    """Today's spend per scorer and per model, and each budget's remaining (``tracescore status``,
    the metrics). A field that is no number is None (unknown), and named in ``unreadable``: read
    as 0 it showed a smaller spend and a budget left whole. A ``total`` that is no number is its
    scorers' sum, as the judge's next check makes it (``tracescore_check_counters``), unless one
    of them is no number too. Nothing is written: ``status`` is a health check, a replica's too."""
    day = day or utc_day()
    spent = await ledger.spent(day)
    unreadable = sorted(k for k, v in spent.items() if v is None)
    if spent.get(TOTAL, 0.0) is None:
        parts = [v for k, v in spent.items() if k.startswith("scorer:")]
        spent[TOTAL] = None if None in parts else sum(v for v in parts if v is not None)

    def budget(field: str, limit: float) -> dict[str, float | None]:
        used = spent.get(field, 0.0)
        return {
            "limit_usd": limit,
            "spent_usd": used,
            "remaining_usd": None if used is None else max(0.0, limit - used),
        }

    return {
        "day": day,
        "total_usd": spent.get(TOTAL, 0.0),
        "by_scorer": {k[7:]: v for k, v in sorted(spent.items()) if k.startswith("scorer:")},
        "by_model": {k[6:]: v for k, v in sorted(spent.items()) if k.startswith("model:")},
        # Judge calls today to models with no price (their cost is in no figure above).
        "unpriced_calls": {
            k[9:]: None if v is None else int(v) for k, v in sorted(spent.items()) if k.startswith("unpriced:")
        },
        "budgets": {field: budget(field, limit) for field, limit in sorted(budgets.limits().items())},
        "unreadable": unreadable,
    }


def install_local_guard(
    budgets: Budgets,
    job_id: str | None = None,
    max_cost_usd: float | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> tuple[MemoryLedger, Callable[[], None]]:
    """Budgets for scoring in this process (``score``, a backfill without a broker): a ledger,
    the in-memory twin of the workers', behind this process's judge guard, whose ``spend`` is
    the judge spend those commands show (every call, a pair a stop left without a record too);
    and what puts the hooks back as they were (call it when the scoring is over)."""
    ledger = MemoryLedger()
    if job_id and max_cost_usd is not None:
        ledger.job_limits[job_id] = float(max_cost_usd)
    previous = get_judge_hooks()
    set_judge_hooks(
        replace(
            previous,
            guard=BudgetGuard(ledger, budgets, prices=prices, on_usage=ledger.answered, on_failure=ledger.failed),
        )
    )
    return ledger, lambda: set_judge_hooks(previous)


# What the dry-run estimate assumes: a token is 4 characters; each judge step's prompt template
# adds this many characters around the run; each answer is this many tokens (a score and a
# sentence or two of JSON; capped by the judge's max_tokens).
CHARS_PER_TOKEN = 4
TEMPLATE_CHARS = 600
ANSWER_TOKENS = 150


@dataclass
class _Estimate:
    runs: int = 0
    judge_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "judge_calls": self.judge_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "unpriced_calls": self.unpriced_calls,
        }


class CostEstimate:
    """``backfill --dry-run``'s estimate of judge tokens and cost, made without calling a judge.

    Per run and scorer, each prompt step is one judge call whose prompt is the judge's system
    text (preamble + instructions) + the run's input and output as JSON + ``TEMPLATE_CHARS``,
    at ``CHARS_PER_TOKEN``; its answer ``ANSWER_TOKENS`` (at most the judge's max_tokens); no
    prompt caching, no retries. Priced by the price table. Its error: prompts that quote only
    part of the run (a filtered run, the last message) or add long context make it high or low;
    real tokenizers differ from 4 characters a token by some ±25 % on English text; answers
    vary. Read it as the order of magnitude, not the bill.
    """

    def __init__(self, scorers: Mapping[str, Scorer], prices: Mapping[str, ModelPrice] | None = None) -> None:
        self.prices = prices if prices is not None else price_table()
        self.by_scorer: dict[str, _Estimate] = {s: _Estimate() for s in scorers}
        self.by_model: dict[str, _Estimate] = {}
        self._steps: dict[str, list[tuple[str, int, int]]] = {}
        # Runs whose content could not be measured (a value no JSON encoder writes): left out.
        self.not_estimated = 0
        for scorer_id, scorer in scorers.items():
            steps = []
            for judge in scorer.step_judges().values():
                if judge is None or judge.model is None:
                    continue
                model = judge.model if isinstance(judge.model, str) else judge.model.model_id
                system = len(JUDGE_SYSTEM_PREAMBLE) + len(judge.instructions or "")
                steps.append((model, system, min(ANSWER_TOKENS, judge.max_tokens)))
            self._steps[scorer_id] = steps

    def add(self, run: Any) -> None:
        """One run (a ``TracedRun``, or anything with ``input`` / ``output``) for every scorer."""
        try:
            chars = len(json.dumps(to_jsonable_python(run.input))) + len(json.dumps(to_jsonable_python(run.output)))
        except (ValueError, TypeError, RecursionError):  # that run only: the dry run goes on
            self.not_estimated += 1
            return
        for scorer_id, steps in self._steps.items():
            self.by_scorer[scorer_id].runs += 1
            for model, system, answer in steps:
                prompt = (system + chars + TEMPLATE_CHARS) // CHARS_PER_TOKEN
                cost = price_usage(model, JudgeUsage(input_tokens=prompt, output_tokens=answer), self.prices)
                for e in (self.by_scorer[scorer_id], self.by_model.setdefault(model, _Estimate())):
                    e.judge_calls += 1
                    e.input_tokens += prompt
                    e.output_tokens += answer
                    if cost is None:
                        e.unpriced_calls += 1
                    else:
                        e.cost_usd += cost

    def as_json(self) -> dict[str, Any]:
        return {
            "method": "characters / 4 of the judge's system text + the run's input and output + "
            f"{TEMPLATE_CHARS} per prompt step; {ANSWER_TOKENS} answer tokens; no caching, no retries",
            "cost_usd": sum(e.cost_usd for e in self.by_scorer.values()),
            "input_tokens": sum(e.input_tokens for e in self.by_scorer.values()),
            "output_tokens": sum(e.output_tokens for e in self.by_scorer.values()),
            "judge_calls": sum(e.judge_calls for e in self.by_scorer.values()),
            "unpriced_calls": sum(e.unpriced_calls for e in self.by_scorer.values()),
            "runs_not_estimated": self.not_estimated,
            "by_scorer": {k: v.as_json() for k, v in self.by_scorer.items()},
            "by_model": {k: v.as_json() for k, v in self.by_model.items()},
        }

    def lines(self) -> list[str]:
        data = self.as_json()
        if not data["judge_calls"]:
            return ["estimated judge cost: none (no scorer asks a judge)"]
        unpriced = f", {data['unpriced_calls']:,} calls to models without a price" if data["unpriced_calls"] else ""
        out = [
            f"estimated judge cost: ~{data['cost_usd']:.4f} USD for {data['judge_calls']:,} judge calls, "
            f"~{data['input_tokens']:,} input + ~{data['output_tokens']:,} output tokens{unpriced} "
            "(characters / 4; no caching, no retries: an order of magnitude, not the bill)"
        ]
        out += [f"  scorer {k}: ~{v.cost_usd:.4f} USD ({v.judge_calls:,} calls)" for k, v in self.by_scorer.items()]
        out += [f"  model  {k}: ~{v.cost_usd:.4f} USD ({v.judge_calls:,} calls)" for k, v in self.by_model.items()]
        if self.not_estimated:
            out.append(f"  {self.not_estimated:,} run(s) left out: their content could not be measured")
        return out
