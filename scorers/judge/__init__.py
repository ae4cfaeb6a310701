"""The LLM judge: configuration, model adapters, processors and retries."""

from scorers.judge._ask import JudgeAnswer, ask_judge
from scorers.judge._config import Judge, JudgeModel
from scorers.judge._hooks import JudgeHooks, JudgeLimiter, get_judge_hooks, set_judge_hooks

__all__ = [
    "Judge",
    "JudgeAnswer",
    "JudgeHooks",
    "JudgeLimiter",
    "JudgeModel",
    "ask_judge",
    "get_judge_hooks",
    "set_judge_hooks",
]
