"""The names ``scorers`` exports, for type checkers; ``__init__.py`` loads each from the module
named here on first use."""

# The subpackages: attributes of the package (as when it imported them all), loaded on first use.
from . import agent, builtin, judge
from ._errors import RunInputError, ScorerConfigError, ScorerError, ScorerRunError, category_of
from ._filter import filter_run
from ._not_scorable import NotScorable, not_scorable
from ._result import JudgeAttempt, JudgeExecution, JudgeUsage, ScoreResult, StepName
from ._run import ScorerRun, StepResults
from ._scorer import PrepareRun, Scorer, ScorerType, create_scorer
from ._secrets import header_value_problem, scrub_secrets
from ._steps import PromptStep
from .judge import Judge

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
    "agent",
    "builtin",
    "category_of",
    "create_scorer",
    "filter_run",
    "header_value_problem",
    "judge",
    "not_scorable",
    "scrub_secrets",
]
