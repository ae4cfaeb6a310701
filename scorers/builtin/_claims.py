"""Claim extraction shared by ``faithfulness`` and ``hallucination``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from scorers import ScorerRun
from scorers.builtin._llm import fenced, require_output

__all__ = ["Claims", "claims_prompt"]


class Claims(BaseModel):
    claims: list[str] = Field(description="Checkable factual claims made by the output, in order")


def claims_prompt(run: ScorerRun) -> str:
    output = require_output(run)
    return (
        "List the factual claims the assistant output below makes: each a single statement of "
        "fact that could be checked against a source, self-contained (pronouns resolved), in the "
        "output's order. Leave out greetings, questions, opinions, offers of help and statements "
        "about the conversation itself. An output with no factual claim gives an empty list.\n\n"
        f"{fenced('assistant output', output)}\n\n"
        'Answer as JSON: {"claims": [...]}.'
    )
