"""What judge calls cost: a price table per model and ``price_usage`` (pure data, no I/O).

Prices are US dollars per million tokens: ``input``, ``output``, ``cached_input`` (tokens read
from the provider's prompt cache) and ``cache_write`` (tokens written to it: Anthropic bills a
5-minute cache write at 1.25 × input; OpenAI's automatic caching writes for free, so its
``cache_write`` is the input price).

The defaults were taken on ``PRICES_TAKEN`` (standard tier, no batch or fast-mode rates, the
short-context tier where a model has a long-context one) from stored copies of Anthropic's
price page (platform.claude.com/docs/en/about-claude/pricing) and, for OpenAI and the newest
models, from price tables that cite developers.openai.com/api/docs/pricing (read there between
2026-09 and 2026-11). Prices change: check them, and override them (the worker reads
``TRACESCORE_PRICES``) rather than trusting this table for billing.

A model is found by its id (``"openai/gpt-4o-mini"``), or by the id without a date suffix
(``"anthropic/claude-sonnet-4-5-20250929"`` → ``"anthropic/claude-sonnet-4-5"``). A model not
in the table has no price: its cost is None ("unpriced"), never 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from scorers._result import JudgeExecution, JudgeUsage

__all__ = ["DEFAULT_PRICES", "PRICES_TAKEN", "ModelPrice", "find_price", "price_executions", "price_usage"]

PRICES_TAKEN = "2026-12-01"


# USD per million tokens no model comes near: a price past it is a typo (1e308 made every
# call's cost infinite, which no ledger can add, and every budget went unenforced).
MAX_PRICE_PER_MILLION = 1_000_000.0  # a dollar a token


class ModelPrice(BaseModel):
    """USD per million tokens. ``cached_input`` / ``cache_write`` default to ``input``; finite,
    ≥ 0 and at most ``MAX_PRICE_PER_MILLION`` (an infinite price makes an infinite cost).
    Numbers only: lax mode read ``true`` as 1 USD and ``"0.15"`` as a price."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)

    input: float = Field(ge=0, le=MAX_PRICE_PER_MILLION)
    output: float = Field(ge=0, le=MAX_PRICE_PER_MILLION)
    cached_input: float | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MILLION)
    cache_write: float | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MILLION)


def _p(input: float, cached: float, output: float, write: float | None = None) -> ModelPrice:
    return ModelPrice(input=input, output=output, cached_input=cached, cache_write=write)


DEFAULT_PRICES: Mapping[str, ModelPrice] = {
    # OpenAI: input, cached input, output (cache writes are free: OpenAI caches by itself).
    "openai/gpt-6-astra": _p(10.00, 1.00, 50.00),
    "openai/gpt-6-sol": _p(2.00, 0.20, 10.00),
    "openai/gpt-6-luna": _p(0.10, 0.01, 0.50),
    "openai/gpt-5.6-terra": _p(2.00, 0.20, 12.00),
    "openai/gpt-5.6-luna": _p(0.20, 0.02, 1.20),
    "openai/gpt-5.4": _p(2.50, 0.25, 15.00),
    "openai/gpt-5.4-mini": _p(0.75, 0.075, 4.50),
    "openai/gpt-5": _p(1.25, 0.125, 10.00),
    "openai/gpt-5-mini": _p(0.25, 0.025, 2.00),
    "openai/gpt-5-nano": _p(0.05, 0.005, 0.40),
    "openai/gpt-4.1": _p(2.00, 0.50, 8.00),
    "openai/gpt-4.1-mini": _p(0.40, 0.10, 1.60),
    "openai/gpt-4.1-nano": _p(0.10, 0.025, 0.40),
    "openai/gpt-4o": _p(2.50, 1.25, 10.00),
    "openai/gpt-4o-mini": _p(0.15, 0.075, 0.60),
    # Anthropic: input, cache hits, output, 5-minute cache writes (short-context tier).
    "anthropic/claude-fable-5-1": _p(10.00, 0.25, 50.00, 12.50),
    "anthropic/claude-fable-5": _p(10.00, 1.00, 50.00, 12.50),
    "anthropic/claude-opus-5-5": _p(4.00, 0.20, 20.00, 5.00),
    "anthropic/claude-opus-5": _p(5.00, 0.50, 25.00, 6.25),
    "anthropic/claude-opus-4-8": _p(5.00, 0.50, 25.00, 6.25),
    "anthropic/claude-opus-4-7": _p(5.00, 0.50, 25.00, 6.25),
    "anthropic/claude-opus-4-6": _p(5.00, 0.50, 25.00, 6.25),
    "anthropic/claude-opus-4-5": _p(5.00, 0.50, 25.00, 6.25),
    "anthropic/claude-sonnet-5-5": _p(2.00, 0.10, 10.00, 2.50),
    "anthropic/claude-sonnet-5": _p(2.00, 0.20, 10.00, 2.50),
    "anthropic/claude-sonnet-4-6": _p(3.00, 0.30, 15.00, 3.75),
    "anthropic/claude-sonnet-4-5": _p(3.00, 0.30, 15.00, 3.75),
    "anthropic/claude-haiku-5-5": _p(0.10, 0.01, 0.50, 0.125),
    "anthropic/claude-haiku-4-5": _p(1.00, 0.10, 5.00, 1.25),
}

# A dated snapshot of a listed model (-20250929, -2024-07-18) or its -latest alias.
_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def find_price(model_id: str, table: Mapping[str, ModelPrice] = DEFAULT_PRICES) -> ModelPrice | None:
    """The price of ``model_id`` in ``table`` (exact id, else the id without its date suffix)."""
    found = table.get(model_id)
    if found is None:
        found = table.get(_SNAPSHOT.sub("", model_id))
    return found


def price_usage(model_id: str, usage: JudgeUsage, table: Mapping[str, ModelPrice] = DEFAULT_PRICES) -> float | None:
    """US dollars for ``usage`` of ``model_id``; None when the model has no price (and it used
    tokens: no usage costs 0 whatever the model)."""
    if usage.input_tokens == 0 and usage.output_tokens == 0:
        return 0.0
    price = find_price(model_id, table)
    if price is None:
        return None
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    written = min(usage.cache_write_input_tokens, usage.input_tokens - cached)
    plain = usage.input_tokens - cached - written
    dollars = (
        plain * price.input
        + cached * (price.input if price.cached_input is None else price.cached_input)
        + written * (price.input if price.cache_write is None else price.cache_write)
        + usage.output_tokens * price.output
    )
    return dollars / 1_000_000


def price_executions(
    executions: list[JudgeExecution], table: Mapping[str, ModelPrice] = DEFAULT_PRICES
) -> float | None:
    """The cost of a run's judge work (one execution per prompt step); None if any step's model
    has no price."""
    total = 0.0
    for execution in executions:
        cost = price_usage(execution.model, execution.usage, table)
        if cost is None:
            return None
        total += cost
    return total
