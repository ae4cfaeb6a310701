"""create_scorer and the step pipeline."""

from __future__ import annotations

import asyncio
import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy
import pytest
from pydantic import BaseModel

from scorers import (
    Judge,
    NotScorable,
    PromptStep,
    RunInputError,
    ScorerConfigError,
    ScoreResult,
    ScorerRun,
    ScorerRunError,
    StepResults,
    create_scorer,
    not_scorable,
)
from scorers.judge.testing import FakeJudgeModel


def _overlap_scorer() -> Any:
    return (
        create_scorer("overlap", description="shared words")
        .preprocess(lambda run: (set(run.input.split()), set(run.output.split())))
        .analyze(lambda results: len(results.preprocess_step_result[0] & results.preprocess_step_result[1]))
        .generate_score(lambda results: results.analyze_step_result / len(results.preprocess_step_result[0]))
        .generate_reason(lambda score, results: f"{results.analyze_step_result} shared, {score:.2f}")
    )


def test_create_scorer_requires_id() -> None:
    """A missing or blank id is rejected when the scorer is created."""
    with pytest.raises(ScorerConfigError, match="needs an id"):
        create_scorer("")
    with pytest.raises(TypeError):
        create_scorer()  # type: ignore[call-arg]


def test_name_defaults_to_id() -> None:
    """name falls back to id; an explicit name is kept."""
    assert create_scorer("abc").name == "abc"
    assert create_scorer("abc", name="Nice").name == "Nice"


def test_step_methods_return_new_scorers() -> None:
    """Adding a step leaves the original scorer unchanged."""
    base = create_scorer("s")
    with_score = base.generate_score(lambda: 1.0)
    assert with_score is not base
    with pytest.raises(ScorerConfigError, match="no generate_score"):
        base.run_sync(input="a", output="b")
    assert with_score.run_sync(input="a", output="b").score == 1.0
    with pytest.raises(AttributeError, match="immutable"):
        base.name = "x"  # type: ignore[misc]


def test_steps_run_in_order_and_see_previous_results() -> None:
    """Each step sees the results of the steps before it; the result carries them all."""
    result = _overlap_scorer().run_sync(input="a b c d", output="b d x", run_id="r1")
    assert result.run_id == "r1"
    assert result.scorer_id == "overlap"
    assert result.analyze_step_result == 2
    assert result.score == 0.5
    assert result.reason == "2 shared, 0.50"
    assert sorted(result.preprocess_step_result[0]) == ["a", "b", "c", "d"]
    assert result.completed_steps == ["preprocess", "analyze", "generate_score", "generate_reason"]
    assert (
        result.preprocess_prompt,
        result.analyze_prompt,
        result.generate_score_prompt,
        result.generate_reason_prompt,
    ) == (None,) * 4
    assert result.judge == {}
    assert result.not_scorable is None


def test_missing_generate_score_raises_before_any_step() -> None:
    """No step runs when generate_score is missing."""
    calls: list[str] = []
    scorer = create_scorer("s").preprocess(lambda: calls.append("pre"))
    with pytest.raises(ScorerConfigError, match="'s' has no generate_score"):
        scorer.run_sync(input=1, output=2)
    assert calls == []


def test_async_and_sync_steps_mix() -> None:
    """Async step functions are awaited, sync ones called, in both drivers."""

    async def analyze(results: StepResults) -> int:
        await asyncio.sleep(0)
        return int(results.preprocess_step_result) * 2

    async def reason(score: float) -> str:
        return f"score={score}"

    scorer = (
        create_scorer("mix")
        .preprocess(lambda run: len(run.output))
        .analyze(analyze)
        .generate_score(lambda results: results.analyze_step_result / 10)
        .generate_reason(reason)
    )
    sync_result = scorer.run_sync(input="", output="abcd")
    async_result = asyncio.run(scorer.run(input="", output="abcd"))
    assert sync_result.score == async_result.score == 0.8
    assert sync_result.reason == "score=0.8"


def test_run_sync_inside_running_loop_is_an_error() -> None:
    """run_sync refuses to block a running event loop when it would need one."""

    async def step() -> float:
        return 1.0

    scorer = create_scorer("s").generate_score(step)

    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await scorer\.run"):
            scorer.run_sync(input=1, output=2)

    asyncio.run(main())


def test_step_receives_only_declared_arguments() -> None:
    """A step gets only the keyword arguments it declares; **kwargs gets all."""
    seen: dict[str, Any] = {}

    def score_all(**kwargs: Any) -> float:
        seen["score"] = set(kwargs)
        return 0.0

    def reason_only_score(score: float) -> str:
        seen["reason"] = score
        return "ok"

    scorer = create_scorer("s").generate_score(score_all).generate_reason(reason_only_score)
    scorer.run_sync(input=1, output=2)
    assert seen == {"score": {"run", "results"}, "reason": 0.0}


def test_step_declaring_unknown_required_parameter_is_rejected() -> None:
    """A required parameter that is never passed fails when the step is added, naming it."""
    with pytest.raises(ScorerConfigError, match=r"'context'.*may declare: results, run"):
        create_scorer("s").generate_score(lambda context: 1.0)
    with pytest.raises(ScorerConfigError, match="'score'"):
        create_scorer("s").analyze(lambda score: 1)


def test_run_context_and_ids() -> None:
    """run exposes input, output, run_id, ground_truth and request_context (runtime_context alias)."""
    captured: list[ScorerRun] = []
    scorer = create_scorer("s").generate_score(lambda run: captured.append(run) or 1.0)
    scorer.run_sync(input="i", output="o", ground_truth="g", runtime_context={"tenant": "t1"})
    scorer.run_sync(input="i", output="o", request_context={"tenant": "t2"})
    first, second = captured
    assert (first.input, first.output, first.ground_truth) == ("i", "o", "g")
    assert first.request_context == {"tenant": "t1"}
    assert second.request_context == {"tenant": "t2"}
    assert first.run_id != second.run_id
    assert len(first.run_id) == 36  # a uuid4


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, "0.5", True, [1]])
def test_generate_score_must_be_a_finite_number(bad: Any) -> None:
    """Anything but a finite number fails the run, naming the scorer and the step."""
    scorer = create_scorer("strict").generate_score(lambda: bad)
    with pytest.raises(ScorerRunError, match="scorer 'strict' failed in step generate_score") as info:
        scorer.run_sync(input=1, output=2)
    assert info.value.failed_step == "generate_score"
    assert "generate_score" in str(info.value.cause)


def test_score_range_is_enforced() -> None:
    """A declared score range rejects scores outside it."""
    scorer = create_scorer("r", score_range=(0, 1)).generate_score(lambda run: run.output)
    assert scorer.run_sync(input=0, output=1).score == 1.0
    with pytest.raises(ScorerRunError, match=r"outside the declared range \(0, 1\)"):
        scorer.run_sync(input=0, output=1.5)


def test_failing_step_reports_partial_result() -> None:
    """A failing step raises ScorerRunError with failed_step, completed_steps and partial results."""

    def boom(results: StepResults) -> float:
        raise KeyError("missing")

    scorer = create_scorer("f").preprocess(lambda: {"a": 1}).analyze(lambda: 7).generate_score(boom)
    with pytest.raises(ScorerRunError) as info:
        scorer.run_sync(input=1, output=2, run_id="rid")
    err = info.value
    assert err.failed_step == "generate_score"
    assert err.completed_steps == ("preprocess", "analyze")
    assert err.partial.preprocess_step_result == {"a": 1}
    assert err.partial.analyze_step_result == 7
    assert err.partial.score is None
    assert err.partial.run_id == "rid"
    assert isinstance(err.cause, KeyError)
    assert err.error_type == "KeyError"


def test_failing_reason_keeps_the_score_in_partial() -> None:
    """When generate_reason fails the partial result still has the score."""

    def bad_reason() -> str:
        raise ValueError("nope")

    with pytest.raises(ScorerRunError) as info:
        create_scorer("f").generate_score(lambda: 0.25).generate_reason(bad_reason).run_sync(input=1, output=2)
    assert info.value.failed_step == "generate_reason"
    assert info.value.partial.score == 0.25


def test_reason_must_be_a_string() -> None:
    """generate_reason returning a non-string fails the run."""
    with pytest.raises(ScorerRunError, match="must return a string"):
        create_scorer("f").generate_score(lambda: 1.0).generate_reason(lambda: 3).run_sync(input=1, output=2)


@pytest.mark.parametrize("step", ["preprocess", "analyze", "generate_score", "generate_reason"])
def test_not_scorable_stops_early(step: str) -> None:
    """A step returning not_scorable ends the run with score None, not an error."""
    calls: list[str] = []

    def make(name: str, value: Any) -> Any:
        def fn() -> Any:
            calls.append(name)
            return not_scorable(f"no {name}") if name == step else value

        return fn

    scorer = (
        create_scorer("ns")
        .preprocess(make("preprocess", 1))
        .analyze(make("analyze", 2))
        .generate_score(make("generate_score", 0.5))
        .generate_reason(make("generate_reason", "why"))
    )
    result = scorer.run_sync(input=1, output=2)
    assert result.score is None
    assert result.not_scorable == {"step": step, "reason": f"no {step}"}
    assert calls[-1] == step


def test_not_scorable_may_be_raised() -> None:
    """Raising the signal works like returning it."""

    def pre() -> None:
        raise not_scorable("empty output")

    result = create_scorer("ns").preprocess(pre).generate_score(lambda: 1.0).run_sync(input=1, output=2)
    assert result.not_scorable == {"step": "preprocess", "reason": "empty output"}


def test_prepare_run_sync_and_async() -> None:
    """prepare_run transforms the run before any step; it may be async."""

    async def upper(run: ScorerRun) -> ScorerRun:
        return run.replace(output=run.output.upper())

    sync = create_scorer("p", prepare_run=lambda run: run.replace(output=run.output * 2)).generate_score(
        lambda run: len(run.output)
    )
    assert sync.run_sync(input="", output="ab").score == 4
    asynchronous = create_scorer("p", prepare_run=upper).generate_score(lambda run: float(run.output == "AB"))
    assert asyncio.run(asynchronous.run(input="", output="ab")).score == 1.0


def test_prepare_run_must_return_a_run() -> None:
    """A prepare_run returning something else fails clearly."""
    scorer = create_scorer("p", prepare_run=lambda run: {"output": 1}).generate_score(lambda: 1.0)  # type: ignore[arg-type,return-value]
    with pytest.raises(ScorerRunError, match="prepare_run must return a ScorerRun") as info:
        scorer.run_sync(input=1, output=2)
    assert info.value.failed_step == "prepare_run"
    assert info.value.completed_steps == ()


def test_custom_model_pair_types_the_run() -> None:
    """A (InputModel, OutputModel) pair validates and coerces input and output."""

    class Question(BaseModel):
        query: str
        context: list[str]

    class Answer(BaseModel):
        answer: str
        confidence: float

    scorer = create_scorer("typed", type=(Question, Answer)).generate_score(lambda run: run.output.confidence)
    assert (
        scorer.run_sync(input={"query": "q", "context": []}, output={"answer": "a", "confidence": "0.75"}).score == 0.75
    )
    with pytest.raises(RunInputError, match="run output is not a valid Answer: confidence"):
        scorer.run_sync(input={"query": "q", "context": []}, output={"answer": "a"})


def test_bad_type_is_rejected() -> None:
    """type must be 'agent', a model pair or None."""
    with pytest.raises(ScorerConfigError, match="type must be 'agent'"):
        create_scorer("t", type="workflow")  # type: ignore[arg-type]


def test_result_round_trips_through_json() -> None:
    """A ScoreResult serialises to JSON and back without loss."""

    class Stats(BaseModel):
        words: int

    scorer = (
        create_scorer("rt")
        .preprocess(lambda: Stats(words=3))
        .analyze(lambda: {"tuple": (1, 2), "nested": [{"x": None}]})
        .generate_score(lambda: 0.125)
        .generate_reason(lambda: "fine")
    )
    result = scorer.run_sync(input="a", output="b", run_id="x")
    text = result.model_dump_json()
    again = ScoreResult.model_validate_json(text)
    assert again == result
    assert json.loads(text)["preprocess_step_result"] == {"words": 3}
    assert again.analyze_step_result == {"tuple": [1, 2], "nested": [{"x": None}]}


def test_resume_skips_completed_steps_and_on_step_reports_progress() -> None:
    """A checkpoint's completed steps are not run again (a function step only when a step after it
    runs); on_step sees each step complete."""
    calls: list[str] = []
    checkpoints: list[list[str]] = []
    scorer = (
        create_scorer("cp")
        .preprocess(lambda: calls.append("pre") or 1)
        .generate_score(lambda: calls.append("score") or 0.5)
        .generate_reason(lambda score: calls.append("reason") or f"{score}")
    )
    full = scorer.run_sync(input=1, output=2, run_id="r", on_step=lambda r: checkpoints.append(list(r.completed_steps)))
    assert checkpoints == [
        ["preprocess"],
        ["preprocess", "generate_score"],
        ["preprocess", "generate_score", "generate_reason"],
    ]
    checkpoint = full.model_copy(update={"completed_steps": ["preprocess", "generate_score"], "reason": None})
    calls.clear()
    resumed = scorer.run_sync(input=1, output=2, resume=checkpoint)
    # A function step runs again when a later step reads it (its value may not survive JSON).
    assert calls == ["pre", "reason"]
    assert resumed.score == 0.5
    assert resumed.reason == "0.5"
    assert resumed.run_id == "r"
    calls.clear()
    again = scorer.run_sync(input=1, output=2, resume=full)
    assert calls == []
    assert (again.score, again.reason, again.completed_steps) == (0.5, "0.5", full.completed_steps)


@pytest.mark.parametrize("bad", [(1, 0), (0,), (0, math.inf), ("0", "1"), 1.0])
def test_bad_score_range_is_rejected_when_built(bad: Any) -> None:
    """A score_range that is not (low, high) finite numbers with low <= high fails create_scorer."""
    with pytest.raises(ScorerConfigError, match="score_range must be"):
        create_scorer("r", score_range=bad)


def test_label_must_be_callable() -> None:
    """A label that is not a function fails create_scorer."""
    with pytest.raises(ScorerConfigError, match="label must be a function"):
        create_scorer("r", label="good")  # type: ignore[arg-type]


def test_prompt_declaring_score_outside_generate_reason_is_rejected() -> None:
    """Only generate_reason's create_prompt receives 'score'; elsewhere it fails when added."""
    step = PromptStep("p", lambda score: f"{score}", output_schema={"type": "object"})
    with pytest.raises(ScorerConfigError, match=r"declares 'score'.*analyze"):
        create_scorer("s").analyze(step)
    create_scorer("s").generate_reason(PromptStep("r", lambda score: f"{score}"))


def test_score_answer_without_score_field_names_the_fix() -> None:
    """A generate_score judge answer with no 'score' field fails saying to add calculate_score."""
    model = FakeJudgeModel({"verdict": "good"})
    step = PromptStep("s", lambda: "score it", output_schema={"type": "object", "properties": {"verdict": {}}})
    scorer = create_scorer("s", judge=Judge(model)).generate_score(step)
    with pytest.raises(ScorerRunError, match=r"no 'score' field.*calculate_score"):
        scorer.run_sync(input=1, output=2)


def test_unusable_output_schema_is_rejected_when_built() -> None:
    """A PromptStep output_schema pydantic cannot use fails at construction, not mid-run."""
    with pytest.raises(ScorerConfigError, match="output_schema must be a pydantic model"):
        PromptStep("p", lambda: "p", output_schema=42)  # type: ignore[arg-type]
    PromptStep("p", lambda: "p", output_schema=list[str] | None)


def test_nested_scorer_failure_keeps_the_original_cause() -> None:
    """A scorer that fails inside another scorer's step leaves the original error as .cause."""

    def boom() -> float:
        raise ConnectionError("judge unreachable")

    inner = create_scorer("inner").generate_score(boom)

    async def outer_step(run: ScorerRun) -> float:
        return (await inner.run(input=run.input, output=run.output)).score or 0.0

    outer = create_scorer("outer").generate_score(outer_step)
    with pytest.raises(ScorerRunError, match=r"'outer' failed in step generate_score.*'inner'") as info:
        outer.run_sync(input=1, output=2)
    assert isinstance(info.value.cause, ConnectionError)
    assert info.value.error_type == "ConnectionError"
    assert isinstance(info.value.__cause__, ScorerRunError)


def test_scorer_copies_to_itself() -> None:
    """An immutable scorer survives copy/deepcopy (as part of a copied config)."""
    import copy

    scorer = create_scorer("c", judge=Judge("openai/gpt-4o-mini")).generate_score(lambda: 1.0)
    assert copy.deepcopy({"scorer": scorer})["scorer"] is scorer
    assert copy.copy(scorer) is scorer


def test_not_scorable_reason_is_optional() -> None:
    """As in Mastra, not_scorable() needs no reason; the result says none was given."""
    result = (
        create_scorer("ns").preprocess(lambda: not_scorable()).generate_score(lambda: 1.0).run_sync(input=1, output=2)
    )
    assert result.score is None
    assert result.not_scorable == {"step": "preprocess", "reason": "no reason given"}
    with pytest.raises(TypeError, match="string or nothing"):
        not_scorable(42)  # type: ignore[arg-type]


class _Claims(BaseModel):
    claims: list[str]


def _checkpoint_after(scorer: Any, step: str, **kwargs: Any) -> ScoreResult:
    """The checkpoint a worker stores after ``step`` (JSON in Redis), the worker then dying."""

    class Died(SystemExit):  # (the process going down: a step's own BaseException is its failure)
        pass

    stored: list[str] = []

    def on_step(partial: ScoreResult) -> None:
        stored.append(partial.model_dump_json())
        if partial.completed_steps[-1] == step:
            raise Died

    with pytest.raises(Died):
        scorer.run_sync(**kwargs, on_step=on_step)
    return ScoreResult.model_validate_json(stored[-1])


def test_a_resumed_judge_step_gives_later_steps_the_validated_answer_again() -> None:
    """A redelivery resumed from a checkpoint handed later steps the judge's answer as the JSON
    the checkpoint kept: a dict where the README promises the validated model, so a scorer
    written as the README shows failed (AttributeError, internal) on every redelivery."""
    first = FakeJudgeModel({"claims": ["Paris is the capital"]})
    scorer = (
        create_scorer("grounded", judge=Judge(first))
        .preprocess(PromptStep("claims", lambda run: f"claims of {run.output}", output_schema=_Claims))
        .generate_score(lambda results: len(results.preprocess_step_result.claims) / 2)
    )
    checkpoint = _checkpoint_after(scorer, "preprocess", input="q", output="Paris", run_id="r")
    assert checkpoint.preprocess_step_result == {"claims": ["Paris is the capital"]}
    resumed = scorer.run_sync(input="q", output="Paris", resume=checkpoint)
    assert resumed.score == 0.5
    assert len(first.requests) == 1  # the paid answer is not asked for again
    assert resumed.judge["preprocess"] == checkpoint.judge["preprocess"]


def test_a_function_step_whose_value_json_cannot_keep_runs_again_on_resume() -> None:
    """The README's overlap scorer keeps sets: resumed after preprocess, its analyze got a list
    (TypeError: list & set, internal). Its steps run again; the judge step's answer is kept."""
    judge = FakeJudgeModel({"claims": ["a"]})
    calls: list[str] = []

    def words(run: ScorerRun) -> set[str]:
        calls.append("words")
        return set(run.input.split())

    scorer = (
        create_scorer("overlap", judge=Judge(judge))
        .preprocess(words)
        .analyze(PromptStep("claims", lambda run: "claims", output_schema=_Claims))
        .generate_score(
            lambda run, results: (
                len(results.preprocess_step_result & set(run.output.split())) / len(results.preprocess_step_result)
            )
        )
    )
    kwargs: dict[str, Any] = {"input": "a b c d", "output": "a b", "run_id": "r"}
    checkpoint = _checkpoint_after(scorer, "analyze", **kwargs)
    assert sorted(checkpoint.preprocess_step_result) == ["a", "b", "c", "d"]  # a list now
    calls.clear()
    resumed = scorer.run_sync(**kwargs, resume=checkpoint)
    assert (resumed.score, calls, len(judge.requests)) == (0.5, ["words"], 1)


def test_a_checkpointed_answer_that_no_longer_fits_the_schema_is_asked_again() -> None:
    """A checkpoint kept by a version whose schema differed: the step asks the judge again
    instead of failing every redelivery."""
    judge = FakeJudgeModel({"claims": ["x", "y"]})
    scorer = (
        create_scorer("c", judge=Judge(judge))
        .preprocess(PromptStep("claims", lambda run: "claims", output_schema=_Claims))
        .generate_score(lambda results: len(results.preprocess_step_result.claims) / 4)
    )
    stale = ScoreResult(
        run_id="r", scorer_id="c", completed_steps=["preprocess"], preprocess_step_result={"verdicts": []}
    )
    resumed = scorer.run_sync(input="q", output="a", resume=stale)
    assert (resumed.score, len(judge.requests)) == (0.5, 1)


def test_a_checkpointed_answer_whose_validation_does_not_give_it_back_is_asked_again() -> None:
    """A validator that rescales (a 0-10 answer kept as 0-1) turned the stored 0.8 into 0.08 on
    resume, scored silently. Validating the stored answer must give it back, or the judge is
    asked again."""
    from pydantic import field_validator

    class Rating(BaseModel):
        value: float

        @field_validator("value")
        @classmethod
        def _tenths(cls, v: float) -> float:
            return v / 10

    judge = FakeJudgeModel({"value": 8}, {"value": 8})
    scorer = (
        create_scorer("rated", judge=Judge(judge))
        .analyze(PromptStep("rate", lambda run: "rate it 0-10", output_schema=Rating))
        .generate_score(lambda results: results.analyze_step_result.value)
    )
    checkpoint = _checkpoint_after(scorer, "analyze", input="q", output="a", run_id="r")
    assert checkpoint.analyze_step_result == {"value": 0.8}
    resumed = scorer.run_sync(input="q", output="a", resume=checkpoint)
    assert (resumed.score, len(judge.requests)) == (0.8, 2)


def test_all_of_is_not_paid_again_on_resume() -> None:
    """all_of runs its scorers inside a function step, which a resumed run ran again: its judge
    scorer was paid a second time, and the reason contradicted the checkpointed score. Its value
    is plain JSON, so the checkpoint's is taken."""
    from scorers.builtin import checks

    judge = FakeJudgeModel({"score": 1.0})
    judged = create_scorer("judged", judge=Judge(judge), score_range=(0, 1)).generate_score(
        PromptStep("score", lambda run: "score it")
    )
    combined = checks.all_of(judged, checks.includes("a"))
    checkpoint = _checkpoint_after(combined, "generate_score", input="q", output="a", run_id="r")
    resumed = combined.run_sync(input="q", output="a", resume=checkpoint)
    assert (resumed.score, len(judge.requests)) == (1.0, 1)
    assert resumed.reason is not None
    assert resumed.reason.startswith("2 of 2 checks passed")


def test_an_older_checkpoint_or_a_set_field_is_not_asked_again() -> None:
    """The check that validation gives the answer back compared it with the stored JSON: a field
    with a default added since, or a set (whose order differs from process to process), made the
    step pay again. Validation must be stable instead."""

    class Topics(BaseModel):
        topics: set[str]
        confident: bool = True  # added after the checkpoint was kept

    judge = FakeJudgeModel()
    scorer = (
        create_scorer("t", judge=Judge(judge))
        .analyze(PromptStep("topics", lambda run: "topics", output_schema=Topics))
        .generate_score(lambda results: len(results.analyze_step_result.topics) / 4)
    )
    older = ScoreResult(
        run_id="r",
        scorer_id="t",
        completed_steps=["analyze"],
        analyze_step_result={"topics": ["refund", "billing", "tone", "delay"]},  # as another process ordered it
    )
    resumed = scorer.run_sync(input="q", output="a", resume=older)
    assert (resumed.score, judge.requests) == (1.0, [])


def test_a_result_holding_lone_surrogates_or_non_finite_numbers_reads_back_from_its_json() -> None:
    """Agent text with a lone surrogate (a truncated emoji) reached a step result, a key, the
    prompt, the reason, the label and a not-scorable reason as it was: `model_dump_json` raised
    (`score --json` ended, losing every later run), and a dict key holding one failed the run
    with a bare UnicodeEncodeError. NaN and infinities were written as null and read back as
    None, so the README's "serialises to JSON and back without loss" did not hold."""
    text = "half an emoji \ud83d"
    judge = FakeJudgeModel({"verdict": "fine"}, default_text=f"because {text}")
    scorer = (
        create_scorer("hostile", judge=Judge(judge), label=lambda score: f"band {text}")
        .preprocess(lambda run: {"ratio": math.nan, "max": math.inf, text: [text, -math.inf], "words": {text}})
        .analyze(PromptStep("analyze", lambda run: f"Judge this: {run.output}", output_schema={"type": "object"}))
        .generate_score(lambda results: 0.5)
        .generate_reason(PromptStep("reason", lambda run: f"Why? {run.output}"))
    )
    result = scorer.run_sync(input="q", output=text, run_id=f"run {text}")
    fixed = "half an emoji \ufffd"
    assert result.preprocess_step_result == {"ratio": None, "max": None, fixed: [fixed, None], "words": [fixed]}
    assert result.analyze_prompt == f"Judge this: {fixed}"
    assert result.generate_reason_prompt == f"Why? {fixed}"
    assert result.reason == f"because {fixed}"
    assert result.label == f"band {fixed}"
    assert result.run_id == f"run {fixed}"
    assert ScoreResult.model_validate_json(result.model_dump_json()) == result

    stopped = (
        create_scorer("stops")
        .preprocess(lambda run: not_scorable(f"nothing to read {text}"))
        .generate_score(lambda results: 1.0)
        .run_sync(input="q", output="a")
    )
    assert stopped.not_scorable == {"step": "preprocess", "reason": f"nothing to read {fixed}"}
    assert ScoreResult.model_validate_json(stopped.model_dump_json()) == stopped


def test_a_run_id_that_is_not_text_is_a_run_input_error_naming_the_scorer() -> None:
    """It was pydantic's ValidationError for ScoreResult, outside the scorer error tree."""
    with pytest.raises(RunInputError, match="scorer 'overlap': run_id must be a string, got int"):
        _overlap_scorer().run_sync(input="a", output="b", run_id=5)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(Fraction(1, 4), 0.25), (Decimal("0.5"), 0.5), (numpy.float32(0.75), 0.75), (numpy.int64(1), 1.0)],
    ids=["Fraction", "Decimal", "numpy.float32", "numpy.int64"],
)
def test_generate_score_takes_any_real_number(value: Any, expected: float) -> None:
    """A numpy or exact number was refused as 'must yield a number' (np.float64 alone passed,
    being a float)."""
    result = create_scorer("n").generate_score(lambda results: value).run_sync(input="a", output="b")
    assert result.score == expected
    assert type(result.score) is float


def test_generate_score_still_refuses_a_decimal_that_is_not_finite() -> None:
    with pytest.raises(ScorerRunError, match="must yield a finite number"):
        create_scorer("n").generate_score(lambda results: Decimal("NaN")).run_sync(input="a", output="b")


def test_a_step_result_of_numpy_values_is_kept_as_plain_json() -> None:
    """numpy's scalars and arrays (a similarity step's output) failed the run: pydantic cannot
    write them (review)."""
    result = (
        create_scorer("np")
        .preprocess(lambda run: {"sim": numpy.float32(0.5), "vector": numpy.array([1.0, 2.0]), "n": numpy.int64(3)})
        .generate_score(lambda results: 0.5)
        .run_sync(input="a", output="b")
    )
    assert result.preprocess_step_result == {"sim": 0.5, "vector": [1.0, 2.0], "n": 3}
    assert ScoreResult.model_validate_json(result.model_dump_json()) == result


async def _awaits_a_task_it_cancelled() -> float:
    task = asyncio.ensure_future(asyncio.sleep(10))
    task.cancel()
    await task  # raises CancelledError into the step: its own, not the run's
    return 1.0


def test_a_steps_own_cancelled_error_is_the_steps_failure() -> None:
    """A step that awaited a task it had cancelled raised CancelledError out of the run: in a
    backfill the run left no record and counted as neither scored nor failed (log audit)."""
    scorer = create_scorer("cancels").generate_score(lambda: _awaits_a_task_it_cancelled())
    with pytest.raises(ScorerRunError, match="failed in step generate_score: CancelledError") as sync_failure:
        scorer.run_sync(input="a", output="b")
    assert sync_failure.value.failed_step == "generate_score"
    with pytest.raises(ScorerRunError, match="failed in step generate_score: CancelledError"):
        asyncio.run(scorer.run(input="a", output="b"))


def test_a_cancelled_run_is_still_cancelled() -> None:
    """The run's own cancellation (its timeout, a shutdown) stays a CancelledError."""
    started = asyncio.Event()

    async def slow() -> float:
        started.set()
        await asyncio.sleep(10)
        return 1.0

    scorer = create_scorer("slow").generate_score(lambda: slow())

    async def cancel_it() -> None:
        task = asyncio.ensure_future(scorer.run(input="a", output="b"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())


class _OwnBaseException(BaseException):
    """Some libraries derive their errors from BaseException (gevent's Timeout, trio's Cancelled)."""


def test_a_steps_own_base_exception_is_the_steps_failure() -> None:
    """It escaped the run: an embedded backfill ended with a traceback quoting the run's text
    (log audit). What ends a process still ends it."""

    def raises(error: BaseException) -> Any:
        def step(run: ScorerRun) -> float:
            raise error

        return create_scorer("own").generate_score(step)

    with pytest.raises(ScorerRunError, match="failed in step generate_score: _OwnBaseException: agent text"):
        raises(_OwnBaseException("agent text")).run_sync(input="a", output="b")
    with pytest.raises(ScorerRunError, match="_OwnBaseException"):
        asyncio.run(raises(_OwnBaseException("agent text")).run(input="a", output="b"))
    with pytest.raises(KeyboardInterrupt):
        raises(KeyboardInterrupt()).run_sync(input="a", output="b")
    with pytest.raises(SystemExit):
        raises(SystemExit(3)).run_sync(input="a", output="b")


@pytest.mark.parametrize("driver", ["run_sync", "run"])
@pytest.mark.parametrize("callback", ["sync", "async"])
def test_an_on_step_callback_failure_is_not_blamed_on_the_step_it_followed(driver: str, callback: str) -> None:
    """A callback raising after generate_score (a checkpoint with Redis down) failed the run "in
    step generate_score" with failed_step generate_score, a step that had succeeded. It is the
    callback's failure, its cause's category kept; the step stays completed, so the partial
    resumes after it."""
    calls: list[str] = []
    scorer = (
        create_scorer("cp")
        .preprocess(lambda: calls.append("pre") or 1)
        .generate_score(lambda: calls.append("score") or 0.5)
        .generate_reason(lambda score: calls.append("reason") or f"{score}")
    )

    def save(result: ScoreResult) -> None:
        if result.completed_steps[-1] == "generate_score":
            raise ConnectionError("redis down")

    async def save_async(result: ScoreResult) -> None:
        await asyncio.sleep(0)
        save(result)

    on_step = save if callback == "sync" else save_async

    def score(**kw: Any) -> ScoreResult:
        if driver == "run_sync":
            return scorer.run_sync(input=1, output=2, **kw)
        return asyncio.run(scorer.run(input=1, output=2, **kw))

    with pytest.raises(ScorerRunError) as info:
        score(on_step=on_step)
    err = info.value
    assert str(err) == "scorer 'cp': the on_step callback after step generate_score failed: ConnectionError: redis down"
    assert err.failed_step is None
    assert err.completed_steps == ("preprocess", "generate_score")
    assert (err.partial.score, err.partial.reason) == (0.5, None)
    assert isinstance(err.cause, ConnectionError)
    assert err.category == "retryable"
    assert calls == ["pre", "score"]
    calls.clear()
    assert score(resume=err.partial).reason == "0.5"
    assert calls == ["pre", "reason"]  # (generate_score not run again)


def test_a_sys_exit_in_an_on_step_callback_names_no_step() -> None:
    """A SystemExit from the callback is tagged for the worker as no step's (it named the step
    the callback followed)."""

    def exits(result: ScoreResult) -> None:
        raise SystemExit(3)

    scorer = create_scorer("exits").preprocess(lambda: 1).generate_score(lambda: 0.5)
    with pytest.raises(SystemExit) as info:
        scorer.run_sync(input=1, output=2, on_step=exits)
    assert info.value.failed_step is None  # type: ignore[attr-defined]
    assert info.value.partial.completed_steps == ["preprocess"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("driver", ["run_sync", "run"])
@pytest.mark.parametrize("callback", ["sync", "async"])
def test_not_scorable_from_an_on_step_callback_is_the_callbacks_failure(driver: str, callback: str) -> None:
    """A callback raising NotScorable after generate_score ended the run as not scorable "at step
    generate_score", the score that step had made dropped. The callback is a checkpoint hook,
    not a step: its NotScorable is its failure, as any other exception from it (no step failed,
    the score kept in the partial, which resumes after it)."""
    scorer = create_scorer("cp").generate_score(lambda: 0.5).generate_reason(lambda score: f"{score}")

    def save(result: ScoreResult) -> None:
        if result.completed_steps[-1] == "generate_score":
            raise not_scorable("the checkpoint says no")

    async def save_async(result: ScoreResult) -> None:
        await asyncio.sleep(0)
        save(result)

    on_step = save if callback == "sync" else save_async

    def score() -> ScoreResult:
        if driver == "run_sync":
            return scorer.run_sync(input=1, output=2, on_step=on_step)
        return asyncio.run(scorer.run(input=1, output=2, on_step=on_step))

    with pytest.raises(ScorerRunError) as info:
        score()
    err = info.value
    assert str(err) == (
        "scorer 'cp': the on_step callback after step generate_score failed: NotScorable: the checkpoint says no"
    )
    assert err.failed_step is None
    assert err.completed_steps == ("generate_score",)
    assert (err.partial.score, err.partial.not_scorable) == (0.5, None)
    assert isinstance(err.cause, NotScorable)
    assert scorer.run_sync(input=1, output=2, resume=err.partial).reason == "0.5"


@pytest.mark.parametrize("how", ["returned", "raised"])
def test_a_not_scorable_run_frees_its_input_without_a_cyclic_collection(how: str) -> None:
    """A step's NotScorable, returned, was raised from a local of the run's frame: the two held
    each other, and the run's input with them, until a cyclic collection, which workers make
    rarely (worker/_gc.py): in-process backfill of not-scorable runs of 16 MB each grew by 100 MB
    every half second (824 MB for 40 such runs, 234 MB now)."""
    import gc
    import weakref

    class Payload:
        pass

    def preprocess(run: Any) -> Any:
        if how == "raised":
            raise NotScorable("no text answer")
        return NotScorable("no text answer")

    scorer = create_scorer(id="x").preprocess(preprocess).generate_score(lambda run, results: 1.0)
    payload = Payload()
    freed = weakref.ref(payload)
    gc.disable()  # (only reference counting frees it, as between a worker's rare collections)
    try:
        result = scorer.run_sync(input=payload, output="answer")
        del payload
        assert result.not_scorable == {"step": "preprocess", "reason": "no text answer"}
        assert freed() is None, gc.get_referrers(freed())
    finally:
        gc.enable()
