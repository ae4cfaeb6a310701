"""Built-in scorers: factories returning ordinary ``Scorer`` objects built with ``create_scorer``.

Code-based (no judge): ``completeness``, ``content_similarity``, ``keyword_coverage``,
``textual_difference``, ``tone_consistency``, ``tool_call_accuracy`` and the ``checks``
namespace. ``CATALOGUE`` lists every builtin with its id, kind, range, direction and required
inputs; ``catalogue_markdown()`` renders it as the README table.
"""

from scorers.builtin import checks
from scorers.builtin._catalogue import CATALOGUE, CatalogueEntry, catalogue_markdown
from scorers.builtin._completeness import completeness
from scorers.builtin._content_similarity import content_similarity
from scorers.builtin._keyword_coverage import keyword_coverage
from scorers.builtin._textual_difference import textual_difference
from scorers.builtin._tone import tone_consistency
from scorers.builtin._tool_call_accuracy import tool_call_accuracy

__all__ = [
    "CATALOGUE",
    "CatalogueEntry",
    "catalogue_markdown",
    "checks",
    "completeness",
    "content_similarity",
    "keyword_coverage",
    "textual_difference",
    "tone_consistency",
    "tool_call_accuracy",
]
