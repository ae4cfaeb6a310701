"""Structured output through the real SDKs: injection modes, native output, the JSON fallback."""

from __future__ import annotations

import re
from typing import Any

import pytest
import structlog.testing
from pydantic import BaseModel

from scorers import Judge, PromptStep, ScorerRunError, create_scorer
from scorers.judge import JUDGE_SYSTEM_PREAMBLE, JudgeOutputError, JudgeRequest, JudgeResponse, JudgeResponseError
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import MODELS, full_scorer, run, score_scorer


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("setting", "where"),
    [("auto", "native"), (True, "system"), ("system", "system"), ("inline", "inline"), (False, "native")],
)
def test_injection_modes(fake_llm: FakeLLMServer, model: str, setting: object, where: str) -> None:
    """Each json_prompt_injection value puts the schema where it says, for both providers."""
    result = run(score_scorer(Judge(model, "Be strict.", json_prompt_injection=setting)))  # type: ignore[arg-type]
    assert result.score == 0.5
    (req,) = fake_llm.requests
    assert req.provider == model.split("/")[0]
    assert req.model == model.split("/", 1)[1]
    schema_in_system = "```json" in req.system
    schema_in_user = "```json" in req.last_user_text
    if where == "native":
        expected = "openai_json_schema" if req.provider == "openai" else "anthropic_tool"
        assert req.structured == expected
        assert (schema_in_system, schema_in_user) == (False, False)
    else:
        assert req.structured is None
        assert (schema_in_system, schema_in_user) == (where == "system", where == "inline")
    assert req.system.startswith(JUDGE_SYSTEM_PREAMBLE)
    assert "Be strict." in req.system
    assert result.judge["generate_score"].attempts[0].prompt_injection == where


def test_openai_native_schema_is_strict(fake_llm: FakeLLMServer) -> None:
    """OpenAI strict mode gets closed objects with every property required."""
    schema = {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}, "note": {"type": "string"}},
        "required": ["score"],
    }
    scorer = create_scorer("x", judge=Judge("openai/gpt-4o-mini")).generate_score(
        PromptStep(
            "s", lambda: "score", output_schema=schema, calculate_score=lambda judge_output: judge_output["score"]
        )
    )
    fake_llm.script(Reply.json({"score": 0.25, "note": None}))
    result = run(scorer)
    body = fake_llm.requests[0].body["response_format"]["json_schema"]
    assert body["strict"] is True
    assert body["schema"]["additionalProperties"] is False
    assert sorted(body["schema"]["required"]) == ["note", "score"]
    assert result.score == 0.25
    # the strict-mode null for the optional property is dropped again
    assert result.judge["generate_score"].output == {"score": 0.25}


@pytest.mark.parametrize("model", MODELS)
def test_unparseable_native_output_falls_back_to_prompt_injection(fake_llm: FakeLLMServer, model: str) -> None:
    """Native output that is not JSON is retried once with the schema in the system message."""
    fake_llm.script(Reply.text("I would say about 0.7"), Reply.json({"score": 0.7}))
    result = run(score_scorer(Judge(model)))
    assert result.score == 0.7
    first, second = fake_llm.requests
    assert first.structured is not None
    assert second.structured is None
    assert "```json" in second.system
    attempts = result.judge["generate_score"].attempts
    assert [(a.status, a.prompt_injection) for a in attempts] == [("error", "native"), ("ok", "system")]
    assert "not valid JSON" in (attempts[0].error or "")


@pytest.mark.parametrize("model", MODELS)
def test_schema_invalid_native_output_falls_back(fake_llm: FakeLLMServer, model: str) -> None:
    """Native output outside a declared range is retried once with prompt injection."""
    fake_llm.script(Reply.json({"verdict": "good", "confidence": 1.5}))
    result = run(full_scorer(Judge(model)))
    assert result.analyze_step_result == {"verdict": "fake", "confidence": 0.5}
    assert fake_llm.count() == 4  # analyze twice, score, reason
    assert "less than or equal to 1" in (result.judge["analyze"].attempts[0].error or "")


@pytest.mark.parametrize("model", MODELS)
def test_the_fallbacks_log_line_names_where_the_answer_failed_never_its_values(
    fake_llm: FakeLLMServer, model: str
) -> None:
    """A claims-like step's answer is the agent's own text: the judge.fallback line quoted it
    ("verdict: Input should be a valid string (got ['Paris ... AGENT-PRIVATE'])")."""
    marker = "AGENT-PRIVATE-4711"
    fake_llm.script(Reply.json({"verdict": [f"Paris is the capital. {marker}"], "confidence": 0.5}))
    with structlog.testing.capture_logs() as logs:
        result = run(full_scorer(Judge(model)), output=f"Paris is the capital. {marker}")
    assert result.analyze_step_result == {"verdict": "fake", "confidence": 0.5}
    (line,) = [entry for entry in logs if entry["event"] == "judge.fallback"]
    assert line["at"] == ["verdict"]
    assert marker not in repr(logs)
    assert marker in (result.judge["analyze"].attempts[0].error or "")  # the record keeps it


@pytest.mark.parametrize("model", MODELS)
def test_a_refusal_fails_the_step_and_is_never_a_reason(fake_llm: FakeLLMServer, model: str) -> None:
    """OpenAI's refusal (no content, message.refusal) became the score's reason, "[refusal] I
    can't help with that."; Anthropic's (stop_reason "refusal") failed as "the answer is
    empty". Both fail the step naming the refusal, after the one fallback call."""
    fake_llm.script(Reply.json({"verdict": "fake", "confidence": 0.5}), Reply.auto(), Reply.refusal(), Reply.refusal())
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge(model)))
    assert info.value.failed_step == "generate_reason"
    assert isinstance(info.value.cause, JudgeOutputError)
    assert "the judge refused to answer" in str(info.value.cause)


@pytest.mark.parametrize(("model", "finish"), [(MODELS[0], "length"), (MODELS[1], "max_tokens")])
def test_json_cut_at_the_token_limit_says_so(fake_llm: FakeLLMServer, model: str, finish: str) -> None:
    """A structured answer cut at the output limit was only "not valid JSON (Unterminated
    string ...)"; it names the limit now."""
    cut = Reply.text('{"verdict": "fake", "confid', finish=finish)
    fake_llm.script(cut, cut)
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge(model, json_prompt_injection=True)))
    assert f"the answer was cut at the token limit ({finish})" in str(info.value.cause)


@pytest.mark.parametrize("model", MODELS)
def test_a_score_outside_the_range_or_a_nan_is_an_answer_that_does_not_fit(fake_llm: FakeLLMServer, model: str) -> None:
    """A judge's {"score": 7} on a (0, 1) scorer, and a NaN (Python's parser reads it, JSON has
    none), failed as ValueError, category internal (a bug), with no fallback call. Each is an
    answer that does not fit: retried once with the schema in the prompt, then JudgeOutputError."""
    scorer = create_scorer("s", judge=Judge(model), score_range=(0, 1)).generate_score(
        PromptStep("score", lambda run: "Score it from 0 to 1.")
    )
    fake_llm.script(Reply.json({"score": 7}), Reply.json({"score": 0.25}))
    assert run(scorer).score == 0.25  # the fallback's answer fits
    for bad, problem in (
        (Reply.json({"score": 7}), "above the maximum 1"),
        (Reply.text('{"score": NaN}'), "NaN is not a JSON number"),
        # The JSON-schema validator's number check raised OverflowError on it (internal).
        (Reply.text('{"score": 1' + "0" * 400 + "}"), "out of a number's range"),
    ):
        fake_llm.script(bad, bad)
        with pytest.raises(ScorerRunError) as info:
            run(scorer)
        assert info.value.category == "invalid_output"
        assert problem in str(info.value.cause)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (Reply.json({"robustness": float("nan")}), r"robustness: nan is not a finite number|NaN is not a JSON number"),
        (Reply.json({"robustness": float("inf")}), r"robustness: inf is not a finite number|Infinity is not a JSON"),
        (Reply.text('{"robustness": 1e999}'), r"robustness: inf is not a finite number"),
        (Reply.text('{"robustness": -1e999}'), r"robustness: -inf is not a finite number"),
        (Reply.text('{"robustness": 1' + "0" * 400 + "}"), r"robustness: an integer of 1329 bits is out of"),
    ],
)
def test_a_number_json_cannot_carry_is_an_answer_that_does_not_fit(
    fake_llm: FakeLLMServer, model: str, answer: Reply, problem: str
) -> None:
    """NaN and infinities reached a step through Anthropic's tool input (parsed by its SDK) and
    ``1e999`` (Python's parser reads it as inf): a pydantic float took them, and a built-in's
    clamp made a NaN a 0 and an infinity a full score. A 400-digit integer failed as an internal
    OverflowError with the paid call unrecorded. Each is an answer that does not fit now."""

    class Robustness(BaseModel):
        robustness: float

    scorer = (
        create_scorer("s", judge=Judge(model))
        .analyze(PromptStep("analyze", lambda run: "How robust?", output_schema=Robustness))
        .generate_score(lambda results: min(1.0, max(0.0, results.analyze_step_result.robustness)))
    )
    fake_llm.script(answer, answer)
    with pytest.raises(ScorerRunError) as info:
        run(scorer)
    assert info.value.category == "invalid_output"
    assert isinstance(info.value.cause, JudgeOutputError)
    assert re.search(problem, str(info.value.cause))
    # Both paid calls are on the record, the fallback's too.
    assert len(info.value.partial.judge["analyze"].attempts) == 2


def test_answer_still_invalid_fails_with_model_step_and_problem(fake_llm: FakeLLMServer) -> None:
    """When the fallback answer is also invalid, the step fails naming model, step and problem."""
    fake_llm.script(
        Reply.json({"verdict": "good", "confidence": 3}), Reply.text('{"verdict": "good", "confidence": 2}')
    )
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge("anthropic/claude-3-5-haiku-latest")))
    err = info.value
    assert err.failed_step == "analyze"
    assert isinstance(err.cause, JudgeOutputError)
    message = str(err.cause)
    assert "anthropic/claude-3-5-haiku-latest" in message
    assert "step analyze" in message
    assert "confidence" in message
    assert "less than or equal to 1" in message
    execution = err.partial.judge["analyze"]
    assert execution.status == "error"
    assert execution.attempt_count == 2
    assert fake_llm.count() == 2


def test_no_fallback_when_prompt_injection_answer_is_invalid(fake_llm: FakeLLMServer) -> None:
    """Prompt-injected output is not retried: one invalid answer fails the step."""
    fake_llm.script(Reply.text("no json here"))
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(Judge("openai/gpt-4o-mini", json_prompt_injection="inline")))
    assert isinstance(info.value.cause, JudgeOutputError)
    assert "not valid JSON" in str(info.value.cause)
    assert fake_llm.count() == 1


def test_truncated_json_answer_falls_back(fake_llm: FakeLLMServer) -> None:
    """A truncated JSON answer (cut off by max_tokens) counts as unparseable native output."""
    fake_llm.script(Reply.text('{"score": 0.'))
    result = run(score_scorer(Judge("openai/gpt-4o-mini")))
    assert result.score == 0.5
    assert fake_llm.count() == 2


def test_fenced_json_in_prose_is_accepted(fake_llm: FakeLLMServer) -> None:
    """A prompt-injected answer wrapped in a ```json fence still parses."""
    fake_llm.script(Reply.text('Sure!\n```json\n{"score": 0.9}\n```'))
    result = run(score_scorer(Judge("anthropic/claude-3-5-haiku-latest", json_prompt_injection="system")))
    assert result.score == 0.9


def test_per_step_judge_overrides_field_by_field(fake_llm: FakeLLMServer) -> None:
    """A step judge with only model= set uses that model and inherits the scorer's instructions."""
    scorer = full_scorer(
        Judge("openai/gpt-4o-mini", "Scorer-level instructions.", json_prompt_injection="inline"),
        generate_reason=Judge(model="anthropic/claude-3-5-haiku-latest"),
        generate_score=Judge(json_prompt_injection="system"),
    )
    result = run(scorer)
    analyze, score, reason = fake_llm.requests
    assert (analyze.provider, score.provider, reason.provider) == ("openai", "openai", "anthropic")
    assert all("Scorer-level instructions." in r.system for r in fake_llm.requests)
    assert "```json" in analyze.last_user_text  # inline, inherited
    assert "```json" in score.system  # step override
    assert result.judge["generate_reason"].model == "anthropic/claude-3-5-haiku-latest"
    assert result.judge["generate_reason"].provider == "anthropic"
    assert result.reason == "This is the fake judge's answer."


def test_generate_reason_is_free_text(fake_llm: FakeLLMServer) -> None:
    """generate_reason sends no schema and returns the judge's text."""
    fake_llm.rule(Reply.text("  It is correct.  "), user_contains="Explain")
    result = run(full_scorer(Judge("openai/gpt-4o-mini")))
    reason_request = fake_llm.requests[-1]
    assert reason_request.structured is None
    assert reason_request.schema is None
    assert result.reason == "It is correct."


@pytest.mark.parametrize("model", MODELS)
def test_an_answer_longer_than_max_tokens_allows_is_refused_not_kept(fake_llm: FakeLLMServer, model: str) -> None:
    """A provider (a broken proxy) that ignores ``max_tokens`` and answers 8 MB: the score kept
    the answer three times (raw output, output, reason) and stored it. It is a
    JudgeResponseError naming the sizes, and nothing of the answer is kept."""
    huge = "lorem ipsum " * 700_000
    fake_llm.script(
        Reply.json({"verdict": "fake", "confidence": 0.5}),
        Reply.auto(),
        Reply.text(huge, output_tokens=5000),
        Reply.text(huge, output_tokens=5000),
    )
    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge(model, max_tokens=256)))
    assert info.value.failed_step == "generate_reason"
    cause = info.value.cause
    assert isinstance(cause, JudgeResponseError)
    assert "the answer is 8,400,000 characters, more than max_tokens=256 allows (16,384)" in str(cause)
    assert fake_llm.count() == 3  # analyze, score, and the one reason call: not retried
    partial = info.value.partial
    assert partial is not None
    assert len(partial.model_dump_json()) < 10_000
    # Paid for, so counted: the step's usage and its attempt carry the answer's tokens.
    assert cause.execution is not None
    assert cause.execution.usage.output_tokens == 5000
    assert [a.usage.output_tokens if a.usage else None for a in cause.execution.attempts] == [5000]


def test_a_custom_models_parsed_answer_is_held_to_the_same_bound() -> None:
    """A custom JudgeModel answering only through ``parsed`` (no text): an 8 MB object passed,
    as the step's output, where the same text was refused."""

    class Parsed:
        model_id = "custom/parsed"
        provider = "custom"
        supports_native_structured_output = True

        async def generate(self, request: JudgeRequest) -> JudgeResponse:
            return JudgeResponse(text="", parsed={"verdict": "y" * 2_000_000, "confidence": 0.5})

    with pytest.raises(ScorerRunError) as info:
        run(full_scorer(Judge(Parsed(), max_tokens=16)))
    assert info.value.failed_step == "analyze"
    assert isinstance(info.value.cause, JudgeResponseError)
    assert "more than max_tokens=16 allows (1,024)" in str(info.value.cause)


@pytest.mark.parametrize("finish", ["agent said: " + "z" * 1_000_000, 5, {"reason": "length"}, ["length"]])
@pytest.mark.parametrize("model", MODELS)
def test_a_finish_reason_no_provider_sends_is_stored_as_other(fake_llm: FakeLLMServer, model: str, finish: Any) -> None:
    """A proxy's finish reason of a megabyte was stored whole in the attempt; one that is not a
    string (a number, an object, a list) failed the paid call as an internal TypeError, its usage
    lost. A word is kept as it is, anything else as "other", and the answer is read."""
    fake_llm.script(
        Reply.json({"verdict": "fake", "confidence": 0.5}),
        Reply.auto(),
        Reply.text("Because.", finish=finish),
    )
    result = run(full_scorer(Judge(model)))
    assert [a.finish_reason for a in result.judge["generate_reason"].attempts] == ["other"]
    assert result.judge["analyze"].attempts[0].finish_reason in ("stop", "tool_use", "end_turn", "tool_calls")


@pytest.mark.parametrize(("model", "finish"), [(MODELS[0], "length"), (MODELS[1], "max_tokens")])
def test_a_reason_cut_at_the_token_limit_is_kept_and_says_so(fake_llm: FakeLLMServer, model: str, finish: str) -> None:
    """A free-text reason cut at ``max_tokens`` was kept with nothing to tell it from a whole
    one. It is still kept (most of a reason beats none), its attempt's ``finish_reason`` says
    where the model stopped, and ``judge.cut_short`` is logged, by names, never the text."""
    cut = "The verdict holds because the capital named is"
    fake_llm.script(Reply.json({"verdict": "fake", "confidence": 0.5}), Reply.auto(), Reply.text(cut, finish=finish))
    with structlog.testing.capture_logs() as logs:
        result = run(full_scorer(Judge(model)))
    assert result.reason == cut
    assert [a.finish_reason for a in result.judge["generate_reason"].attempts] == [finish]
    assert result.judge["analyze"].attempts[0].finish_reason not in ("length", "max_tokens")
    warned = [e for e in logs if e["event"] == "judge.cut_short"]
    assert [(e["scorer"], e["step"], e["finish_reason"]) for e in warned] == [("full", "generate_reason", finish)]
    assert "capital" not in repr(logs)
