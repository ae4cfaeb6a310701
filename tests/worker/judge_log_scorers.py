"""Judge scorers of both providers whose prompt carries a marker standing for the agent's content
(the worker's env points the SDKs at tests/fakellm): for tests of what the worker logs."""

from __future__ import annotations

from scorers import Judge, PromptStep, create_scorer

MARKER = "AGENT-CONTENT-MARKER-judge-prompt"


def _scorer(scorer_id: str, model: str) -> object:
    return create_scorer(scorer_id, type="agent", judge=Judge(model=model)).generate_score(
        PromptStep(description="one judge call", create_prompt=lambda run: f"SCORE the agent's words: {MARKER}")
    )


judged_openai = _scorer("judged_openai", "openai/fake-judge")
judged_anthropic = _scorer("judged_anthropic", "anthropic/fake-judge")
