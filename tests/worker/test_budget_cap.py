"""The per-run judge-call cap in process (score_batch with the worker's BudgetGuard): it counts
failed calls really sent, per scorer version, and leaves the judge's own retries, its schema
fallback and the worker's transient retries alone up to one delivery's attempts + one call per
retry delivery."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
from pydantic import BaseModel

from scorers import Judge, JudgeUsage, PromptStep, Scorer, create_scorer
from scorers.judge import JudgeHooks, StreamErrorRetryProcessor, get_judge_hooks, price_usage, set_judge_hooks
from scorers.judge.testing import FakeJudgeModel, server_error
from tests._redis import RedisServer
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from worker._budget import TOTAL, BudgetGuard, Budgets, MemoryLedger, default_attempt_cap, run_key, utc_day
from worker._registry import Registry
from worker._scoring import BatchReport, ScoringDeps, score_batch
from worker.store import MemoryScoreStore


class Verdict(BaseModel):
    score: float


def _scorer(model: FakeJudgeModel, *, version: str = "1", retries: int = 0) -> Scorer:
    judge = Judge(model=model)
    if retries:
        retrying = [StreamErrorRetryProcessor(max_retries=retries)]
        judge = Judge(model=model, error_processors=retrying, max_processor_retries=retries)
    return create_scorer("g", type="agent", version=version, judge=judge).generate_score(
        PromptStep("grade", lambda run: "SCORE it", output_schema=Verdict)
    )


@pytest.fixture
def ledger() -> Iterator[MemoryLedger]:
    previous = get_judge_hooks()
    found = MemoryLedger()

    async def no_wait(seconds: float) -> None:
        return None

    set_judge_hooks(JudgeHooks(guard=BudgetGuard(found, Budgets()), sleep=no_wait))
    try:
        yield found
    finally:
        set_judge_hooks(previous)


def _deliver(scorer: Scorer, store: MemoryScoreStore, *, first: bool, final: bool = False) -> BatchReport:
    deps = ScoringDeps(registry=Registry([scorer]), store=store)
    return asyncio.run(score_batch(batch(range(1), ["g"], salt="cap"), deps, final_attempt=final, redelivery=not first))


def test_default_cap_is_one_delivery_plus_one_call_per_retry_delivery() -> None:
    assert default_attempt_cap(_scorer(FakeJudgeModel({"score": 1})), 3) == 1 + 3
    assert default_attempt_cap(_scorer(FakeJudgeModel({"score": 1}), retries=3), 3) == 4 + 3


def test_one_transient_failure_is_retried_by_the_next_delivery_and_scored(ledger: MemoryLedger) -> None:
    model = FakeJudgeModel(server_error(503), {"score": 0.7})
    store = MemoryScoreStore()
    scorer = _scorer(model)
    first = _deliver(scorer, store, first=True)
    assert first.retry
    assert not store.records
    _deliver(scorer, store, first=False)
    (record,) = store.records.values()
    assert (record.score, record.error_type, len(model.requests)) == (0.7, None, 2)


def test_the_schema_fallback_call_is_not_refused(ledger: MemoryLedger) -> None:
    model = FakeJudgeModel({"score": "not a number"}, {"score": 0.7})  # native answer invalid, then valid
    store = MemoryScoreStore()
    _deliver(_scorer(model), store, first=True)
    (record,) = store.records.values()
    assert (record.score, record.error_type, len(model.requests)) == (0.7, None, 2)


def test_a_new_scorer_version_starts_from_zero(ledger: MemoryLedger) -> None:
    store = MemoryScoreStore()
    failing = FakeJudgeModel(*[server_error(503)] * 20)
    for attempt in range(4):
        _deliver(_scorer(failing, version="1"), store, first=attempt == 0, final=attempt == 3)
    assert len(failing.requests) == 4  # the default judge: one call per delivery
    healthy = FakeJudgeModel({"score": 0.5})
    _deliver(_scorer(healthy, version="2"), store, first=False)
    assert len(healthy.requests) == 1
    assert any(r.scorer_version == "2" and r.score == 0.5 for r in store.records.values())


def test_an_always_failing_judge_costs_one_delivery_plus_one_call_per_retry(ledger: MemoryLedger) -> None:
    """The issue's case: 4 attempts per delivery, 4 deliveries (retry budget 3) -> 7 calls, not 16."""
    model = FakeJudgeModel(*[server_error(503)] * 40)
    store = MemoryScoreStore()
    scorer = _scorer(model, retries=3)
    reports = [_deliver(scorer, store, first=n == 0, final=n == 3) for n in range(4)]
    assert len(model.requests) == 4 + 3
    (record,) = store.records.values()
    # The record names the real failure and the cap; it is retryable (dlq retry resets the count).
    assert record.error_type == "JudgeServerError"
    assert record.retryable
    assert "TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN: 7" in (record.error_message or "")
    assert reports[1].exhausted  # refused on the second delivery: recorded, not retried again
    request = batch(range(1), ["g"], salt="cap").requests[0]
    asyncio.run(ledger.reset_calls([run_key(request.trace_id, request.target_span_ids[0], "g")]))
    assert not ledger.calls


class _WaitingLimiter:
    """A shared rate limiter that keeps every caller waiting (a 429 pause, a spent minute)."""

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        await asyncio.sleep(3600)
        yield

    def slot(self, model_id: str, estimated_tokens: int) -> Any:
        return self._slot()

    async def record_usage(self, model_id: str, tokens: int) -> None:
        return None

    async def pause(self, model_id: str, seconds: float) -> None:
        return None


def test_a_call_cancelled_before_it_was_sent_is_not_counted(ledger: MemoryLedger) -> None:
    model = FakeJudgeModel({"score": 0.7})
    scorer = _scorer(model, retries=0)
    store = MemoryScoreStore()
    set_judge_hooks(JudgeHooks(limiter=_WaitingLimiter(), guard=BudgetGuard(ledger, Budgets())))
    deps = ScoringDeps(registry=Registry([scorer]), store=store)

    async def cancelled_delivery() -> None:
        task = asyncio.ensure_future(score_batch(batch(range(1), ["g"], salt="cap"), deps, final_attempt=False))
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    for _ in range(6):  # more cancelled deliveries than the cap (1 + 3)
        asyncio.run(cancelled_delivery())
    assert not model.requests
    assert not ledger.calls
    set_judge_hooks(JudgeHooks(guard=BudgetGuard(ledger, Budgets())))
    _deliver(scorer, store, first=False)
    (record,) = store.records.values()
    assert (record.score, len(model.requests)) == (0.7, 1)


def test_judge_cost_metric_counts_what_was_paid_as_the_ledger_does() -> None:
    """A run whose first prompt step was answered (paid) and whose second failed transiently is
    not stored on this delivery: its paid call is in the cost metric all the same, under the one
    model called, equal to the ledger's spend (the metric used to count stored records only)."""
    from prometheus_client import Metric

    from scorers.judge import DEFAULT_PRICES
    from worker._budget import utc_day
    from worker.metrics._instruments import _metrics, observe_judge_usage

    def cost_total() -> float:
        (family,) = cast(list[Metric], list(_metrics().cost.collect()))
        return sum(
            s.value
            for s in family.samples
            if s.name.endswith("_total") and s.labels == {"scorer": "two", "model": "openai/gpt-4o-mini"}
        )

    model = FakeJudgeModel({"score": 0.5}, server_error(503), model_id="openai/gpt-4o-mini")
    assert "openai/gpt-4o-mini" in DEFAULT_PRICES
    scorer = (
        create_scorer("two", type="agent", judge=Judge(model=model))
        .preprocess(PromptStep("first", lambda run: "SCORE first", output_schema=Verdict))
        .generate_score(PromptStep("second", lambda run: "SCORE second", output_schema=Verdict))
    )
    ledger = MemoryLedger()
    previous = get_judge_hooks()
    set_judge_hooks(JudgeHooks(guard=BudgetGuard(ledger, Budgets(), on_usage=observe_judge_usage)))
    before = cost_total()
    try:
        store = MemoryScoreStore()
        deps = ScoringDeps(registry=Registry([scorer]), store=store, checkpoint="none")
        report = asyncio.run(score_batch(batch(range(1), ["two"], salt="paid"), deps, final_attempt=False))
    finally:
        set_judge_hooks(previous)
    assert report.retry
    assert not store.records
    spent = ledger.days[utc_day()]
    assert spent["model:openai/gpt-4o-mini"] > 0
    assert cost_total() - before == pytest.approx(spent["model:openai/gpt-4o-mini"])


def test_the_guard_costs_one_round_trip_per_call_without_budgets(redis_server: RedisServer) -> None:
    """No budgets, a first delivery, a backfill job without --max-cost: per answered call one
    round trip writing the spend (one script: no MULTI/EXEC, the fields it adds to checked
    inside, the write marked done, EXPIRE once per key, asked with TTL inside; a job's call
    counted in the same script), a job's call one more reading its limit (a resume may give it
    one), and no per-run key at all."""
    from worker._budget import RedisLedger, enter_run, utc_day

    client = redis_server.client(12)
    client.flushdb()
    ledger = RedisLedger(redis_server.url(12))
    guard = BudgetGuard(ledger, Budgets())
    usage = JudgeUsage(input_tokens=800, output_tokens=60)
    calls = 200

    async def one(n: int, job_id: str | None) -> None:
        enter_run(f"t{n}:s:g", "g", job_id, 5, version="1", redelivery=False)
        await guard.before_call("openai/gpt-4o-mini", "g")
        await guard.after_call("openai/gpt-4o-mini", "g", usage)

    async def many(job_id: str | None) -> None:
        for n in range(calls):
            await asyncio.ensure_future(one(n, job_id))
        await ledger.close()

    try:
        for job_id in (None, "job-1"):
            client.config_resetstat()
            asyncio.run(many(job_id))
            stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}
            for connecting in ("config|resetstat", "hello", "select", "auth", "client|setinfo"):
                stats.pop(connecting, None)
            # scorer, model, total (and the job's own hash: those and its count of calls)
            writes = 3 + (4 if job_id else 0)
            assert stats.pop("hincrbyfloat") == writes * calls
            # One script a call, and a job's call one more reading its limit (a script too). (An
            # EVALSHA Redis did not have yet is loaded and sent again.)
            assert stats.pop("evalsha") - stats.pop("script|load", 0) == calls * (2 if job_id else 1)
            # Once per key: the day's hash on the first pass, the job's on the second.
            assert stats.pop("expire") == 1
            # Each write's mark, inside its script (sent again after a lost reply, it adds nothing).
            assert stats.pop("set") == calls
            # Inside the scripts: their keys' types and the fields they add to, checked (and the read).
            for inside in ("type", "hmget", "hgetall", "get", "hget", "ttl", "hexists", "exists"):
                stats.pop(inside, None)
            assert stats == {}, stats  # no MULTI/EXEC, no counter, no other read
        assert not list(client.scan_iter(match="*judge_calls*"))
        assert 0 < client.ttl(f"tracescore:spend:{utc_day()}") <= 35 * 24 * 3600
    finally:
        client.flushdb()
        client.close()


def test_a_jobs_spend_hash_counts_every_call_in_the_write_each_already_made(redis_server: RedisServer) -> None:
    """The job's ledger hash is its summary's spend (``job_spend``), so it counts every call sent:
    a failed one of a capped run in the script that counts it for the cap, one of an uncapped run
    (judges inside function steps) in a write of its own, a free answer (no tokens priced) and
    one of a model without a price (per model, in the day's hash too), each one round trip."""
    from worker._budget import RedisLedger, enter_run, job_spend, utc_day

    client = redis_server.client(12)
    client.flushdb()
    ledger = RedisLedger(redis_server.url(12))
    guard = BudgetGuard(ledger, Budgets())

    async def calls() -> None:
        enter_run("t:s:g", "g", "job-1", 5, version="1", redelivery=False)
        await guard.call_failed("openai/gpt-4o-mini", "g", RuntimeError("503"))
        enter_run("t:s:f", "f", "job-1", 0)
        await guard.call_failed("openai/gpt-4o-mini", "f", RuntimeError("503"))
        await guard.after_call("openai/gpt-4o-mini", "f", JudgeUsage(input_tokens=0, output_tokens=0))
        await guard.after_call("local/unpriced", "f", JudgeUsage(input_tokens=10, output_tokens=1))
        await guard.after_call("openai/gpt-4o-mini", "f", JudgeUsage(input_tokens=800, output_tokens=60))
        await ledger.close()

    try:
        client.config_resetstat()
        asyncio.run(calls())
        stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}
        assert stats["evalsha"] - stats.get("script|load", 0) == 5  # one script a call
        spend = job_spend(client, "job-1").as_json()
        assert spend["judge_calls"] == 5
        assert spend["unpriced_calls"] == {"local/unpriced": 1}
        assert spend["by_scorer"].keys() == {"f"}
        assert spend["by_model"] == {"openai/gpt-4o-mini": spend["total_usd"]}
        assert spend["total_usd"] > 0
        assert client.hget(f"tracescore:spend:{utc_day()}", "unpriced:local/unpriced") == b"1"
        assert 0 < client.ttl("tracescore:spend:job:job-1") <= 35 * 24 * 3600
    finally:
        client.flushdb()
        client.close()


def test_a_spend_hash_deleted_and_written_again_by_the_same_process_gets_its_ttl_again(
    redis_server: RedisServer,
) -> None:
    """The ledger gave a spend hash its 35-day TTL once per key and process (a set of keys seen):
    a job's or day's hash deleted (or expired) and written again by the same worker got none, and
    stayed for good. Each write now gives a hash without one its TTL, in the script that adds."""
    from worker._budget import RedisLedger, enter_run, utc_day

    client = redis_server.client(12)
    client.flushdb()
    ledger = RedisLedger(redis_server.url(12))
    guard = BudgetGuard(ledger, Budgets())
    keys = (f"tracescore:spend:{utc_day()}", "tracescore:spend:job:job-1")

    async def calls() -> None:
        enter_run("t:s:g", "g", "job-1", 5, version="1", redelivery=False)
        await guard.after_call("openai/gpt-4o-mini", "g", JudgeUsage(input_tokens=800, output_tokens=60))
        client.delete(*keys)
        await guard.after_call("openai/gpt-4o-mini", "g", JudgeUsage(input_tokens=800, output_tokens=60))
        ttls = [client.ttl(k) for k in keys]
        client.delete(keys[1])
        await guard.call_failed("openai/gpt-4o-mini", "g", RuntimeError("503"))  # (the failure's script)
        ttls.append(client.ttl(keys[1]))
        await ledger.close()
        assert all(0 < ttl <= 35 * 24 * 3600 for ttl in ttls), dict(zip([*keys, "after a failure"], ttls, strict=True))

    try:
        asyncio.run(calls())
    finally:
        client.flushdb()
        client.close()


def test_a_jobs_spend_hash_an_earlier_release_wrote_says_its_calls_are_unknown(redis_server: RedisServer) -> None:
    """A job's spend hash an earlier release wrote has no ``calls`` field: its spend read with
    0 judge calls, shown as exact ("0.4000 USD (0 judge calls)") for a job that paid for some.
    Its calls are unknown now (``null``, and the line says why); its spend is shown as it was."""
    from worker._budget import RedisLedger, enter_run, job_spend
    from worker._summary import spend_lines

    client = redis_server.client(12)
    client.flushdb()
    try:
        client.hset("tracescore:spend:job:job-old", mapping={"scorer:g": 0.4, "model:m": 0.4, "total": 0.4})
        spend = job_spend(client, "job-old").as_json()
        assert (spend["total_usd"], spend["judge_calls"]) == (pytest.approx(0.4), None)
        assert spend_lines(spend)[0] == (
            "  judge spend       0.4000 USD   (judge calls unknown: the job's spend was first counted by an"
            " earlier release, which kept no count of calls, or its count is no number)"
        )
        client.hset("tracescore:spend:job:job-new", mapping={"calls": 2})  # (two failed calls: no spend)
        assert job_spend(client, "job-new").as_json()["judge_calls"] == 2

        # The job resumed on this release's workers: their calls alone would be counted, shown as all.
        ledger = RedisLedger(redis_server.url(12))
        guard = BudgetGuard(ledger, Budgets())

        async def calls() -> None:
            enter_run("t:s:g", "g", "job-old", 5, version="1", redelivery=False)
            await guard.after_call("openai/gpt-4o-mini", "g", JudgeUsage(input_tokens=800, output_tokens=60))
            enter_run("t:s:g", "g", "job-old-2", 5, version="1", redelivery=False)
            await guard.call_failed("openai/gpt-4o-mini", "g", RuntimeError("503"))
            await ledger.close()

        client.hset("tracescore:spend:job:job-old-2", mapping={"scorer:g": 0.4, "model:m": 0.4, "total": 0.4})
        asyncio.run(calls())
        for job_id in ("job-old", "job-old-2"):
            spend = job_spend(client, job_id).as_json()
            assert spend["judge_calls"] is None, (job_id, spend)
            assert spend["total_usd"] >= 0.4
    finally:
        client.flushdb()
        client.close()


def test_a_jobs_calls_count_that_is_no_number_reads_as_unknown(redis_server: RedisServer) -> None:
    """A job's ``calls`` field that is no number (read only: the next write repairs it) is left
    out as unreadable, and the job read 0 judge calls, shown as exact ("0.4000 USD (0 judge
    calls)") for a job that paid for some: its calls are unknown, as an earlier release's."""
    from worker._budget import job_spend

    client = redis_server.client(12)
    client.flushdb()
    try:
        client.hset("tracescore:spend:job:job-x", mapping={"scorer:g": 0.4, "total": 0.4, "calls": "many"})
        assert job_spend(client, "job-x").as_json()["judge_calls"] is None
    finally:
        client.flushdb()
        client.close()


def test_messages_dead_lettered_for_a_spent_budget_are_logged_once_a_minute_with_a_count() -> None:
    """Every message is refused while a budget is spent: a WARNING line a minute per process
    saying how many, not an ERROR line per message."""
    import structlog
    from structlog.testing import capture_logs

    from worker._logs import CountedLog

    now = [1000.0]
    spent = CountedLog(
        "budget_exhausted_messages",
        logger=structlog.get_logger("t"),
        count_key="dead_lettered",
        clock=lambda: now[0],
    )
    with capture_logs() as logs:
        written = [spent.note(letter=f"l{n}") for n in range(50)]
        now[0] += 30
        written += [spent.note(letter=f"m{n}") for n in range(10)]
        now[0] += 31
        written.append(spent.note(letter="last"))
    assert written.count(True) == 2
    lines = [e for e in logs if e["event"] == "budget_exhausted_messages"]
    assert [(e["log_level"], e["dead_lettered"], e["since_start"], e["letter"]) for e in lines] == [
        ("warning", 1, 1, "l0"),
        ("warning", 60, 61, "last"),
    ]


def test_the_in_process_ledger_keeps_a_bounded_count_of_failed_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tracescore score` gives each run its own key: through a judge's outage, a file of
    millions of runs kept one count (and error text) per failing run for as long as it ran."""
    from worker import _budget

    monkeypatch.setattr(_budget, "MEMORY_CALLS_KEPT", 50)
    ledger = MemoryLedger()

    async def fail(runs: range) -> None:
        for i in runs:
            await ledger.note_failure(f"run-{i}", "v1", "JudgeServerError", 60)

    asyncio.run(fail(range(50)))
    asyncio.run(fail(range(1)))  # run-0 fails again: the newest touched
    asyncio.run(fail(range(50, 51)))  # one more run: the oldest touched (run-1) goes
    assert asyncio.run(ledger.failed_calls("run-0", "v1")) == (2, "JudgeServerError")
    assert asyncio.run(ledger.failed_calls("run-1", "v1")) == (0, None)
    asyncio.run(fail(range(51, 1000)))
    assert len(ledger.calls) == len(ledger.errors) == 50
    assert asyncio.run(ledger.failed_calls("run-999", "v1")) == (1, "JudgeServerError")


def _openai_body(**fields: Any) -> str:
    answer = {"role": "assistant", "content": '{"score": 0.5}'}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini"}
    body |= {"choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    body |= {"usage": {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050}, **fields}
    return json.dumps({k: v for k, v in body.items() if v is not ...})


def _anthropic_body(**fields: Any) -> str:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5"}
    body |= {"content": [{"type": "text", "text": '{"score": 0.5}'}], "stop_reason": "end_turn"}
    body |= {"usage": {"input_tokens": 1000, "output_tokens": 50}, **fields}
    return json.dumps({k: v for k, v in body.items() if v is not ...})


# Answers that carry their usage but no answer the judge can read: (model, 200 body).
PAID_BUT_UNREADABLE = {
    "OpenAI, no choices": ("openai/gpt-4o-mini", _openai_body(choices=[])),
    "OpenAI, a choice that is no object": ("openai/gpt-4o-mini", _openai_body(choices=["Jane Doe"])),
    "OpenAI, content an object": (
        "openai/gpt-4o-mini",
        _openai_body(choices=[{"message": {"content": {"said": "Jane Doe"}}, "finish_reason": "stop"}]),
    ),
    "Anthropic, content a string": ("anthropic/claude-haiku-4-5", _anthropic_body(content="Jane Doe")),
    "Anthropic, a text block of no text": ("anthropic/claude-haiku-4-5", _anthropic_body(content=[{"type": "text"}])),
    # A gateway passing its upstream's failure on as a 200, with what the upstream call used.
    "OpenAI, an error object beside usage": (
        "openai/gpt-4o-mini",
        _openai_body(choices=..., error={"type": "upstream_error", "message": "upstream failed"}),
    ),
    "OpenAI, an error object beside choices": (
        "openai/gpt-4o-mini",
        _openai_body(error={"type": "upstream_error", "message": "upstream failed"}),
    ),
    "Anthropic, an error object beside usage": (
        "anthropic/claude-haiku-4-5",
        _anthropic_body(type="error", content=..., error={"type": "upstream_error", "message": "upstream failed"}),
    ),
}


@pytest.mark.parametrize(("model", "body"), list(PAID_BUT_UNREADABLE.values()), ids=list(PAID_BUT_UNREADABLE))
def test_an_unreadable_answer_that_reports_usage_is_paid_for_not_a_failed_call(
    ledger: MemoryLedger, fake_llm: FakeLLMServer, model: str, body: str
) -> None:
    """A chat completion of `choices: []` (or a message of another shape) with its usage was raised
    while it was read: its tokens and cost were in no record and no spend, and it counted as a
    failed call against the run's cap. It is a JudgeResponseError with its usage counted as any
    answer's: in the record, in the day's spend, and not in the cap's count."""
    fake_llm.script(Reply.raw(body))
    scorer = create_scorer("g", type="agent", judge=Judge(model=model)).generate_score(
        PromptStep("grade", lambda run: "SCORE it", output_schema=Verdict)
    )
    store = MemoryScoreStore()
    _deliver(scorer, store, first=True)
    (record,) = store.records.values()
    assert record.error_type == "JudgeResponseError"
    assert (record.input_tokens, record.output_tokens, record.judge_calls) == (1000, 50, 1)
    cost = price_usage(model, JudgeUsage(input_tokens=1000, output_tokens=50))
    assert cost
    assert record.cost_usd == pytest.approx(cost)
    assert ledger.days[utc_day()][TOTAL] == pytest.approx(cost)
    assert not ledger.calls  # paid for: no failed call against the run's cap


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (
            "openai/gpt-4o-mini",
            _openai_body(
                choices=..., error={"type": "upstream_error"}, usage={"prompt_tokens": 0, "completion_tokens": 0}
            ),
        ),
        (
            "anthropic/claude-haiku-4-5",
            _anthropic_body(type="error", content=..., error={"type": "upstream_error"}, usage={"input_tokens": 0}),
        ),
    ],
    ids=["OpenAI", "Anthropic"],
)
def test_an_error_in_a_200_reporting_no_tokens_is_a_failed_call(
    ledger: MemoryLedger, fake_llm: FakeLLMServer, model: str, body: str
) -> None:
    """A gateway's error beside a usage of 0 tokens (its upstream used nothing) is a failed call,
    counted against the run's cap as any error answer is; only tokens used make it a paid one.
    Taken as paid, an upstream failing again and again with `usage: {0, 0}` was never counted."""
    fake_llm.script(Reply.raw(body))
    scorer = create_scorer("g", type="agent", judge=Judge(model=model)).generate_score(
        PromptStep("grade", lambda run: "SCORE it", output_schema=Verdict)
    )
    store = MemoryScoreStore()
    _deliver(scorer, store, first=True)
    (record,) = store.records.values()
    assert record.error_type == "JudgeResponseError"
    assert (record.input_tokens, record.output_tokens) == (0, 0)
    assert ledger.calls  # a failed call against the run's cap
