"""tracescore's scoring pipeline: a Python rendering of Mastra's ``createScorer``.

Pure Python, pydantic and the judge SDKs; imports neither celery nor opentelemetry.
"""

from scorers._errors import RunInputError, ScorerConfigError, ScorerError, ScorerRunError, category_of
from scorers._filter import filter_run
from scorers._not_scorable import NotScorable, not_scorable
from scorers._result import JudgeAttempt, JudgeExecution, JudgeUsage, ScoreResult, StepName
from scorers._run import ScorerRun, StepResults
from scorers._scorer import PrepareRun, Scorer, ScorerType, create_scorer
from scorers._secrets import scrub_secrets
from scorers._steps import PromptStep
from scorers.judge import Judge

__all__ = [
    "Judge",
    "JudgeAttempt",
    "JudgeExecution",
    "JudgeUsage",
    "NotScorable",
    "PrepareRun",
    "PromptStep",
    "RunInputError",
    "ScoreResult",
    "Scorer",
    "ScorerConfigError",
    "ScorerError",
    "ScorerRun",
    "ScorerRunError",
    "ScorerType",
    "StepName",
    "StepResults",
    "category_of",
    "create_scorer",
    "filter_run",
    "not_scorable",
    "scrub_secrets",
]
