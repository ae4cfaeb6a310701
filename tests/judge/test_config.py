"""Judge settings: defaults, field-by-field inheritance, and argument checks."""

from __future__ import annotations

import copy

import pytest

from scorers import Judge, PromptStep, ScorerConfigError, ScorerRunError, create_scorer
from scorers.judge import StreamErrorRetryProcessor
from scorers.judge.testing import FakeJudgeModel


def test_defaults_read_through_unset_fields() -> None:
    """Unset fields read as the documented defaults."""
    judge = Judge("openai/gpt-4o-mini", "Be fair.")
    assert judge.json_prompt_injection == "auto"
    assert judge.input_processors == judge.output_processors == judge.error_processors == ()
    assert judge.max_processor_retries is None
    assert judge.effective_max_processor_retries == 0
    assert judge.explicit_fields == {"model", "instructions"}


def test_default_retry_cap_with_error_processors() -> None:
    """With error processors and no cap, the cap is 10; an explicit cap wins."""
    proc = StreamErrorRetryProcessor()
    assert Judge("openai/m", error_processors=[proc]).effective_max_processor_retries == 10
    assert Judge("openai/m", error_processors=[proc], max_processor_retries=2).effective_max_processor_retries == 2


def test_over_overrides_only_set_fields() -> None:
    """A step judge overrides the fields it sets; the rest come from the scorer's judge."""
    proc = StreamErrorRetryProcessor()
    base = Judge("openai/gpt-4o-mini", "Base.", "inline", error_processors=[proc], max_processor_retries=3)
    step = Judge(model="anthropic/claude-3-5-haiku-latest", json_prompt_injection=False)
    merged = step.over(base)
    assert merged.model == "anthropic/claude-3-5-haiku-latest"
    assert merged.instructions == "Base."
    assert merged.json_prompt_injection is False
    assert merged.error_processors == (proc,)
    assert merged.max_processor_retries == 3
    assert step.over(None) is step


def test_processor_lists_replace() -> None:
    """An explicit empty processor list on a step replaces the scorer's list."""
    base = Judge("openai/m", error_processors=[StreamErrorRetryProcessor()])
    assert Judge(error_processors=[]).over(base).error_processors == ()


def test_step_judges_of_a_scorer() -> None:
    """Scorer.step_judges shows each prompt step's effective judge."""
    scorer = create_scorer("x", judge=Judge("openai/m", "I")).generate_score(
        PromptStep("s", lambda: "p", judge=Judge(timeout=5))
    )
    effective = scorer.step_judges()["generate_score"]
    assert effective is not None
    assert (effective.model, effective.instructions, effective.timeout) == ("openai/m", "I", 5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "gpt-4o"}, "openai/<model>"),
        ({"model": "mistral/large"}, "not understood"),
        ({"model": 3}, "JudgeModel"),
        ({"json_prompt_injection": "yes"}, "'auto', True, 'system', 'inline', False"),
        ({"max_processor_retries": -1}, ">= 0"),
        ({"timeout": 0}, "> 0"),
        # NaN compares false with everything: every call timed out at once, each a paid retry.
        ({"timeout": float("nan")}, "finite number of seconds > 0, got nan"),
        ({"timeout": float("inf")}, "finite number of seconds > 0, got inf"),
        ({"temperature": float("nan")}, "finite number, got nan"),
        ({"max_tokens": 1.5}, "int > 0"),
    ],
)
def test_bad_arguments_raise_at_once(kwargs: dict[str, object], message: str) -> None:
    """Invalid Judge arguments raise ScorerConfigError naming the valid alternatives."""
    with pytest.raises(ScorerConfigError, match=message.replace("(", r"\(").replace("<", "<")):
        Judge(**kwargs)  # type: ignore[arg-type]


def test_api_key_hidden_in_repr() -> None:
    """repr(Judge) never shows the API key."""
    assert "sk-secret" not in repr(Judge("openai/m", api_key="sk-secret"))


def test_judge_is_immutable() -> None:
    """Judge fields cannot be reassigned."""
    judge = Judge("openai/m")
    with pytest.raises(AttributeError):
        judge.instructions = "x"  # type: ignore[misc]


def test_prompt_step_without_model_fails_clearly() -> None:
    """A prompt step with no judge model names the fix."""
    scorer = create_scorer("x").generate_score(PromptStep("s", lambda: "p"))
    with pytest.raises(ScorerRunError) as info:
        scorer.run_sync(input="i", output="o")
    assert isinstance(info.value.cause, ScorerConfigError)
    assert "Judge(model=" in str(info.value.cause)


def test_native_only_needs_native_support() -> None:
    """json_prompt_injection=False on a model without native structured output is a config error."""
    model = FakeJudgeModel(supports_native_structured_output=False)
    scorer = create_scorer("x", judge=Judge(model, json_prompt_injection=False)).generate_score(
        PromptStep("s", lambda: "p")
    )
    with pytest.raises(ScorerRunError) as info:
        scorer.run_sync(input="i", output="o")
    assert "does not support" in str(info.value.cause)


def test_judge_copies_to_itself() -> None:
    """An immutable Judge survives copy/deepcopy (as part of a copied config)."""
    judge = Judge("openai/gpt-4o-mini", error_processors=[StreamErrorRetryProcessor()])
    assert copy.deepcopy({"judge": judge})["judge"] is judge
    assert copy.copy(judge) is judge
