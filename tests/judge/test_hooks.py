"""The host's JudgeHooks wrap every provider request: limiter slot, pause, usage, call context."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from scorers import Judge
from scorers.judge import JudgeHooks, StreamErrorRetryProcessor, get_judge_hooks, set_judge_hooks
from tests.fakellm import FakeLLMServer, RecordedRequest, Reply, Rule
from tests.judge.helpers import run, score_scorer


class RecordingLimiter:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.in_slot = False
        self.in_context = False

    @asynccontextmanager
    async def _slot(self, model_id: str, estimated_tokens: int) -> AsyncIterator[None]:
        self.events.append(("slot", (model_id, estimated_tokens > 0)))
        self.in_slot = True
        try:
            yield
        finally:
            self.in_slot = False
            self.events.append(("release", model_id))

    def slot(self, model_id: str, estimated_tokens: int) -> AsyncIterator[None]:  # type: ignore[override]
        return self._slot(model_id, estimated_tokens)  # type: ignore[return-value]

    async def record_usage(self, model_id: str, tokens: int) -> None:
        self.events.append(("usage", tokens))

    async def pause(self, model_id: str, seconds: float) -> None:
        self.events.append(("pause", (model_id, seconds)))

    @contextmanager
    def context(self, model_id: str) -> Iterator[None]:
        self.events.append(("enter", model_id))
        self.in_context = True
        try:
            yield
        finally:
            self.in_context = False
            self.events.append(("exit", model_id))


@pytest.fixture
def limiter(sleeps: list[float]) -> Iterator[RecordingLimiter]:
    recording = RecordingLimiter()
    previous = get_judge_hooks()
    set_judge_hooks(JudgeHooks(limiter=recording, call_context=recording.context, sleep=previous.sleep))  # type: ignore[arg-type]
    try:
        yield recording
    finally:
        set_judge_hooks(previous)


def test_slot_and_context_are_held_during_the_request(fake_llm: FakeLLMServer, limiter: RecordingLimiter) -> None:
    """The server sees the request while the slot is held and the call context is entered."""
    seen: list[tuple[bool, bool]] = []

    def check(req: RecordedRequest) -> bool:
        seen.append((limiter.in_slot, limiter.in_context))
        return True

    fake_llm.script(Rule(Reply.json({"score": 0.5}, input_tokens=40, output_tokens=2), match=check))
    run(score_scorer(Judge("openai/gpt-4o-mini")))
    assert seen == [(True, True)]
    kinds = [e[0] for e in limiter.events]
    assert kinds == ["slot", "enter", "exit", "release", "usage"]
    assert limiter.events[0] == ("slot", ("openai/gpt-4o-mini", True))
    assert limiter.events[-1] == ("usage", 42)


def test_429_with_retry_after_pauses_the_model(fake_llm: FakeLLMServer, limiter: RecordingLimiter) -> None:
    """A 429 with Retry-After pauses the model in the limiter, and each request gets its own slot."""
    fake_llm.script(Reply.rate_limited(retry_after="2"))
    run(score_scorer(Judge("anthropic/claude-3-5-haiku-latest", error_processors=[StreamErrorRetryProcessor()])))
    assert ("pause", ("anthropic/claude-3-5-haiku-latest", 2.0)) in limiter.events
    assert [e[0] for e in limiter.events].count("slot") == 2
    assert ("usage", 0) in limiter.events  # the failed request used no tokens


def test_429_without_retry_after_does_not_pause(fake_llm: FakeLLMServer, limiter: RecordingLimiter) -> None:
    """Without Retry-After there is nothing to pause for."""
    fake_llm.script(Reply.rate_limited())
    run(score_scorer(Judge("openai/gpt-4o-mini", error_processors=[StreamErrorRetryProcessor()])))
    assert not any(kind == "pause" for kind, _ in limiter.events)


def test_a_429_that_reports_usage_still_pauses_the_model(limiter: RecordingLimiter) -> None:
    """A rate-limit error carrying the tokens it used (a custom model's, or a gateway's upstream
    429 inside an answer) is paid for, as any answer that said what it used; its Retry-After was
    dropped there: the usage reached the limiter and the pause did not, so every caller of the
    model went on into the same limit."""
    from scorers._result import JudgeUsage
    from scorers.judge.testing import FakeJudgeModel, rate_limited

    paid = rate_limited(retry_after_ms=2500, model_id="fake/judge")
    paid.usage = JudgeUsage(input_tokens=30, output_tokens=4)
    model = FakeJudgeModel(paid, {"score": 0.5})
    result = run(score_scorer(Judge(model, error_processors=[StreamErrorRetryProcessor()])))
    assert result.score == 0.5
    assert ("usage", 34) in limiter.events
    assert ("pause", ("fake/judge", 2.5)) in limiter.events


# A 200 whose body is an upstream's rate limit (a gateway passing it on, as OpenRouter does), its
# Retry-After on the 200's headers: (model, body, headers, the pause in seconds).
_RATE_LIMITED_IN_A_200 = {
    "OpenRouter's code 429, Retry-After": (
        "openai/gpt-4o-mini",
        {"error": {"code": 429, "message": "Provider returned error", "metadata": {"provider_name": "P", "raw": "x"}}},
        {"retry-after": "3"},
        3.0,
    ),
    "OpenRouter's code 429, retry-after-ms": (
        "openai/gpt-4o-mini",
        {"error": {"code": 429, "message": "Provider returned error"}},
        {"retry-after-ms": "1500", "retry-after": "9"},
        1.5,
    ),
    "Anthropic's rate_limit_error, Retry-After": (
        "anthropic/claude-3-5-haiku-latest",
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        {"retry-after": "4"},
        4.0,
    ),
}


@pytest.mark.parametrize(
    ("model", "body", "headers", "seconds"), list(_RATE_LIMITED_IN_A_200.values()), ids=list(_RATE_LIMITED_IN_A_200)
)
def test_a_rate_limit_inside_a_200_pauses_the_model_by_its_retry_after(
    fake_llm: FakeLLMServer,
    limiter: RecordingLimiter,
    model: str,
    body: dict[str, object],
    headers: dict[str, str],
    seconds: float,
) -> None:
    """An upstream 429 a 200 carries was a JudgeRateLimitError without retry_after_ms: the 200's
    Retry-After was never read, so the limiter was not paused and every caller of the model went
    on into the same limit, where a real HTTP 429 with that header pauses it."""
    fake_llm.script(Reply.raw(json.dumps(body), headers=headers))
    result = run(score_scorer(Judge(model, error_processors=[StreamErrorRetryProcessor()])))
    assert result.score is not None
    assert [e for e in limiter.events if e[0] == "pause"] == [("pause", (model, seconds))]
    assert fake_llm.count() == 2  # retried once


def test_a_rate_limit_inside_a_200_without_retry_after_does_not_pause(
    fake_llm: FakeLLMServer, limiter: RecordingLimiter
) -> None:
    """As a real 429 without the header: nothing says how long, nothing is paused."""
    fake_llm.script(Reply.raw(json.dumps({"error": {"code": 429, "message": "Provider returned error"}})))
    run(score_scorer(Judge("openai/gpt-4o-mini", error_processors=[StreamErrorRetryProcessor()])))
    assert not any(kind == "pause" for kind, _ in limiter.events)


def test_an_overloaded_error_inside_a_200_waits_its_retry_after_as_an_http_529_does(
    fake_llm: FakeLLMServer, limiter: RecordingLimiter, sleeps: list[float]
) -> None:
    """Anthropic's overloaded_error (529) in a 200 is what an HTTP 529 is: a server error, retried
    after its Retry-After (the processor's wait), the model not paused (only a 429 pauses it)."""
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    fake_llm.script(Reply.raw(json.dumps(overloaded), headers={"retry-after": "5"}))
    fake_llm.script(Reply.overloaded(headers={"retry-after": "5"}))
    judge = Judge("anthropic/claude-3-5-haiku-latest", error_processors=[StreamErrorRetryProcessor(max_retries=2)])
    run(score_scorer(judge))
    assert not any(kind == "pause" for kind, _ in limiter.events)
    assert sleeps[:2] == [5.0, 5.0]  # the in-body one and the HTTP one alike
