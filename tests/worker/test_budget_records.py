"""What each score record says it cost: tokens (cached included), judge calls and cost_usd, filled
in by ``score_batch`` from the real SDKs' usage against tests/fakellm; failed runs included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from scorers import Judge, JudgeUsage, PromptStep, Scorer, create_scorer
from scorers.judge import DEFAULT_PRICES, price_usage
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._batches import batch
from tracing import ScoreRecord
from worker._budget import BudgetGuard, MemoryLedger, parse_budgets, parse_prices, spend_report
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker._settings import SettingsError, load_settings
from worker.store import MemoryScoreStore

LONG = "Grade support answers for accuracy and tone, strictly. " * 90  # over the cache minimum


class Verdict(BaseModel):
    score: float


def _score(*scorers: Scorer, runs: int = 2) -> list[ScoreRecord]:
    store = MemoryScoreStore()
    deps = ScoringDeps(registry=Registry(scorers), store=store, model_concurrency=1)
    asyncio.run(score_batch(batch(range(runs), [s.id for s in scorers], salt="cost"), deps))
    return list(store.records.values())


def _grader(model: str, instructions: str | None = None, scorer_id: str = "grader") -> Scorer:
    return create_scorer(scorer_id, type="agent", judge=Judge(model=model, instructions=instructions)).generate_score(
        PromptStep("grade", lambda run: "SCORE it", output_schema=Verdict)
    )


def test_records_carry_cached_tokens_calls_and_cost_through_anthropic(fake_llm: FakeLLMServer) -> None:
    """The first run writes the instructions to the cache, the next reads them: both records say
    so, and each cost_usd is the price table's for its tokens (writes at 1.25×, reads at 0.1×)."""
    first, second = sorted(_score(_grader("anthropic/claude-haiku-4-5", LONG)), key=lambda r: r.cached_input_tokens)
    prefix = second.cached_input_tokens
    assert first.cached_input_tokens == 0
    assert prefix > 1000
    assert first.judge_calls == second.judge_calls == 1
    p = DEFAULT_PRICES["anthropic/claude-haiku-4-5"]
    assert p.cache_write is not None
    assert p.cached_input is not None
    wrote = (first.input_tokens - prefix) * p.input + prefix * p.cache_write + first.output_tokens * p.output
    read = (second.input_tokens - prefix) * p.input + prefix * p.cached_input + second.output_tokens * p.output
    assert first.cost_usd == pytest.approx(wrote / 1e6)
    assert second.cost_usd == pytest.approx(read / 1e6)


def test_openai_cached_tokens_reach_the_record(fake_llm: FakeLLMServer) -> None:
    """OpenAI's automatic prefix caching (instructions first) shows in the second record, and
    each record's cost_usd is the table's: cached tokens at the cached-input rate, no cache write."""
    records = sorted(_score(_grader("openai/gpt-4o-mini", LONG)), key=lambda r: r.cached_input_tokens)
    cached = [r.cached_input_tokens for r in records]
    assert cached[0] == 0
    assert cached[1] > 1000
    p = DEFAULT_PRICES["openai/gpt-4o-mini"]
    assert p.cached_input is not None
    for r in records:
        dollars = (r.input_tokens - r.cached_input_tokens) * p.input + r.cached_input_tokens * p.cached_input
        assert r.cost_usd == pytest.approx((dollars + r.output_tokens * p.output) / 1e6)


def test_a_failed_run_still_carries_what_it_spent(fake_llm: FakeLLMServer) -> None:
    """Step one answered (and was paid for), step two failed for good: the error record keeps
    the tokens, calls and cost of both."""
    fake_llm.rule(Reply.error(401, "bad key"), user_contains="REASON")
    scorer = (
        create_scorer("two", type="agent", judge=Judge(model="openai/gpt-4o-mini"))
        .generate_score(PromptStep("grade", lambda run: "SCORE it", output_schema=Verdict))
        .generate_reason(PromptStep("why", lambda score: f"REASON for {score}"))
    )
    (record,) = _score(scorer, runs=1)
    assert record.error_type == "JudgeAuthError"
    assert record.judge_calls == 2
    assert record.input_tokens > 0
    assert record.cost_usd is not None
    assert record.cost_usd > 0


def test_unpriced_model_records_cost_none(fake_llm: FakeLLMServer) -> None:
    """A judge model without a price: cost_usd is None, never 0."""
    (record,) = _score(_grader("openai/some-private-model"), runs=1)
    assert record.judge_calls == 1
    assert record.cost_usd is None


def test_price_override_applies_to_records(fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRACESCORE_PRICES prices a model the defaults do not know."""
    monkeypatch.setenv("TRACESCORE_PRICES", json.dumps({"openai/some-private-model": {"input": 1e6, "output": 0}}))
    (record,) = _score(_grader("openai/some-private-model"), runs=1)
    assert record.cost_usd == pytest.approx(record.input_tokens)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("budgets", '{"scorers": {"x": -1}}', "TRACESCORE_BUDGETS"),
        ("budgets", '{"scorer": {"x": 1}}', "TRACESCORE_BUDGETS"),
        ("budgets", "not json", "TRACESCORE_BUDGETS"),
        ("prices", '{"m": {"input": 1}}', "TRACESCORE_PRICES"),
        ("prices", '{"m": {"input": -1, "output": 1}}', "TRACESCORE_PRICES"),
        # Non-finite values: a NaN budget is never reached, an infinite price is an infinite
        # cost Redis refuses to add (the paid answer lost). 1e999 is json's way to Infinity.
        ("budgets", '{"scorers": {"x": NaN}}', "TRACESCORE_BUDGETS"),
        ("budgets", '{"total": Infinity}', "TRACESCORE_BUDGETS"),
        ("budgets", '{"models": {"m": 1e999}}', "TRACESCORE_BUDGETS"),
        ("prices", '{"m": {"input": Infinity, "output": 1}}', "TRACESCORE_PRICES"),
        ("prices", '{"m": {"input": 1, "output": NaN}}', "TRACESCORE_PRICES"),
        ("prices", '{"m": {"input": 1, "output": 1, "cached_input": 1e999}}', "TRACESCORE_PRICES"),
        # Finite but past any model (a dollar a token): 1e308 made each call's cost infinite.
        ("prices", '{"m": {"input": 1e308, "output": 1}}', "TRACESCORE_PRICES"),
    ],
)
def test_bad_budgets_and_prices_fail_at_start_naming_the_variable(variable: str, value: str, said: str) -> None:
    """A bad value is refused at start-up with the variable's name and the expected shape."""
    with pytest.raises(SettingsError, match=said) as raised:
        load_settings(**{variable: value})
    # One line, naming where (pydantic's text spanned several, printed with U+FFFD for each
    # line break, with a link; README audit).
    assert "\n" not in str(raised.value)
    assert "errors.pydantic.dev" not in str(raised.value)


def test_a_bad_price_or_budget_names_the_model_or_key() -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(prices='{"openai/x": {"input": 1, "output": -2}}')
    assert "openai/x: output: Input should be greater than or equal to 0" in str(raised.value)
    with pytest.raises(SettingsError) as raised:
        load_settings(budgets='{"scorers": {"relevancy": "five"}}')
    assert "scorers.relevancy: Input should be a valid number" in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        # Lax mode read these as numbers: a budget of `true` was 1 USD, a price of "0.15" a price.
        ("budgets", '{"total": true}', "total: Input should be a valid number"),
        ("budgets", '{"scorers": {"relevancy": "5"}}', "scorers.relevancy: Input should be a valid number"),
        ("prices", '{"openai/x": {"input": true, "output": 1}}', "openai/x: input: Input should be a valid number"),
        ("prices", '{"openai/x": {"input": 1, "output": "0.6"}}', "openai/x: output: Input should be a valid number"),
        # A known model without its provider matches no call: its budget was never enforced.
        (
            "budgets",
            '{"models": {"gpt-4o": 50}}',
            "models.gpt-4o: a judge model id names its provider: 'openai/gpt-4o' for the built-in judge, or a"
            " custom JudgeModel's own (e.g. 'azure/gpt-4o')",
        ),
        (
            "budgets",
            '{"models": {"claude-sonnet-4-5-20250929": 5}}',
            "'anthropic/claude-sonnet-4-5-20250929' for the built-in judge",
        ),
        ("prices", '{"gpt-4o-mini": {"input": 1, "output": 1}}', "gpt-4o-mini: a judge model id names its provider"),
    ],
)
def test_a_budget_or_price_that_would_be_misread_is_refused_naming_it(variable: str, value: str, said: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(**{variable: value})
    assert said in str(raised.value)


def test_a_custom_models_own_id_may_name_no_provider() -> None:
    """A custom ``JudgeModel``'s id is its own: only a name we know under a provider is refused."""
    settings = load_settings(
        budgets='{"models": {"local-llama": 2}, "total": 3}', prices='{"local-llama": {"input": 1, "output": 2}}'
    )
    assert parse_budgets(settings.budgets).models == {"local-llama": 2}
    assert parse_prices(settings.prices)["local-llama"].output == 2


def test_unpriced_calls_are_counted_apart_from_the_spend() -> None:
    """A call to a model with no price adds nothing to the spend, and is counted by model."""
    ledger = MemoryLedger()
    guard = BudgetGuard(ledger, parse_budgets('{"total": 1}'))
    asyncio.run(guard.after_call("vllm/local", "s", JudgeUsage(input_tokens=5, output_tokens=1)))
    asyncio.run(guard.after_call("openai/gpt-4o-mini", "s", JudgeUsage(input_tokens=1_000_000)))
    report = asyncio.run(spend_report(ledger, parse_budgets('{"total": 1}')))
    assert report["unpriced_calls"] == {"vllm/local": 1}
    assert report["total_usd"] == pytest.approx(0.15)
    assert report["by_model"] == {"openai/gpt-4o-mini": pytest.approx(0.15)}
    assert report["budgets"]["total"]["remaining_usd"] == pytest.approx(0.85)


def test_a_model_budget_caps_its_dated_snapshots_too() -> None:
    """A dated name is priced as its model, and was not capped as it: a budget on
    openai/gpt-4o-mini let openai/gpt-4o-mini-2024-07-18 spend past it (cost audit)."""
    from scorers.judge import JudgeCallRefused

    budgets = parse_budgets('{"models": {"openai/gpt-4o-mini": 0.1}}')
    guard = BudgetGuard(MemoryLedger(), budgets)
    dated = "openai/gpt-4o-mini-2024-07-18"
    asyncio.run(guard.before_call(dated, "s"))
    asyncio.run(guard.after_call(dated, "s", JudgeUsage(input_tokens=1_000_000)))  # $0.15
    with pytest.raises(JudgeCallRefused, match="budget of model openai/gpt-4o-mini is spent"):
        asyncio.run(guard.before_call(dated, "s"))
    with pytest.raises(JudgeCallRefused):
        asyncio.run(guard.before_call("openai/gpt-4o-mini", "s"))
    asyncio.run(guard.before_call("openai/gpt-4o", "s"))  # another model: its own spend


def _answer_naming(model: str, named: Any) -> str:
    """A 200 answer of ``model``'s provider whose ``model`` field is ``named``."""
    if model.startswith("openai/"):
        choice = {"index": 0, "message": {"role": "assistant", "content": '{"score": 0.5}'}, "finish_reason": "stop"}
        usage: dict[str, int] = {"prompt_tokens": 1000, "completion_tokens": 50}
        return json.dumps(
            {"id": "chatcmpl-1", "object": "chat.completion", "model": named, "choices": [choice], "usage": usage}
        )
    content = [{"type": "text", "text": '{"score": 0.5}'}]
    usage = {"input_tokens": 1000, "output_tokens": 50}
    return json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": named,
            "content": content,
            "stop_reason": "end_turn",
            "usage": usage,
        }
    )


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("openai/gpt-4o-mini", "gpt-4o"),
        ("openai/gpt-4o-mini", "some-private-model"),
        ("openai/gpt-4o-mini", "x" * 100_000),
        ("anthropic/claude-haiku-4-5", "claude-opus-4-1"),
        ("anthropic/claude-haiku-4-5", 5),
        ("anthropic/claude-haiku-4-5", None),
    ],
)
def test_a_call_is_priced_as_the_model_asked_whatever_the_answer_names(
    fake_llm: FakeLLMServer, model: str, named: Any
) -> None:
    """The README's rule: the price and the budget are the model the judge asked for; an answer
    naming another (a proxy's routing, a pricier or unknown model, a number) changes neither."""
    fake_llm.script(Reply.raw(_answer_naming(model, named)))
    (record,) = _score(_grader(model), runs=1)
    assert record.error_type is None, record.error_message
    assert (record.judge_models, record.judge_calls) == ([model], 1)
    assert record.cost_usd == pytest.approx(price_usage(model, JudgeUsage(input_tokens=1000, output_tokens=50)) or -1)
