"""``ScoreResult``: everything one scorer run produced. It travels through the queue as JSON."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["STEP_NAMES", "JudgeAttempt", "JudgeExecution", "JudgeUsage", "ScoreResult", "StepName"]

StepName = Literal["preprocess", "analyze", "generate_score", "generate_reason"]
STEP_NAMES: tuple[StepName, ...] = ("preprocess", "analyze", "generate_score", "generate_reason")


class JudgeUsage(BaseModel):
    """Tokens of judge calls. ``input_tokens`` is the whole prompt, cached parts included:
    ``cached_input_tokens`` (read from the provider's prompt cache) and
    ``cache_write_input_tokens`` (written to it, Anthropic's ``cache_creation_input_tokens``)
    are shares of it, priced at their own rates (``scorers.judge.price_usage``)."""

    model_config = ConfigDict(frozen=True)
    # Never negative (a custom JudgeModel's too): a negative count would price as a refund.
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    cache_write_input_tokens: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: JudgeUsage) -> JudgeUsage:
        return JudgeUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens + other.cache_write_input_tokens,
        )


class JudgeAttempt(BaseModel):
    """One call to the judge model (the first try or a retry)."""

    status: Literal["ok", "error"]
    duration_ms: float
    usage: JudgeUsage | None = None
    error: str | None = None
    error_type: str | None = None
    status_code: int | None = None
    request_id: str | None = None
    retry_delay_ms: float | None = None
    prompt_injection: str | None = None
    # Why the model stopped, in the provider's words ("stop", "length", "max_tokens", ...):
    # "length"/"max_tokens" on a free-text step says its text was cut at max_tokens.
    finish_reason: str | None = None


class JudgeExecution(BaseModel):
    """The judge's work for one prompt step: the prompt, the answer, and every attempt."""

    step: StepName
    status: Literal["ok", "error"]
    prompt: str
    output: Any = None
    raw_output: str | None = None
    model: str
    provider: str
    usage: JudgeUsage = Field(default_factory=JudgeUsage)
    attempt_count: int = 0
    duration_ms: float = 0.0
    error: str | None = None
    attempts: list[JudgeAttempt] = Field(default_factory=list)


class ScoreResult(BaseModel):
    """What ``Scorer.run`` returns. Step results are stored JSON-ready, so a round trip is exact."""

    run_id: str
    scorer_id: str = ""
    score: float | None = None
    reason: str | None = None
    label: str | None = None
    preprocess_step_result: Any = None
    analyze_step_result: Any = None
    preprocess_prompt: str | None = None
    analyze_prompt: str | None = None
    generate_score_prompt: str | None = None
    generate_reason_prompt: str | None = None
    judge: dict[StepName, JudgeExecution] = Field(default_factory=dict)
    not_scorable: dict[str, str] | None = None
    completed_steps: list[StepName] = Field(default_factory=list)
