"""A real prefork worker with metrics on scores runs; its /metrics must say exactly what it did."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests._redis import free_port
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.metrics_scorers import fast
from tracing import CelerySink, ScoreBatch, score_id_for
from tracing.queue import parse_json
from worker import _keys
from worker._budget import RedisLedger, utc_day
from worker._loop import run_coro
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker._settings import load_settings
from worker.cli._status import collect_status
from worker.metrics import RedisStateCollector
from worker.store import DeadLetter, MemoryScoreStore, RedisDeadLetters, RedisOutbox

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of the node's /metrics, by series name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return _samples(response.read().decode())


def _samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(samples: Samples, name: str, **match: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` whose labels include ``match`` (zero values left out)."""
    wanted = set(match.items())
    return {labels: v for (n, labels), v in samples.items() if n == name and wanted <= labels and v}


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(series(samples, name, **match).values())


def _outcome(record: dict[str, Any]) -> tuple[str, str, str]:
    if record["error_type"]:
        return (record["scorer_id"], "failed", record["error_type"])
    if record["score"] is None:
        return (record["scorer_id"], "not_scorable", "")
    return (record["scorer_id"], "scored", "")


@pytest.fixture
def metrics_worker(
    redis_url: str, tmp_path: Path, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]
) -> Iterator[tuple[WorkerProcess, int, Path]]:
    port = free_port()
    worker = WorkerProcess(
        "metrics",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        pool="prefork",
        concurrency=2,
        scorers="tests.worker.metrics_scorers",
        env={
            **fake_llm_env,
            "TRACESCORE_METRICS_PORT": str(port),
            "TRACESCORE_METRICS_HOST": "127.0.0.1",
            "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
            # Two requests of burst, then two a second: judge calls in one batch must wait.
            "TRACESCORE_RATE_LIMITS": json.dumps({"openai/fake-judge": {"requests_per_minute": 120}}),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
        },
    )
    try:
        worker.wait_ready()
        yield worker, port, tmp_path / "metrics"
    finally:
        worker.stop()


def test_metrics_count_what_the_prefork_children_scored(
    metrics_worker: tuple[WorkerProcess, int, Path], fake_llm: FakeLLMServer, redis_url: str, tmp_path: Path
) -> None:
    """Successes, failures, not-scorable runs, a judge 429 retried, a 401 and a run left for
    the message's retry: the scraped counters and histograms equal the stored records (and the
    one retry), summed over both pool children."""
    worker, port, metrics_dir = metrics_worker
    # The first judge request is rate limited (retried by the judge), the next one refused.
    fake_llm.script(Reply.rate_limited(retry_after_ms="100"), Reply.error(401, "bad key"))
    # Store state a child meets while scoring: a trace's record index of another Redis type
    # and a spend field that is not a number (the unpriced calls' count), both repaired before
    # they are written (seeded for the next hour's day too, in case the test spans midnight UTC).
    fast = [batch(range(n, n + 1), ["fast"], salt="m-fast") for n in range(8)]
    client = redis.Redis.from_url(redis_url)
    client.set(_keys.trace_key(fast[0].requests[0].trace_id), "not a set")
    for day in {utc_day(), utc_day(time.time() + 3600)}:
        client.hset(_keys.spend_key(day), "unpriced:openai/fake-judge", "junk")
    client.close()
    sink = CelerySink(redis_url)
    for message in fast:  # one run a message: the two children share them
        sink.send(message)
    sink.send(batch(range(3), ["broken"], salt="m-broken"))
    sink.send(batch(range(2), ["declines"], salt="m-declines"))
    sink.send(batch(range(6), ["judged"], salt="m-judged"))
    sink.send(batch(range(1), ["flaky"], salt="m-flaky"))  # fails transiently once, then scores
    sink.close()
    scores_path = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores_path)) >= 20, 60), worker.text()[-3000:]
    records = read_scores(scores_path)
    assert len(records) == 20

    # 20 stored runs, and the flaky one's first attempt left for the message's retry.
    assert wait_for(lambda: total(scrape(port), "tracescore_runs_total") == 21, 10)
    samples = scrape(port)

    # Runs by scorer, outcome and reason: exactly the records.
    runs = {
        (dict(labels)["scorer"], dict(labels)["outcome"], dict(labels)["reason"]): v
        for labels, v in series(samples, "tracescore_runs_total").items()
    }
    retried = runs.pop(("flaky", "retry", "ConnectionError"))
    assert retried == 1
    assert runs == dict(Counter(_outcome(r) for r in records))
    assert runs[("fast", "scored", "")] == 8
    assert runs[("broken", "failed", "ValueError")] == 3
    assert runs[("declines", "not_scorable", "")] == 2
    assert runs[("judged", "scored", "")] == 5
    assert runs[("judged", "failed", "JudgeAuthError")] == 1
    assert runs[("flaky", "scored", "")] == 1

    # Judge requests: five answers, one 429 (then retried), one 401; the fake judge saw 7.
    model = "openai/fake-judge"
    requests = {
        dict(labels)["outcome"]: v
        for labels, v in series(samples, "tracescore_judge_requests_total", model=model).items()
    }
    assert requests == {"ok": 5, "JudgeRateLimitError": 1, "JudgeAuthError": 1}
    assert fake_llm.count(model="fake-judge") == 7
    assert total(samples, "tracescore_judge_retries_total", model=model) == 1
    assert total(samples, "tracescore_judge_request_duration_seconds_count", model=model) == 7
    assert total(samples, "tracescore_judge_request_duration_seconds_sum", model=model) > 0

    # Tokens and cost, counted per answered call: here (no call paid for a run left unstored)
    # the judged records' sums.
    judged = [r for r in records if r["judge_models"]]
    assert judged
    assert all(r["judge_models"] == [model] for r in judged)
    for kind, field in (("input", "input_tokens"), ("output", "output_tokens")):
        expected = sum(r[field] for r in judged)
        assert expected > 0
        assert total(samples, "tracescore_judge_tokens_total", scorer="judged", model=model, kind=kind) == expected
    priced = [r["cost_usd"] for r in judged if r["cost_usd"] is not None]
    assert total(samples, "tracescore_judge_cost_usd_total") == pytest.approx(sum(priced))
    # fake-judge has no price here: every answered call is an unpriced one (a record that paid
    # for no answer costs 0).
    assert not any(priced)
    assert total(samples, "tracescore_judge_unpriced_calls_total", scorer="judged", model=model) == requests["ok"]

    # The shared rate limiter made some judge calls wait (a burst of 2 for 6 runs at once).
    assert total(samples, "tracescore_limiter_waits_total", model=model) >= 1
    assert total(samples, "tracescore_limiter_wait_seconds_total", model=model) > 0

    # Counted in the children that met them: one key repaired, and the spend field that was no
    # number (by the first answered call's add, which then counted; it failed each add before).
    repaired = {frozenset({("where", "put_records")}): 1, frozenset({("where", "spend_add")}): 1}
    assert series(samples, "tracescore_store_key_repairs_total") == repaired
    assert total(samples, "tracescore_store_unreadable_values", key="spend_add") == 0
    client = redis.Redis.from_url(redis_url)
    try:
        assert float(client.hget(_keys.spend_key(utc_day()), "unpriced:openai/fake-judge") or 0) == requests["ok"]
    finally:
        client.close()

    # Histograms: one batch observation per delivery (the flaky message twice), one latency per
    # stored run.
    assert total(samples, "tracescore_batch_duration_seconds_count") == 13
    assert total(samples, "tracescore_run_latency_seconds_count") == 20
    assert total(samples, "tracescore_run_latency_seconds_bucket", le="+Inf") == 20
    assert total(samples, "tracescore_run_latency_seconds_count", scorer="fast", source="live") == 8

    # Scrape-time gauges: the queue is empty, both children alive, nothing dead-lettered.
    assert samples[("tracescore_queue_depth", frozenset({("queue", "tracescore")}))] == 0
    assert samples[("tracescore_queue_oldest_age_seconds", frozenset({("queue", "tracescore")}))] == 0
    assert samples[("tracescore_redis_up", frozenset({("target", "broker")}))] == 1
    assert samples[("tracescore_redis_up", frozenset({("target", "store")}))] == 1
    assert total(samples, "tracescore_worker_processes") == 2
    assert series(samples, "tracescore_dead_letters") == {}
    (node_dir,) = metrics_dir.iterdir()
    assert node_dir.name.startswith("metrics@")

    # Both children recorded runs; the endpoint shows their sum.
    per_process = _runs_per_process(node_dir)
    assert len([n for n in per_process.values() if n]) == 2, per_process
    assert sum(per_process.values()) == 21

    # A child killed outright: the pool replaces it, the scrape drops its live gauge, and what
    # it counted stays counted.
    victim = next(pid for pid, n in per_process.items() if n)
    os.kill(victim, signal.SIGKILL)
    # (the sweep of dead children's files runs at each scrape)
    assert wait_for(
        lambda: total(scrape(port), "tracescore_worker_processes") == 2 and victim not in _live_pids(node_dir), 30, 0.2
    ), worker.text()[-2000:]
    after = scrape(port)
    assert total(after, "tracescore_runs_total") == 21
    assert total(after, "tracescore_judge_requests_total") == 7
    # The children's gauge of unreadable values is a sum kept past their death, like a counter.
    assert series(after, "tracescore_store_key_repairs_total") == repaired


def _started(log: Path, proc: subprocess.Popen[bytes]) -> bool:
    return " ready." in log.read_text() or proc.poll() is not None


def _runs_per_process(node_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in node_dir.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        families = MultiProcessCollector.merge([str(path)], accumulate=True)  # type: ignore[no-untyped-call]
        out[pid] = sum(
            s.value for f in families if f.name == "tracescore_runs" for s in f.samples if s.name.endswith("_total")
        )
    return out


def _live_pids(node_dir: Path) -> set[int]:
    return {int(p.stem.rsplit("_", 1)[1]) for p in node_dir.glob("gauge_livesum_*.db")}


def test_scrape_time_gauges_read_the_queue_dead_letters_and_outbox(redis_url: str) -> None:
    """Without a worker consuming: queue depth and the oldest message's age (from its runs'
    enqueued_at), dead letters by reason and the sinks' pending counts, read from Redis."""
    settings = load_settings(
        broker_url=redis_url, queue="metrics-q", budgets='{"total": 10, "models": {"openai/gpt-4o": 2}}'
    )
    oldest = batch(range(2), ["fast"], salt="q-old")
    two_minutes_ago = time.time() - 120
    for request in oldest.requests:  # handed to the queue two minutes ago
        object.__setattr__(request, "enqueued_at", two_minutes_ago)
    sink = CelerySink(redis_url, queue="metrics-q")
    sink.send(oldest)
    sink.send(batch(range(3), ["fast"], salt="q-new"))
    sink.close()

    letters = RedisDeadLetters(redis_url, max_letters=3)
    run_coro(letters.push(DeadLetter(reason="not_json", message_key="m0")), 5)  # dropped past the bound
    kept = [DeadLetter(reason=r, message_key=f"m{n}") for n, r in enumerate(["poison", "poison", "invalid_payload"], 1)]
    for letter in kept:
        run_coro(letters.push(letter), 5)
    run_coro(letters.close(), 5)
    ledger = RedisLedger(redis_url)
    run_coro(ledger.add(utc_day(), ["scorer:fast", "model:openai/gpt-4o", "total"], 1.5, None), 5)
    run_coro(ledger.close(), 5)
    outbox = RedisOutbox(redis_url)
    outbox.register(["jsonl"])
    outbox.enqueue("jsonl", ["s1", "s2"])
    outbox.close()
    client = redis.Redis.from_url(redis_url)
    client.hset(_keys.outbox_counts_key("jsonl"), "dead_letters_dropped", 7)  # (past its bound)
    client.close()

    samples = _scrape(settings, "node-a@host")
    queue = frozenset({("queue", "metrics-q")})
    assert samples[("tracescore_queue_depth", queue)] == 2
    assert 119 <= samples[("tracescore_queue_oldest_age_seconds", queue)] < 180
    assert samples[("tracescore_dead_letters", frozenset({("reason", "poison")}))] == 2
    assert samples[("tracescore_dead_letters", frozenset({("reason", "invalid_payload")}))] == 1
    assert ("tracescore_dead_letters", frozenset({("reason", "not_json")})) not in samples
    assert samples[("tracescore_dead_letters_dropped", frozenset({("reason", "not_json")}))] == 1
    # The kept letters' bytes, beside the byte bound they are held under.
    assert samples[("tracescore_dead_letters_bytes", frozenset())] == sum(len(d.model_dump_json()) for d in kept)
    assert samples[("tracescore_dead_letters_max_bytes", frozenset())] == settings.dlq_max_bytes
    assert samples[("tracescore_sink_scores", frozenset({("sink", "jsonl"), ("state", "pending")}))] == 2
    assert samples[("tracescore_sink_scores", frozenset({("sink", "jsonl"), ("state", "delivered")}))] == 0
    assert samples[("tracescore_sink_dead_letters_dropped", frozenset({("sink", "jsonl")}))] == 7
    assert not [k for k in samples if k[0] == "tracescore_sink_scores" and ("state", "dead_letters_dropped") in k[1]]
    assert samples[("tracescore_worker_info", frozenset({("node", "node-a@host"), ("queue", "metrics-q")}))] == 1
    assert samples[("tracescore_redis_up", frozenset({("target", "broker")}))] == 1
    # Today's spend against the budgets (worker/_budget.py's ledger).
    assert samples[("tracescore_spend_today_usd", frozenset({("scope", "total")}))] == 1.5
    assert samples[("tracescore_spend_today_usd", frozenset({("scope", "scorer:fast")}))] == 1.5
    assert samples[("tracescore_budget_limit_usd", frozenset({("budget", "total")}))] == 10
    assert samples[("tracescore_budget_remaining_ratio", frozenset({("budget", "total")}))] == pytest.approx(0.85)
    assert samples[("tracescore_budget_remaining_ratio", frozenset({("budget", "model:openai/gpt-4o")}))] == (
        pytest.approx(0.25)
    )


def test_hostile_values_in_redis_are_skipped_and_counted_not_a_failed_scrape_or_judge_call(redis_url: str) -> None:
    """Non-numbers where counts and spend live (a hand-edited key, a hostile writer): the scrape
    keeps every readable gauge and counts what it skipped; the budget guard still decides."""
    from scorers._result import JudgeUsage
    from scorers.judge import JudgeCallRefused
    from worker._budget import BudgetGuard, parse_budgets

    client = redis.Redis.from_url(redis_url)
    client.hset(_keys.dlq_reasons_key(), mapping={"poison": "2", "junk": "many"})
    # (unknown until the next push sums it again: left out; beside an empty list it is 0, as status says)
    client.lpush(_keys.dlq_key(), DeadLetter(reason="poison").model_dump_json())
    client.set(_keys.dlq_bytes_key(), "lots")
    client.hset(_keys.spend_key(utc_day()), mapping={"total": "lots", "scorer:fast": "0.5", "model:m": "nan"})
    # A sink's queue of another Redis type: refused (never deleted), only the sink gauges go.
    client.sadd(_keys.outbox_sinks_key(), "otlp")
    client.set(_keys.outbox_key("otlp"), "not a queue")
    client.close()
    settings = load_settings(broker_url=redis_url, budgets='{"total": 10, "scorers": {"fast": 1}}')
    # (the counter is the process's: an earlier test's counts are in it, so this scrape's are
    # the difference; an absolute ">= 1" held whatever this scrape counted)
    skipped = ("dlq_reasons:junk", "dlq_bytes", "spend:total", "spend:model:m")
    before = {key: _unreadable(key) for key in skipped}
    samples = _scrape(settings, "node-h@host")
    assert samples[("tracescore_redis_up", frozenset({("target", "store")}))] == 1
    assert samples[("tracescore_dead_letters", frozenset({("reason", "poison")}))] == 2
    assert ("tracescore_dead_letters_bytes", frozenset()) not in samples
    assert samples[("tracescore_spend_today_usd", frozenset({("scope", "scorer:fast")}))] == 0.5
    # (the total summed from the scorers' spend, as the judge's check repairs it; model:m left out)
    assert samples[("tracescore_spend_today_usd", frozenset({("scope", "total")}))] == 0.5
    assert ("tracescore_spend_today_usd", frozenset({("scope", "model:m")})) not in samples
    assert series(samples, "tracescore_sink_scores") == {}
    # What was skipped is counted in this process's metric (a node serves every process's sum).
    assert {key: _unreadable(key) - before[key] for key in skipped} == dict.fromkeys(skipped, 1)
    # A sink's counter that is not a number: its other counters are kept, the bad one counted.
    client = redis.Redis.from_url(redis_url)
    client.delete(_keys.outbox_key("otlp"))
    client.hset(_keys.outbox_counts_key("otlp"), mapping={"delivered": "12x", "retried": 4})
    client.close()
    before = _unreadable("outbox_counts")
    samples = _scrape(settings, "node-h@host")
    assert samples[("tracescore_sink_scores", frozenset({("sink", "otlp"), ("state", "retried")}))] == 4
    assert _unreadable("outbox_counts") == before + 1
    client = redis.Redis.from_url(redis_url)
    client.delete(_keys.outbox_counts_key("otlp"))
    client.set(_keys.outbox_key("otlp"), "not a queue")
    client.close()

    ledger = RedisLedger(redis_url)
    guard = BudgetGuard(ledger, parse_budgets('{"total": 10, "scorers": {"fast": 0.4}}'))
    try:
        # The unreadable total is summed again from the scorers' spend before it is read (it read
        # as 0: every call passed the total budget); the scorer's spend refuses.
        with pytest.raises(JudgeCallRefused, match="scorer fast"):
            run_coro(guard.before_call("m", "fast"), 5)
        client = redis.Redis.from_url(redis_url)
        try:
            assert client.hget(_keys.spend_key(utc_day()), "total") == b"0.5"
            # Its spend added to readable fields now (it failed, uncounted, before).
            before = _unreadable("spend_add")
            run_coro(guard.after_call("openai/gpt-4o-mini", "fast", JudgeUsage(input_tokens=10)), 5)
            assert _unreadable("spend_add") == before
            assert float(client.hget(_keys.spend_key(utc_day()), "total")) > 0.5
        finally:
            client.close()
    finally:
        run_coro(ledger.close(), 5)


def test_a_spend_field_that_is_no_number_is_shown_unknown_or_summed_not_smaller(redis_url: str) -> None:
    """`status` and the scrape read the spend without writing (a health check on a replica), and
    read a field that is no number as 0: a total of 0 and a total budget left whole (ratio 1:
    no alert) while the scorers had spent 0.75 of it, and the next judge call's check sums it
    again. A total that is no number is the scorers' sum now, as that repair makes it; a field
    that cannot be had so is unknown (`null`, no gauge), never a smaller figure; still counted."""
    from worker.cli import cli as cli_main

    budgets = '{"total": 1, "scorers": {"fast": 1, "slow": 1}}'
    settings = load_settings(broker_url=redis_url, budgets=budgets)
    client = redis.Redis.from_url(redis_url)
    spend = _keys.spend_key(utc_day())
    client.hset(spend, mapping={"total": "lots", "scorer:fast": "0.5", "scorer:slow": "0.25", "model:m": "0.75"})
    try:
        report = collect_status(1.0, settings)["spend"]
        assert report["total_usd"] == pytest.approx(0.75)
        assert report["budgets"]["total"]["remaining_usd"] == pytest.approx(0.25)
        samples = _scrape(settings, "node-s@host")
        assert samples[("tracescore_spend_today_usd", frozenset({("scope", "total")}))] == pytest.approx(0.75)
        ratio = samples[("tracescore_budget_remaining_ratio", frozenset({("budget", "total")}))]
        assert ratio == pytest.approx(0.25)

        # A scorer's spend no number too: it, the total and their budgets are unknown.
        client.hset(spend, "scorer:slow", "nan")
        before = _unreadable("spend:scorer:slow")
        report = collect_status(1.0, settings)["spend"]
        assert report["total_usd"] is None
        assert report["by_scorer"] == {"fast": 0.5, "slow": None}
        assert report["by_model"] == {"m": 0.75}
        assert report["budgets"]["total"] == {"limit_usd": 1, "spent_usd": None, "remaining_usd": None}
        assert report["budgets"]["scorer:slow"]["remaining_usd"] is None
        assert report["budgets"]["scorer:fast"]["remaining_usd"] == pytest.approx(0.5)
        assert report["unreadable"] == ["scorer:slow", "total"]
        assert _unreadable("spend:scorer:slow") == before + 1
        samples = _scrape(settings, "node-s@host")
        gauges = {dict(labels)["scope"]: v for (n, labels), v in samples.items() if n == "tracescore_spend_today_usd"}
        assert gauges == {"scorer:fast": 0.5, "model:m": 0.75}
        ratios = {
            dict(labels)["budget"] for (n, labels), v in samples.items() if n == "tracescore_budget_remaining_ratio"
        }
        assert ratios == {"scorer:fast"}
        shown = CliRunner().invoke(
            cli_main,
            ["status", "--broker", redis_url],
            env={"TRACESCORE_REDIS_URL": redis_url, "TRACESCORE_BUDGETS": budgets},
        )
        assert shown.exit_code == 0, shown.output
        day = utc_day()
        assert (
            f"spend       {day} (UTC): unknown (a spend field in Redis is no number: scorer:slow, total;"
            in shown.output
        )
        assert "  scorer  slow: unknown" in shown.output
        assert "budget      total: unknown of 1.0000 USD left today" in shown.output
        assert "budget      scorer:fast: 0.5000 of 1.0000 USD left today" in shown.output
        # Read only: the fields stand as they were, for the judge's next check to repair.
        assert client.hget(spend, "total") == b"lots"
    finally:
        client.close()


def test_a_counter_that_is_no_number_is_shown_unknown_not_0(redis_url: str) -> None:
    """A sink's counter, a dead-letter reason's count or a failure count that is no number (a
    damaged value) showed as 0 in `status` and the scrape (or was left out of a sum by reason):
    a sink that had delivered thousands showed none. Each is unknown now (`null`, "unknown", a
    line naming it, never its value; no gauge sample), still counted, and left as it was."""
    from worker.cli import cli as cli_main
    from worker.store._jobs import failure_bucket

    settings = load_settings(broker_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    client.sadd(_keys.outbox_sinks_key(), "otlp")
    client.hset(_keys.outbox_counts_key("otlp"), mapping={"delivered": "12x", "dropped": "SECRET", "retried": 4})
    client.hset(_keys.dlq_reasons_key(), mapping={"invalid_payload": 2, "weird": "SECRET"})
    bucket = failure_bucket()
    client.hset(_keys.failures_key(bucket), mapping={"timeout": 3, "odd": "2"})
    client.hset(_keys.failures_key(bucket - 1), mapping={"odd": "SECRET"})
    before = _unreadable("outbox_counts")
    try:
        status = collect_status(0.3, settings)
        assert status["sinks"]["otlp"] == {
            "delivered": None, "pending": 0, "failed": 0, "dropped": None, "retried": 4, "dead_letters_dropped": 0
        }  # fmt: skip
        assert _unreadable("outbox_counts") == before + 2
        assert status["dead_letters_by_reason"] == {"invalid_payload": 2, "weird": None}
        assert status["recent_failures"] == {"timeout": 3, "odd": None}

        samples = _scrape(settings, "node-c@host")
        sinks = {dict(labels)["state"]: v for (n, labels), v in samples.items() if n == "tracescore_sink_scores"}
        assert sinks == {"pending": 0, "failed": 0, "retried": 4}
        assert _unreadable("outbox_counts") == before + 4
        letters = {dict(labels)["reason"] for (n, labels), v in samples.items() if n == "tracescore_dead_letters"}
        assert letters == {"invalid_payload"}

        env = {"TRACESCORE_REDIS_URL": redis_url}
        shown = CliRunner().invoke(cli_main, ["status", "--broker", redis_url, "--timeout", "0.3"], env=env)
        assert shown.exit_code == 0, shown.output
        assert "sink        otlp: unknown delivered, 0 pending, 0 failed, unknown dropped (record expired)" in (
            shown.output
        )
        assert "dead letters 0 (invalid_payload=2, weird=unknown)" in shown.output
        assert "failures    last hour: timeout=3, odd=unknown" in shown.output
        assert (
            "unknown     a counter in Redis is no number: sink otlp delivered, sink otlp dropped,"
            " dead letters weird, failures odd" in shown.output
        )
        assert "SECRET" not in shown.output
        listed = CliRunner().invoke(cli_main, ["sinks", "list", "--json", "--broker", redis_url], env=env)
        assert listed.exit_code == 0, listed.output
        assert json.loads(listed.stdout)["otlp"]["delivered"] is None
        listed = CliRunner().invoke(cli_main, ["sinks", "list", "--broker", redis_url], env=env)
        assert "otlp: unknown delivered, 0 pending, 0 failed" in listed.output
        # Read only: the fields stand as they were, for the next write to repair.
        assert client.hget(_keys.outbox_counts_key("otlp"), "delivered") == b"12x"
    finally:
        client.close()


def test_an_unreadable_score_record_or_checkpoint_is_counted(redis_url: str) -> None:
    """A stored score record or step checkpoint that no longer validates is read as none (the
    run is scored again, or starts over): counted in tracescore_store_unreadable_values under
    key score_record or checkpoint, each read, so an operator can alert on it. It was logged
    only (score_record_unreadable, checkpoint_unreadable)."""
    from worker.store import RedisScoreStore

    damaged, foreign, whole = "damaged-record", "foreign-record", "whole-checkpoint"
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(_keys.record_key(damaged), "{not json")
        client.set(_keys.record_key(foreign), json.dumps({"score_id": foreign, "score": {"value": 0.9}}))
        client.set(_keys.checkpoint_key(damaged), b"\xff\xfe{not json")
        client.set(_keys.checkpoint_key(whole), json.dumps({"run_id": "r", "completed_steps": ["preprocess"]}))
    finally:
        client.close()
    before = (_unreadable("score_record"), _unreadable("checkpoint"))

    async def read() -> tuple[dict[str, Any], dict[str, Any]]:
        store = RedisScoreStore(redis_url)
        try:
            ids = [damaged, foreign, whole]
            return await store.existing(ids), await store.get_checkpoints(ids)
        finally:
            await store.close()

    records, checkpoints = asyncio.run(read())
    assert (records, list(checkpoints)) == ({}, [whole])
    assert _unreadable("score_record") - before[0] == 2
    assert _unreadable("checkpoint") - before[1] == 1


def test_keys_of_another_type_are_named_not_reported_as_redis_down(redis_url: str) -> None:
    """Redis answers, but the queue's list, kombu's unacked hash and the dead-letter counts hold
    other types: the queue's key (it holds messages, never deleted) is named in
    tracescore_keys_refused with no depth for it, the counts are repaired as the store repairs
    them, and both targets stay up, so an alert on redis_up cannot mistake a misplaced key for
    an outage."""
    client = redis.Redis.from_url(redis_url)
    client.set("refused-q", "not a list")
    client.set("unacked", "not a hash")
    client.set(_keys.dlq_reasons_key(), "not a hash")
    client.sadd(_keys.outbox_sinks_key(), "otlp")
    client.set(_keys.outbox_key("otlp"), "not a queue")
    try:
        samples = _scrape(load_settings(broker_url=redis_url, queue="refused-q"), "node-k@host")
        assert samples[("tracescore_redis_up", frozenset({("target", "broker")}))] == 1
        assert samples[("tracescore_redis_up", frozenset({("target", "store")}))] == 1
        assert series(samples, "tracescore_keys_refused") == {
            frozenset({("key", "refused-q")}): 1,
            frozenset({("key", _keys.outbox_key("otlp"))}): 1,
        }
        queue = frozenset({("queue", "refused-q")})
        assert ("tracescore_queue_depth", queue) not in samples  # unknown, not 0
        assert ("tracescore_queue_oldest_age_seconds", queue) not in samples
        assert ("tracescore_queue_unacked", frozenset()) not in samples
        assert client.get("refused-q") == b"not a list"  # left for the operator
        assert client.get(_keys.outbox_key("otlp")) == b"not a queue"
        assert client.type(_keys.dlq_reasons_key()) == b"none"  # repaired: rebuilt by the store

        # Moved aside: the next scrape reads the queue again and names nothing.
        client.rename("refused-q", "refused-q-aside")
        client.delete(_keys.outbox_key("otlp"), "unacked")  # (a worker repairs "unacked" by itself)
        samples = _scrape(load_settings(broker_url=redis_url, queue="refused-q"), "node-k@host")
        assert series(samples, "tracescore_keys_refused") == {}
        assert samples[("tracescore_queue_depth", queue)] == 0
        assert samples[("tracescore_queue_unacked", frozenset())] == 0
    finally:
        client.close()


def test_a_broker_that_refuses_the_reads_is_down_not_a_refused_key(redis_url: str) -> None:
    """A broker user that may not run TYPE (a Redis ACL): no misplaced key, so the scrape says the
    broker is not readable (redis_up 0) and names no key. The reads go in one MULTI, which Redis
    aborts whole on a refused command; read one by one, the refusal was taken for a key's type."""
    client = redis.Redis.from_url(redis_url)
    client.acl_setuser("scraper", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-type"])
    try:
        host = redis_url.rpartition("@")[2]
        samples = _scrape(load_settings(broker_url=f"redis://scraper:pw@{host}", queue="q"), "node-p@host")
        assert samples[("tracescore_redis_up", frozenset({("target", "broker")}))] == 0
        assert series(samples, "tracescore_keys_refused") == {}
    finally:
        client.acl_deluser("scraper")
        client.close()


def _scrape(settings: Any, node: str) -> Samples:
    """Every sample of one scrape of the Redis-read gauges, by series name and labels."""
    collector = RedisStateCollector(settings, node)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return _samples(generate_latest(registry).decode())
    finally:
        collector.close()


def _unreadable(key: str) -> float:
    from worker.metrics._instruments import _metrics

    (family,) = _metrics().unreadable.collect()
    return sum(s.value for s in family.samples if s.labels == {"key": key})


def test_scrape_with_redis_down_says_so_and_does_not_fail() -> None:
    """A broker that does not answer: redis_up 0 and no queue gauges, not a failed scrape."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    collector = RedisStateCollector(load_settings(broker_url=dead), "node-b@host")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        text = generate_latest(registry).decode()
    finally:
        collector.close()
    assert 'tracescore_redis_up{target="broker"} 0.0' in text
    assert 'tracescore_redis_up{target="store"} 0.0' in text
    assert "tracescore_queue_depth" not in text.replace("# HELP tracescore_queue_depth", "").replace(
        "# TYPE tracescore_queue_depth", ""
    )


def test_two_named_workers_on_one_host_are_both_listed_by_status(redis_url: str, tmp_path: Path) -> None:
    """`tracescore worker -n a@%h` and `-n b@%h` on one host: `status` lists two workers."""
    tracescore = str(Path(sys.executable).with_name("tracescore"))
    procs = []
    logs = []
    outs = []
    try:
        for name in ("alpha", "beta"):
            log = tmp_path / f"{name}.log"
            logs.append(log)
            out = log.open("w")
            outs.append(out)
            procs.append(
                subprocess.Popen(
                    [tracescore, "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "solo",
                     "-n", f"{name}@%h", "--broker", redis_url],
                    env={**os.environ, "TRACESCORE_WRITER": "none", "PYTHONPATH": str(Path(__file__).parents[2])},
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
        for log, proc in zip(logs, procs, strict=True):
            assert wait_for(partial(_started, log, proc), 60)
            assert proc.poll() is None, log.read_text()[-2000:]
        settings = load_settings(broker_url=redis_url)
        host = socket.gethostname()
        assert wait_for(lambda: len(collect_status(2.0, settings)["workers"]) == 2, 20)
        assert collect_status(2.0, settings)["workers"] == [f"alpha@{host}", f"beta@{host}"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
        for out in outs:
            out.close()


def test_a_wedged_childs_timeout_record_is_counted_after_it_exits(redis_url: str, tmp_path: Path) -> None:
    """A run blocking its prefork child past the run timeout: the child stores its `timeout`
    record and exits; the scrape still counts that run (the dead child's counters stay) and
    shows one live process (its replacement)."""
    port = free_port()
    scores_path = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "wedged",
        redis_url,
        tmp_path,
        scores_path=scores_path,
        pool="prefork",
        concurrency=1,
        scorers="tests.worker.metrics_scorers",
        env={
            "TRACESCORE_METRICS_PORT": str(port),
            "TRACESCORE_METRICS_HOST": "127.0.0.1",
            "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
            "TRACESCORE_RUN_TIMEOUT_SECONDS": "2",
            "TRACESCORE_TASK_SOFT_TIME_LIMIT": "20",
            "TRACESCORE_TASK_TIME_LIMIT": "25",
            "TRACESCORE_VISIBILITY_TIMEOUT": "30",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
        },
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(1), ["wedges"], salt="wedged"))
        sink.send(batch(range(2), ["fast"], salt="after-wedged"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores_path)) >= 3, 90), worker.text()[-3000:]
        # logged after the record is written and flushed: it may trail the scores file
        assert wait_for(lambda: "worker_loop_wedged_exiting" in worker.text(), 30), worker.text()[-3000:]
        (stuck,) = [r for r in read_scores(scores_path) if r["scorer_id"] == "wedges"]
        assert stuck["error_type"] == "timeout"

        def settled() -> bool:
            samples = scrape(port)
            return total(samples, "tracescore_runs_total") == 3 and total(samples, "tracescore_worker_processes") == 1

        # (the replacement child starts, and the scrape sweeps the dead one's live gauge)
        assert wait_for(settled, 60, 0.2), (scrape(port), worker.text()[-3000:])
        samples = scrape(port)
        assert total(samples, "tracescore_runs_total", scorer="wedges", outcome="failed", reason="timeout") == 1
        assert total(samples, "tracescore_runs_total", scorer="fast", outcome="scored") == 2
    finally:
        worker.stop()


def test_a_metrics_port_in_use_fails_the_start_naming_it(redis_url: str, tmp_path: Path) -> None:
    """The metrics port is taken: the worker exits at start, saying which port and why."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = WorkerProcess(
            "busyport",
            redis_url,
            tmp_path,
            scores_path=tmp_path / "scores.jsonl",
            env={"TRACESCORE_METRICS_PORT": str(port), "TRACESCORE_METRICS_HOST": "127.0.0.1"},
        )
        try:
            assert wait_for(lambda: worker.proc.poll() is not None, 60), worker.text()[-2000:]
            assert worker.proc.returncode != 0
            assert f"tracescore worker cannot start: metrics on port {port}" in worker.text()
            assert " ready." not in worker.text()
        finally:
            worker.stop()


def test_oldest_message_age_reads_only_what_a_message_carries() -> None:
    """The earliest enqueued_at of a kombu message (base64 body or not); anything unreadable
    is None, never an exception in the scrape."""
    import base64

    from worker.metrics import oldest_enqueued_at

    body = json.dumps([[{"requests": [{"enqueued_at": 1700000005.5}, {"enqueued_at": 1700000001.25}]}], {}, {}])
    encoded = base64.b64encode(body.encode()).decode()
    envelope = {"body": encoded, "properties": {"body_encoding": "base64"}, "headers": {}}
    assert oldest_enqueued_at(json.dumps(envelope).encode()) == 1700000001.25
    assert oldest_enqueued_at(json.dumps({"body": body, "properties": {}}).encode()) == 1700000001.25
    for hostile in (b"", b"not json", b"[]", b'{"body": 5}', b'{"no": "body"}', json.dumps({"body": "x"}).encode()):
        assert oldest_enqueued_at(hostile) is None
    no_stamp = {
        "body": base64.b64encode(b'[[{"requests": [{}]}], {}, {}]').decode(),
        "properties": {"body_encoding": "base64"},
    }
    assert oldest_enqueued_at(json.dumps(no_stamp).encode()) is None
    broken_base64 = {"body": "%%%", "properties": {"body_encoding": "base64"}}
    assert oldest_enqueued_at(json.dumps(broken_base64).encode()) is None


def test_oldest_message_age_is_not_read_from_the_traces_content() -> None:
    """A span attribute or event named ``enqueued_at`` travels in the message: a search of the
    body's text took it for the run's, and the gauge showed a queue decades old (an alert fired
    with no backlog). Only each request's own field counts."""
    from worker.metrics import oldest_enqueued_at

    span = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "agent", "attributes": {"enqueued_at": 5.0},
            "events": [{"name": "gen_ai.choice", "attributes": {"enqueued_at": 7}}]}  # fmt: skip
    request = {"spans": [span], "target_span_id": "cd" * 8, "scorer_ids": ["s"], "enqueued_at": 1700000003.5}
    body = json.dumps([[{"batch_id": "b", "requests": [request, {**request, "enqueued_at": None}]}], {}, {}])
    envelope = {"body": body, "properties": {}}
    assert oldest_enqueued_at(json.dumps(envelope).encode()) == 1700000003.5


def _recorded(name: str, **labels: str) -> float:
    """This process's value of the recorded series ``name`` (summed over the labels matching)."""
    from worker.metrics._instruments import _metrics

    found = 0.0
    for metric in vars(_metrics()).values():
        for family in metric.collect() if hasattr(metric, "collect") else ():
            found += sum(s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items())
    return found


def test_runs_skipped_or_left_to_another_delivery_are_counted() -> None:
    """A run a message names again (already scored, a copy in the same message) is skipped and
    counted by reason in tracescore_runs_skipped_total; one claimed by another delivery is left
    for this message's retry and counted as outcome retry, reason deferred. Each used to be in
    the batch_done line only."""

    def skipped(reason: str) -> float:
        return _recorded("tracescore_runs_skipped_total", scorer="fast", reason=reason)

    deferred = partial(_recorded, "tracescore_runs_total", scorer="fast", outcome="retry", reason="deferred")
    store = MemoryScoreStore()
    deps = ScoringDeps(registry=Registry([fast]), store=store)
    before = (skipped("already_scored"), skipped("duplicate"), deferred())

    one, other, held = batch(range(3), ["fast"], salt="skips").requests
    held_id = score_id_for(held.trace_id, held.target_span_ids[0], "fast", "1")
    asyncio.run(store.claim([held_id], "another-delivery", 60))
    copies = ScoreBatch(batch_id="skips", requests=[one, one.model_copy(), other, held])
    report = asyncio.run(score_batch(copies, deps))
    assert (report.scored, report.skipped, report.deferred) == (2, {"duplicate": 1}, [held_id])
    again = asyncio.run(score_batch(ScoreBatch(batch_id="skips-again", requests=[one, other]), deps))
    assert again.skipped == {"already_scored": 2}

    assert skipped("already_scored") - before[0] == 2
    assert skipped("duplicate") - before[1] == 1
    assert deferred() - before[2] == 1


def test_an_enqueued_at_that_is_no_time_scores_its_runs_and_leaves_the_latency_alone() -> None:
    """A hand-made message may carry ``enqueued_at`` as NaN or an infinity (JSON's screen and
    kombu read ``-Infinity``): its runs are scored as any (a bad time costs no message), and no
    latency is observed for them. ``-Infinity`` made the latency an infinite sample: the
    histogram's sum stayed +Inf for the life of the worker's metrics; NaN a sample of 0 s."""
    latency_sum = partial(_recorded, "tracescore_run_latency_seconds_sum", scorer="fast")
    latency_count = partial(_recorded, "tracescore_run_latency_seconds_count", scorer="fast")
    scored = partial(_recorded, "tracescore_runs_total", scorer="fast", outcome="scored")
    deps = ScoringDeps(registry=Registry([fast]), store=MemoryScoreStore())
    before = (latency_sum(), latency_count(), scored())
    requests = []
    for n, stamp in enumerate(["-Infinity", "Infinity", "NaN"]):
        request = json.loads(batch(range(n, n + 1), ["fast"], salt="no-time").requests[0].model_dump_json())
        request["enqueued_at"] = "STAMP"
        requests.append(json.dumps(request).replace('"STAMP"', stamp))
    message = parse_json('{"batch_id": "no-time", "requests": [' + ",".join(requests) + "]}")
    report = asyncio.run(score_batch(ScoreBatch.model_validate(message), deps))
    assert report.scored == 3
    assert scored() - before[2] == 3
    assert (latency_sum() - before[0], latency_count() - before[1]) == (0.0, 0.0)


def test_a_dead_letter_list_of_another_type_is_a_refused_key(redis_url: str) -> None:
    """The dead-letter list holding another Redis type is never deleted (it holds letters), and
    every message the workers refuse meanwhile goes back to the queue (message_refusal_not_recorded):
    the scrape names the key in tracescore_keys_refused, as `tracescore status` does, and keeps
    the store up. It named nothing, so no alert could see the refusals going round."""
    client = redis.Redis.from_url(redis_url)
    client.set(_keys.dlq_key(), "not a list")
    try:
        samples = _scrape(load_settings(broker_url=redis_url), "node-d@host")
        assert samples[("tracescore_redis_up", frozenset({("target", "store")}))] == 1
        assert series(samples, "tracescore_keys_refused") == {frozenset({("key", _keys.dlq_key())}): 1}
        assert client.get(_keys.dlq_key()) == b"not a list"  # left for the operator
        client.delete(_keys.dlq_key())
        assert series(_scrape(load_settings(broker_url=redis_url), "node-d@host"), "tracescore_keys_refused") == {}
    finally:
        client.close()


def test_the_dead_letters_bytes_gauge_says_what_status_says(redis_url: str) -> None:
    """The gauge read the byte total's key by a rule of its own, not the store's: a total left
    beside a list deleted by hand was scraped as those bytes (status: 0, an empty list holds
    none), and a total of 16 digits or more, which the store takes for damaged (summed again at
    the next push; status: unknown), was scraped as a number. The gauge and status now read it
    alike (``RedisDeadLetters.size_bytes``'s script)."""
    settings = load_settings(broker_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    letters = RedisDeadLetters(redis_url)
    try:
        cases = {"list deleted, its total left": ("5000", False), "a total of 16 digits": ("1" * 16, True)}
        seen = {}
        for name, (total, with_letter) in cases.items():
            client.delete(_keys.dlq_key(), _keys.dlq_bytes_key())
            if with_letter:
                run_coro(letters.push(DeadLetter(reason="poison", message_key=f"m-{name}")), 5)
            client.set(_keys.dlq_bytes_key(), total)
            status_bytes = run_coro(letters.size_bytes(), 5)
            scraped = _scrape(settings, "node-b@host").get(("tracescore_dead_letters_bytes", frozenset()))
            seen[name] = (status_bytes, scraped)
    finally:
        run_coro(letters.close(), 5)
        client.close()
    assert seen == {"list deleted, its total left": (0, 0), "a total of 16 digits": (None, None)}


def test_a_restarted_node_does_not_count_its_previous_run_again(redis_url: str, tmp_path: Path) -> None:
    """The README: the node's metrics directory is emptied when it starts. A prefork node scores
    3 runs, stops and starts again under the same name and directory: its counters begin at 0,
    not at the 3 the previous run's files still held, and it scores on from there."""
    port = free_port()
    env = {
        "TRACESCORE_METRICS_PORT": str(port),
        "TRACESCORE_METRICS_HOST": "127.0.0.1",
        "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
    }
    scores = tmp_path / "scores.jsonl"

    def node() -> WorkerProcess:
        return WorkerProcess(
            "again", redis_url, tmp_path, scores_path=scores, pool="prefork", concurrency=2,
            scorers="tests.worker.metrics_scorers", env=env,
        )  # fmt: skip

    first = node()
    try:
        first.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(3), ["fast"], salt="again-1"))
        sink.close()
        assert wait_for(lambda: total(scrape(port), "tracescore_runs_total") == 3, 30), first.text()[-3000:]
    finally:
        first.stop()
    (node_dir,) = (tmp_path / "metrics").iterdir()
    assert list(node_dir.glob("counter_*.db"))  # what the first run counted is still on disk
    second = node()
    try:
        second.wait_ready()
        assert wait_for(lambda: "tracescore_worker_info" in {n for n, _ in scrape(port)}, 30)
        assert total(scrape(port), "tracescore_runs_total") == 0
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["fast"], salt="again-2"))
        sink.close()
        assert wait_for(lambda: total(scrape(port), "tracescore_runs_total") == 2, 30), second.text()[-3000:]
    finally:
        second.stop()
