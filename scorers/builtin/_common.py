"""Small checks shared by the builtin factories: options are validated when the scorer is built."""

from __future__ import annotations

import math

from scorers import ScorerConfigError
from scorers.builtin._text import stop_words

__all__ = ["check_language", "check_positive"]


def check_language(scorer_id: str, language: str) -> None:
    try:
        stop_words(language)
    except ValueError as exc:
        raise ScorerConfigError(f"scorer {scorer_id!r}: {exc}") from exc


def check_positive(scorer_id: str, option: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ScorerConfigError(f"scorer {scorer_id!r}: {option} must be a finite positive number, got {value!r}")
    return float(value)
