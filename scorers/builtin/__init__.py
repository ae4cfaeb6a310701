"""Built-in scorers: factories returning ordinary ``Scorer`` objects built with ``create_scorer``.

Code-based (no judge): ``completeness``, ``content_similarity``, ``keyword_coverage``,
``textual_difference``, ``tone_consistency``, ``tool_call_accuracy`` and the ``checks``
namespace.

LLM judge (each takes ``model`` — ``"provider/model"`` or a ``JudgeModel`` — plus ``scale``
and an optional ``judge=Judge(...)`` for processors/retries): ``answer_relevancy``,
``faithfulness``, ``hallucination``, ``bias``, ``toxicity``, ``prompt_alignment``,
``context_precision``, ``context_relevance``, ``noise_sensitivity``, ``answer_similarity``,
``tool_call_accuracy_llm``. See ``scorers/builtin/_llm.py`` for when a run is not scorable
and when it is an error.

``CATALOGUE`` lists every builtin with its id, kind, range, direction and required
inputs; ``catalogue_markdown()`` renders it as the README table.
"""

from scorers.builtin import checks
from scorers.builtin._answer_relevancy import answer_relevancy
from scorers.builtin._answer_similarity import answer_similarity
from scorers.builtin._bias import bias
from scorers.builtin._catalogue import CATALOGUE, CatalogueEntry, catalogue_markdown
from scorers.builtin._completeness import completeness
from scorers.builtin._content_similarity import content_similarity
from scorers.builtin._context_precision import context_precision
from scorers.builtin._context_relevance import context_relevance
from scorers.builtin._faithfulness import faithfulness
from scorers.builtin._hallucination import hallucination
from scorers.builtin._keyword_coverage import keyword_coverage
from scorers.builtin._noise_sensitivity import noise_sensitivity
from scorers.builtin._prompt_alignment import prompt_alignment
from scorers.builtin._textual_difference import textual_difference
from scorers.builtin._tone import tone_consistency
from scorers.builtin._tool_call_accuracy import tool_call_accuracy
from scorers.builtin._tool_call_accuracy_llm import tool_call_accuracy_llm
from scorers.builtin._toxicity import toxicity

__all__ = [
    "CATALOGUE",
    "CatalogueEntry",
    "answer_relevancy",
    "answer_similarity",
    "bias",
    "catalogue_markdown",
    "checks",
    "completeness",
    "content_similarity",
    "context_precision",
    "context_relevance",
    "faithfulness",
    "hallucination",
    "keyword_coverage",
    "noise_sensitivity",
    "prompt_alignment",
    "textual_difference",
    "tone_consistency",
    "tool_call_accuracy",
    "tool_call_accuracy_llm",
    "toxicity",
]
