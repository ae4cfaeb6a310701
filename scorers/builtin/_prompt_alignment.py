"""``prompt_alignment`` (LLM judge): does the answer do what the user and the system prompt asked?

Steps (Mastra's prompt-alignment semantics, our prompts):
1. analyze (judge): for the user prompt and/or the system prompt, four dimensions, each 0–1:
   intent alignment, requirements fulfilment (per requirement), completeness, and
   appropriateness of format and tone.
2. generate_score (code), weighted as in Mastra:
   user prompt   = 0.40·intent + 0.30·requirements + 0.20·completeness + 0.10·appropriateness;
   system prompt = 0.35·intent + 0.35·requirements + 0.15·completeness + 0.15·appropriateness;
   ``evaluation_mode="both"`` = 0.7·user + 0.3·system (Mastra scores its single analysis
   twice there; we ask for both analyses). Times ``scale``.
3. generate_reason (judge).

Not scorable: no output text; ``"user"`` mode without a user message; ``"system"`` mode
without system instructions; ``"both"`` with neither. In ``"both"`` mode a run that has only one
of the two prompts is judged on that one alone.

An answer that leaves out an analysis it was asked for is a judge answer that does not fit: in
``"user"`` and ``"system"`` mode the schema requires that analysis (one fallback call, then
``JudgeOutputError``); in ``"both"`` mode which analyses are asked depends on the run, so the
score step raises ``JudgeOutputError`` itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from scorers import Judge, PromptStep, Scorer, ScorerConfigError, ScorerRun, StepResults, create_scorer, not_scorable
from scorers.agent import get_combined_system_prompt
from scorers.builtin._llm import (
    LLM_VERSION,
    ModelOption,
    as_json,
    check_scale,
    fenced,
    make_judge,
    parse,
    require_output,
    rounded,
)
from scorers.builtin._runs import user_text
from scorers.judge import JudgeModel, JudgeOutputError

__all__ = ["AlignmentAnalysis", "PromptAlignmentAnalysis", "prompt_alignment"]

EvaluationMode = Literal["user", "system", "both"]

INSTRUCTIONS = """You judge how well an AI assistant's answer aligns with the prompts it was given:
the user's request and the system (developer) instructions. Score each dimension from 0 to 1:
1 fully aligned, 0 not at all. Judge alignment with what was asked, not general quality."""

_WEIGHTS = {
    "user": (0.40, 0.30, 0.20, 0.10),
    "system": (0.35, 0.35, 0.15, 0.15),
}
_BOTH = {"user": 0.7, "system": 0.3}
_MODE_TEXT = {"user": "user", "system": "system", "both": "user and system"}
_DIMENSIONS = (
    "intent_alignment (the primary intent, whether the answer addresses it, a score); "
    "requirements_fulfillment (each explicit or clearly implied requirement, fulfilled or not, "
    "and an overall_score); completeness (a score and the missing elements); "
    "response_appropriateness (format and tone as asked, a score); overall_assessment."
)


class IntentAlignment(BaseModel):
    score: float = Field(description="0 to 1")
    primary_intent: str
    is_addressed: bool
    reasoning: str


class Requirement(BaseModel):
    requirement: str
    is_fulfilled: bool
    reasoning: str


class RequirementsFulfillment(BaseModel):
    requirements: list[Requirement]
    overall_score: float = Field(description="0 to 1")


class Completeness(BaseModel):
    score: float = Field(description="0 to 1")
    missing_elements: list[str]
    reasoning: str


class ResponseAppropriateness(BaseModel):
    score: float = Field(description="0 to 1")
    format_alignment: bool
    tone_alignment: bool
    reasoning: str


class AlignmentAnalysis(BaseModel):
    intent_alignment: IntentAlignment
    requirements_fulfillment: RequirementsFulfillment
    completeness: Completeness
    response_appropriateness: ResponseAppropriateness
    overall_assessment: str

    def weighted(self, prompt: Literal["user", "system"]) -> float:
        wi, wr, wc, wa = _WEIGHTS[prompt]
        parts = (
            (wi, self.intent_alignment.score),
            (wr, self.requirements_fulfillment.overall_score),
            (wc, self.completeness.score),
            (wa, self.response_appropriateness.score),
        )
        return sum(w * min(1.0, max(0.0, s)) for w, s in parts)


class PromptAlignmentAnalysis(BaseModel):
    user: AlignmentAnalysis | None = Field(description="Alignment with the user prompt, or null if not asked")
    system: AlignmentAnalysis | None = Field(description="Alignment with the system prompt, or null if not asked")


class _UserAnalysis(PromptAlignmentAnalysis):
    """``"user"`` mode's answer: the user analysis is required."""

    user: AlignmentAnalysis = Field(description="Alignment with the user prompt")
    system: AlignmentAnalysis | None = Field(default=None, description="Not asked: null")


class _SystemAnalysis(PromptAlignmentAnalysis):
    """``"system"`` mode's answer: the system analysis is required."""

    user: AlignmentAnalysis | None = Field(default=None, description="Not asked: null")
    system: AlignmentAnalysis = Field(description="Alignment with the system prompt")


_SCHEMAS: dict[str, type[PromptAlignmentAnalysis]] = {
    "user": _UserAnalysis,
    "system": _SystemAnalysis,
    "both": PromptAlignmentAnalysis,
}


def prompt_alignment(
    model: ModelOption,
    *,
    evaluation_mode: EvaluationMode = "both",
    scale: float = 1.0,
    judge: Judge | None = None,
    id: str = "prompt-alignment",
    name: str | None = None,
) -> Scorer:
    """Alignment of the answer with the user and/or system prompt (0–scale, higher is better).

    Options:
        model: ``"provider/model"`` or a ``JudgeModel``.
        evaluation_mode: ``"user"``, ``"system"`` or ``"both"`` (default).
        scale: the score of a fully aligned answer (default 1).
        judge: a ``Judge`` whose set fields apply on top.
        id, name: the scorer's identity.
    """
    scale = check_scale(id, scale)
    if evaluation_mode not in ("user", "system", "both"):
        raise ScorerConfigError(
            f"scorer {id!r}: evaluation_mode must be 'user', 'system' or 'both', got {evaluation_mode!r}"
        )

    judge_ = make_judge(id, model, INSTRUCTIONS, judge)
    model_id = judge_.model.model_id if isinstance(judge_.model, JudgeModel) else str(judge_.model)

    def prompts(run: ScorerRun) -> tuple[str, str]:
        """The user and system prompts this run is judged against ("" when not judged)."""
        user = user_text(run).strip() if evaluation_mode in ("user", "both") else ""
        system = get_combined_system_prompt(run.input).strip() if evaluation_mode in ("system", "both") else ""
        if not user and not system:
            wanted = {"user": "a user message", "system": "system instructions"}.get(
                evaluation_mode, "a user message or system instructions"
            )
            raise not_scorable(f"the run has no {wanted} to check the answer against")
        return user, system

    def analyze_prompt(run: ScorerRun) -> str:
        output = require_output(run)
        user, system = prompts(run)
        asked = [k for k, text in (("user", user), ("system", system)) if text]
        lines = [
            f"Analyse the assistant answer's alignment with the {' prompt and, separately, the '.join(asked)} prompt.",
            "For each analysed prompt fill: " + _DIMENSIONS,
        ]
        lines += [f"Set {k} to null: it is not analysed." for k in ("user", "system") if k not in asked]
        blocks = [fenced(f"{k} prompt", text) for k, text in (("system", system), ("user", user)) if text]
        blocks.append(fenced("assistant answer", output))
        return (
            "\n".join(lines)
            + "\n\n"
            + "\n\n".join(blocks)
            + '\n\nAnswer as JSON: {"user": {...} or null, "system": {...} or null}.'
        )

    def score(run: ScorerRun, results: StepResults) -> float:
        analysis = parse(PromptAlignmentAnalysis, results.analyze_step_result)
        user, system = prompts(run)
        parts: list[tuple[float, float]] = []
        asked: Literal["user", "system"]
        for asked, text, part in (("user", user, analysis.user), ("system", system, analysis.system)):
            if not text:
                continue
            if part is None:
                raise JudgeOutputError(
                    f"scorer {id!r}: the judge left out the {asked}-prompt analysis it was asked for",
                    model_id=model_id,
                    step="analyze",
                    raw_output=None,
                )
            parts.append((_BOTH[asked], part.weighted(asked)))
        total = sum(w for w, _ in parts)
        return rounded(sum(w * s for w, s in parts) / total, scale)

    def reason_prompt(results: StepResults, score: float) -> str:
        analysis = parse(PromptAlignmentAnalysis, results.analyze_step_result)
        return (
            f"The prompt-alignment score is {score} on a scale of 0 to {scale:g}. Explain it in two "
            "or three sentences: what the answer did as asked and which requirements it missed.\n\n"
            f"Analysis:\n{fenced('analysis', as_json(analysis.model_dump()))}"
        )

    return (
        create_scorer(
            id,
            name=name or "Prompt alignment",
            description=f"Alignment of the answer with the {_MODE_TEXT[evaluation_mode]} prompt: "
            "intent, requirements, completeness, format (LLM judge).",
            judge=judge_,
            type="agent",
            score_range=(0.0, scale),
            direction="higher",
            version=LLM_VERSION,
        )
        .analyze(PromptStep("Analyse prompt alignment", analyze_prompt, output_schema=_SCHEMAS[evaluation_mode]))
        .generate_score(score)
        .generate_reason(PromptStep("Explain the score", reason_prompt))
    )
