"""``create_scorer`` and ``Scorer``: the preprocess → analyze → generate_score → generate_reason pipeline.

The pipeline is written once, as a generator (``_flow``) that yields each awaitable it
needs resolved. ``Scorer.run`` awaits them; ``Scorer.run_sync`` resolves them on one event
loop kept per thread. A scorer of plain sync functions yields nothing, so ``run_sync`` runs it
without touching an event loop at all.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import decimal
import inspect
import math
import numbers
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ValidationError

from scorers._errors import RunInputError, ScorerConfigError, ScorerRunError
from scorers._json import json_ready, well_formed
from scorers._not_scorable import NotScorable
from scorers._result import JudgeExecution, ScoreResult, StepName
from scorers._run import ScorerRun, StepResults
from scorers._steps import PLAIN_JSON, FunctionStep, PromptStep, Step, StepFunction, call_declared, declared_params
from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent
from scorers.judge import Judge, ask_judge

__all__ = ["OnStep", "PrepareRun", "Scorer", "ScorerType", "create_scorer"]

OnStep: TypeAlias = Callable[[ScoreResult], Awaitable[None] | None]
PrepareRun: TypeAlias = Callable[[ScorerRun], ScorerRun | Awaitable[ScorerRun]]
ScorerType: TypeAlias = Literal["agent"] | tuple[type[BaseModel], type[BaseModel]] | None
Direction: TypeAlias = Literal["higher", "lower"]

_STEP_ARGS: dict[StepName, frozenset[str]] = {
    "preprocess": frozenset({"run", "results"}),
    "analyze": frozenset({"run", "results"}),
    "generate_score": frozenset({"run", "results"}),
    "generate_reason": frozenset({"run", "results", "score"}),
}
_SCORE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "number"}},
    "required": ["score"],
    "additionalProperties": False,
}
_Flow: TypeAlias = Generator[Awaitable[Any], Any, ScoreResult]


@dataclass(frozen=True, slots=True)
class _Steps:
    preprocess: Step | None = None
    analyze: Step | None = None
    generate_score: Step | None = None
    generate_reason: Step | None = None

    def done(self, completed: list[StepName]) -> bool:
        """Whether every step this scorer has is in ``completed``."""
        return all(
            getattr(self, name) is None or name in completed
            for name in ("preprocess", "analyze", "generate_score", "generate_reason")
        )


class Scorer:
    """An immutable scorer. Each step method returns a new scorer; the receiver is unchanged."""

    __slots__ = (
        "_judges",
        "_steps",
        "description",
        "direction",
        "id",
        "judge",
        "label",
        "name",
        "prepare_run",
        "score_range",
        "type",
        "version",
    )

    id: str
    name: str
    description: str
    judge: Judge | None
    type: ScorerType
    prepare_run: PrepareRun | None
    version: str
    score_range: tuple[float, float] | None
    direction: Direction
    label: Callable[[float], str | None] | None
    _steps: _Steps
    # Derived once (the scorer is immutable): the worker asks for them on every run it scores.
    _judges: dict[StepName, Judge | None]

    def __init__(
        self,
        *,
        id: str,
        name: str,
        description: str,
        judge: Judge | None,
        type: ScorerType,
        prepare_run: PrepareRun | None,
        version: str,
        score_range: tuple[float, float] | None,
        direction: Direction,
        label: Callable[[float], str | None] | None,
        steps: _Steps,
    ) -> None:
        for attr, value in (
            ("id", id),
            ("name", name),
            ("description", description),
            ("judge", judge),
            ("type", type),
            ("prepare_run", prepare_run),
            ("version", version),
            ("score_range", score_range),
            ("direction", direction),
            ("label", label),
            ("_steps", steps),
        ):
            object.__setattr__(self, attr, value)
        judges: dict[StepName, Judge | None] = {}
        for step_name in _STEP_ARGS:
            step = getattr(steps, step_name)
            if isinstance(step, PromptStep):
                judges[step_name] = step.judge.over(judge) if step.judge is not None else judge
        object.__setattr__(self, "_judges", judges)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Scorer is immutable; build a new one instead of setting {name!r}")

    # Immutable: a copy is the same scorer (the default copy protocol would set attributes).
    def __copy__(self) -> Scorer:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Scorer:
        return self

    def __repr__(self) -> str:
        steps = [s for s in ("preprocess", "analyze", "generate_score", "generate_reason") if getattr(self._steps, s)]
        return f"<Scorer {self.id!r} v{self.version} steps={steps}>"

    # --- builder -------------------------------------------------------------------------

    def _with(self, step: StepName, value: StepFunction | PromptStep) -> Scorer:
        what = f"scorer {self.id!r} {step} step"
        if isinstance(value, PromptStep):
            if step in ("preprocess", "analyze") and value.output_schema is None:
                raise ScorerConfigError(
                    f"{what}: a PromptStep for {step} needs output_schema (a pydantic model or a JSON-schema dict)"
                )
            if step == "generate_reason" and value.calculate_score is not None:
                raise ScorerConfigError(f"{what}: calculate_score only applies to generate_score")
            if step != "generate_reason" and "score" in (value.prompt_params or ()):
                raise ScorerConfigError(
                    f"{what}: create_prompt declares 'score', which only generate_reason receives; "
                    f"a {step} prompt may declare: results, run"
                )
            built: Step = value
        else:
            params = declared_params(value, _STEP_ARGS[step], what)
            built = FunctionStep(value, params, plain_json=getattr(value, PLAIN_JSON, False) is True)
        return Scorer(
            id=self.id,
            name=self.name,
            description=self.description,
            judge=self.judge,
            type=self.type,
            prepare_run=self.prepare_run,
            version=self.version,
            score_range=self.score_range,
            direction=self.direction,
            label=self.label,
            steps=replace(self._steps, **{step: built}),
        )

    def preprocess(self, step: StepFunction | PromptStep) -> Scorer:
        return self._with("preprocess", step)

    def analyze(self, step: StepFunction | PromptStep) -> Scorer:
        return self._with("analyze", step)

    def generate_score(self, step: StepFunction | PromptStep) -> Scorer:
        return self._with("generate_score", step)

    def generate_reason(self, step: StepFunction | PromptStep) -> Scorer:
        return self._with("generate_reason", step)

    @property
    def has_judge_steps(self) -> bool:
        return bool(self._judges)

    def step_judges(self) -> dict[StepName, Judge | None]:
        """The effective judge of each prompt step (the step's fields over the scorer's)."""
        return dict(self._judges)

    # --- drivers -------------------------------------------------------------------------

    async def run(
        self,
        *,
        input: Any,
        output: Any,
        run_id: str | None = None,
        ground_truth: Any = None,
        request_context: Any = None,
        runtime_context: Any = None,
        resume: ScoreResult | None = None,
        on_step: OnStep | None = None,
    ) -> ScoreResult:
        """Score one input/output pair. ``runtime_context`` is the older name of ``request_context``.

        ``resume`` takes a partial result (a checkpoint): the judge steps in its
        ``completed_steps`` are not asked again, their answers validated again into what the
        call gave (asked again if that does not give back what was stored); a completed
        function step runs again when a later step is left to read its value (unless marked
        ``plain_json``). ``on_step(result)`` (sync or
        async) is called after each completed step with the result so far, e.g. to store a
        checkpoint; if it raises (``NotScorable`` too: it is no step), the run fails with
        ``failed_step`` None (no step failed) and the step in ``completed_steps``.
        """
        flow = self._flow(
            input, output, run_id, ground_truth, _context(request_context, runtime_context), resume, on_step
        )
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                awaitable = flow.send(sent) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                sent, error = await awaitable, None
            except _NOT_THE_STEPS:
                raise
            except BaseException as exc:  # (the flow tells a step's own from ours; tags a SystemExit)
                sent, error = None, exc

    def run_sync(
        self,
        *,
        input: Any,
        output: Any,
        run_id: str | None = None,
        ground_truth: Any = None,
        request_context: Any = None,
        runtime_context: Any = None,
        resume: ScoreResult | None = None,
        on_step: OnStep | None = None,
    ) -> ScoreResult:
        """Blocking ``run``. Must not be called from a running event loop (use ``await run``)."""
        flow = self._flow(
            input, output, run_id, ground_truth, _context(request_context, runtime_context), resume, on_step
        )
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                awaitable = flow.send(sent) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                loop = _thread_loop()
            except RuntimeError:
                if inspect.iscoroutine(awaitable):
                    awaitable.close()
                flow.close()
                raise
            try:
                sent, error = loop.run_until_complete(awaitable), None
            except _NOT_THE_STEPS:
                raise
            except BaseException as exc:
                sent, error = None, exc

    # --- the pipeline --------------------------------------------------------------------

    def _flow(
        self,
        input: Any,
        output: Any,
        run_id: str | None,
        ground_truth: Any,
        request_context: Any,
        resume: ScoreResult | None,
        on_step: OnStep | None,
    ) -> _Flow:
        steps = self._steps
        if steps.generate_score is None:
            raise ScorerConfigError(f"scorer {self.id!r} has no generate_score step; add one with .generate_score(...)")
        if run_id is not None and not isinstance(run_id, str):
            raise RunInputError(f"scorer {self.id!r}: run_id must be a string, got {type(run_id).__name__}")
        run = ScorerRun(
            input=self._coerce(input, "input"),
            output=self._coerce(output, "output"),
            run_id=well_formed(run_id or (resume.run_id if resume else None) or str(uuid.uuid4())),
            ground_truth=ground_truth,
            request_context=request_context,
        )
        result = ScoreResult(run_id=run.run_id, scorer_id=self.id)
        current: StepName | Literal["prepare_run"] = "prepare_run"
        try:
            if self.prepare_run is not None:
                prepared = self.prepare_run(run)
                if inspect.isawaitable(prepared):
                    prepared = yield prepared
                if not isinstance(prepared, ScorerRun):
                    raise TypeError(f"prepare_run must return a ScorerRun, got {type(prepared).__name__}")
                run = prepared

            results = StepResults()
            # A checkpoint keeps step results as JSON: a judge's answer is validated again into
            # what its call gave; a function step's value (a set, a model) may not survive JSON,
            # so the step runs again unless no later step is left to read it or it is marked
            # plain_json (the built-in checks').
            finished = resume is not None and resume.score is not None and steps.done(resume.completed_steps)
            name: StepName
            for name in ("preprocess", "analyze"):
                step = getattr(steps, name)
                if step is None:
                    continue
                current = name
                value = _resumed(step, name, resume, finished)
                if value is _AGAIN:
                    value = yield from self._step(name, step, run, results, None, result)
                elif resume is not None:
                    _restore(result, resume, name)
                if isinstance(value, NotScorable):
                    raise value
                results = replace(results, **{f"{name}_step_result": value})
                setattr(result, f"{name}_step_result", json_ready(value))
                yield from self._completed(name, result, on_step)

            current = name = "generate_score"
            if resume is not None and name in resume.completed_steps and resume.score is not None:
                score = resume.score
                _restore(result, resume, name)
            else:
                value = yield from self._step(name, steps.generate_score, run, results, None, result)
                if isinstance(value, NotScorable):
                    raise value
                score = self._check_score(value)
            result.score = score
            if self.label is not None:
                label = self.label(score)
                result.label = well_formed(label) if isinstance(label, str) else label
            yield from self._completed(name, result, on_step)

            if steps.generate_reason is not None:
                current = name = "generate_reason"
                if resume is not None and name in resume.completed_steps:
                    # A redelivery after the last checkpoint must not pay for the reason again.
                    reason = resume.reason
                    _restore(result, resume, name)
                else:
                    reason = yield from self._step(name, steps.generate_reason, run, results, score, result)
                if isinstance(reason, NotScorable):
                    raise reason
                if reason is not None and not isinstance(reason, str):
                    raise TypeError(f"generate_reason must return a string, got {type(reason).__name__}")
                result.reason = None if reason is None else well_formed(reason)
                yield from self._completed(name, result, on_step)
        except NotScorable as signal:
            if _failed_step(current, result) is None:
                # From the on_step callback, which is no step (a checkpoint hook): its failure, as
                # any other exception from it, not the end of the run "at" the step it followed,
                # whose score was dropped.
                raise self._run_error(signal, current, None, result) from signal
            # Raised from a local of this frame (``value``), so the frame and the exception held
            # each other, and the run's input with them, until a cyclic collection: workers
            # collect rarely (worker/_gc.py), and not-scorable runs of 16 MB piled up by the
            # gigabyte. A run's end, not an error: its traceback says nothing.
            signal.__traceback__ = None
            result.score = None
            result.not_scorable = {"step": current, "reason": well_formed(signal.reason)}
        except SystemExit as exc:
            # Not this run's to wrap (the process or its thread may be ending), but a caller that
            # makes it the run's failure (the worker) names the step and keeps what it spent.
            exc.failed_step, exc.partial = _failed_step(current, result), result  # type: ignore[attr-defined]
            raise
        except _PROCESS_EXITS:
            raise
        except BaseException as exc:
            failed_step = _failed_step(current, result)
            execution = getattr(exc, "execution", None)
            if isinstance(execution, JudgeExecution) and failed_step is not None and failed_step != "prepare_run":
                result.judge[failed_step] = execution
            if isinstance(exc, asyncio.CancelledError) and _being_cancelled():
                # The run itself is cancelled (its timeout, a shutdown): not the step's error.
                # What its steps spent, the one cut short too, goes with it as ``partial``.
                exc.partial = result  # type: ignore[attr-defined]
                raise
            # (else the step's own: a CancelledError from awaiting a task it cancelled, or a
            # BaseException of its own; a run ended by either left no record, or took the
            # command down with a traceback quoting the run)
            raise self._run_error(exc, current, failed_step, result) from exc
        return result

    def _run_error(
        self,
        exc: BaseException,
        current: StepName | Literal["prepare_run"],
        failed_step: StepName | Literal["prepare_run"] | None,
        result: ScoreResult,
    ) -> ScorerRunError:
        """The run's failure: ``exc`` in step ``current``, or (``failed_step`` None) in the
        ``on_step`` callback after it."""
        if failed_step is None:
            what = f"scorer {self.id!r}: the on_step callback after step {current} failed"
        else:
            what = f"scorer {self.id!r} failed in step {current}"
        return ScorerRunError(
            f"{what}: {type(exc).__name__}: {exc}",
            scorer_id=self.id,
            failed_step=failed_step,
            completed_steps=tuple(result.completed_steps),
            partial=result,
            # A scorer run inside a step (checks.all_of) failed: keep its original cause, so
            # retry policies still see e.g. the judge's 429 rather than a wrapper.
            cause=exc.cause if isinstance(exc, ScorerRunError) else exc,
        )

    @staticmethod
    def _completed(name: StepName, result: ScoreResult, on_step: OnStep | None) -> Generator[Awaitable[Any], Any, None]:
        # Appended before the callback runs: a failure from here on is the callback's (_failed_step).
        result.completed_steps.append(name)
        if on_step is not None:
            pending = on_step(result)
            if pending is not None and inspect.isawaitable(pending):
                yield pending

    def _step(
        self,
        name: StepName,
        step: Step,
        run: ScorerRun,
        results: StepResults,
        score: float | None,
        result: ScoreResult,
    ) -> Generator[Awaitable[Any], Any, Any]:
        kwargs: dict[str, Any] = {"run": run, "results": results}
        if name == "generate_reason":
            kwargs["score"] = score
        if isinstance(step, FunctionStep):
            value = call_declared(step.fn, step.params, kwargs)
            if inspect.isawaitable(value):
                value = yield value
            return value

        prompt = step.render_prompt(kwargs)
        if inspect.isawaitable(prompt):
            prompt = yield prompt
        if isinstance(prompt, NotScorable):
            return prompt
        if not isinstance(prompt, str):
            raise TypeError(f"create_prompt must return a string, got {type(prompt).__name__}")
        setattr(result, f"{name}_prompt", well_formed(prompt))
        schema = step.output_schema
        if name == "generate_score" and schema is None:
            schema = _SCORE_SCHEMA
            if step.calculate_score is None and self.score_range is not None:
                # The answer is the score: a judge's 7 on a 0-1 scale is an answer that does not
                # fit (one fallback call, then JudgeOutputError), not a bug in the scorer.
                low, high = self.score_range
                schema = {**schema, "properties": {"score": {"type": "number", "minimum": low, "maximum": high}}}
        answer = yield ask_judge(
            scorer_id=self.id, step=name, judge=self._judges[name], prompt=prompt, output_schema=schema
        )
        result.judge[name] = answer.execution
        value = answer.value
        if name != "generate_score":
            return value
        if step.calculate_score is not None:
            computed = step.compute_score(
                {
                    "run": run,
                    "results": results,
                    "analyze_step_result": results.analyze_step_result,
                    "judge_output": value,
                }
            )
            if inspect.isawaitable(computed):
                computed = yield computed
            return computed
        if isinstance(value, Mapping):
            if "score" in value:
                return value["score"]
        elif hasattr(value, "score"):
            return value.score
        raise TypeError(
            f"the judge's answer has no 'score' field ({type(value).__name__}); give the PromptStep "
            "a calculate_score that maps its output_schema's answer to a number"
        )

    def _check_score(self, value: Any) -> float:
        where = f"scorer {self.id!r} generate_score"
        # (any real number: numpy's and Fraction register as numbers.Real; Decimal does not)
        if isinstance(value, bool) or not isinstance(value, numbers.Real | decimal.Decimal):
            raise TypeError(f"{where} must yield a number, got {type(value).__name__}: {value!r:.80}")
        score = float(value)
        if not math.isfinite(score):
            raise ValueError(f"{where} must yield a finite number, got {score}")
        if self.score_range is not None and not self.score_range[0] <= score <= self.score_range[1]:
            raise ValueError(f"{where} yielded {score}, outside the declared range {self.score_range}")
        return score

    def _coerce(self, value: Any, which: Literal["input", "output"]) -> Any:
        if self.type is None:
            return value
        if self.type == "agent":
            model: Any = ScorerRunInputForAgent if which == "input" else ScorerRunOutputForAgent
        else:
            model = self.type[0] if which == "input" else self.type[1]
        try:
            if model is ScorerRunOutputForAgent:
                return ScorerRunOutputForAgent.validate(value)
            return value if isinstance(value, model) else model.model_validate(value)
        except ValidationError as exc:
            raise RunInputError(
                f"scorer {self.id!r}: run {which} is not a valid {model.__name__}: "
                + "; ".join(_describe(e) for e in exc.errors()[:5])
            ) from exc


def create_scorer(
    id: str,
    *,
    name: str | None = None,
    description: str = "",
    judge: Judge | None = None,
    type: ScorerType = None,
    prepare_run: PrepareRun | None = None,
    version: str = "1",
    score_range: tuple[float, float] | None = None,
    direction: Direction = "higher",
    label: Callable[[float], str | None] | None = None,
) -> Scorer:
    """Start a scorer; chain ``.preprocess/.analyze/.generate_score/.generate_reason`` on it.

    ``version`` goes into score ids: bump it when the scorer's logic changes so backfills
    score again. ``score_range`` (if given) is enforced; ``label`` maps a score to a label.
    """
    if not isinstance(id, str) or not id.strip():
        raise ScorerConfigError("create_scorer needs an id: a non-empty string")
    if (
        type is not None
        and type != "agent"
        and not (
            isinstance(type, tuple)
            and len(type) == 2
            and all(isinstance(t, builtins_type) and issubclass(t, BaseModel) for t in type)
        )
    ):
        raise ScorerConfigError(
            f"scorer {id!r}: type must be 'agent', an (InputModel, OutputModel) pair of pydantic models, "
            f"or None; got {type!r}"
        )
    if judge is not None and not isinstance(judge, Judge):
        raise ScorerConfigError(f"scorer {id!r}: judge must be a Judge, got {builtins_type(judge).__name__}")
    if direction not in ("higher", "lower"):
        raise ScorerConfigError(f"scorer {id!r}: direction must be 'higher' or 'lower', got {direction!r}")
    if prepare_run is not None and not callable(prepare_run):
        raise ScorerConfigError(f"scorer {id!r}: prepare_run must be callable")
    if label is not None and not callable(label):
        raise ScorerConfigError(f"scorer {id!r}: label must be a function of the score, got {label!r}")
    if score_range is not None:
        score_range = _check_range(id, score_range)
    return Scorer(
        id=id,
        name=name or id,
        description=description,
        judge=judge,
        type=type,
        prepare_run=prepare_run,
        version=str(version),
        score_range=score_range,
        direction=direction,
        label=label,
        steps=_Steps(),
    )


builtins_type = type


def _check_range(scorer_id: str, score_range: Any) -> tuple[float, float]:
    """``(low, high)`` as given; checked when the scorer is built, not at the first run."""
    bounds = tuple(score_range) if isinstance(score_range, tuple | list) else ()
    if len(bounds) == 2 and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds):
        low, high = bounds
        if math.isfinite(low) and math.isfinite(high) and low <= high:
            return low, high
    raise ScorerConfigError(
        f"scorer {scorer_id!r}: score_range must be (low, high) with finite numbers low <= high, got {score_range!r}"
    )


def _context(request_context: Any, runtime_context: Any) -> Any:
    return request_context if request_context is not None else runtime_context


def _describe(error: Any) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ())) or "(root)"
    return f"{loc}: {error.get('msg')}"


# What ends the process (or a thread, as the loop's watchdog does with a SystemExit): never
# recorded here as a step's failure. A caller that runs steps on a thread of its own may make a
# step's SystemExit the run's failure, as the worker does (only that thread would end).
_PROCESS_EXITS = (KeyboardInterrupt, SystemExit, GeneratorExit)
# What the drivers raise at once rather than hand back to the flow: a SystemExit goes back, so
# that the flow tags it with its step before it goes on up.
_NOT_THE_STEPS = (KeyboardInterrupt, GeneratorExit)


def _failed_step(
    current: StepName | Literal["prepare_run"], result: ScoreResult
) -> StepName | Literal["prepare_run"] | None:
    """The step a failure in ``current`` belongs to: None once ``current`` is among the completed
    steps, where only the ``on_step`` callback after it (``Scorer._completed``) still runs, and
    what failed is the callback, not the step."""
    return None if current in result.completed_steps else current


def _being_cancelled() -> bool:
    """Whether the task running this code is being cancelled (not merely handed a
    CancelledError by a step that awaited a task of its own it had cancelled)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: nothing here can be cancelled
        return False
    return task is not None and task.cancelling() > 0


_AGAIN: Any = object()  # _resumed: the step must run again


def _resumed(step: Step, name: StepName, resume: ScoreResult | None, finished: bool) -> Any:
    """A completed step's result from the checkpoint ``resume``, or ``_AGAIN``."""
    if resume is None or name not in resume.completed_steps:
        return _AGAIN
    stored = getattr(resume, f"{name}_step_result")
    if finished or (isinstance(step, FunctionStep) and step.plain_json):
        return stored  # read by nothing (every later step is in the checkpoint too), or exact
    if not isinstance(step, PromptStep):
        return _AGAIN
    try:
        return step.restore(stored)
    except ValueError:  # it no longer fits the schema, or its validation changes it: ask again
        return _AGAIN


def _restore(result: ScoreResult, resume: ScoreResult, step: StepName) -> None:
    prompt = getattr(resume, f"{step}_prompt")
    if prompt is not None:
        setattr(result, f"{step}_prompt", prompt)
    if step in resume.judge:
        result.judge[step] = resume.judge[step]


_local = threading.local()
_loops: list[asyncio.AbstractEventLoop] = []
_loops_lock = threading.Lock()


@atexit.register
def _close_thread_loops() -> None:
    """Close run_sync's loops at exit (after their async generators), so nothing leaks a warning."""
    with _loops_lock:
        loops, _loops[:] = list(_loops), []
    for loop in loops:
        if not loop.is_closed() and not loop.is_running():
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """One event loop per thread for ``run_sync``, reused across calls (judge clients live on it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("Scorer.run_sync was called inside a running event loop; use `await scorer.run(...)`")
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
        with _loops_lock:
            _loops.append(loop)
    return loop
