"""Promises of the README's "Writing a scorer" and "LLM judges" sections no other test checked,
each through the real SDKs over HTTP to tests/fakellm (audit-judges)."""

from __future__ import annotations

import socket
import traceback
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import structlog.testing
from pydantic import BaseModel, Field, field_validator

from scorers import Judge, PromptStep, ScorerConfigError, ScorerRunError, create_scorer
from scorers.judge import (
    JudgeConnectionError,
    JudgeOutputError,
    JudgeProviderError,
    RetryMatcher,
    StreamErrorRetryProcessor,
)
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import MODELS, Verdict, run, score_scorer


def _base_url(model: str, port: int) -> str:
    return f"http://127.0.0.1:{port}" + ("/v1" if model.startswith("openai/") else "")


@pytest.mark.parametrize("model", MODELS)
def test_a_refused_connection_reaches_a_matcher_as_econnrefused(sleeps: list[float], model: str) -> None:
    """README: a matcher sees the socket error as ``error.code`` ("ECONNREFUSED"). A matcher
    written for it that never matched would leave a judge behind a restarting proxy unretried."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seen: list[str | None] = []

    def refused(error: JudgeProviderError) -> bool:
        seen.append(error.code)
        return error.code == "ECONNREFUSED"

    judge = Judge(
        model,
        base_url=_base_url(model, port),
        api_key="sk-test",
        error_processors=[
            StreamErrorRetryProcessor(max_retries=0, matchers=[RetryMatcher(refused, max_retries=2, delay_ms=5)])
        ],
        max_processor_retries=2,
    )
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge))
    assert isinstance(info.value.cause, JudgeConnectionError)
    assert seen == ["ECONNREFUSED"] * 3  # the matcher decided: two retries past max_retries=0
    assert sleeps == [0.005, 0.005]


@pytest.mark.parametrize("model", MODELS)
def test_an_async_create_prompt_is_awaited_and_its_text_sent(fake_llm: FakeLLMServer, model: str) -> None:
    """README: create_prompt "may be async". Sent un-awaited, the judge would score the text of
    a coroutine object."""

    async def prompt(run: Any) -> str:
        return f"Score this answer: {run.output}"

    result = run(create_scorer("s", judge=Judge(model)).generate_score(PromptStep("score", prompt)))
    assert result.score == 0.5
    (request,) = fake_llm.requests
    assert "Score this answer: Paris is the capital of France." in request.last_user_text
    assert "coroutine" not in request.last_user_text
    assert result.generate_score_prompt == "Score this answer: Paris is the capital of France."


class Count(BaseModel):
    count: int


@pytest.mark.parametrize("model", MODELS)
def test_calculate_score_gets_its_arguments_and_maps_an_answer_outside_the_range(
    fake_llm: FakeLLMServer, model: str
) -> None:
    """README: calculate_score(run=, results=, analyze_step_result=, judge_output=) maps the
    answer; the number is held within score_range only "when no calculate_score maps it". A
    0-10 judge answer mapped to (0, 1) must be the score, with no fallback call paid for it."""
    seen: dict[str, Any] = {}

    def calculate(run: Any, results: Any, analyze_step_result: Any, judge_output: Any) -> float:
        seen.update(
            output=run.output,
            analyzed=results.analyze_step_result,
            analyze_step_result=analyze_step_result,
            judge_output=judge_output,
        )
        return float(judge_output["score"]) / 10

    scorer = (
        create_scorer("s", judge=Judge(model), score_range=(0, 1))
        .analyze(lambda run: {"words": len(str(run.output).split())})
        .generate_score(PromptStep("score", lambda run: "Score it from 0 to 10.", calculate_score=calculate))
    )
    fake_llm.script(Reply.json({"score": 7}))
    result = run(scorer)
    assert result.score == pytest.approx(0.7)
    assert seen == {
        "output": "Paris is the capital of France.",
        "analyzed": {"words": 6},
        "analyze_step_result": {"words": 6},
        "judge_output": {"score": 7},
    }
    assert fake_llm.count() == 1


@pytest.mark.parametrize("model", MODELS)
def test_the_default_max_tokens_is_1024_on_the_wire(fake_llm: FakeLLMServer, model: str) -> None:
    """README: ``max_tokens`` [1024]. The default is what bounds each answer's cost."""
    run(score_scorer(Judge(model)))
    (request,) = fake_llm.requests
    sent = request.body.get("max_completion_tokens", request.body.get("max_tokens"))
    assert sent == 1024


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("fault", "expected_s"),
    [
        (Reply.error(503, "unavailable", headers={"retry-after": "2"}), 2.0),
        (Reply.error(529, "busy", error_type="overloaded_error", headers={"retry-after": "3"}), 3.0),
        (Reply.error(425, "too early", headers={"retry-after-ms": "-1", "retry-after": "4"}), 4.0),
        (Reply.rate_limited(retry_after="inf"), 0.0),
        (Reply.rate_limited(retry_after="1e400"), 0.0),
        (Reply.rate_limited(retry_after="-3"), 0.0),
    ],
    ids=["503", "529", "425-negative-ms", "inf", "1e400", "negative-seconds"],
)
def test_retry_after_is_honoured_on_any_retried_status_and_an_unreadable_one_ignored(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str, fault: Reply, expected_s: float
) -> None:
    """README: any retry waits max(delay, min(Retry-After, max_retry_after_ms)) (not only a
    429's), a 425 is retried, and a negative, non-finite or unreadable value is ignored (an
    infinite one read as a number would wait the full 30 s cap on every retry)."""
    fake_llm.script(fault)
    result = run(score_scorer(Judge(model, error_processors=[StreamErrorRetryProcessor()])))
    assert result.score == 0.5
    assert fake_llm.count() == 2
    assert sleeps == ([pytest.approx(expected_s)] if expected_s else [])


@pytest.mark.parametrize("step", ["preprocess", "analyze"])
def test_a_prompt_step_without_output_schema_before_the_score_is_refused_when_built(step: str) -> None:
    """README: preprocess/analyze need an output_schema; found at build time, not after a paid call."""
    scorer = create_scorer("s", judge=Judge("openai/gpt-4o-mini"))
    with pytest.raises(ScorerConfigError, match=f"a PromptStep for {step} needs output_schema"):
        getattr(scorer, step)(PromptStep("step", lambda run: "List the claims."))


_AGENT = "AGENT-PRIVATE-4711 my card is 4111 1111"
_CLOSED = {
    "type": "object",
    "properties": {"verdict": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}},
    "required": ["verdict", "confidence"],
    "additionalProperties": False,
}


class _Cat(BaseModel):
    kind: Literal["cat"]


class _Dog(BaseModel):
    kind: Literal["dog"]


class _Tagged(BaseModel):
    pet: Annotated[_Cat | _Dog, Field(discriminator="kind")]


class _Claim(BaseModel):
    claim: str


class _Claims(BaseModel):
    verdicts: list[_Claim]


class _Checked(BaseModel):
    verdict: str

    @field_validator("verdict")
    @classmethod
    def _known(cls, value: str) -> str:
        raise ValueError(f"unknown verdict {value}")  # a user's validator quoting what it got


# (output schema, the answer, where it fails, what the error still says)
UNFIT_ANSWERS = {
    "pydantic: a list for a string": (Verdict, {"verdict": [_AGENT], "confidence": 0.5}, "verdict", "valid string"),
    "enum": (_CLOSED, {"verdict": _AGENT, "confidence": 0.5}, "verdict", "must be one of ['yes', 'no']"),
    "type": (_CLOSED, {"verdict": "yes", "confidence": _AGENT}, "confidence", "expected number, got str"),
    # pydantic's own message quotes the tag it found; a validator's, whatever its author wrote
    "pydantic: a tag no variant has": (_Tagged, {"pet": {"kind": _AGENT}}, "pet", "union_tag_invalid"),
    "pydantic: a validator's message": (_Checked, {"verdict": _AGENT}, "verdict", "value_error"),
    # named where it is (pydantic's place gives the item's index as a number, not a key)
    "pydantic: a list item's field": (
        _Claims,
        {"verdicts": [{"claim": [_AGENT]}]},
        "verdicts[0].claim",
        "valid string",
    ),
    "a made-up key": (_CLOSED, {"verdict": "yes", "confidence": 0.5, _AGENT: 1}, "", "unexpected property"),
    "a made-up key with a colon": (
        _CLOSED,
        {"verdict": "yes", "confidence": 0.5, f"note: {_AGENT}": 1},
        "",
        "unexpected property",
    ),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("schema", "answer", "where", "what"), list(UNFIT_ANSWERS.values()), ids=list(UNFIT_ANSWERS))
def test_an_answer_that_does_not_fit_is_described_in_the_error_never_quoted(
    fake_llm: FakeLLMServer, model: str, schema: Any, answer: dict[str, Any], where: str, what: str
) -> None:
    """README: an answer that still does not validate fails the step; the error "describes the
    answer by its length, never quotes it (it may quote the agent): the answer is the error's
    raw_output and the step record's". The message quoted the failing value (``(got [...])``,
    ``got 'AGENT-...'``, up to 60 characters) and named a key the answer made up, into every
    log line that prints the error."""
    fake_llm.rule(Reply.json(answer))
    scorer = create_scorer("s", judge=Judge(model)).analyze(
        PromptStep("analyze", lambda run: "Analyze the answer.", output_schema=schema)
    )
    with pytest.raises(ScorerRunError) as info, structlog.testing.capture_logs() as logs:
        run(scorer.generate_score(lambda: 1.0))
    assert "AGENT-PRIVATE" not in repr(logs)
    error = info.value
    assert isinstance(error.cause, JudgeOutputError)
    assert "AGENT-PRIVATE" not in str(error) + str(error.cause)
    assert "AGENT-PRIVATE" not in "".join(traceback.format_exception(error))  # as a worker logs it
    assert "does not fit the output schema" in str(error.cause)
    assert f"{where or '(a property the schema does not name)'}: " in str(error.cause)
    assert what in str(error.cause)
    assert "AGENT-PRIVATE" in (error.cause.raw_output or "")  # the answer is kept where the README says
    assert "AGENT-PRIVATE" in (error.partial.judge["analyze"].attempts[0].error or "")  # the record keeps it all


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("status", [301, 307])
def test_a_redirect_is_not_retried_even_when_unknown_errors_are(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str, status: int
) -> None:
    """README: a 3xx "is a JudgeStatusError naming the host it points to and the base URL
    setting, not retried"; the processor retries unknown errors only when they are "neither
    retryable nor an HTTP error". With retry_unknown_errors=True a redirect (category unknown)
    was sent again max_retries times: the prompt re-sent to a base URL that cannot answer."""
    fake_llm.rule(Reply.raw("", status=status, headers={"location": "http://127.0.0.1:9/v1/elsewhere"}))
    judge = Judge(model, error_processors=[StreamErrorRetryProcessor(max_retries=2, retry_unknown_errors=True)])
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge))
    assert type(info.value.cause).__name__ == "JudgeStatusError"
    assert info.value.cause.status_code == status  # type: ignore[attr-defined]
    assert fake_llm.count() == 1
    assert sleeps == []


@pytest.mark.parametrize("model", MODELS)
def test_a_body_past_the_cap_is_not_retried_by_a_retry_processor(
    fake_llm: FakeLLMServer, sleeps: list[float], model: str
) -> None:
    """README: past the cap the call is a JudgeResponseError, category unknown, not retried
    unless retry_unknown_errors=True or a matcher asks (a retry pays for the same answer again).
    The cap's own test asks without a retry processor; here the processor a user sets retries
    5xx and 429 three times and must still leave it alone."""
    fake_llm.rule(Reply.raw(b'{"x": "' + b"a" * (17 << 20) + b'"}'))
    judge = Judge(model, max_tokens=256, error_processors=[StreamErrorRetryProcessor(max_retries=3)])
    with pytest.raises(ScorerRunError) as info:
        run(score_scorer(judge))
    assert type(info.value.cause).__name__ == "JudgeResponseError"
    assert "more than max_tokens allows" in str(info.value.cause)
    assert info.value.category == "unknown"
    assert fake_llm.count() == 1


def test_the_writing_a_scorer_example_prints_what_the_readme_says(capsys: pytest.CaptureFixture[str]) -> None:
    """README "Writing a scorer": its example prints ``0.83 5 words shared``. Run as written."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Writing a scorer", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    expected = code.rsplit("# ", 1)[1].strip()
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == expected == "0.83 5 words shared"
