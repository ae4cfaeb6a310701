"""Step kinds: a plain function, or a ``PromptStep`` that asks the LLM judge.

A step function is called with keyword arguments and receives only those it declares
(``run``, ``results``, ``score``; ``**kwargs`` gets them all). The declared names are read
once, when the step is added, so the hot path does no introspection.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from pydantic_core import to_jsonable_python

from scorers._errors import ScorerConfigError

if TYPE_CHECKING:
    from scorers.judge import Judge

__all__ = ["FunctionStep", "PromptStep", "Step", "StepFunction", "call_declared", "declared_params"]

StepFunction: TypeAlias = Callable[..., Any]
OutputSchema: TypeAlias = type[Any] | Mapping[str, Any]


def declared_params(fn: Callable[..., Any], allowed: frozenset[str], what: str) -> frozenset[str] | None:
    """Keyword names ``fn`` accepts out of ``allowed``; None when it takes ``**kwargs``."""
    if not callable(fn):
        raise ScorerConfigError(f"{what} must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: give them everything
        return None
    names: set[str] = set()
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise ScorerConfigError(
                f"{what} takes positional-only parameter {p.name!r}; steps are called with "
                f"keyword arguments (any of: {', '.join(sorted(allowed))})"
            )
        if p.name in allowed:
            names.add(p.name)
        elif p.default is p.empty:
            raise ScorerConfigError(
                f"{what} requires parameter {p.name!r}, which is never passed; "
                f"a step may declare: {', '.join(sorted(allowed))}"
            )
    return frozenset(names)


def call_declared(fn: Callable[..., Any], params: frozenset[str] | None, kwargs: dict[str, Any]) -> Any:
    if params is None:
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


# The attribute ``plain_json`` sets on a step function.
PLAIN_JSON = "__tracescore_plain_json__"

_F = TypeVar("_F", bound=Callable[..., Any])


def plain_json(fn: _F) -> _F:
    """Mark a step function whose value is plain JSON (dicts, lists, text, numbers), so that a
    checkpoint gives it back exactly and a resumed run need not run it again."""
    setattr(fn, PLAIN_JSON, True)
    return fn


@dataclass(frozen=True, slots=True)
class FunctionStep:
    fn: StepFunction
    params: frozenset[str] | None
    # Its value is plain JSON (the built-in checks'): a checkpoint gives it back exactly, so a
    # resumed run takes it from there instead of running the step again (all_of's step runs
    # scorers that may call a judge).
    plain_json: bool = False


@dataclass(frozen=True)
class PromptStep:
    """A step answered by the LLM judge.

    ``create_prompt`` takes the same keyword arguments as a step function and returns the
    prompt text (it may be async). preprocess/analyze need ``output_schema`` (a pydantic
    model or a JSON-schema dict); generate_score's judge answers ``{"score": number}`` unless
    ``output_schema`` says otherwise, and ``calculate_score(run=, results=,
    analyze_step_result=, judge_output=)`` maps the answer to the score. generate_reason's
    judge answers free text.
    """

    description: str
    create_prompt: Callable[..., str | Awaitable[str]]
    output_schema: OutputSchema | None = None
    judge: Judge | None = None
    calculate_score: Callable[..., float | Awaitable[float]] | None = None
    _prompt_params: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)
    _score_params: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):
            raise ScorerConfigError("PromptStep.description must be a string")
        prompt_params = declared_params(
            self.create_prompt,
            frozenset({"run", "results", "score"}),
            f"PromptStep({self.description!r}).create_prompt",
        )
        object.__setattr__(self, "_prompt_params", prompt_params)
        if self.output_schema is not None:
            _check_output_schema(self.description, self.output_schema)
        if self.calculate_score is not None:
            score_params = declared_params(
                self.calculate_score,
                frozenset({"run", "results", "analyze_step_result", "judge_output"}),
                f"PromptStep({self.description!r}).calculate_score",
            )
            object.__setattr__(self, "_score_params", score_params)

    @property
    def prompt_params(self) -> frozenset[str] | None:
        """The names ``create_prompt`` declares (None when it takes ``**kwargs``)."""
        return self._prompt_params

    def render_prompt(self, kwargs: dict[str, Any]) -> str | Awaitable[str]:
        return call_declared(self.create_prompt, self._prompt_params, kwargs)  # type: ignore[no-any-return]

    def restore(self, stored: Any) -> Any:
        """The answer a checkpoint stored as JSON, as the judge's call gave it (a model instance
        for a pydantic schema); ``ValueError`` when it no longer fits the schema, or when its
        validation changes what it validates (a validator that rescales): then only asking
        again gives the answer the call gave."""
        if self.output_schema is None:
            return stored
        from scorers.judge._request import output_spec  # scorers.judge imports this package's types

        spec = output_spec(self.output_schema)
        value = spec.validate(stored)
        # Stable under a dump and a validation, as the call's answer was: a validator that
        # rescales is not (0.8 came back 0.08). (Compared with the stored JSON instead, a set's
        # order, which differs from process to process, or a field added since, asked again.)
        if spec.validate(to_jsonable_python(value)) != value:
            raise ValueError("validating the stored answer changes it")
        return value

    def compute_score(self, kwargs: dict[str, Any]) -> float | Awaitable[float]:
        assert self.calculate_score is not None
        return call_declared(self.calculate_score, self._score_params, kwargs)  # type: ignore[no-any-return]


Step: TypeAlias = FunctionStep | PromptStep


def _check_output_schema(description: str, schema: Any) -> None:
    """Build the schema's validator now (it is cached), so a bad schema fails here, not mid-run."""
    from scorers.judge._request import output_spec  # scorers.judge imports this package's types

    try:
        output_spec(schema)
    except Exception as exc:
        first_line = str(exc).partition("\n")[0]
        raise ScorerConfigError(
            f"PromptStep({description!r}).output_schema must be a pydantic model (or another type "
            f"pydantic validates) or a JSON-schema dict; {schema!r:.80} is not usable: {first_line}"
        ) from exc
