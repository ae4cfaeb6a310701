"""The store's stepped scripts with the Redis that holds them SIGKILLed and started again between
two steps, the client going on through its ordinary reconnect path.

Each script moves at most a step (``STEP_BYTES``, ``_BOUND_STEP``, a page) and the client calls
again until the bounds hold; the README promises that each step leaves the list, the counts by
reason, the dropped counts, the byte count and a sink's order in step. Here a step is followed by a
restart: with the append-only file (fsync always) Redis comes back as the last step left it, and
the operation must finish with every invariant whole (nothing lost the bounds did not drop, nothing
counted or listed twice, both bounds held); with nothing kept (a replica without the data) it comes
back empty, and what the operation then leaves must still agree with itself. Either way it ends,
within a deadline, or fails with a named error; it never hangs or steps forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import worker.store._dead_letters as dead_letters_module
import worker.store._outbox as outbox_module
from tests._redis import RedisServer
from tests.worker._batches import payload
from worker import _keys
from worker.store import DeadLetter, RedisDeadLetters, RedisOutbox, SinkDeadLetter, SyncRedisDeadLetters
from worker.store._redis import RedisConnection

# A whole operation, restart included, ends within this (a step loop that never ends fails here).
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as s:
        yield s


@pytest.fixture
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    if server.proc is None:  # (a test that failed mid-restart)
        server.start()
    client = server.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


def _bounce(server: RedisServer, *, empty: bool) -> None:
    """SIGKILL, then start again on the same port: as it was (the append-only file), or empty."""
    server.stop()
    if empty:
        server.forget()
    server.start()


def _letter(n: int, reason: str, size: int = 200) -> DeadLetter:
    return DeadLetter(reason=reason, message_key=f"msg:{n}", payload={"batch_id": f"b{n}", "input": "x" * size})


def _letters(count: int) -> list[DeadLetter]:
    """``count`` letters, oldest first, of two reasons."""
    return [_letter(n, ("bad_body", "invalid_payload")[n % 2]) for n in range(count)]


def _dlq(raw: redis.Redis) -> list[dict[str, Any]]:
    """The list as Redis holds it, newest first: each letter's id, reason and bytes."""
    out = []
    for entry in raw.lrange(_keys.dlq_key(), 0, -1):
        decoded = json.loads(entry)
        out.append({"id": decoded["id"], "reason": decoded["reason"], "bytes": len(entry)})
    return out


def _ints(raw: redis.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.hgetall(key).items()}


def _assert_dlq_in_step(
    raw: redis.Redis, before: list[DeadLetter], new: DeadLetter | None, max_letters: int, max_bytes: int, *, empty: bool
) -> None:
    """The operation's end: the list, its counts by reason, its byte count (no sum under way) and
    its bounds agree; with the data kept, the letters gone are exactly the oldest the bounds had
    to drop, each counted once as dropped by its reason, and nothing is listed twice."""
    listed = _dlq(raw)
    ids = [x["id"] for x in listed]
    assert len(ids) == len(set(ids)), "a letter listed twice"
    assert _ints(raw, _keys.dlq_reasons_key()) == dict(Counter(x["reason"] for x in listed))
    assert raw.hget(_keys.dlq_bytes_sum_key(), "read") is None, "the byte sum left under way"
    total = sum(x["bytes"] for x in listed)
    assert int(raw.get(_keys.dlq_bytes_key()) or -1) == total
    assert len(listed) <= max_letters
    assert total <= max_bytes or len(listed) == 1
    dropped = _ints(raw, _keys.dlq_dropped_key())
    every = [*before, *([new] if new else [])]  # oldest first
    if empty:
        # Everything went with the data; what the operation left after the restart (nothing of
        # the letters it had) counts nothing dropped that was not.
        assert set(ids) <= {x.id for x in every}
        assert sum(dropped.values()) == 0
        return
    assert ids == [x.id for x in reversed(every)][: len(ids)], "not the newest letters kept"
    gone = every[: len(every) - len(ids)]
    assert dropped == dict(Counter(x.reason for x in gone))
    if gone:  # the bounds dropped no more than they had to: one letter more breaks one
        more = gone[-1]
        more_bytes = len(more.model_dump_json().encode())
        assert len(listed) + 1 > max_letters or total + more_bytes > max_bytes


def _within(call: Callable[[], Any]) -> Any:
    """``call`` (synchronous) bounded by ``DEADLINE_S``."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=DEADLINE_S)
    finally:
        pool.shutdown(wait=False)


async def _fill(url: str, letters: list[DeadLetter]) -> None:
    wide = RedisDeadLetters(url, max_letters=10_000, max_bytes=1 << 40)
    for letter in letters:
        assert await wide.push(letter)
    await wide.close()


# (how the state was left before the push, the narrow bounds as a function of the letters' bytes)
_CASES = {
    # DLQ_MAX_LETTERS lowered: a letter dropped per step (STEP_BYTES 1).
    "letters_lowered": ("kept", lambda one: (5, 1 << 40)),
    # DLQ_MAX_BYTES lowered: the count past the bound is summed again (a page of two per step),
    # then the oldest go a step at a time.
    "bytes_lowered": ("kept", lambda one: (10_000, one * 6 + one // 2)),
    # The byte count lost: summed again, a page per step, nothing to drop.
    "count_lost": ("lost", lambda one: (10_000, 1 << 40)),
    # The byte count lost and DLQ_MAX_BYTES lowered: summed, then dropped.
    "count_lost_bytes_lowered": ("lost", lambda one: (10_000, one * 4 + one // 2)),
}


@pytest.mark.parametrize("lost", [False, True], ids=["between", "reply_lost"])
@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
@pytest.mark.parametrize("after", [1, 2, 6])
@pytest.mark.parametrize("case", list(_CASES))
def test_an_async_push_restarted_between_steps_ends_in_step(
    case: str,
    after: int,
    empty: bool,
    lost: bool,
    server: RedisServer,
    raw: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's push (``RedisDeadLetters``): Redis SIGKILLed and started again after its
    ``after``-th script (the push's own, or a step of the bounds or of the sum). ``reply_lost``:
    killed after the script ran but before its reply was read, so the client's retry sends the
    same call again (redis-py's retry of a pipeline on a connection error)."""
    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1)
    state, bounds = _CASES[case]
    before = _letters(20)
    new = _letter(100, "bad_body")
    one = len(new.model_dump_json().encode())
    max_letters, max_bytes = bounds(one)
    url = server.url()

    async def go() -> tuple[bool, int]:
        await _fill(url, before)
        if state == "lost":
            raw.delete(_keys.dlq_bytes_key())
        dead = RedisDeadLetters(url, max_letters=max_letters, max_bytes=max_bytes)
        scripts = dead._redis.evalsha_many
        ran = 0

        async def spied(*args: Any, **kwargs: Any) -> list[Any]:
            nonlocal ran
            replies = await scripts(*args, **kwargs)
            ran += 1
            if ran == after:
                await asyncio.to_thread(_bounce, server, empty=empty)
                if lost:
                    replies = await scripts(*args, **kwargs)
            return replies

        dead._redis.evalsha_many = spied  # type: ignore[method-assign]
        try:
            async with asyncio.timeout(DEADLINE_S):
                return await dead.push(new), ran
        finally:
            await dead.close()

    pushed, ran = asyncio.run(go())
    assert ran >= after, f"the push took {ran} scripts: no restart between two of them"
    assert pushed
    _assert_dlq_in_step(raw, before, new, max_letters, max_bytes, empty=empty)


@pytest.mark.parametrize("lost", [False, True], ids=["between", "reply_lost"])
@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
@pytest.mark.parametrize("after", [1, 4])
@pytest.mark.parametrize("case", ["letters_lowered", "count_lost_bytes_lowered"])
def test_the_consumers_sync_push_restarted_between_steps_ends_in_step(
    case: str,
    after: int,
    empty: bool,
    lost: bool,
    server: RedisServer,
    raw: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer's guard pushes on a synchronous client (``SyncRedisDeadLetters``): the same
    steps, the same restart between two of them."""
    monkeypatch.setattr(dead_letters_module, "STEP_BYTES", 1)
    state, bounds = _CASES[case]
    before = _letters(20)
    new = _letter(100, "bad_body")
    max_letters, max_bytes = bounds(len(new.model_dump_json().encode()))
    url = server.url()
    asyncio.run(_fill(url, before))
    if state == "lost":
        raw.delete(_keys.dlq_bytes_key())
    checked = dead_letters_module.checked
    ran = 0

    def spied(*args: Any, **kwargs: Any) -> Any:
        nonlocal ran
        reply = checked(*args, **kwargs)
        ran += 1
        if ran == after:
            _bounce(server, empty=empty)
            if lost:
                reply = checked(*args, **kwargs)
        return reply

    monkeypatch.setattr(dead_letters_module, "checked", spied)
    sync = SyncRedisDeadLetters(url, max_letters=max_letters, max_bytes=max_bytes)
    try:
        assert _within(lambda: sync.push(new))
    finally:
        sync.close()
    assert ran >= after
    _assert_dlq_in_step(raw, before, new, max_letters, max_bytes, empty=empty)


# ---- a sink's dead letters, their bound lowered -------------------------------------------------

SINK = "otlp"


def _fill_sink(raw: redis.Redis, count: int) -> list[str]:
    """``count`` ordered dead letters of the sink, oldest first (as a drainer buried them)."""
    ids = [f"score-{n:04d}" for n in range(count)]
    for n, score_id in enumerate(ids):
        letter = SinkDeadLetter(score_id=score_id, sink=SINK, reason="http_403", failed_at=1_700_000_000 + n)
        raw.hset(_keys.outbox_dead_key(SINK), score_id, letter.model_dump_json())
        raw.zadd(_keys.outbox_dead_order_key(SINK), {score_id: (1_700_000_000 + n) * 1000})
    raw.sadd(_keys.outbox_sinks_key(), SINK)
    return ids


@pytest.mark.parametrize("lost", [False, True], ids=["between", "reply_lost"])
@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
@pytest.mark.parametrize("after", [1, 3])
def test_a_sink_bound_restarted_between_steps_ends_in_step(
    after: int, empty: bool, lost: bool, server: RedisServer, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drainer buries a letter past a lowered ``SINK_MAX_DEAD_LETTERS``: the bound drops the
    oldest a step (``_BOUND_STEP``) per script; Redis restarts after the ``after``-th script (the
    bury, or a step; ``reply_lost``: its reply never read, the same call sent again). The
    letters, their order and the count dropped end in step, the newest kept, the bound held."""
    monkeypatch.setattr(outbox_module, "_BOUND_STEP", 2)
    before = _fill_sink(raw, 20)
    new = "score-9999"
    raw.zadd(_keys.outbox_key(SINK), {new: 0})
    outbox = RedisOutbox(server.url(), max_dead_letters=5)
    scripts = outbox._scripts
    ran = 0

    def spied(*args: Any, **kwargs: Any) -> list[Any]:
        nonlocal ran
        replies = scripts(*args, **kwargs)
        ran += 1
        if ran == after:
            _bounce(server, empty=empty)
            if lost:
                replies = scripts(*args, **kwargs)
        return replies

    outbox._scripts = spied  # type: ignore[method-assign]
    try:
        lease = outbox.lease(SINK, 10, lease_s=30)
        letter = SinkDeadLetter(score_id=new, sink=SINK, reason="http_403", failed_at=1_800_000_000)
        settled = _within(lambda: outbox.dead(lease, [letter]))
    finally:
        outbox.close()
    assert ran >= after
    letters = {k.decode() for k in raw.hkeys(_keys.outbox_dead_key(SINK))}
    ordered = [k.decode() for k in raw.zrange(_keys.outbox_dead_order_key(SINK), 0, -1)]
    assert set(ordered) == letters
    assert len(ordered) == len(letters)
    assert len(letters) <= 5
    dropped = int(raw.hget(_keys.outbox_counts_key(SINK), "dead_letters_dropped") or 0)
    if empty:
        assert letters == set()
        assert dropped == 0
        return
    # (a bury sent again finds its lease settled: "not settled" by that try, but buried)
    assert settled == (0 if lost and after == 1 else 1)
    assert ordered == [*before, new][-5:]
    assert dropped == 16


def _settle_replies_lost(outbox: RedisOutbox, server: RedisServer, action: str) -> list[tuple[Any, Any]]:
    """Every settle pipeline holding an ``action`` runs, then Redis is SIGKILLed and started again
    (as it was) before its replies are read, and the same calls are sent again (redis-py's retry of
    a pipeline on a connection error): the caller reads the second replies. Returns (first,
    second) for each ``action`` call."""
    scripts = outbox._scripts
    seen: list[tuple[Any, Any]] = []

    def spied(where: str, script: Any, calls: Any) -> list[Any]:
        replies = scripts(where, script, calls)
        if where == "settle" and any(args[2] == action for _, args in calls):
            _bounce(server, empty=False)
            again = scripts(where, script, calls)
            seen.extend((a, b) for (_, args), a, b in zip(calls, replies, again, strict=True) if args[2] == action)
            replies = again
        return replies

    outbox._scripts = spied  # type: ignore[method-assign]
    return seen


def test_a_bury_whose_reply_was_lost_still_orders_and_bounds_older_letters(
    server: RedisServer, raw: redis.Redis
) -> None:
    """Letters a previous release wrote (no order entry) past a lowered ``SINK_MAX_DEAD_LETTERS``:
    the bury's script answers "unordered" and the drainer orders and bounds them. That reply lost,
    the bury sent again answers "not settled"; the step of the bound it then takes answers
    "unordered" too, which was ignored (before: the 21 letters stayed past the bound of 5 until
    the next bury). They are ordered and bounded now, the newest kept."""
    ordered = _fill_sink(raw, 20)
    unordered = ordered[:10]  # (the oldest, as a previous release's would be)
    raw.zrem(_keys.outbox_dead_order_key(SINK), *unordered)
    new = "score-9999"
    raw.zadd(_keys.outbox_key(SINK), {new: 0})
    outbox = RedisOutbox(server.url(), max_dead_letters=5)
    seen = _settle_replies_lost(outbox, server, "dead")
    try:
        lease = outbox.lease(SINK, 10, lease_s=30)
        letter = SinkDeadLetter(score_id=new, sink=SINK, reason="http_403", failed_at=1_800_000_000)
        _within(lambda: outbox.dead(lease, [letter]))
    finally:
        outbox.close()
    assert [(list(map(int, a)), b) for a, b in seen] == [([1, 0, 1, 0], 0)]  # (its "unordered" lost)
    letters = {k.decode() for k in raw.hkeys(_keys.outbox_dead_key(SINK))}
    kept = [k.decode() for k in raw.zrange(_keys.outbox_dead_order_key(SINK), 0, -1)]
    assert len(letters) <= 5, f"{len(letters)} letters past the bound of 5"
    assert kept == [*ordered, new][-5:]
    assert set(kept) == letters
    assert int(raw.hget(_keys.outbox_counts_key(SINK), "dead_letters_dropped") or 0) == 16


class _Sink:
    """Takes every record but those in ``refused``; keeps what it was handed, each call."""

    name = SINK
    endpoint = None

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused
        self.handed: list[str] = []

    def deliver(self, records: Any) -> list[Any]:
        from tracing.sinks import Delivered, Refused

        self.handed += [r.score_id for r in records]
        return [Refused("http_403", "no") if r.score_id in self.refused else Delivered() for r in records]


@pytest.mark.parametrize("action", ["ack", "dead"])
def test_a_drainers_settle_whose_reply_was_lost_is_counted_once_and_sent_once(
    action: str, server: RedisServer, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drainer's ack (two scores the sink took) or bury (one it refused) ran, its reply was lost
    and the same calls sent again: those answer "not settled" (``ack``/``dead`` return 0), which
    the drainer does not read. Each score is handed to the sink once, counted once (delivered 2,
    one dead letter, none retried), logged once, and nothing is left queued or leased to come due
    again."""
    from structlog.testing import capture_logs

    import worker._delivery as delivery
    from tracing import ScoreRecord, score_id_for
    from worker._delivery import DrainPolicy, drain_once

    monkeypatch.setattr(delivery, "_dead_letter_logs", {})  # (the first line of each test said at once)

    records = [
        ScoreRecord(
            score_id=score_id_for(f"{n:032x}", f"{n:016x}", "s", "1"), trace_id=f"{n:032x}",
            span_id=f"{n:016x}", scorer_id="s", score=0.5,
        )
        for n in range(3)
    ]  # fmt: skip
    for r in records:
        raw.set(_keys.record_key(r.score_id), r.model_dump_json())
    raw.zadd(_keys.outbox_key(SINK), {r.score_id: 0 for r in records})
    raw.sadd(_keys.outbox_sinks_key(), SINK)
    refused = records[2].score_id
    sink = _Sink({refused})
    outbox = RedisOutbox(server.url())
    seen = _settle_replies_lost(outbox, server, action)
    policy = DrainPolicy(batch_size=10, lease_s=30, max_attempts=3)
    try:
        with capture_logs() as logs:
            assert _within(lambda: drain_once(sink, outbox, policy)) == 3  # type: ignore[arg-type]
            assert drain_once(sink, outbox, policy) == 0  # type: ignore[arg-type]
        counts = outbox.counts()[SINK]
        letters = outbox.dead_letters(SINK)
        states = outbox.states(SINK, [r.score_id for r in records])
    finally:
        outbox.close()
    assert sorted(sink.handed) == sorted(r.score_id for r in records)  # each once
    assert (counts.delivered, counts.failed, counts.pending, counts.retried) == (2, 1, 0, 0)
    assert [x.score_id for x in letters] == [refused]
    assert states == {r.score_id: "failed" if r.score_id == refused else "delivered" for r in records}
    assert raw.zcard(_keys.outbox_key(SINK)) == 0
    assert raw.hlen(_keys.outbox_attempts_key(SINK)) == 0
    said = [x for x in logs if x["event"] == "sink_dead_letter"]
    assert sum(x["letters"] for x in said) == 1
    # (each first try settled, {1, ...} for a bury; each resend did not)
    assert [(int(a[0] if isinstance(a, list) else a), b) for a, b in seen] == [(1, 0)] * (2 if action == "ack" else 1)


# ---- paging: `dlq list`, `dlq retry <id>` / `--all` ---------------------------------------------


def _paged(dead: RedisDeadLetters, after: int, server: RedisServer, empty: bool) -> Callable[[], int]:
    """Restart Redis after the ``after``-th page ``dead`` reads (LRANGE); returns the pages read."""
    client = dead._redis.client
    lrange = client.lrange
    pages = 0

    async def spied(*args: Any, **kwargs: Any) -> Any:
        nonlocal pages
        page = await lrange(*args, **kwargs)
        pages += 1
        if pages == after:
            await asyncio.to_thread(_bounce, server, empty=empty)
        return page

    client.lrange = spied
    return lambda: pages


@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
def test_dlq_list_restarted_between_pages(empty: bool, server: RedisServer, raw: redis.Redis) -> None:
    """``dlq list`` reads the newest a page (``_FIND_PAGE``) at a time: a restart between two pages
    lists each letter once, newest first; an empty Redis ends the listing at what was read."""
    before = _letters(12)
    url = server.url()

    async def go() -> tuple[list[str], int]:
        await _fill(url, before)
        dead = RedisDeadLetters(url)
        try:
            pages = _paged(dead, 1, server, empty)
            async with asyncio.timeout(DEADLINE_S):
                listed = await dead.latest(10)
            return [x.id for x in listed], pages()
        finally:
            await dead.close()

    listed, pages = asyncio.run(go())
    newest = [x.id for x in reversed(before)]
    assert pages >= 2 or empty
    assert listed == (newest[: dead_letters_module._FIND_PAGE] if empty else newest[:10])


@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
def test_a_letter_taken_by_id_restarted_between_pages(empty: bool, server: RedisServer, raw: redis.Redis) -> None:
    """``take(<id>)`` of the oldest letter reads from the newest a page at a time: a restart
    between two pages still finds and takes it, the list's counts and bytes in step; an empty
    Redis has no such letter (None)."""
    before = _letters(12)
    url = server.url()

    async def go() -> DeadLetter | None:
        await _fill(url, before)
        dead = RedisDeadLetters(url)
        try:
            _paged(dead, 1, server, empty)
            async with asyncio.timeout(DEADLINE_S):
                return await dead.take(before[0].id)
        finally:
            await dead.close()

    taken = asyncio.run(go())
    if empty:
        assert taken is None
        assert _dlq(raw) == []
        return
    assert taken is not None
    assert taken.id == before[0].id
    _assert_dlq_in_step(raw, before[1:], None, 10_000, 1 << 40, empty=False)
    assert raw.hgetall(_keys.dlq_dropped_key()) == {}


@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
@pytest.mark.parametrize("after", [1, 2])
def test_every_letter_taken_restarted_between_pages(
    after: int, empty: bool, server: RedisServer, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlq retry --all`` / ``dlq drop``: ``each`` reads the oldest a page at a time and each
    letter is taken as it goes. A restart between two pages yields and takes every letter once
    (none skipped, none twice), the counts and bytes following; an empty Redis ends it."""
    monkeypatch.setattr(dead_letters_module, "_PAGE", 5)
    before = _letters(12)
    url = server.url()

    async def go() -> list[str]:
        await _fill(url, before)
        dead = RedisDeadLetters(url)
        taken: list[str] = []
        try:
            _paged(dead, after, server, empty)
            async with asyncio.timeout(DEADLINE_S):
                async for letter in dead.each():
                    if await dead.take(letter.id) is not None:
                        taken.append(letter.id)
            return taken
        finally:
            await dead.close()

    taken = asyncio.run(go())
    assert len(taken) == len(set(taken))
    if empty:
        # (the page read before the restart is yielded, but no longer there to take)
        assert taken == [x.id for x in before[: 5 * (after - 1)]]
    else:
        assert taken == [x.id for x in before]
    assert _dlq(raw) == []
    assert raw.hgetall(_keys.dlq_reasons_key()) == {}
    assert int(raw.get(_keys.dlq_bytes_key()) or 0) == 0


# ---- a take whose reply a restart lost: `dlq retry <id>`, `dlq drop <id>` ------------------------


def _take_replies_lost(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every take script (``dead_letter_take``) runs, then Redis is SIGKILLed and started again (as
    it was) before its reply is read, and the same call is sent again (redis-py's retry of a
    pipeline on a connection error): the caller reads the second reply. Returns the first ones."""
    evalsha_many = RedisConnection.evalsha_many
    first: list[Any] = []

    async def spied(self: RedisConnection, script: str, numkeys: int, calls: Any, *, where: str = "store") -> Any:
        replies = await evalsha_many(self, script, numkeys, calls, where=where)
        if where == "dead_letter_take":
            first.append(replies[0])
            await asyncio.to_thread(_bounce, server, empty=False)
            replies = await evalsha_many(self, script, numkeys, calls, where=where)
        return replies

    monkeypatch.setattr(RedisConnection, "evalsha_many", spied)
    return first


@pytest.mark.parametrize("how", ["by_id", "paged"])
def test_a_take_whose_reply_was_lost_still_returns_the_letter(
    how: str, server: RedisServer, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take script removed the letter, its reply was lost and the same call sent again: that
    call finds no letter, yet it was this caller's take. It returns the letter (before: None, which
    `dlq retry <id>` told as "another caller had removed it" for a letter it had sent), and the
    counts and bytes are moved once."""
    before = _letters(6)
    url = server.url()
    asyncio.run(_fill(url, before))
    first = _take_replies_lost(server, monkeypatch)

    async def go() -> list[str]:
        dead = RedisDeadLetters(url)
        try:
            async with asyncio.timeout(DEADLINE_S):
                if how == "by_id":
                    taken = await dead.take(before[2].id)
                    return [] if taken is None else [taken.id]
                return [x.id async for x in dead.each() if await dead.take(x.id) is not None]
        finally:
            await dead.close()

    taken = asyncio.run(go())
    assert first, "no take was sent"
    assert all(x == 1 for x in first), first  # (each first try took its letter)
    if how == "by_id":
        assert taken == [before[2].id]
        _assert_dlq_in_step(raw, [*before[:2], *before[3:]], None, 10_000, 1 << 40, empty=False)
    else:
        assert taken == [x.id for x in before]
        assert _dlq(raw) == []
        assert raw.hgetall(_keys.dlq_reasons_key()) == {}
        assert int(raw.get(_keys.dlq_bytes_key()) or 0) == 0


@pytest.mark.parametrize("command", ["retry", "drop"])
def test_dlq_retry_and_drop_of_an_id_whose_take_reply_was_lost_say_what_they_did(
    command: str,
    server: RedisServer,
    raw: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tracescore dlq retry <id>` / `dlq drop <id>` with Redis restarted between the take and its
    reply: "requeued <id>" / "dropped <id>", exit 0 (before: exit 1, "requeued, but another caller
    had removed it from the list" for a letter it had sent and taken; "another caller had removed
    it" for one it had dropped)."""
    from worker._settings import get_settings
    from worker.cli import main

    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    asyncio.run(_fill(server.url(), [letter]))
    monkeypatch.setenv("TRACESCORE_BROKER_URL", server.url())
    monkeypatch.delenv("TRACESCORE_REDIS_URL", raising=False)
    get_settings.cache_clear()
    first = _take_replies_lost(server, monkeypatch)
    try:
        capsys.readouterr()
        code = _within(lambda: main(["dlq", command, letter.id]))
        said = capsys.readouterr()
    finally:
        get_settings.cache_clear()
    assert first == [1]
    assert "another caller" not in said.err
    assert (code, f"{'requeued' if command == 'retry' else 'dropped'} {letter.id}" in said.out) == (0, True), said
    assert _dlq(raw) == []
    assert raw.llen("tracescore") == (1 if command == "retry" else 0)  # sent once
