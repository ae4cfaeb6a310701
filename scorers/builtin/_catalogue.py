"""The catalogue of built-in scorers: one place the README table and registries are made from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from scorers import Scorer
from scorers.builtin import _checks
from scorers.builtin._answer_relevancy import answer_relevancy
from scorers.builtin._answer_similarity import answer_similarity
from scorers.builtin._bias import bias
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

__all__ = ["CATALOGUE", "CatalogueEntry", "catalogue_markdown"]


@dataclass(frozen=True)
class CatalogueEntry:
    """One built-in scorer: its default id, how it judges, and what a run must carry.

    ``score_range`` is the default range; LLM scorers scale it with their ``scale`` option.
    ``factory`` builds the scorer (``CATALOGUE["faithfulness"].factory(model=...)``).
    """

    id: str
    factory: Callable[..., Scorer]
    kind: Literal["code", "llm"]
    score_range: tuple[float, float]
    direction: Literal["higher", "lower"]
    requires: tuple[str, ...]
    summary: str

    @property
    def import_name(self) -> str:
        module = "checks." if self.factory.__module__.endswith("_checks") else ""
        return f"{module}{self.factory.__name__}"


_UNIT = (0.0, 1.0)
_CONTEXT = "context (option, or tool results)"
_ENTRIES: list[CatalogueEntry] = [
    CatalogueEntry(
        "completeness",
        completeness,
        "code",
        _UNIT,
        "higher",
        ("input", "output"),
        "Share of the input's key terms (content words) covered by the output.",
    ),
    CatalogueEntry(
        "content-similarity",
        content_similarity,
        "code",
        _UNIT,
        "higher",
        ("input", "output"),
        "Character-bigram Dice similarity of input and output.",
    ),
    CatalogueEntry(
        "keyword-coverage",
        keyword_coverage,
        "code",
        _UNIT,
        "higher",
        ("input", "output"),
        "Share of the reference's keywords (stop words removed) found in the output.",
    ),
    CatalogueEntry(
        "textual-difference",
        textual_difference,
        "code",
        _UNIT,
        "higher",
        ("input", "output"),
        "Similarity ratio (normalized Indel) with change count and length difference.",
    ),
    CatalogueEntry(
        "tone-consistency",
        tone_consistency,
        "code",
        _UNIT,
        "higher",
        ("output",),
        "VADER sentiment agreement with a reference tone, or stability across sentences.",
    ),
    CatalogueEntry(
        "tool-call-accuracy",
        tool_call_accuracy,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "Expected tool called / expected order of calls (strict or lenient), 0 or 1.",
    ),
    CatalogueEntry(
        "check-includes",
        _checks.includes,
        "code",
        _UNIT,
        "higher",
        ("output",),
        "Output contains a substring.",
    ),
    CatalogueEntry(
        "check-excludes",
        _checks.excludes,
        "code",
        _UNIT,
        "higher",
        ("output",),
        "Output does not contain a substring.",
    ),
    CatalogueEntry(
        "check-equals",
        _checks.equals,
        "code",
        _UNIT,
        "higher",
        ("output",),
        "Output equals a string.",
    ),
    CatalogueEntry(
        "check-matches",
        _checks.matches,
        "code",
        _UNIT,
        "higher",
        ("output",),
        "Output matches a regular expression.",
    ),
    CatalogueEntry(
        "check-called-tool",
        _checks.called_tool,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "A tool was called (at least N times).",
    ),
    CatalogueEntry(
        "check-did-not-call",
        _checks.did_not_call,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "A tool was not called.",
    ),
    CatalogueEntry(
        "check-tool-order",
        _checks.tool_order,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "Tools were called in an order (gaps allowed).",
    ),
    CatalogueEntry(
        "check-max-tool-calls",
        _checks.max_tool_calls,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "At most N tool calls.",
    ),
    CatalogueEntry(
        "check-no-tool-errors",
        _checks.no_tool_errors,
        "code",
        _UNIT,
        "higher",
        ("tool calls",),
        "No tool call failed or was left without a result.",
    ),
    CatalogueEntry(
        "check-all",
        _checks.all_of,
        "code",
        _UNIT,
        "higher",
        ("the combined checks' inputs",),
        "1 when every combined scorer scores 1.",
    ),
    CatalogueEntry(
        "check-any",
        _checks.any_of,
        "code",
        _UNIT,
        "higher",
        ("the combined checks' inputs",),
        "1 when any combined scorer scores 1.",
    ),
    CatalogueEntry(
        "answer-relevancy",
        answer_relevancy,
        "llm",
        _UNIT,
        "higher",
        ("input", "output"),
        "Statements judged yes/unsure/no for relevance to the user's message (unsure = 0.3).",
    ),
    CatalogueEntry(
        "faithfulness",
        faithfulness,
        "llm",
        _UNIT,
        "higher",
        ("output", _CONTEXT),
        "Share of the answer's claims supported by the context.",
    ),
    CatalogueEntry(
        "hallucination",
        hallucination,
        "llm",
        _UNIT,
        "lower",
        ("output", _CONTEXT),
        "Share of the answer's claims contradicted by the context.",
    ),
    CatalogueEntry(
        "bias",
        bias,
        "llm",
        _UNIT,
        "lower",
        ("output",),
        "Share of the answer's opinions that are biased.",
    ),
    CatalogueEntry(
        "toxicity",
        toxicity,
        "llm",
        _UNIT,
        "lower",
        ("output",),
        "Share of the answer's statements that are toxic.",
    ),
    CatalogueEntry(
        "prompt-alignment",
        prompt_alignment,
        "llm",
        _UNIT,
        "higher",
        ("output", "user and/or system prompt"),
        "Intent, requirements, completeness and format against the user and system prompts.",
    ),
    CatalogueEntry(
        "context-precision",
        context_precision,
        "llm",
        _UNIT,
        "higher",
        ("output", _CONTEXT),
        "Mean average precision of the useful context pieces' ranking.",
    ),
    CatalogueEntry(
        "context-relevance",
        context_relevance,
        "llm",
        _UNIT,
        "higher",
        ("output", _CONTEXT),
        "Relevance and use of the context, less penalties for unused and missing context.",
    ),
    CatalogueEntry(
        "noise-sensitivity",
        noise_sensitivity,
        "llm",
        _UNIT,
        "higher",
        ("input", "output", "baseline_response + noisy_query options"),
        "Robustness of the answer to a noisy query, against a baseline answer.",
    ),
    CatalogueEntry(
        "answer-similarity",
        answer_similarity,
        "llm",
        _UNIT,
        "higher",
        ("output", "ground_truth"),
        "Semantic-unit match of the answer against the ground-truth answer.",
    ),
    CatalogueEntry(
        "tool-call-accuracy-llm",
        tool_call_accuracy_llm,
        "llm",
        _UNIT,
        "higher",
        ("input", "tool calls", "available_tools option"),
        "Share of tool calls the judge finds appropriate for the request.",
    ),
]

CATALOGUE: Mapping[str, CatalogueEntry] = MappingProxyType({e.id: e for e in _ENTRIES})


def catalogue_markdown() -> str:
    """The README's table of built-in scorers, generated from ``CATALOGUE``."""
    rows = [
        "| id | factory | kind | range | direction | required inputs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in CATALOGUE.values():
        low, high = e.score_range
        span = f"{low:g}–{high:g}" if e.kind == "code" else f"{low:g}–scale (default {high:g})"
        better = "higher is better" if e.direction == "higher" else "lower is better"
        rows.append(f"| `{e.id}` | `{e.import_name}` | {e.kind} | {span} | {better} | {', '.join(e.requires)} |")
    return "\n".join(rows) + "\n"
