"""What the operator's commands read and change, for one ``Settings``: the queue's status
(``tracescore status``) and the dead letters (``tracescore dlq list|retry``).

A server that cannot be reached raises ``redis.RedisError`` or ``OSError`` (``ConnectionError``
for the worker ping); the command line says which server, in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from pydantic import ValidationError

from tracing import CelerySink, redact
from tracing.queue import MAX_BATCH_PAIRS, RequestCutter, RunTooLarge, ScoreBatch, ScoreRequest, plain_id
from worker._budget import RedisLedger, parse_budgets, run_key, spend_report
from worker._errors import UnreadableCounterError
from worker._keys import backfill_hold_key, backfill_jobs_key, backfill_state_key, job_key
from worker._limiter import RedisRateLimiter
from worker._reconnect import CLI_PATIENCE, DECODED
from worker._settings import Settings
from worker.backfill import BackfillState
from worker.store import (
    DeadLetter,
    RedisDeadLetters,
    RedisJobStats,
    StoreKeyTypeError,
    check_list,
    checked,
    checked_script,
    job_counts,
    validation_place,
)

if TYPE_CHECKING:
    from worker._guard import BrokerWrites

__all__ = [
    "Dropped",
    "Requeued",
    "backfill_jobs",
    "broker_status",
    "dead_letters",
    "drop_dead_letters",
    "requeue_dead_letters",
    "store_evicts",
    "store_status",
]

# How long one `dlq retry` holds a letter it is sending back (a `dlq drop`, one it removed): past
# it (the caller died), a later retry may send it.
HOLD_S = 60.0


def broker_status(settings: Settings, ping_timeout: float = 1.0) -> dict[str, Any]:
    """The broker's side: queue depth, unacked deliveries, the workers that answer a ping, and
    whether its Redis refuses writes, full (used memory at ``maxmemory`` with ``noeviction``) or
    read-only (the endpoint is a replica: a failover under way): then the workers wait and no
    ping can be sent (``workers`` None). The queue's list of another Redis type leaves its depth
    unknown (None), named in ``refused_keys``."""
    tls = settings.tls.redis_kwargs(settings.broker_url)  # rediss:// verifies, as the workers do
    broker = redis.Redis.from_url(settings.broker_redis_url, socket_connect_timeout=2, socket_timeout=2, **tls)
    refused: list[str] = []
    try:
        broker.ping()
        depth: int | None = None
        try:
            check_list(broker, settings.queue)
            depth = int(broker.llen(settings.queue))
        except StoreKeyTypeError as exc:
            refused.append(f"the broker's queue: {exc}")
        # (a workers' unacked hash of another type is repaired by the next worker that uses it)
        unacked = int(broker.hlen("unacked")) if broker.type("unacked") in (b"none", b"hash") else None
        from worker._guard import BrokerWrites

        writes = BrokerWrites.read(broker)  # (None: INFO not allowed, as on some managed Redis)
    finally:
        broker.close()
    full = writes is not None and writes.full()
    read_only = writes is not None and writes.read_only
    from celery import Celery

    # A throwaway app on exactly this broker, for the control channel (worker pings).
    control = Celery("tracescore-status", broker=settings.broker_url, set_as_current=False)
    control.conf.update(
        accept_content=["json"],
        broker_connection_retry_on_startup=False,
        broker_use_ssl=settings.tls.kombu_ssl(settings.broker_url),
    )
    workers: list[str] | None = None
    try:
        # A connection of its own for the replies: the app's pool is kombu's, shared by every
        # Celery app on this broker URL in the process, and may hold one the server has closed.
        with control.connection_for_write() as connection:
            workers = sorted(control.control.inspect(timeout=ping_timeout, connection=connection).ping() or {})
    except redis.exceptions.OutOfMemoryError:
        full = True  # (the reply queue's declare is a write)
    except redis.exceptions.ReadOnlyError:
        read_only = True
    except Exception as exc:  # kombu's errors vary by transport: each means the ping got no answer
        raise ConnectionError(f"worker ping failed: {type(exc).__name__}: {redact(str(exc))}") from exc
    finally:
        control.close()
    return {
        "broker": redact(settings.broker_url),
        "queue": settings.queue,
        "queue_depth": depth,
        "unacked": unacked,
        "workers": workers,
        "broker_full": full,
        "broker_read_only": read_only,
        "broker_evicts": _evicting(writes),
        "broker_memory": {
            "used_bytes": writes.used_bytes if writes is not None else 0,
            "max_bytes": writes.max_bytes if writes is not None else None,
        },
        "refused_keys": refused,
    }


def _evicting(writes: BrokerWrites | None) -> str | None:
    """The maxmemory-policy of a Redis that drops keys when full (not noeviction, with a
    maxmemory); None when it keeps them, or INFO is not allowed (``writes`` None)."""
    return writes.policy if writes is not None and writes.evicts else None


def store_evicts(settings: Settings) -> str | None:
    """``_evicting`` for the score store (a Redis of its own, or the broker's)."""
    from worker._guard import BrokerWrites

    store = redis.Redis.from_url(settings.store_url, socket_connect_timeout=2, socket_timeout=2)
    try:
        return _evicting(BrokerWrites.read(store))
    finally:
        store.close()


async def store_status(settings: Settings) -> dict[str, Any]:
    """The score store's side: dead letters by reason, failures of the last hour, rate limits."""
    letters = RedisDeadLetters(settings.store_url, **CLI_PATIENCE)
    jobs = RedisJobStats(settings.store_url, **CLI_PATIENCE)
    limiter = RedisRateLimiter(settings.store_url, settings.rate_limit, **CLI_PATIENCE)
    ledger = RedisLedger(settings.store_url, **CLI_PATIENCE)
    try:
        try:
            size: int | None = await letters.size()
            refused: list[str] = []
        except StoreKeyTypeError as exc:  # the list itself of another type: say so, show the rest
            size, refused = None, [str(exc)]
        return {
            "dead_letters": size,
            "dead_letters_by_reason": await letters.counts(),
            "dead_letters_dropped": await letters.dropped(),
            # None while the count is lost or damaged in Redis: the next push sums it again.
            "dead_letters_bytes": None if refused else await letters.size_bytes(),
            "dead_letters_max_bytes": settings.dlq_max_bytes,
            "refused_keys": refused,
            "recent_failures": await jobs.recent_failures(),
            "rate_limits": await limiter.state(),
            # Judge spend today (UTC) per scorer and model, and each budget's remaining.
            "spend": await spend_report(ledger, parse_budgets(settings.budgets)),
        }
    finally:
        await letters.close()
        await jobs.close()
        await limiter.close()
        await ledger.close()


# KEYS: the index of jobs, then the state of each id in ARGV. An id whose state is gone (expired)
# leaves the index, so it stays as large as the jobs Redis still keeps; one whose state a save
# wrote meanwhile stays (each is looked at in this one step).
_FORGET_EXPIRED = checked_script(
    "{KEYS[1], 'zset', 'k'}",
    """
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('ZREM', KEYS[1], ARGV[i - 1]) end
end
""",
)


def backfill_jobs(settings: Settings) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """The backfill jobs whose state is still in the score store, newest first (from the index
    ``backfill_jobs_key``, never a SCAN), and the keys refused (another Redis type: named, the
    figure unknown). A job's counts that are unknown (a count kept aside: ``counts_unreadable``
    with the fields and the repair; a count that is no integer yet: None) never fail the rest."""
    client = redis.Redis.from_url(settings.store_url, socket_connect_timeout=2, socket_timeout=5, **DECODED)
    index = backfill_jobs_key()
    try:
        try:
            found: list[Any] = checked(
                client,
                "backfill_jobs",
                [(index, "zset", True)],
                lambda: client.zrange(index, 0, -1, desc=True, withscores=True),
            )
        except StoreKeyTypeError as exc:
            return None, [f"the index of backfill jobs: {exc}"]
        listed = [(str(job_id), float(started)) for job_id, started in found]
        pipe = client.pipeline(transaction=False)
        for job_id, _ in listed:
            pipe.get(backfill_state_key(job_id))
            pipe.type(backfill_hold_key(job_id))
            pipe.hgetall(job_key(job_id))
        replies = pipe.execute(raise_on_error=False)
        jobs: list[dict[str, Any]] = []
        refused: list[str] = []
        gone: list[str] = []
        for i, (job_id, started) in enumerate(listed):
            raw, hold, counts = replies[3 * i : 3 * i + 3]
            if raw is None:
                gone.append(job_id)
                continue
            job, problems = _job(client, job_id, started, raw, hold, counts)
            jobs.append(job)
            refused += problems
        if gone:
            states = [backfill_state_key(j) for j in gone]
            # (a replica, a full Redis or a user who may not write: the list is right all the same)
            with contextlib.suppress(redis.exceptions.ResponseError):
                checked(
                    client,
                    "backfill_jobs",
                    [],
                    lambda: client.eval(_FORGET_EXPIRED, 1 + len(gone), index, *states, *gone),
                )
        return jobs, refused
    finally:
        client.close()


def _job(
    client: Any, job_id: str, started: float, raw: Any, hold: Any, counts: Any
) -> tuple[dict[str, Any], list[str]]:
    """One job of ``backfill_jobs`` from its replies (an error for a key of another type)."""
    refused: list[str] = []
    job: dict[str, Any] = {
        "job_id": job_id,
        "started": _utc(started),
        "status": None,
        "source": None,
        "scorers": None,
        "runs_enqueued": None,
        "expected_scores": None,
        "scored": None,
        "failed": None,
        "skipped": None,
        "held": hold == "string",
        "counts_unreadable": None,
        "state_unreadable": None,
    }
    state_key = backfill_state_key(job_id)
    if isinstance(raw, redis.exceptions.ResponseError):
        refused.append(f"backfill {job_id}'s state: {_wrong_type(client, state_key, 'string', raw)}")
    else:
        try:
            state = BackfillState.model_validate_json(raw)
        except ValidationError as exc:  # (its text would quote the stored value)
            job["state_unreadable"] = (
                f"{exc.error_count()} problem(s), first at {validation_place(exc.errors()[0]['loc'])}"
            )
        else:
            job.update(
                status=state.status,
                source=state.source_label,
                scorers=state.options.scorer_ids,
                runs_enqueued=state.counters.runs_enqueued,
                expected_scores=state.expected_scores,
            )
    counters_key = job_key(job_id)
    if isinstance(counts, redis.exceptions.ResponseError):
        refused.append(f"backfill {job_id}'s hash of counters: {_wrong_type(client, counters_key, 'hash', counts)}")
        return job, refused
    try:
        read = job_counts(counts, counters_key)
    except UnreadableCounterError as exc:
        job["counts_unreadable"] = {
            "field": exc.field,
            "kept": list(exc.kept),
            "counted": exc.counted or None,
            "times": exc.times,
            "message": str(exc),
            "repair": exc.repair(),
        }
    else:
        job.update({k: read.get(k, 0) for k in ("scored", "failed", "skipped")})
    return job, refused


def _utc(started: float) -> str | None:
    """An index score as a UTC time; None for one no clock reads (written by hand: ``inf``)."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    except (OverflowError, ValueError, OSError):
        return None


def _wrong_type(client: Any, key: str, expected: str, error: Exception) -> str:
    """The refusal's words for ``key``, which answered ``error`` (WRONGTYPE): it holds another type."""
    if "WRONGTYPE" not in str(error):
        raise error
    return str(StoreKeyTypeError(key, str(client.type(key)), expected))


async def dead_letters(settings: Settings, limit: int) -> tuple[int, list[DeadLetter]]:
    """How many dead letters there are, and the newest ``limit`` of them."""
    store = RedisDeadLetters(settings.store_url, **CLI_PATIENCE)
    try:
        return await store.size(), await store.latest(limit)
    finally:
        await store.close()


async def _asked(
    store: RedisDeadLetters, ids: list[str] | None, reason: str | None, problems: list[str]
) -> AsyncIterator[DeadLetter]:
    """The letters asked for, oldest first: ``ids`` (each one missing named in ``problems``), else
    every one, or every one of ``reason``. The list is read a page at a time and each letter is
    taken by the bytes of its page (``store.take``), so every letter costs one read of the list
    in all, not one each."""
    wanted = None if ids is None else dict.fromkeys(ids)
    async for letter in store.each():
        if wanted is None:
            if reason is None or letter.reason == reason:
                yield letter
        elif letter.id in wanted:
            del wanted[letter.id]
            yield letter
            if not wanted:
                return
    problems.extend(f"{i}: no such dead letter (see `tracescore dlq list`)" for i in wanted or ())


class Requeued(NamedTuple):
    """What ``requeue_dead_letters`` did: the letters sent, one line per letter that was not
    (and why), and of those the ids of the letters that cannot be retried (left listed)."""

    requeued: list[DeadLetter]
    problems: list[str]
    not_retryable: list[str]


async def requeue_dead_letters(settings: Settings, ids: list[str] | None) -> Requeued:
    """Send the dead letters ``ids`` (``None``: every one) back to the scoring queue."""
    store = RedisDeadLetters(settings.store_url, **CLI_PATIENCE)
    # rediss:// verified as the workers do (TRACESCORE_BROKER_CA_FILE); the workers' message cap.
    sink = CelerySink(
        settings.broker_url, queue=settings.queue, tls=settings.tls, max_payload_bytes=settings.max_payload_bytes
    )
    ledger = RedisLedger(settings.store_url, **CLI_PATIENCE)
    requeued: list[DeadLetter] = []
    problems: list[str] = []
    not_retryable: list[str] = []
    try:
        async for letter in _asked(store, ids, None, problems):
            letter_id = letter.id
            if not letter.retryable or letter.payload is None:
                problems.append(f"{letter_id}: not retryable ({letter.reason}); fix the producer instead")
                not_retryable.append(letter_id)
                continue
            try:
                batches = _letter_batches(letter.payload, settings.max_payload_bytes)
            except ValidationError as exc:
                problems.append(f"{letter_id}: the stored message is not a valid ScoreBatch: {exc.errors()[0]['msg']}")
                continue
            except RunTooLarge as exc:
                problems.append(f"{letter_id}: cut under MAX_BATCH_PAIRS, a message would hold {exc}")
                continue
            # Two `dlq retry` at once would both send it: one message refused twice over.
            if not await store.hold(letter_id, HOLD_S):
                problems.append(f"{letter_id}: being requeued by another `tracescore dlq retry`")
                continue
            # Asked for again by the operator: the runs' judge calls start from zero (the cap).
            await ledger.reset_calls(
                [
                    run_key(r.trace_id, t, s)
                    for batch in batches
                    for r in batch.requests
                    for t in r.target_span_ids
                    for s in r.scorer_ids
                ]
            )
            try:
                for batch in batches:
                    sink.send(batch)
            except Exception as exc:
                # (the messages sent already are scored; sent again by a later retry, their stored
                # scores are skipped by their ids)
                await store.release(letter_id)  # not sent: a retry may try it at once
                problems.append(f"{letter_id}: could not requeue: {type(exc).__name__}: {redact(str(exc))}")
                continue
            # Removed only once sent: interrupted before this, the letter stays listed (a later
            # retry sends it again once the hold lapses, which the idempotent score ids make
            # harmless), never lost.
            # The hold stays until it lapses: a retry that listed the letter before it was taken
            # must not find it free and send it again.
            if await store.take(letter_id) is None:
                problems.append(f"{letter_id}: requeued, but another caller had removed it from the list")
                continue
            requeued.append(letter)
    finally:
        sink.close()
        await store.close()
        await ledger.close()
    return Requeued(requeued, problems, not_retryable)


def _letter_batches(payload: Any, max_payload_bytes: int) -> list[ScoreBatch]:
    """The messages that send a dead letter's ``payload`` again: itself, validated, or, for a
    message of an earlier release asking for more (run, scorer id) pairs than ``MAX_BATCH_PAIRS``
    (which the workers now refuse whole), its requests cut under it as producers cut them now
    (``<batch id>-<n>``). A batch id that is no plain id (kept by an earlier release: a split's
    past 128 characters, a producer's own text) goes under a digest of itself, as the workers'
    screen refuses it. Raises ``ValidationError`` when the payload is no batch but for its pairs,
    ``RunTooLarge`` for one of its runs over ``max_payload_bytes`` alone."""
    try:
        batches = [ScoreBatch.model_validate(payload)]
    except ValidationError:
        parts = _past_pairs(payload)
        if parts is None:
            raise
        batch_id, requests = parts
        cutter = RequestCutter(max_payload_bytes)
        chunks = []
        for request in requests:
            try:
                chunks += cutter.add(request)
            except RunTooLarge:
                if len(request.target_span_ids) == 1:
                    raise
                for one in request.per_target():  # (a run over the cap alone: the letter stays)
                    chunks += cutter.add(one)
        chunks.append(cutter.take())
        batches = [
            ScoreBatch(batch_id=f"{batch_id}-{n}", requests=chunk.requests)
            for n, chunk in enumerate(c for c in chunks if c.requests)
        ]
    for i, batch in enumerate(batches):
        if not plain_id(batch.batch_id):
            digest = hashlib.sha256(batch.batch_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            batches[i] = batch.model_copy(update={"batch_id": f"dlq-{digest}"})
    return batches


def _past_pairs(payload: Any) -> tuple[str, list[ScoreRequest]] | None:
    """(batch id, requests) of a payload that is a valid batch but for asking more than
    ``MAX_BATCH_PAIRS`` pairs; None for any other."""
    if not isinstance(payload, dict) or set(payload) != {"batch_id", "requests"}:
        return None
    batch_id, raw = payload["batch_id"], payload["requests"]
    if not isinstance(batch_id, str) or not isinstance(raw, list):
        return None
    try:
        requests = [ScoreRequest.model_validate(r) for r in raw]
    except ValidationError:
        return None
    return (batch_id, requests) if sum(r.pairs() for r in requests) > MAX_BATCH_PAIRS else None


class Dropped(NamedTuple):
    """What ``drop_dead_letters`` did: the letters removed, and one line per letter that was not."""

    dropped: list[DeadLetter]
    problems: list[str]


async def drop_dead_letters(settings: Settings, ids: list[str] | None, reason: str | None = None) -> Dropped:
    """Remove the dead letters ``ids`` for good (``None``: every one, or every one of ``reason``),
    unreadable ones too; a letter a `dlq retry` is sending is left to it."""
    store = RedisDeadLetters(settings.store_url, **CLI_PATIENCE)
    dropped: list[DeadLetter] = []
    problems: list[str] = []
    try:
        async for letter in _asked(store, ids, reason, problems):
            # The hold stays until it lapses: a retry that listed the letter before it was
            # dropped must not send it.
            if not await store.hold(letter.id, HOLD_S):
                problems.append(f"{letter.id}: being requeued by a `tracescore dlq retry`; left to it")
            elif await store.take(letter.id) is None:
                problems.append(f"{letter.id}: another caller had removed it from the list")
            else:
                dropped.append(letter)
    finally:
        await store.close()
    return Dropped(dropped, problems)
