"""``score_batch``: score every run × scorer of one queue message on the current event loop.

No Celery here: the Celery task, the embedded mode and tests all call this one function.

For each (run, scorer) pair the score id is deterministic (``score_id_for``). A pair whose score
is already stored is skipped; the rest are claimed (so two deliveries of the same message do not
both pay for judge calls; one stored meanwhile is refused the claim and skipped), resumed from
their last step checkpoint if a previous delivery died midway, scored concurrently (bounded per
judge model, and overall), recorded once (``store.put_records`` is atomic: the first writer
wins, and it queues each new record for every configured sink: the outbox) and only then handed
to the writer, which wakes the sinks' drainers (``worker._delivery``) or shows the records (a
command's table).
A failure becomes an error record — except a transient one (timeouts, 429/5xx after the
judge's own retries) on a non-final attempt, which is left unrecorded for the task to retry.

A request carries a trace's span records and the targets of the runs to score among them (the
exporter and backfill send one request per trace, naming every run they planned); each target's
run is read here, with ``trace_to_run(run_spans, target)``: one pair per target × scorer, and
records name the target's span (its name and times). Each run is read once, from its own records
(``ScoreRequest.run_spans``: the trace's spans are walked once, not once per run), and only when
some of its pairs are claimed for scoring (a redelivery of scored runs reads nothing). A trace
that cannot be read gives one error record per requested scorer, with
``error_type`` the ``TraceReadError`` reason (``bad_json``, ``no_content``...; ``read_failed``
when the reading itself crashed) and a message naming the span and attribute: visible and
counted, never a crashed batch.

Limits: a run longer than ``run_timeout_s`` (awaiting, or blocking the loop: see
``worker._loop.LoopWatchdog``) and a run that exhausts memory (``MemoryError``, e.g. at the
worker's address-space limit) become error records with ``error_type`` ``timeout`` and
``memory``; the batch's other runs go on. Both are final: the same run would do it again.

A batch stopped midway (cancelled at the end of SIGTERM's grace period or by a time limit, or a
step losing the store) cancels the scorers still running, stores the scores that finished (a
put already under way is waited for, not cancelled), and only then releases the other claims:
the redelivery pays for what was cut off, and again for what was done only when the store could
not take it.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import structlog
from redis import exceptions as redis_errors

from scorers import Scorer, ScorerError, ScoreResult, ScorerRunError
from scorers.judge import JudgeCallRefused, JudgeModel, ModelPrice
from tracing import ScoreRecord, ScoreWriter, SpanRecord, TracedRun, TraceReadError, score_id_for, trace_to_run
from tracing.queue import ScoreBatch, ScoreRequest, shown_id
from worker._budget import default_attempt_cap, enter_run, price_table, run_key
from worker._errors import RunLimitError, StepExitError, caused_by, crash_fields, is_transient
from worker._loop import LOOP_BLOCK_LIMITS, LoopBlockedError, for_the_loops_limit, halting, was_targeted
from worker._record_fields import judge_spend, not_scorable_text
from worker._registry import UnknownScorerError
from worker.metrics import observe_batch, observe_records, observe_skipped
from worker.store import ScoreStore, StoreUnavailableError, claim, delivery_owner, process_owner

__all__ = [
    "STORE_REFUSALS",
    "BatchReport",
    "RunLimitError",
    "ScoringDeps",
    "StoreUnavailableError",
    "batch_pairs",
    "batch_score_ids",
    "expire_runs",
    "is_transient",
    "read_run",
    "run_limited",
    "running_label",
    "score_batch",
    "scoring_run_of",
    "shown_id",
    "transient_failure",
    "wedged_record",
]

log = structlog.get_logger("tracescore.worker.scoring")

_GENERAL = "*"


@dataclass
class ScoringDeps:
    """What ``score_batch`` needs: where scorers, scores and write-back live, and the limits."""

    registry: Mapping[str, Scorer]
    store: ScoreStore
    writer: ScoreWriter | None = None
    model_concurrency: int = 64
    run_concurrency: int = 256
    score_ttl_s: int = 7 * 24 * 3600
    claim_ttl_s: int = 300
    checkpoint_ttl_s: int = 24 * 3600
    # Which scorers keep step checkpoints: "judge" (those with prompt steps: judge calls cost
    # money), "all" (function-only scorers too, one store write per step) or "none".
    checkpoint: Literal["judge", "all", "none"] = "judge"
    # Failed judge calls one run may make across all its deliveries (0: default_attempt_cap,
    # one delivery's attempts + one per retry delivery of the message's retry budget).
    judge_call_cap: int = 0
    retry_budget: int = 3
    # Set per delivery by score_batch: False for a message's first delivery, whose runs have
    # no failed judge calls from earlier deliveries (the call cap then reads none).
    redelivery: bool = True
    # A scorer run longer than this becomes a ``timeout`` error record (None: no limit).
    run_timeout_s: float | None = None
    # What judge calls cost (``Settings.prices`` over the defaults): each record's ``cost_usd``.
    prices: Mapping[str, ModelPrice] = field(default_factory=price_table)
    owner: str = field(default_factory=process_owner)
    _gates: dict[tuple[int, str], asyncio.Semaphore] = field(default_factory=dict, repr=False)

    def gate(self, key: str) -> asyncio.Semaphore:
        """The semaphore for one judge model (or ``"*"``: runs without a judge), per event loop."""
        loop_key = (id(asyncio.get_running_loop()), key)
        gate = self._gates.get(loop_key)
        if gate is None:
            size = self.run_concurrency if key == _GENERAL else self.model_concurrency
            gate = self._gates[loop_key] = asyncio.Semaphore(size)
        return gate


@dataclass
class BatchReport:
    """What one ``score_batch`` call did. ``retry`` holds score ids left for another attempt."""

    batch_id: str
    requests: int = 0
    pairs: int = 0
    scored: int = 0
    not_scorable: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    transient: Counter[str] = field(default_factory=Counter)
    retry: list[str] = field(default_factory=list)
    # Recorded as errors after transient failures on the final attempt (retryable records).
    exhausted: list[str] = field(default_factory=list)
    # Claimed by another delivery: done by it, or free again once its claim lapses.
    deferred: list[str] = field(default_factory=list)
    # Retryable failures an earlier delivery of this message recorded (and counted), by type:
    # a retry leaves them as they are (their ids are in ``exhausted``, for the message's letter).
    kept: Counter[str] = field(default_factory=Counter)
    written: int = 0
    write_failed: int = 0
    elapsed_s: float = 0.0

    @property
    def needs_retry(self) -> bool:
        return bool(self.retry or self.deferred)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "requests": self.requests,
            "pairs": self.pairs,
            "scored": self.scored,
            "not_scorable": self.not_scorable,
            "failed": dict(self.failed),
            "skipped": dict(self.skipped),
            "transient": dict(self.transient),
            "deferred": len(self.deferred),
            "exhausted": len(self.exhausted),
            "kept": dict(self.kept),
            "written": self.written,
            "write_failed": self.write_failed,
            "elapsed_s": round(self.elapsed_s, 4),
        }


@dataclass
class _Pair:
    request: ScoreRequest
    span_id: str  # the target: which of the request's runs
    target: SpanRecord | None  # its record (its name and times go in the score record)
    scorer_id: str  # as its records show it (``shown_id`` for one the worker does not have)
    scorer: Scorer | None
    score_id: str
    unknown: UnknownScorerError | None = None


@dataclass
class _Transient:
    pair: _Pair
    error_type: str


# A store that refuses every write: full (used memory at maxmemory under noeviction), or a
# read-only replica (a failover under way).
STORE_REFUSALS = (redis_errors.OutOfMemoryError, redis_errors.ReadOnlyError)
# Redis away under a step (its checkpoint, the judge's rate-limit slot), or refusing every write:
# not the run's failure, however the step wrapped it.
_STORE_AWAY = (StoreUnavailableError, *STORE_REFUSALS)

# The scorer run each task is in (its pair and deps for ``score_batch``'s runs, the caller's
# label for other ``run_limited`` callers) and its deadline: ``expire_runs`` cancels the runs past
# it, and the loop watchdog names (and records) the run that blocks the loop — the task it is
# stuck in. (One dict entry per run instead of an ``asyncio.timeout`` each: that cost ~6 µs a run.)
_running: dict[asyncio.Task[Any], tuple[object, float]] = {}
# Runs cancelled for their deadline (their CancelledError becomes a timeout).
_expired: set[asyncio.Task[Any]] = set()


@dataclass
class _PairRun:
    pair: _Pair
    deps: ScoringDeps
    # The run's result after its last finished step: what it spent, for a record of a run
    # stopped at a limit (cancelled, or stuck where the watchdog gave up on the loop).
    last: ScoreResult | None = None


async def expire_runs(every_s: float) -> None:
    """Cancel this loop's runs that are past their deadline, every ``every_s`` seconds (run it
    as a task next to the runs, and cancel it when they are done)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        now = time.monotonic()
        for task, (_, deadline) in list(_running.items()):
            if deadline <= now and task not in _expired and task.get_loop() is loop and not task.done():
                _expired.add(task)
                task.cancel()


async def run_limited(scorer: Scorer, run_timeout_s: float | None, *, label: object = None, **run: Any) -> ScoreResult:
    """``await scorer.run(**run)`` under the worker's limits: past ``run_timeout_s`` (enforced by
    ``expire_runs`` on this loop, or by a ``LoopWatchdog`` when a step blocks the loop) or out of
    memory, it raises ``RunLimitError``; a step calling ``sys.exit``, ``StepExitError``. ``label``
    names the run for ``running_label``."""
    task = asyncio.current_task()
    if task is not None:
        _running[task] = (label, time.monotonic() + run_timeout_s if run_timeout_s else math.inf)
    try:
        return await scorer.run(**run)
    except asyncio.CancelledError as cancelled:
        # Ours (``expire_runs``) → a timeout; anyone else's (the batch is being cancelled) goes on up.
        if task is None or task not in _expired or task.uncancel() > 0:
            raise
        log.warning("scorer_run_timeout", scorer=scorer.id, limit_s=run_timeout_s)
        error = RunLimitError(
            f"scorer {scorer.id!r} did not finish within TRACESCORE_RUN_TIMEOUT_SECONDS "
            f"({run_timeout_s} s); it was cancelled",
            error_type="timeout",
        )
        partial = getattr(cancelled, "partial", None)  # (its steps' spend, the one cut short too)
        error.partial = partial if isinstance(partial, ScoreResult) else None
        raise error from None
    except ScorerRunError as exc:
        limit = _limit_error_type(exc.cause, task)
        if limit is None:
            raise
        raise _limit_error(scorer, exc, limit, run_timeout_s, task) from None
    except ScorerError:
        raise
    except SystemExit as exc:
        if halting(exc):
            raise
        raise StepExitError(
            scorer.id, exc.code, getattr(exc, "failed_step", None), getattr(exc, "partial", None)
        ) from None
    except Exception as exc:  # outside the steps (a bug in the scorer): a limit, or the caller's to record
        limit = _limit_error_type(exc, task)
        if limit is None:
            raise
        raise _limit_error(scorer, exc, limit, run_timeout_s, task) from None
    finally:
        if task is not None:
            _running.pop(task, None)
            _expired.discard(task)


def _limit_error(
    scorer: Scorer,
    exc: BaseException,
    error_type: str,
    run_timeout_s: float | None,
    task: asyncio.Task[Any] | None = None,
) -> RunLimitError:
    failed_step = exc.failed_step if isinstance(exc, ScorerRunError) else None
    where = f"step {failed_step or '?'}"
    if isinstance(exc, ScorerRunError) and failed_step is None and exc.completed_steps:
        where = f"the checkpoint after step {exc.completed_steps[-1]}"  # (on_step's: no step failed)
    if error_type == "timeout" and for_the_loops_limit(task):
        message = (
            f"scorer {scorer.id!r} blocked the event loop in {where} and was interrupted: "
            f"with the steps before it, the loop had not turned for {LOOP_BLOCK_LIMITS} × "
            f"TRACESCORE_RUN_TIMEOUT_SECONDS ({run_timeout_s} s)"
        )
    elif error_type == "timeout":
        message = (
            f"scorer {scorer.id!r} blocked the event loop past TRACESCORE_RUN_TIMEOUT_SECONDS "
            f"({run_timeout_s} s) in {where} and was interrupted"
        )
    else:
        message = f"scorer {scorer.id!r} ran out of memory in {where} (MemoryError)"
    log.warning(f"scorer_run_{error_type}", scorer=scorer.id, step=failed_step)
    error = RunLimitError(message, error_type=error_type, failed_step=failed_step)
    error.partial = exc.partial if isinstance(exc, ScorerRunError) else None
    if error_type == "memory":
        # What the step allocated is reachable from the exception's frames until they go:
        # free it now, before the next allocation anywhere in the process fails too.
        exc.__traceback__ = None
        exc.__cause__ = exc.__context__ = None
        gc.collect()
    return error


def running_label(task: asyncio.Task[Any] | None) -> object:
    """The ``label`` of the ``run_limited`` run ``task`` is in (None if it is in none)."""
    found = _running.get(task) if task is not None else None
    return found[0] if found is not None else None


def scoring_run_of(task: asyncio.Task[Any] | None) -> bool:
    """True when ``task`` is inside a scorer run (its steps may take the watchdog's exception)."""
    return task is not None and task in _running


def wedged_record(
    task: asyncio.Task[Any] | None,
    blocked_s: float,
    *,
    outcome: str = "the worker process was replaced",
    error: BaseException | None = None,
    error_type: str = "timeout",
) -> tuple[ScoreRecord, ScoringDeps] | None:
    """The ``timeout`` error record (or ``error_type`` with ``error``) for the run that ``task``
    is stuck in (None if it is not a run), for the watchdog to store before the process is
    replaced (or, embedded, the loop)."""
    found = running_label(task)
    if not isinstance(found, _PairRun):
        return None
    pair, deps = found.pair, found.deps
    if error is None:
        error = LoopBlockedError(
            f"scorer {pair.scorer_id!r} blocked the worker's event loop for {blocked_s:.0f} s "
            f"(TRACESCORE_RUN_TIMEOUT_SECONDS is {deps.run_timeout_s}) in code that could not be "
            f"interrupted; {outcome}"
        )
    return _record(deps.prices, pair, found.last, error=error, error_type=error_type), deps


def _limit_error_type(exc: BaseException | None, task: asyncio.Task[Any] | None) -> str | None:
    """``timeout`` / ``memory`` when ``exc`` is a run hitting the worker's limits. The
    watchdog's exception is a timeout only in the task it was fired at: elsewhere it landed by
    mistake (the targeted step had just returned) and the run fails as retryable."""
    if isinstance(exc, LoopBlockedError):
        return "timeout" if was_targeted(task) else None
    if isinstance(exc, MemoryError):
        return "memory"
    return None


def _model_key(scorer: Scorer) -> str:
    for judge in scorer.step_judges().values():
        model = judge.model if judge is not None else None
        if isinstance(model, str):
            return model
        if isinstance(model, JudgeModel):
            return model.model_id
    return _GENERAL


def _checkpointed(scorer: Scorer, deps: ScoringDeps) -> bool:
    if deps.checkpoint == "judge":
        return scorer.has_judge_steps
    return deps.checkpoint == "all"


def batch_score_ids(batch: ScoreBatch, registry: Mapping[str, Scorer]) -> list[str]:
    """The score id of every run × scorer pair of ``batch``."""
    return [p.score_id for p in _pairs(batch, registry)]


def batch_pairs(batch: ScoreBatch, registry: Mapping[str, Scorer]) -> dict[str, tuple[str, str, str, str | None]]:
    """Each run × scorer pair of ``batch`` by score id: its trace id, target span id, scorer id
    and job id (to name and count a pair that has no record)."""
    return {p.score_id: (p.request.trace_id, p.span_id, p.scorer_id, p.request.job_id) for p in _pairs(batch, registry)}


def _pairs(batch: ScoreBatch, registry: Mapping[str, Scorer]) -> list[_Pair]:
    pairs: list[_Pair] = []
    for request in batch.requests:
        trace_id = request.trace_id
        # (the id named, the id its records show, the scorer or why there is none)
        scorers: list[tuple[str, str, Scorer | None, UnknownScorerError | None]] = []
        for scorer_id in dict.fromkeys(request.scorer_ids):
            try:
                scorers.append((scorer_id, scorer_id, registry[scorer_id], None))
            except KeyError:  # (UnknownScorerError is one)
                # The producer's text, of any length and content: its records, one a run, each
                # held it whole twice (1 MB beside 20 runs made 40 MB of records, sent to every
                # sink). Shown as logs and letters show it; the score id is still the pair's.
                shown = shown_id(scorer_id) or scorer_id
                scorers.append((scorer_id, shown, None, UnknownScorerError(shown, registry.keys())))
        targets = request.targets()
        for span_id in request.target_span_ids:
            target = targets.get(span_id)
            for scorer_id, shown, scorer, unknown in scorers:
                version = scorer.version if scorer is not None else "unknown"
                score_id = score_id_for(trace_id, span_id, scorer_id, version)
                pairs.append(_Pair(request, span_id, target, shown, scorer, score_id, unknown))
    return pairs


def _scorer_label(pair: _Pair) -> str | None:
    """The pair's scorer for the metrics: None for one the worker does not know."""
    return pair.scorer_id if pair.scorer is not None else None


def _record(
    prices: Mapping[str, ModelPrice],
    pair: _Pair,
    result: ScoreResult | None,
    *,
    error: BaseException | None = None,
    error_type: str | None = None,
    failed_step: str | None = None,
    retryable: bool = False,
) -> ScoreRecord:
    request = pair.request
    executions = list(result.judge.values()) if result is not None else []
    target = pair.target  # its times keep the sinks' write-back inside the scored span
    return ScoreRecord(
        score_id=pair.score_id,
        trace_id=request.trace_id,
        span_id=pair.span_id,
        span_name=target.name if target is not None else "",
        scorer_id=pair.scorer_id,
        scorer_name=pair.scorer.name if pair.scorer is not None else None,
        scorer_version=pair.scorer.version if pair.scorer is not None else "unknown",
        score=result.score if result is not None and error is None else None,
        label=result.label if result is not None and error is None else None,
        reason=result.reason if result is not None and error is None else None,
        not_scorable=not_scorable_text(result) if error is None else None,
        error_type=error_type,
        error_message=str(error)[:2000] if error is not None else None,
        failed_step=failed_step,
        retryable=retryable,
        input_tokens=sum(e.usage.input_tokens for e in executions),
        output_tokens=sum(e.usage.output_tokens for e in executions),
        cached_input_tokens=sum(e.usage.cached_input_tokens for e in executions),
        **judge_spend(result, prices),
        span_start_ns=target.start_time_ns if target is not None else None,
        span_end_ns=target.end_time_ns if target is not None else None,
        run_id=result.run_id if result is not None else None,
        environment=target.environment if target is not None else None,
        job_id=request.job_id,
        source=request.source,
        enqueued_at=request.enqueued_at,
        scored_at=time.time(),
    )


def transient_failure(exc: ScorerError) -> bool:
    """A run's failure that another try may not meet: a step's error whose category is
    ``retryable`` (a judge's 503, 429, timeout). Not a limit or ``sys.exit`` (the same run would
    do it again) nor a refused judge call (a spent budget, the call cap: retried by no try)."""
    return isinstance(exc, ScorerRunError) and not isinstance(exc.cause, JudgeCallRefused) and is_transient(exc)


async def _score_pair(
    pair: _Pair, run: TracedRun | TraceReadError, deps: ScoringDeps, checkpoint: ScoreResult | None, final_attempt: bool
) -> ScoreRecord | _Transient:
    scorer = pair.scorer
    if scorer is None:
        assert pair.unknown is not None
        return _record(deps.prices, pair, None, error=pair.unknown, error_type="UnknownScorerError")
    if isinstance(run, TraceReadError):  # the shipped trace could not be read into a run
        return _record(deps.prices, pair, None, error=run, error_type=run.reason)
    ident = run.identity
    label = _PairRun(pair, deps)
    checkpointed = _checkpointed(scorer, deps)
    on_step = None
    if checkpointed or scorer.has_judge_steps:  # only judge steps spend: nothing to keep else

        async def on_step(partial: ScoreResult) -> None:
            label.last = partial
            if checkpointed:  # judge steps cost money: a redelivery resumes after the last one
                await deps.store.put_checkpoint(pair.score_id, partial, deps.checkpoint_ttl_s)

    # The judge calls below belong to this run: its budgets and its call cap (this coroutine
    # runs in a task of its own, so the context ends with it).
    enter_run(
        run_key(pair.request.trace_id, pair.span_id, pair.scorer_id),
        pair.scorer_id,
        pair.request.job_id,
        deps.judge_call_cap or default_attempt_cap(scorer, deps.retry_budget),
        version=scorer.version,
        redelivery=deps.redelivery,
    )
    async with deps.gate(_model_key(scorer)):
        try:
            result = await run_limited(
                scorer,
                deps.run_timeout_s,
                label=label,
                input=run.input,
                output=run.output,
                run_id=f"{ident.trace_id}:{ident.span_id}",
                ground_truth=run.ground_truth,
                request_context=run.request_context,
                resume=checkpoint,
                on_step=on_step,
            )
        except (RunLimitError, StepExitError) as exc:
            return _record(
                deps.prices,
                pair,
                exc.partial or label.last,  # cancelled: what its finished steps spent
                error=RuntimeError(str(exc)),
                error_type=exc.error_type,
                failed_step=exc.failed_step,
            )
        except ScorerRunError as exc:
            away = caused_by(exc, _STORE_AWAY)
            if away is not None:
                # Redis went away under a step (its checkpoint, the judge's rate-limit slot), or
                # refuses every write: not the run's failure. The message goes back to the queue.
                raise away from None
            if isinstance(exc.cause, JudgeCallRefused):
                # A budget is spent or the run's judge-call cap reached: recorded now, and
                # retryable, so a delivery once the budget resets (or `dlq retry`) replaces it.
                return _record(
                    deps.prices,
                    pair,
                    exc.partial,
                    error=exc,
                    error_type=exc.cause.error_type,
                    failed_step=exc.failed_step,
                    retryable=True,
                )
            transient = transient_failure(exc)
            if transient and not final_attempt:
                return _Transient(pair, exc.error_type)
            return _record(
                deps.prices,
                pair,
                exc.partial,
                error=exc,
                error_type=exc.error_type,
                failed_step=exc.failed_step,
                retryable=transient,
            )
        except ScorerError as exc:
            return _record(deps.prices, pair, None, error=exc, error_type=type(exc).__name__)
        except Exception as exc:  # a bug in a scorer outside its steps: still a visible record
            log.error("scorer_crashed", scorer=pair.scorer_id, score_id=pair.score_id, **crash_fields(exc))
            return _record(deps.prices, pair, None, error=exc, error_type=type(exc).__name__)
    return _record(deps.prices, pair, result)


class _GroupCommit:
    """Records finished runs in groups: while one ``put_records`` call is in flight, the records
    of runs finishing meanwhile wait and go together in the next one (one round trip for many)."""

    def __init__(self, deps: ScoringDeps) -> None:
        self._deps = deps
        self._pending: list[tuple[list[ScoreRecord], asyncio.Future[list[bool]]]] = []
        self._draining = False

    async def submit(self, records: list[ScoreRecord]) -> list[bool]:
        if not records:
            return []
        future: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._pending.append((records, future))
        if not self._draining:
            self._draining = True
            try:
                await self._drain()
            except BaseException:
                # Cancelled mid-put (the shutdown grace ran out), ``_drain`` gave this caller's
                # future the error too: retrieved here, or asyncio logs it at exit as an ERROR
                # with a traceback ("Future exception was never retrieved").
                if future.done() and not future.cancelled():
                    future.exception()
                raise
            finally:
                self._draining = False
        return await future

    async def _drain(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            flat = [r for records, _ in group for r in records]
            try:
                fresh = await self._deps.store.put_records(flat, self._deps.owner, self._deps.score_ttl_s)
            except BaseException as exc:
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            start = 0
            for records, future in group:
                future.set_result(fresh[start : start + len(records)])
                start += len(records)


def read_run(trace_id: str, span_id: str, spans: list[SpanRecord]) -> TracedRun | TraceReadError:
    """The run of target ``span_id``, read from its span records ``spans``; an unreadable trace:
    the error, logged (ids and the reason only). A reader that crashed on content it did not
    foresee is ``read_failed``: the error record (or a dry run's estimate) goes on without it."""
    try:
        return trace_to_run(spans, span_id)
    except TraceReadError as exc:
        log.warning(
            "trace_unreadable",
            trace_id=trace_id,
            span_id=exc.span_id,
            span_name=shown_id(exc.span_name),
            attribute=shown_id(exc.attribute),
            reason=exc.reason,
        )
        return exc.with_traceback(None)
    except Exception as exc:  # a bug in the transform: still visible records, the batch goes on
        log.error("trace_read_crashed", trace_id=trace_id, span_id=span_id, **crash_fields(exc))
        return TraceReadError(
            "read_failed",
            f"reading the trace failed: {type(exc).__name__} (a bug in the trace reader; "
            "the worker log has where, under trace_read_crashed)",
            span_id=span_id,
        )


async def _score_run(
    pairs: list[_Pair],
    spans: list[SpanRecord],
    deps: ScoringDeps,
    checkpoints: dict[str, ScoreResult],
    final_attempt: bool,
    report: BatchReport,
    recorder: _GroupCommit,
    recording: set[asyncio.Task[Any]],
) -> None:
    """Score one run (``pairs``: one target of one request, its scorers), read from ``spans``.

    Once its scorers are done it joins ``recording``: a batch being stopped waits for it instead
    of cancelling it, so a result already paid for is stored before the claims are released."""
    run = read_run(pairs[0].request.trace_id, pairs[0].span_id, spans)
    scoring = [
        asyncio.ensure_future(_score_pair(p, run, deps, checkpoints.get(p.score_id), final_attempt)) for p in pairs
    ]
    this = asyncio.current_task()
    assert this is not None
    try:
        outcomes = await asyncio.gather(*scoring)
    except BaseException:
        # Cancelled, or a step lost the store: stop this run's other scorers (gather leaves them
        # running on an error, paying for judge calls on claims about to be released), and keep
        # the results that finished: a redelivery would pay for them again.
        for task in scoring:
            task.cancel()
        await asyncio.wait(scoring)
        finished = [t.result() for t in scoring if not t.cancelled() and t.exception() is None]
        if finished:
            recording.add(this)
            try:
                await _record_run(finished, deps, report, recorder)
            except Exception:  # the store is away: these are scored again, as the rest
                log.warning("finished_scores_not_stored", scores=len(finished))
        raise
    recording.add(this)
    await _record_run(outcomes, deps, report, recorder)


async def _record_run(
    outcomes: list[ScoreRecord | _Transient], deps: ScoringDeps, report: BatchReport, recorder: _GroupCommit
) -> None:
    """Store one run's finished scores (releasing the claims of its transient failures), count
    them, and hand the new ones to the writer."""
    records = [o for o in outcomes if isinstance(o, ScoreRecord)]
    transient = [o for o in outcomes if isinstance(o, _Transient)]
    if transient:
        await deps.store.release([t.pair.score_id for t in transient], deps.owner)
        for t in transient:
            report.transient[t.error_type] += 1
            report.retry.append(t.pair.score_id)
    fresh = await recorder.submit(records)
    new = [r for r, is_new in zip(records, fresh, strict=True) if is_new]
    observe_records(new, [(t.pair.scorer_id, t.error_type) for t in transient])
    # Recorded first by another delivery: that one counted it.
    lost = [r for r, is_new in zip(records, fresh, strict=True) if not is_new]
    observe_skipped((None if r.error_type == "UnknownScorerError" else r.scorer_id, "duplicate") for r in lost)
    report.skipped["duplicate"] += len(lost)
    for record in new:
        if record.error_type:
            report.failed[record.error_type] += 1
            if record.retryable:
                report.exhausted.append(record.score_id)
        elif record.score is None:
            report.not_scorable += 1
        else:
            report.scored += 1
    if new and deps.writer is not None:
        try:
            deps.writer.write(new)
            report.written += len(new)
        except Exception as exc:
            # The score is stored (and visible via `tracescore scores`); only the write-back failed.
            # (Where, not the text: a sink's error may quote the record it refused.)
            log.error("score_write_failed", records=len(new), trace_id=new[0].trace_id, **crash_fields(exc))
            report.write_failed += len(new)


async def score_batch(
    batch: ScoreBatch,
    deps: ScoringDeps,
    *,
    final_attempt: bool = True,
    redelivery: bool = True,
    retried: bool = False,
) -> BatchReport:
    """Score every request × scorer in ``batch``; see the module docstring for the guarantees.

    With ``final_attempt=False`` transient failures are not recorded but listed in
    ``report.retry`` (their claims released, checkpoints kept) for the caller to retry.
    Pairs claimed by another delivery are listed in ``report.deferred``: retry them after a
    while (once that delivery recorded them, or its claim lapsed).
    ``redelivery=False`` (the first delivery of a message's runs: not a split batch's run)
    spares the judge-call cap its read of the runs' failed calls in earlier deliveries (there
    are none).
    ``retried=True`` (a later delivery of the same message) leaves a retryable failure of the
    message's job as it is recorded, listed in ``report.exhausted`` and ``report.kept``: an
    earlier delivery recorded and counted it, and the job may have ended on that count (scored
    now, it moved failed → scored after a backfill's wait had ended). The message's letter keeps
    it for `dlq retry`, a first delivery, which scores it again.
    """
    started = time.perf_counter()
    # Claims belong to this delivery, not to the process.
    deps = replace(deps, owner=delivery_owner(deps.owner), redelivery=redelivery)
    report = BatchReport(batch_id=batch.batch_id, requests=len(batch.requests))
    named = _pairs(batch, deps.registry)
    report.pairs = len(named)
    # A message naming one run and scorer twice (a hand-made message, or a backfill of the
    # previous release, which could send a run twice): one claim covers every copy, so without
    # this each copy would be scored, and its judge paid.
    first: dict[str, _Pair] = {}
    copies: defaultdict[str, list[str]] = defaultdict(list)  # per job: an id for each copy
    seen: Counter[str] = Counter()
    skips: list[tuple[str | None, str]] = []  # (scorer, reason) of each run not scored, for the metrics
    for pair in named:
        seen[pair.score_id] += 1
        if first.setdefault(pair.score_id, pair) is not pair:
            report.skipped["duplicate"] += 1
            skips.append((_scorer_label(pair), "duplicate"))
            if pair.request.job_id:
                # The same for every delivery of this message, `dlq retry`'s new message too
                # (it keeps the batch id): counted among the job's skips once, whatever the
                # delivery. The first delivery alone used to count it: a retry counted it again.
                copies[pair.request.job_id].append(f"duplicate:{batch.batch_id}:{pair.score_id}:{seen[pair.score_id]}")
    pairs = list(first.values())

    existing = await deps.store.existing([p.score_id for p in pairs])
    skipped_by_job: defaultdict[str, list[str]] = defaultdict(list)

    def already_scored(pair: _Pair, recorded_for: str | None) -> None:
        report.skipped["already_scored"] += 1
        skips.append((_scorer_label(pair), "already_scored"))
        # Counted for a job only if another job (or live traffic) scored it; a redelivery of
        # this job's own message was already counted when the score was recorded. Once per
        # score: a message retried for its deferred runs meets these again.
        if pair.request.job_id and recorded_for != pair.request.job_id:
            skipped_by_job[pair.request.job_id].append(pair.score_id)

    todo: list[_Pair] = []
    for pair in pairs:
        record = existing.get(pair.score_id)
        if record is not None and record.retryable and retried and record.job_id == pair.request.job_id:
            report.kept[record.error_type or "error"] += 1
            report.exhausted.append(pair.score_id)
        elif record is None or record.retryable:  # a retryable error record may be replaced
            todo.append(pair)
        else:
            already_scored(pair, record.job_id)

    claims = await claim(deps.store, [p.score_id for p in todo], deps.owner, deps.claim_ttl_s)
    held, recorded = claims.held, claims.recorded
    mine = [p for p in todo if p.score_id in held]
    # Recorded since the read above (another delivery finished it), or by a version whose
    # record this one cannot read: the put would keep that record, so scoring it would pay twice.
    for pair in todo:
        if pair.score_id in recorded:
            already_scored(pair, recorded[pair.score_id] or None)
    for job_id, score_ids in skipped_by_job.items():
        await deps.store.jobs.count_skipped_once(job_id, "already_scored", score_ids)
    for job_id, copy_ids in copies.items():
        # A job expects a score per copy it sent.
        await deps.store.jobs.count_skipped_once(job_id, "duplicate", copy_ids)
    # Held by another delivery: scoring it now, or dead (its claim lapses within claim_ttl_s).
    # Either way try again later rather than pay twice or lose the score.
    deferred = [p for p in todo if p.score_id not in held and p.score_id not in recorded]
    report.deferred = [p.score_id for p in deferred]
    observe_skipped(skips)
    # Left for this message's retry, as a transient failure is.
    observe_records([], [(_scorer_label(p), "deferred") for p in deferred])

    checkpoints = await deps.store.get_checkpoints(
        [p.score_id for p in mine if p.scorer is not None and _checkpointed(p.scorer, deps)]
    )
    recorder = _GroupCommit(deps)
    by_run: dict[tuple[int, str], list[_Pair]] = defaultdict(list)
    for pair in mine:
        by_run[id(pair.request), pair.span_id].append(pair)
    # Each request's runs split into their records once, for the requests with claimed runs only.
    run_spans: dict[int, dict[str, list[SpanRecord]]] = {}
    for group in by_run.values():
        request = group[0].request
        if id(request) not in run_spans:
            run_spans[id(request)] = request.run_spans()
    recording: set[asyncio.Task[Any]] = set()
    tasks = [
        asyncio.ensure_future(
            _score_run(group, run_spans[key[0]][key[1]], deps, checkpoints, final_attempt, report, recorder, recording)
        )
        for key, group in by_run.items()
    ]
    expiry = (
        asyncio.ensure_future(expire_runs(min(1.0, deps.run_timeout_s / 4))) if deps.run_timeout_s and tasks else None
    )
    try:
        # Not gather: cancelling this coroutine must not cancel the runs that are recording.
        if tasks:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                raise error
    except BaseException:
        # Cancelled (time limit, shutdown) or the store failed: stop the runs still scoring
        # (they would keep paying for judge calls on claims released below), let those whose
        # scores are being stored finish (one round trip), then let a redelivery claim the rest.
        for task in tasks:
            if task not in recording:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved: the first failure is the one raised
        stored = await _safe_existing(deps, [p.score_id for p in mine])
        await _safe_release(deps, [p.score_id for p in mine if p.score_id not in stored])
        raise
    finally:
        if expiry is not None:
            expiry.cancel()
        report.elapsed_s = time.perf_counter() - started
        observe_batch(report.elapsed_s)
    for key in [k for k, v in report.skipped.items() if not v]:
        del report.skipped[key]
    return report


async def _safe_existing(deps: ScoringDeps, ids: list[str]) -> set[str]:
    try:
        return set(await deps.store.existing(ids))
    except Exception:
        return set()


async def _safe_release(deps: ScoringDeps, ids: list[str]) -> None:
    try:
        await deps.store.release(ids, deps.owner)
    except Exception:
        log.warning("claim_release_failed", claims=len(ids))
