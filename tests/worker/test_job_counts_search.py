"""A seeded random search over a job's counts: both stores, side by side, under the same
sequences of puts (jobs a and b, live traffic; scores, retryable and final failures), a put sent
again (its reply lost), deliveries as ``score_batch`` makes them (a kept record of another's is
the job's skip, else the job's record is put), and a job's end at any point.

After each step: the stores agree; no counter is below 0; an ended job's total stays what it was;
and a job not ended counts each score it touched once, as the stored record's outcome when that
record is its own, else as a skip. (It found a finished job's late failure, uncounted, moved when
replaced: failed -1.)"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from tracing import ScoreRecord, score_id_for
from worker.store import MemoryScoreStore, RedisScoreStore

SEQUENCES = 250
JOBS = ("a", "b")
KINDS = ("score", "retryable", "retryable", "final")

Op = tuple[Any, ...]


def _record(n: int, job: str | None, kind: str, stamp: float) -> ScoreRecord:
    trace, span = f"{n + 500:032x}", f"{n + 500:016x}"
    fields: dict[str, Any] = (
        {"score": 0.5}
        if kind == "score"
        else {"error_type": "Timeout" if kind == "retryable" else "Bad", "retryable": kind == "retryable"}
    )
    return ScoreRecord(
        score_id=score_id_for(trace, span, "s", "1"),
        trace_id=trace,
        span_id=span,
        scorer_id="s",
        job_id=job,
        created_at=stamp,  # (two puts differ; a put sent again is the very same record)
        **fields,
    )


def _sequence(rng: random.Random) -> list[Op]:
    ops: list[Op] = []
    for _ in range(rng.randint(4, 20)):
        r, n = rng.random(), rng.randrange(3)
        if r < 0.3:
            ops.append(("put", rng.choice(["a", "b", None]), n, rng.choice(KINDS)))
        elif r < 0.6:
            ops.append(("deliver", rng.choice(JOBS), n, rng.choice(KINDS)))
        elif r < 0.75:
            ops.append(("again", rng.randrange(3)))
        elif r < 0.85:
            ops.append(("finish", rng.choice(JOBS)))
        else:
            ops.append(("put_two", rng.choice(["a", "b", None]), rng.sample(range(3), 2), rng.choice(KINDS)))
    return ops


def _total(progress: dict[str, int]) -> int:
    return sum(progress.get(k, 0) for k in ("scored", "failed", "skipped"))


def _nonzero(progress: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in progress.items() if v}


async def _own_failures(store: Any, score_ids: set[str], job: str) -> list[ScoreRecord]:
    """The stored records among ``score_ids`` that are ``job``'s own failures."""
    found = await store.existing(sorted(score_ids))
    return [r for r in found.values() if r.job_id == job and r.error_type]


async def _play(ops: list[Op], redis_url: str) -> str | None:
    """The first broken rule, named with its step; None when every step kept them."""
    stores: list[Any] = [MemoryScoreStore(), RedisScoreStore(redis_url)]
    put: list[ScoreRecord] = []
    touched: dict[str, set[str]] = {job: set() for job in JOBS}
    ended: dict[str, int] = {}

    async def put_each(records: list[ScoreRecord]) -> str | None:
        put.extend(records)
        for record in records:
            if record.job_id:
                touched[record.job_id].add(record.score_id)
        fresh = [await store.put_records(records, "w", 600) for store in stores]
        return None if fresh[0] == fresh[1] else f"put replies differ: {fresh}"

    try:
        for step, op in enumerate(ops):
            wrong: str | None = None
            if op[0] == "finish":
                ended.setdefault(op[1], _total(await stores[0].jobs.progress(op[1])))
                for store in stores:
                    await store.jobs.finish(op[1])  # (again: a --resume of an ended job ends it again)
            elif op[0] == "again" and put:
                wrong = await put_each([put[-1 - op[1] % len(put)]])
            elif op[0] == "put":
                wrong = await put_each([_record(op[2], op[1], op[3], step)])
            elif op[0] == "put_two":
                wrong = await put_each([_record(n, op[1], op[3], step) for n in op[2]])
            elif op[0] == "deliver":
                record = _record(op[2], op[1], op[3], step)
                found = [(await store.existing([record.score_id])).get(record.score_id) for store in stores]
                if len({(r.job_id, r.retryable) if r else None for r in found}) > 1:
                    wrong = f"stored records differ: {found}"
                elif found[0] is not None and not found[0].retryable:
                    touched[op[1]].add(record.score_id)
                    if found[0].job_id != op[1]:
                        for store in stores:
                            await store.jobs.count_skipped_once(op[1], "already_scored", [record.score_id])
                else:
                    wrong = await put_each([record])
            if wrong:
                return f"step {step} {op}: {wrong}"
            for job in JOBS:
                memory, redis = [_nonzero(await store.jobs.progress(job)) for store in stores]
                if memory != redis:
                    wrong = f"the stores disagree on {job}: memory {memory}, Redis {redis}"
                elif any(v < 0 for v in memory.values()):
                    wrong = f"{job} counts below 0: {memory}"
                elif job in ended and _total(memory) != ended[job]:
                    wrong = f"{job}'s total moved after its end: {ended[job]} -> {memory}"
                elif job in ended and memory.get("failed", 0) > len(await _own_failures(stores[0], touched[job], job)):
                    wrong = f"{job} counts a failure another's record replaced, after its end: {memory}"
                elif job not in ended:
                    found_now = await stores[0].existing(sorted(touched[job]))
                    rule: Counter[str] = Counter()
                    for score_id in touched[job]:
                        record_now = found_now.get(score_id)
                        if record_now is not None and record_now.job_id == job:
                            counter = "failed" if record_now.error_type else "scored"
                            rule[counter] += 1
                            if record_now.error_type:
                                rule[f"failed:{record_now.error_type}"] += 1
                        else:
                            rule.update(["skipped", "skipped:already_scored"])
                    if memory != dict(rule):
                        wrong = f"{job} counts {memory}, its touched scores say {dict(rule)}"
                if wrong:
                    return f"step {step} {op}: {wrong}"
        return None
    finally:
        for store in stores:
            await store.close()


def test_random_sequences_keep_each_jobs_counts(redis_url: str) -> None:
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url)
    broken: list[str] = []
    try:
        for seed in range(SEQUENCES):
            client.flushdb()
            found = asyncio.run(_play(_sequence(random.Random(seed)), redis_url))
            if found:
                broken.append(f"seed {seed}: {found}")
    finally:
        client.close()
    assert broken == [], "\n".join(broken[:5])
