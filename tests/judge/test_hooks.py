"""The host's JudgeHooks wrap every provider request: limiter slot, pause, usage, call context."""

from __future__ import annotations

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
