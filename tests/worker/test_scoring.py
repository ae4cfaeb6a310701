"""score_batch on the in-memory store: skip, claim, checkpoint, error records, writer once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from scorers import ScoreResult, create_scorer
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tracing import MemoryScoreWriter, ScoreBatch, ScoreRecord
from tracing._score_record import score_id_for
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker.store import MemoryScoreStore, RedisScoreStore

calls: dict[str, int] = {}


def _count(name: str) -> None:
    calls[name] = calls.get(name, 0) + 1


def _score(run: Any) -> float:
    _count("plain")
    return 0.5


plain = create_scorer("plain", type="agent").generate_score(_score)
labelled = create_scorer("labelled", type="agent", label=lambda s: "half").generate_score(lambda: 0.5)
unscorable = create_scorer("unscorable", type="agent").generate_score(
    lambda run: __import__("scorers").not_scorable("no tools")
)
failing = create_scorer("failing", type="agent").generate_score(lambda: 1 / 0)


def _deps(*scorers: Any, **kw: Any) -> tuple[ScoringDeps, MemoryScoreStore, MemoryScoreWriter]:
    store, writer = MemoryScoreStore(), MemoryScoreWriter()
    return ScoringDeps(registry=Registry(scorers), store=store, writer=writer, **kw), store, writer


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def test_scores_every_run_and_scorer_once() -> None:
    """Each run × scorer yields one stored and one written record with the deterministic id."""
    deps, store, writer = _deps(plain, labelled)
    msg = batch(range(5), ["plain", "labelled"])
    report = asyncio.run(score_batch(msg, deps))
    assert report.scored == 10
    assert not report.failed
    ident = msg.requests[0]
    expected = score_id_for(ident.trace_id, ident.target_span_ids[0], "labelled", "1")
    assert store.records[expected].label == "half"
    assert len(writer.records) == 10
    assert len({r.score_id for r in writer.records}) == 10
    # One write per run (the outbox hands each run's records over together).
    assert writer.writes == 5


def test_a_scorer_id_named_twice_in_a_request_is_scored_once() -> None:
    """README (Workers): an id named twice is scored once, a judge paid once: one call, one
    record, one write per run, an unknown id named twice one error record; and no copy skipped
    as a ``duplicate`` (a job's skips would count runs its expected scores never held)."""
    deps, store, writer = _deps(plain)
    msg = batch(range(3), ["plain", "plain", "nope", "nope"])
    report = asyncio.run(score_batch(msg, deps))
    assert calls == {"plain": 3}
    assert report.scored == 3
    assert not report.skipped
    assert sorted(r.scorer_id for r in store.records.values()) == ["nope"] * 3 + ["plain"] * 3
    assert len(writer.records) == 6


def test_redelivery_skips_scored_and_writes_nothing_twice() -> None:
    """Delivering the same batch again runs no scorer and writes nothing."""
    deps, _, writer = _deps(plain)
    msg = batch(range(4), ["plain"])
    asyncio.run(score_batch(msg, deps))
    again = asyncio.run(score_batch(msg, deps))
    assert calls["plain"] == 4
    assert again.skipped == {"already_scored": 4}
    assert len(writer.records) == 4


def test_claimed_pairs_are_deferred_to_a_later_attempt() -> None:
    """A pair claimed by another delivery is not scored now but deferred for a retry."""
    deps, store, _ = _deps(plain)
    msg = batch(range(2), ["plain"])
    ident = msg.requests[0]
    held = score_id_for(ident.trace_id, ident.target_span_ids[0], "plain", "1")
    asyncio.run(store.claim([held], "other", 60))
    report = asyncio.run(score_batch(msg, deps))
    assert report.scored == 1
    assert report.deferred == [held]
    assert report.needs_retry
    asyncio.run(store.release([held], "other"))
    again = asyncio.run(score_batch(msg, deps))
    assert again.scored == 1
    assert again.skipped == {"already_scored": 1}
    assert not again.needs_retry


def test_failures_and_unknown_ids_become_error_records() -> None:
    """A failing scorer and an unknown id each give an error record for that pair only."""
    deps, _store, writer = _deps(plain, failing, unscorable)
    report = asyncio.run(score_batch(batch(range(2), ["plain", "failing", "nope", "unscorable"]), deps))
    assert report.scored == 2
    assert report.not_scorable == 2
    assert report.failed == {"ZeroDivisionError": 2, "UnknownScorerError": 2}
    errors = [r for r in writer.records if r.error_type]
    assert {r.error_type for r in errors} == {"ZeroDivisionError", "UnknownScorerError"}
    unknown = next(r for r in errors if r.error_type == "UnknownScorerError")
    assert "this worker knows" in (unknown.error_message or "")
    assert all(r.not_scorable == "generate_score: no tools" for r in writer.records if r.scorer_id == "unscorable")


def test_an_unknown_scorer_id_of_any_text_is_kept_in_its_records_as_a_digest() -> None:
    """A scorer id the worker lacks is the producer's text: any length, any content. Each of the
    message's runs got an error record holding it whole, as its scorer id and again in its
    error: one 1 MB id beside 20 runs made 40 MB of records (stored, sent to every sink) from
    a 1 MB message, agent content or a secret there copied into each. Unless it is a plain id,
    it is kept as a digest (the same for every record of that id, as logs and letters show it);
    the records and their score ids are otherwise the same, and a plain unknown id is shown as
    it is."""
    deps, _store, writer = _deps(plain)
    hostile = "AGENT said: the code is QZXJ " * 40_000  # (letters no digest, id or time holds: "4417" did, by chance)
    report = asyncio.run(score_batch(batch(range(20), ["plain", hostile, "nope"], salt="long-id"), deps))
    assert (report.scored, report.failed) == (20, {"UnknownScorerError": 40})
    unknown = [r for r in writer.records if r.error_type == "UnknownScorerError"]
    shown = {r.scorer_id for r in unknown}
    assert len(shown) == 2
    assert "nope" in shown
    (digest,) = shown - {"nope"}
    assert digest.startswith("sha256:")
    assert len(digest) < 128
    assert all("QZXJ" not in r.model_dump_json() for r in writer.records)
    assert max(len(r.model_dump_json()) for r in writer.records) < 4000
    assert all(digest in (r.error_message or "") for r in unknown if r.scorer_id == digest)
    # The score id is the pair's, as before: the id the message named, not what the record shows.
    first = next(r for r in unknown if r.scorer_id == digest)
    assert first.score_id == score_id_for(first.trace_id, first.span_id, hostile, "unknown")


def test_transient_failure_is_left_for_retry_then_recorded_on_final_attempt() -> None:
    """A timeout is not recorded on a non-final attempt; on the final one it is an error record."""

    async def flaky(run: Any) -> float:
        raise TimeoutError("judge did not answer")

    scorer = create_scorer("flaky", type="agent").generate_score(flaky)
    deps, store, writer = _deps(scorer)
    msg = batch(range(3), ["flaky"])
    first = asyncio.run(score_batch(msg, deps, final_attempt=False))
    assert first.needs_retry
    assert len(first.retry) == 3
    assert not store.records
    # Claims were released, so the retry can claim them again.
    last = asyncio.run(score_batch(msg, deps, final_attempt=True))
    assert last.failed == {"TimeoutError": 3}
    assert len(writer.records) == 3


def test_checkpoint_resume_skips_finished_steps() -> None:
    """After a failure in generate_reason, the next delivery resumes there (the score not rerun)."""
    fail_once = {"reason": True}

    def pre(run: Any) -> dict[str, int]:
        _count("pre")
        return {"n": 3}

    def score(results: Any) -> float:
        _count("score")
        return results.preprocess_step_result["n"] / 10

    def reason(score: float) -> str:
        _count("reason")
        if fail_once.pop("reason", False):
            raise TimeoutError("provider timed out")
        return f"got {score}"

    scorer = create_scorer("multi", type="agent").preprocess(pre).generate_score(score).generate_reason(reason)
    deps, store, writer = _deps(scorer, checkpoint="all")
    msg = batch(range(1), ["multi"])
    first = asyncio.run(score_batch(msg, deps, final_attempt=False))
    assert first.needs_retry
    saved = asyncio.run(store.get_checkpoints(first.retry))
    assert isinstance(saved[first.retry[0]], ScoreResult)
    assert saved[first.retry[0]].completed_steps == ["preprocess", "generate_score"]
    second = asyncio.run(score_batch(msg, deps))
    assert second.scored == 1
    # generate_score is not run again; preprocess, a function step, is (free, and its value may
    # not survive the checkpoint's JSON).
    assert calls == {"pre": 2, "score": 1, "reason": 2}
    assert writer.records[0].reason == "got 0.3"
    assert not asyncio.run(store.get_checkpoints(first.retry))  # cleared once recorded


def test_job_counters_do_not_double_count_redelivery() -> None:
    """Per-job progress counts a redelivered score once; another job's score counts as skipped."""
    deps, store, _ = _deps(plain)
    asyncio.run(score_batch(batch(range(3), ["plain"], job_id="j1"), deps))
    asyncio.run(score_batch(batch(range(3), ["plain"], job_id="j1"), deps))
    assert asyncio.run(store.jobs.progress("j1")) == {"scored": 3}
    asyncio.run(score_batch(batch(range(4), ["plain"], job_id="j2"), deps))
    assert asyncio.run(store.jobs.progress("j2")) == {"scored": 1, "skipped": 3, "skipped:already_scored": 3}
    # The message again (retried for runs another delivery held): j1's scores were counted for
    # j2 a second time, and a job's counts passed its expected total (concurrency audit).
    asyncio.run(score_batch(batch(range(4), ["plain"], job_id="j2"), deps, redelivery=True))
    assert asyncio.run(store.jobs.progress("j2")) == {"scored": 1, "skipped": 3, "skipped:already_scored": 3}


def test_concurrency_is_bounded_per_model() -> None:
    """Runs of a judge-less scorer never exceed run_concurrency at once."""
    state = {"now": 0, "peak": 0}

    async def slow(run: Any) -> float:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return 1.0

    scorer = create_scorer("slow", type="agent").generate_score(slow)
    deps, _, _ = _deps(scorer, run_concurrency=4)
    report = asyncio.run(score_batch(batch(range(20), ["slow"]), deps))
    assert report.scored == 20
    assert state["peak"] == 4


def test_store_failure_stops_the_other_requests_and_frees_their_claims() -> None:
    """When recording fails, score_batch cancels the runs still scoring before it releases their claims."""
    state = {"started": 0, "cancelled": 0}

    async def first_quick_then_stuck(run: Any) -> float:
        state["started"] += 1
        if state["started"] > 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                state["cancelled"] += 1
                raise
        return 1.0

    class FailingStore(MemoryScoreStore):
        async def put_records(self, records: Any, owner: str, ttl_s: int) -> list[bool]:
            raise ConnectionError("store down")

    scorer = create_scorer("stuck", type="agent").generate_score(first_quick_then_stuck)
    store = FailingStore()
    deps = ScoringDeps(registry=Registry([scorer]), store=store)
    msg = batch(range(3), ["stuck"])

    async def main() -> tuple[int, dict[str, str]]:
        with pytest.raises(ConnectionError):
            await score_batch(msg, deps)
        ids = [score_id_for(r.trace_id, t, "stuck", "1") for r in msg.requests for t in r.target_span_ids]
        return state["cancelled"], await store.claim_owners(ids)

    cancelled, owners = asyncio.run(main())
    assert (state["started"], cancelled) == (3, 2)
    assert owners == {}


def _flaky(scorer_id: str) -> tuple[Any, dict[str, bool]]:
    """A scorer that times out until its switch is turned ``on``, and the switch."""
    healthy = {"on": False}

    async def judge_like(run: Any) -> float:
        if not healthy["on"]:
            raise TimeoutError("provider down")
        return 0.9

    return create_scorer(scorer_id, type="agent").generate_score(judge_like), healthy


def test_retryable_error_record_is_replaced_by_a_later_success() -> None:
    """Transient failures past the budget leave retryable error records; a later delivery replaces them."""
    scorer, healthy = _flaky("flaky2")
    deps, store, writer = _deps(scorer)
    msg = batch(range(2), ["flaky2"], job_id="job")
    first = asyncio.run(score_batch(msg, deps, final_attempt=True))
    assert first.failed == {"TimeoutError": 2}
    assert len(first.exhausted) == 2
    assert all(r.retryable for r in writer.records)
    assert asyncio.run(store.jobs.progress("job"))["failed"] == 2
    healthy["on"] = True
    again = asyncio.run(score_batch(msg, deps))
    assert again.scored == 2
    assert [r.score for r in writer.records[2:]] == [0.9, 0.9]
    assert all(r.score == 0.9 for r in store.records.values())
    progress = asyncio.run(store.jobs.progress("job"))
    assert progress["scored"] == 2
    assert progress["failed"] == 0


def test_a_jobs_failure_another_job_scores_is_its_skip_and_its_retry_counts_nothing() -> None:
    """Job a's runs failed for good on a transient error; job b then scored them. a still counted
    them failed, and a's `dlq retry` then counted them skipped too: 900 of 600 in the audit. Now
    b's score turns a's failure into a's skip, once, and a's retry adds nothing."""
    scorer, healthy = _flaky("flaky3")
    deps, store, _ = _deps(scorer)
    of_a = batch(range(3), ["flaky3"], job_id="a")
    asyncio.run(score_batch(of_a, deps, final_attempt=True))
    assert asyncio.run(store.jobs.progress("a")) == {"failed": 3, "failed:TimeoutError": 3}
    healthy["on"] = True
    assert asyncio.run(score_batch(batch(range(3), ["flaky3"], job_id="b"), deps)).scored == 3
    settled = {"failed": 0, "failed:TimeoutError": 0, "skipped": 3, "skipped:already_scored": 3}
    assert asyncio.run(store.jobs.progress("a")) == settled
    assert asyncio.run(store.jobs.progress("b")) == {"scored": 3}
    again = asyncio.run(score_batch(of_a, deps))  # `tracescore dlq retry` of a's letter
    assert again.skipped == {"already_scored": 3}
    assert asyncio.run(store.jobs.progress("a")) == settled


def test_a_record_carries_its_spans_environment_across_the_wire() -> None:
    """The scored span's environment (the exporter's or backfill's record of it) reaches its
    score records through the queue's JSON, as an attribute: the span records keep the fields a
    worker of the release before reads (it refuses unknown ones)."""
    deps, _, writer = _deps(plain)
    msg = batch(range(2), ["plain"])
    span = msg.requests[0].spans[0]
    msg.requests[0].spans[0] = dataclasses.replace(
        span, attributes={**span.attributes, "tracescore.environment": "prod-eu"}
    )
    sent = json.loads(msg.model_dump_json())
    assert {key for request in sent["requests"] for s in request["spans"] for key in s} == {
        "trace_id", "span_id", "name", "parent_span_id", "kind", "start_time_ns", "end_time_ns", "status",
        "attributes", "events", "service_name", "scope_name",
    }  # fmt: skip
    asyncio.run(score_batch(ScoreBatch.model_validate(sent), deps))
    assert {r.trace_id: r.environment for r in writer.records} == {
        msg.requests[0].trace_id: "prod-eu",
        msg.requests[1].trace_id: None,
    }


def test_terminal_error_record_is_not_rescored() -> None:
    """A non-transient failure is final: a redelivery skips it."""
    deps, _, writer = _deps(failing)
    msg = batch(range(1), ["failing"])
    asyncio.run(score_batch(msg, deps))
    again = asyncio.run(score_batch(msg, deps))
    assert again.skipped == {"already_scored": 1}
    assert len(writer.records) == 1
    assert not writer.records[0].retryable


def test_claim_of_a_dead_local_process_is_taken_over() -> None:
    """A claim left by a process of this host that no longer exists does not defer the pair."""
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    deps, store, _ = _deps(plain)
    msg = batch(range(1), ["plain"])
    ident = msg.requests[0]
    held = score_id_for(ident.trace_id, ident.target_span_ids[0], "plain", "1")
    asyncio.run(store.claim([held], f"{socket.gethostname()}:{gone.pid}", 60))
    report = asyncio.run(score_batch(msg, deps))
    assert report.scored == 1
    assert not report.deferred


def test_two_deliveries_in_one_process_score_each_pair_once() -> None:
    """Claims belong to a delivery: the same message twice at once in one process pays once."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(run: Any) -> float:
        _count("slow")
        if not started.is_set():  # only the first call blocks, so a regression fails, not hangs
            started.set()
            await release.wait()
        return 0.25

    deps, _store, writer = _deps(create_scorer("slow", type="agent").generate_score(slow))
    msg = batch(range(3), ["slow"])

    async def main() -> tuple[Any, Any]:
        first = asyncio.create_task(score_batch(msg, deps))
        await started.wait()
        second = await score_batch(msg, deps)  # runs while the first delivery holds the claims
        release.set()
        return await first, second

    first, second = asyncio.run(main())
    assert calls["slow"] == 3
    assert first.scored == 3
    assert second.scored == 0
    assert len(second.deferred) == 3
    assert len(writer.records) == 3


def test_dead_owner_detection_reads_delivery_owners() -> None:
    """A claim's owner names host, pid and delivery; a dead pid on this host is recognised."""
    from worker.store._scores import _owner_is_dead_here

    me = "host-a:1:dabc"
    assert _owner_is_dead_here("host-a:999999999:d1234", me)
    assert _owner_is_dead_here("host-a:999999999", me)  # owners written before deliveries had ids
    assert not _owner_is_dead_here(f"host-a:{__import__('os').getpid()}:d1234", me)
    assert not _owner_is_dead_here("host-b:999999999:d1234", me)


# --- limits: run timeout, a blocked loop, memory ------------------------------------------------


async def _never(run: Any) -> float:
    await asyncio.Event().wait()
    return 0.0


def _busy(run: Any) -> float:
    while True:
        pass


def _huge(run: Any) -> float:
    return float(len(bytearray(1 << 62)))  # more than any machine: MemoryError at once


never = create_scorer("never", type="agent").generate_score(_never)
busy = create_scorer("busy", type="agent").generate_score(_busy)
huge = create_scorer("huge", type="agent").generate_score(_huge)


def _mixed(bad: str, salt: str) -> Any:
    """Run 0 goes to ``bad``, runs 1-3 to ``plain``."""
    good = batch(range(1, 4), ["plain"], salt=salt)
    odd = batch(range(1), [bad], salt=salt)
    return good.model_copy(update={"requests": odd.requests + good.requests})


def test_async_step_past_the_run_timeout_is_a_timeout_record() -> None:
    """An async step that never returns: its run is recorded as `timeout` after run_timeout_s,
    the batch's other runs are scored, and score_batch returns."""
    deps, store, writer = _deps(plain, never, run_timeout_s=0.5)
    report = asyncio.run(asyncio.wait_for(score_batch(_mixed("never", "t"), deps), 10))
    assert report.scored == 3
    assert report.failed == {"timeout": 1}
    (record,) = [r for r in store.records.values() if r.error_type]
    assert record.scorer_id == "never"
    assert "TRACESCORE_RUN_TIMEOUT_SECONDS" in (record.error_message or "")
    assert not record.retryable
    assert len(writer.records) == 4


def test_a_run_stopped_at_the_timeout_records_what_its_judge_steps_spent(fake_llm: FakeLLMServer) -> None:
    """A paid judge step, then a step that never returns: the timeout record said 0 calls and
    0 cost while the judge had been paid (the README: a failed run still carries what its steps
    spent). It carries the finished steps' calls, tokens and cost."""
    from pydantic import BaseModel

    from scorers import PromptStep, create_scorer
    from scorers.judge import Judge

    class Verdict(BaseModel):
        ok: bool

    async def forever(results: Any) -> float:
        await asyncio.Event().wait()
        return 1.0

    paid = (
        create_scorer("paid", judge=Judge("openai/fake-judge", "Judge."))
        .analyze(PromptStep("Check", lambda run: "Is it ok?", output_schema=Verdict))
        .generate_score(forever)
    )
    fake_llm.script(Reply.json({"ok": True}))
    _assert_one_paid_call_in_a_timeout(paid, fake_llm, requests=1)


def _assert_one_paid_call_in_a_timeout(paid: Any, fake_llm: FakeLLMServer, *, requests: int) -> None:
    """``paid`` scored once under a 3 s run timeout: a timeout record carrying one paid call."""
    from scorers.judge._prices import ModelPrice

    prices = {"openai/fake-judge": ModelPrice(input=100.0, output=200.0)}
    # (3 s: the judge's first call imports the SDK, 1.2 s on a slow day, inside the run's time)
    deps, store, _ = _deps(paid, run_timeout_s=3.0, prices=prices)
    report = asyncio.run(asyncio.wait_for(score_batch(batch(range(1), ["paid"], salt="paid"), deps), 30))
    assert report.failed == {"timeout": 1}
    (record,) = store.records.values()
    assert record.error_type == "timeout"
    assert fake_llm.count() == requests
    assert record.judge_calls == 1
    assert record.input_tokens > 0
    assert record.cost_usd is not None
    assert record.cost_usd > 0


def test_sync_step_blocking_the_loop_is_interrupted_and_the_loop_keeps_scoring() -> None:
    """A sync step that never returns blocks the loop: the watchdog interrupts it, the run is a
    `timeout` record, the others are scored, and later batches on the same loop are scored."""
    from tests.worker._workers import wait_for
    from worker._loop import LoopThread, LoopWatchdog
    from worker._scoring import scoring_run_of

    wedged: list[float] = []
    lt = LoopThread("test-loop")
    watchdog = LoopWatchdog(
        lt, limit_s=0.5, grace_s=2.0, can_interrupt=scoring_run_of, on_wedged=lambda t, s: wedged.append(s)
    )
    try:
        deps, store, _ = _deps(plain, busy, run_timeout_s=0.5)
        report = lt.run(score_batch(_mixed("busy", "w"), deps), 20)
        assert report.failed == {"timeout": 1}
        assert report.scored == 3
        (record,) = [r for r in store.records.values() if r.error_type]
        assert record.scorer_id == "busy"
        assert record.failed_step == "generate_score"
        later = lt.run(score_batch(batch(range(10, 14), ["plain"], salt="w"), deps), 10)
        assert later.scored == 4
        assert wait_for(lambda: watchdog.interrupted == 1, 5)
        assert wedged == []
    finally:
        watchdog.stop()
        lt.stop()


def test_memory_error_in_a_step_is_a_memory_record() -> None:
    """A step that cannot get its memory: a `memory` error record; the other runs are scored."""
    deps, store, _ = _deps(plain, huge)
    report = asyncio.run(score_batch(_mixed("huge", "m"), deps))
    assert report.failed == {"memory": 1}
    assert report.scored == 3
    (record,) = [r for r in store.records.values() if r.error_type]
    assert record.failed_step == "generate_score"
    assert "MemoryError" in (record.error_message or "")


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_score_recorded_between_the_read_and_the_claim_is_not_scored_again(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Another delivery (of another job's message) records a score after this delivery read the
    records and before it claims: the claim refuses it (the put would keep that record), so its
    scorer is not run again, and it counts as already scored for this job, whose count still
    adds up. Before, the claim succeeded (the put had released the other's claim): the scorer
    ran again (paid twice), the record was refused as a duplicate, and the job never finished."""
    store: Any = MemoryScoreStore() if kind == "memory" else RedisScoreStore(request.getfixturevalue("redis_url"))
    msg = batch(range(2), ["plain"], salt=f"meanwhile-{kind}", job_id="j-this")
    first = msg.requests[0]
    theirs = ScoreRecord(
        score_id=score_id_for(first.trace_id, first.target_span_ids[0], "plain", "1"),
        trace_id=first.trace_id,
        span_id=first.target_span_ids[0],
        scorer_id="plain",
        score=0.9,
        job_id="j-other",
    )
    read = store.existing
    pending = [theirs]

    async def read_then_they_record(score_ids: Any) -> Any:
        found = await read(score_ids)
        if pending:
            done = [pending.pop()]
            await store.claim([r.score_id for r in done], "other-delivery", 60)
            assert await store.put_records(done, "other-delivery", 60) == [True]
        return found

    store.existing = read_then_they_record

    async def go() -> tuple[Any, dict[str, int]]:
        try:
            report = await score_batch(msg, ScoringDeps(registry=Registry([plain]), store=store))
            return report, await store.jobs.progress("j-this")
        finally:
            await store.close()

    report, progress = asyncio.run(go())
    assert calls == {"plain": 1}
    assert (report.scored, report.skipped, report.deferred) == (1, {"already_scored": 1}, [])
    assert progress["scored"] + progress["skipped"] == 2


def test_a_finished_jobs_message_delivered_again_counts_nothing_more(redis_url: str) -> None:
    """On Redis, as a backfill ends a job: 100 runs, one live traffic had scored (the job's
    skip). Once the job finished, its set of counted skips was dropped, and its message
    delivered again (a worker killed before its ack) counted that skip again: 101 of 100."""
    import redis as sync_redis

    from worker.backfill._state import RedisJobStore

    live, msg = batch(range(1), ["plain"], salt="late"), batch(range(100), ["plain"], salt="late", job_id="j-late")

    async def deliver(*messages: ScoreBatch) -> dict[str, int]:
        store = RedisScoreStore(redis_url)
        try:
            for message in messages:
                await score_batch(message, ScoringDeps(registry=Registry([plain]), store=store))
            return await store.jobs.progress("j-late")
        finally:
            await store.close()

    done = asyncio.run(deliver(live, msg))
    assert done == {"scored": 99, "skipped": 1, "skipped:already_scored": 1}
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    RedisJobStore(client).finished("j-late")
    client.close()
    assert asyncio.run(deliver(msg)) == done
    assert calls == {"plain": 100}  # (nothing scored again either)


def test_a_run_named_twice_in_one_message_is_scored_once() -> None:
    """Copies of one request in a message (hand-made, or replayed into one batch) share one
    score id: scored once (a judge would be paid once), the copies counted as duplicates."""
    deps, store, writer = _deps(plain)
    one, other = batch(range(2), ["plain"]).requests
    msg = ScoreBatch(batch_id="copies", requests=[one, one.model_copy(), other, one.model_copy()])
    report = asyncio.run(score_batch(msg, deps))
    assert calls["plain"] == 2
    assert report.scored == 2
    assert report.skipped == {"duplicate": 2}
    assert report.pairs == 4
    assert len(store.records) == 2
    assert len(writer.records) == 2


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_jobs_copies_in_one_message_count_for_it_once(kind: str, request: pytest.FixtureRequest) -> None:
    """A backfill of the previous release could send a run twice in one message; its job
    expects a score per copy, so a copy is counted for it (skipped: duplicate) once per message,
    whatever the delivery: a redelivery, a `dlq retry` (a new message: a first delivery again,
    which counted it twice) or a redelivery whose first delivery died before counting it."""
    store: Any = MemoryScoreStore() if kind == "memory" else RedisScoreStore(request.getfixturevalue("redis_url"))
    deps = ScoringDeps(registry=Registry([plain]), store=store)
    one, other, third = batch(range(3), ["plain"], salt=f"copies-{kind}", job_id="job-1").requests
    msg = ScoreBatch(batch_id="copies", requests=[one, other, one.model_copy()])
    # Another message of the job, whose first delivery died before counting its copy.
    died = ScoreBatch(batch_id="died", requests=[third, third.model_copy()])

    def counts(progress: dict[str, int]) -> tuple[int, int, int]:
        return progress["scored"], progress["skipped"], progress["skipped:duplicate"]

    async def go() -> list[tuple[int, int, int]]:
        try:
            await score_batch(msg, deps, redelivery=False)
            await score_batch(msg, deps, redelivery=True)
            await score_batch(msg, deps, redelivery=False)  # dlq retry
            after_msg = counts(await store.jobs.progress("job-1"))
            await score_batch(died, deps, redelivery=True)
            return [after_msg, counts(await store.jobs.progress("job-1"))]
        finally:
            await store.close()

    assert asyncio.run(go()) == [(2, 1, 1), (3, 2, 2)]
