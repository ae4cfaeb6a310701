"""Helpers for the LLM-judge builtin tests: run a scorer on a fresh loop against the fake LLM."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from scorers import Scorer, ScoreResult

OPENAI = "openai/gpt-4o-mini"
ANTHROPIC = "anthropic/claude-3-5-haiku-latest"
_FENCE = re.compile(r'<data label="([^"]*)" fence="([0-9a-f]+)">\n(.*?)\n</data fence="\2">', re.S)


def score(scorer: Scorer, **run: Any) -> ScoreResult:
    """``scorer.run`` on its own event loop (``asyncio.run`` closes the judge clients)."""
    return asyncio.run(scorer.run(**run))


def fenced_blocks(prompt: str) -> dict[str, str]:
    """The fenced data blocks of a prompt, by label."""
    return {label: body for label, _, body in _FENCE.findall(prompt)}
