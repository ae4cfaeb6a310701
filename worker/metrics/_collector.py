"""Gauges read from Redis when scraped: the queue, the dead letters, the score sinks' outbox.

They describe the shared state every worker node sees (each node reports the same values:
aggregate with ``max``, not ``sum``). A Redis that does not answer within a couple of seconds
gives ``tracescore_redis_up 0`` and none of these gauges, never a failed scrape. A value in
Redis that is not a number (a hand-edited or hostile key) is skipped, logged and counted in
``tracescore_store_unreadable_values``; it never fails the scrape either. A key of ours holding
another Redis type is not an unreachable Redis: a key the store rebuilds is repaired (as the
store does on every path), one left for the operator (the queue's list, the dead-letter list, a
sink's queue) is ``tracescore_keys_refused`` and its figures are left out.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import redis
import structlog

from tracing.queue import parse_json
from worker import _keys
from worker._budget import RedisLedger, parse_budgets, spend_report
from worker.metrics._instruments import MetricSpec, observe_unreadable
from worker.store import RedisOutbox, StoreKeyTypeError, checked, letters_bytes

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from worker._settings import Settings

__all__ = ["SCRAPED", "RedisStateCollector"]

log = structlog.get_logger("tracescore.worker.metrics")

SCRAPED: Final = (
    MetricSpec("tracescore_redis_up", "gauge", ("target",), "1 when the broker / score store answered this scrape"),
    MetricSpec("tracescore_queue_depth", "gauge", ("queue",), "Messages waiting in the queue (not taken by a worker)"),
    MetricSpec(
        "tracescore_queue_unacked",
        "gauge",
        (),
        "Messages taken by workers and not yet acknowledged (being scored, or held for a retry), all queues",
    ),
    MetricSpec(
        "tracescore_queue_oldest_age_seconds",
        "gauge",
        ("queue",),
        "Age of the oldest waiting message: now minus the earliest enqueued_at of its runs (0 when empty)",
    ),
    MetricSpec("tracescore_dead_letters", "gauge", ("reason",), "Dead letters on the list, by reason"),
    MetricSpec(
        "tracescore_dead_letters_dropped",
        "gauge",
        ("reason",),
        "Dead letters dropped past the list's bounds (TRACESCORE_DLQ_MAX_LETTERS, TRACESCORE_DLQ_MAX_BYTES),"
        " the oldest first, by reason",
    ),
    MetricSpec(
        "tracescore_dead_letters_bytes",
        "gauge",
        (),
        "Bytes of the dead letters on the list (their JSON, each with its message), as their bound counts them",
    ),
    MetricSpec(
        "tracescore_dead_letters_max_bytes",
        "gauge",
        (),
        "The dead-letter list's byte bound (TRACESCORE_DLQ_MAX_BYTES): past it the oldest letters go",
    ),
    MetricSpec(
        "tracescore_keys_refused",
        "gauge",
        ("key",),
        "1 per key of ours holding another Redis type, left as it is for the operator to move aside",
    ),
    MetricSpec(
        "tracescore_sink_scores",
        "gauge",
        ("sink", "state"),
        "Score write-back per sink: pending and failed now; delivered, dropped, retried since the counters began",
    ),
    MetricSpec(
        "tracescore_sink_dead_letters_dropped",
        "gauge",
        ("sink",),
        "A sink's dead letters dropped past its bound (TRACESCORE_SINK_MAX_DEAD_LETTERS), the oldest first,"
        " since the counters began",
    ),
    MetricSpec("tracescore_worker_info", "gauge", ("node", "queue"), "1 per worker node serving these metrics"),
    MetricSpec(
        "tracescore_spend_today_usd",
        "gauge",
        ("scope",),
        "Judge spend today (UTC) by every worker: scope total, scorer:<id> or model:<id>",
    ),
    MetricSpec(
        "tracescore_budget_limit_usd",
        "gauge",
        ("budget",),
        "Daily budget (TRACESCORE_BUDGETS): total, scorer:<id> or model:<id>",
    ),
    MetricSpec(
        "tracescore_budget_remaining_ratio",
        "gauge",
        ("budget",),
        "Share of a daily budget still unspent today (UTC), 0..1",
    ),
)

_TIMEOUT_S = 2.0


def _client(url: str, **kwargs: Any) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=_TIMEOUT_S, socket_timeout=_TIMEOUT_S, **kwargs)


def oldest_enqueued_at(raw_message: bytes) -> float | None:
    """The earliest ``enqueued_at`` of the runs in one kombu Redis message (its JSON envelope
    with the base64 body); None when the message carries none or cannot be read.

    Read where the requests keep it (``[[batch], kwargs, embed]``, each request's own field):
    a search of the body's text also found the key inside the trace's content (a span attribute
    or event named so), and the queue's age jumped by decades. The whole message is parsed, once
    a scrape and only the oldest: at most the workers' payload cap, a few milliseconds a MiB.
    """
    try:
        envelope = json.loads(raw_message)
        body = envelope["body"]
        data = base64.b64decode(body) if envelope.get("properties", {}).get("body_encoding") == "base64" else body
        requests = parse_json(data)[0][0]["requests"]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        return None
    if not isinstance(requests, list):
        return None
    stamps = [
        stamp
        for request in requests
        if isinstance(request, dict)
        and isinstance(stamp := request.get("enqueued_at"), int | float)
        and not isinstance(stamp, bool)
        and math.isfinite(stamp)
    ]
    return float(min(stamps)) if stamps else None


def _unreadable(key: str) -> None:
    observe_unreadable(key)
    log.warning("metrics_value_unreadable", key=key)


def _text(reply: Any) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _refused(gauge: Any, key: str, found: str, expected: str) -> None:
    gauge.add_metric([key], 1)
    log.warning("metrics_key_refused", key=key, found=found, expected=expected)


class RedisStateCollector:
    """A ``prometheus_client`` collector (``collect()`` on every scrape) of the shared state."""

    def __init__(self, settings: Settings, node: str) -> None:
        self._queue = settings.queue
        self._node = node
        self._broker = _client(settings.broker_redis_url, **settings.tls.redis_kwargs(settings.broker_url))
        self._store = _client(settings.store_url)
        self._outbox = RedisOutbox(settings.store_url, reconnect_s=_TIMEOUT_S, command_s=_TIMEOUT_S)
        self._store_url = settings.store_url
        self._budgets = parse_budgets(settings.budgets)
        self._dlq_max_bytes = settings.dlq_max_bytes

    def describe(self) -> list[Metric]:
        return []  # not known ahead: the registry must not call collect() at registration

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        g = {s.name: GaugeMetricFamily(s.name, s.help, labels=list(s.labels)) for s in SCRAPED}
        up, info = g["tracescore_redis_up"], g["tracescore_worker_info"]
        depth, unacked = g["tracescore_queue_depth"], g["tracescore_queue_unacked"]
        age, dead = g["tracescore_queue_oldest_age_seconds"], g["tracescore_dead_letters"]
        dropped = g["tracescore_dead_letters_dropped"]
        dead_bytes, max_bytes = g["tracescore_dead_letters_bytes"], g["tracescore_dead_letters_max_bytes"]
        sinks, refused = g["tracescore_sink_scores"], g["tracescore_keys_refused"]
        sink_dropped = g["tracescore_sink_dead_letters_dropped"]
        info.add_metric([self._node, self._queue], 1)
        yield info
        broker_ok = self._read_queue(depth, unacked, age, refused)
        up.add_metric(["broker"], 1 if broker_ok else 0)
        store_ok = self._read_store(dead, dropped, dead_bytes, (sinks, sink_dropped), refused)
        max_bytes.add_metric([], self._dlq_max_bytes)
        up.add_metric(["store"], 1 if store_ok else 0)
        yield up
        if broker_ok:
            yield from (depth, unacked, age)
        if store_ok:
            yield from (dead, dropped, dead_bytes, max_bytes, sinks, sink_dropped)
            yield from self._spend(g)
        if refused.samples:
            yield refused

    def _read_queue(self, depth: Any, unacked: Any, age: Any, refused: Any) -> bool:
        try:
            # The types first, in one transaction with the reads they vouch for: a WRONGTYPE
            # answer is a misplaced key, not an unreachable broker.
            pipe = self._broker.pipeline(transaction=True)
            pipe.type(self._queue)
            pipe.type("unacked")
            pipe.llen(self._queue)
            # kombu pushes on the left and takes from the right: the oldest is the last.
            pipe.lindex(self._queue, -1)
            pipe.hlen("unacked")
            queue_type, unacked_type, waiting, oldest, taken = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            log.warning("metrics_broker_unavailable", error=type(exc).__name__)
            return False
        if _text(queue_type) in ("none", "list"):
            depth.add_metric([self._queue], int(waiting))
            enqueued = oldest_enqueued_at(oldest) if isinstance(oldest, bytes) else None
            age.add_metric([self._queue], max(0.0, time.time() - enqueued) if enqueued is not None else 0.0)
        else:
            # Never repaired (it holds messages): the workers stop on it, `tracescore status` names it.
            _refused(refused, self._queue, _text(queue_type), "list")
        # kombu's hash of taken messages of another type: the next worker to use it repairs it.
        if _text(unacked_type) in ("none", "hash"):
            unacked.add_metric([], int(taken))
        return True

    def _read_store(self, dead: Any, dropped: Any, dead_bytes: Any, sink_gauges: tuple[Any, Any], refused: Any) -> bool:
        key, dropped_key, bytes_key = _keys.dlq_reasons_key(), _keys.dlq_dropped_key(), _keys.dlq_bytes_key()
        try:
            # The counts by reason are rebuilt by the store: repaired here as on its other paths.
            reasons = checked(
                self._store, "dead_letter_counts", [(key, "hash", False)], lambda: dict(self._store.hgetall(key))
            )
            past_bound = checked(
                self._store,
                "dead_letter_dropped",
                [(dropped_key, "hash", False)],
                lambda: dict(self._store.hgetall(dropped_key)),
            )
            # The list itself is never repaired (it holds letters): while it is of another type,
            # every message the workers refuse goes back to the queue, counted nowhere else.
            letters_type = _text(self._store.type(_keys.dlq_key()))
            if letters_type not in ("none", "list"):
                _refused(refused, _keys.dlq_key(), letters_type, "list")
            # Read as `tracescore status` reads it (the store's script): None while lost or damaged.
            total = letters_bytes(self._store) if letters_type in ("none", "list") else None
            damaged = total is None and bool(self._store.exists(bytes_key))
            try:
                counts = self._outbox.counts()  # a counter that is not a number: None, counted
            except StoreKeyTypeError as exc:  # a sink's queue of another type: left for the operator
                _refused(refused, exc.key, exc.found, exc.expected)
                counts = {}
        except redis.RedisError as exc:
            log.warning("metrics_store_unavailable", error=type(exc).__name__)
            return False
        for gauge, counts_of, by_reason in ((dead, "dlq_reasons", reasons), (dropped, "dlq_dropped", past_bound)):
            for reason, letters in sorted(by_reason.items()):
                name = _text(reason)
                try:
                    n = int(letters)
                except ValueError:
                    _unreadable(f"{counts_of}:{name[:60]}")
                    continue
                if n > 0:
                    gauge.add_metric([name], n)
        # Left out, not 0, while the count is lost or damaged (the next push sums it again).
        if total is not None:
            dead_bytes.add_metric([], total)
        elif damaged and letters_type in ("none", "list"):
            _unreadable("dlq_bytes")
        sinks, sink_dropped = sink_gauges
        for sink, c in sorted(counts.items()):
            for state, count in c.as_dict().items():
                if count is None:  # (no number in Redis: left out, not 0; counted by the outbox)
                    continue
                if state == "dead_letters_dropped":  # (no state of a score: beside the DLQ's own)
                    sink_dropped.add_metric([sink], count)
                else:
                    sinks.add_metric([sink, state], count)
        return True

    def _spend(self, g: dict[str, Any]) -> Iterator[Metric]:
        try:
            report = asyncio.run(self._spend_report())
        except Exception as exc:  # the ledger's Redis errors, whatever wraps them: no spend gauges
            log.warning("metrics_spend_unavailable", error=type(exc).__name__)
            return
        # A figure a field that is no number leaves unknown is left out, not 0 (a smaller spend,
        # a budget left whole: no alert), and counted in tracescore_store_unreadable_values.
        spend = g["tracescore_spend_today_usd"]
        if report["total_usd"] is not None:
            spend.add_metric(["total"], report["total_usd"])
        for kind in ("scorer", "model"):
            for name, usd in report[f"by_{kind}"].items():
                if usd is not None:
                    spend.add_metric([f"{kind}:{name}"], usd)
        yield spend
        if report["budgets"]:
            limit, ratio = g["tracescore_budget_limit_usd"], g["tracescore_budget_remaining_ratio"]
            for budget, b in report["budgets"].items():
                limit.add_metric([budget], b["limit_usd"])
                if b["remaining_usd"] is not None:
                    ratio.add_metric([budget], b["remaining_usd"] / b["limit_usd"] if b["limit_usd"] > 0 else 0.0)
            yield from (limit, ratio)

    async def _spend_report(self) -> dict[str, Any]:
        # The ledger is async (the workers' event loops); a scrape runs on the HTTP server's thread.
        ledger = RedisLedger(self._store_url, reconnect_s=_TIMEOUT_S)
        try:
            return await asyncio.wait_for(spend_report(ledger, self._budgets), _TIMEOUT_S * 2)
        finally:
            await ledger.close()

    def close(self) -> None:
        self._broker.close()
        self._store.close()
        self._outbox.close()
