"""The LLM judge: configuration, model adapters, processors and retries."""

from scorers.judge._ask import JudgeAnswer, ask_judge
from scorers.judge._config import Judge, JudgeModel

__all__ = ["Judge", "JudgeAnswer", "JudgeModel", "ask_judge"]
