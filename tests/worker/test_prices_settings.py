"""The price table comes from the ``Settings`` the app is created with (``prices``, i.e.
``TRACESCORE_PRICES`` for ``tracescore worker``), not from the environment at scoring time."""

from __future__ import annotations

import asyncio
import json

import pytest

from scorers.judge import get_judge_hooks, set_judge_hooks
from tests.fakellm import FakeLLMServer
from tests.worker._batches import batch
from tests.worker.test_budget_records import _grader
from worker._app import create_app
from worker._budget import BudgetGuard, install_local_guard, parse_budgets, parse_prices
from worker._embedded import EmbeddedScorer
from worker._loop import run_coro, stop_loop
from worker._registry import Registry
from worker._runtime import get_runtime, reset_runtime
from worker._scoring import ScoringDeps, score_batch
from worker._settings import load_settings
from worker.store import MemoryScoreStore

MODEL = "openai/some-private-model"


def test_the_deps_price_table_prices_records_whatever_the_environment(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACESCORE_PRICES", json.dumps({MODEL: {"input": 1e6, "output": 0}}))
    store = MemoryScoreStore()
    prices = {**ScoringDeps(registry={}, store=store).prices}
    prices[MODEL] = prices[MODEL].model_copy(update={"input": 2e6})
    deps = ScoringDeps(registry=Registry([_grader(MODEL)]), store=store, prices=prices)
    asyncio.run(score_batch(batch(range(1), ["grader"], salt="prices"), deps))
    (record,) = store.records.values()
    assert record.input_tokens > 0
    assert record.cost_usd == pytest.approx(2 * record.input_tokens)


def test_a_worker_runtime_prices_by_its_settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACESCORE_PRICES", raising=False)
    hooks = get_judge_hooks()
    reset_runtime()
    settings = load_settings(
        broker_url=redis_url,
        scorers="tests.worker.sample_scorers",
        writer="none",
        prices=json.dumps({MODEL: {"input": 3, "output": 4}}),
    )
    try:
        runtime = get_runtime(create_app(settings).settings)
        assert runtime.deps.prices[MODEL].input == 3
        guard = get_judge_hooks().guard
        assert isinstance(guard, BudgetGuard)
        assert guard.prices[MODEL].output == 4
    finally:
        runtime = reset_runtime()
        if runtime is not None:
            run_coro(runtime.store.close(), 5)
            run_coro(runtime.dead_letters.close(), 5)
            run_coro(runtime.limiter.close(), 5)
        stop_loop()
        set_judge_hooks(hooks)


def test_scoring_in_process_prices_by_the_table_it_is_given(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tracescore score`` and an embedded backfill pass their Settings' prices to the
    embedded scorer and the local budget guard, whatever the environment says."""
    monkeypatch.setenv("TRACESCORE_PRICES", json.dumps({MODEL: {"input": 1e6, "output": 0}}))
    prices = parse_prices(json.dumps({MODEL: {"input": 3e5, "output": 0}}))
    store = MemoryScoreStore()
    scorer = EmbeddedScorer(Registry([_grader(MODEL)]), store=store, prices=prices)
    try:
        scorer.submit(batch(range(1), ["grader"], salt="embedded-prices"))
    finally:
        scorer.close()
    (record,) = store.records.values()
    assert record.cost_usd == pytest.approx(0.3 * record.input_tokens)

    hooks = get_judge_hooks()
    _, restore = install_local_guard(parse_budgets(""), prices=prices)
    try:
        guard = get_judge_hooks().guard
        assert isinstance(guard, BudgetGuard)
        assert guard.prices[MODEL].input == 3e5
    finally:
        restore()
    assert get_judge_hooks() == hooks
