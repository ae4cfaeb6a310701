"""More scorers than a request may name (``tracing.queue.MAX_SCORER_IDS`` and one more)."""

from __future__ import annotations

from scorers import Scorer, create_scorer
from tracing.queue import MAX_SCORER_IDS

SCORERS: list[Scorer] = [
    create_scorer(f"s{i}", type="agent").generate_score(lambda run: 1.0) for i in range(MAX_SCORER_IDS + 1)
]
