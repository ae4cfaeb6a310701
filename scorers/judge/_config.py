"""``Judge``: which model answers a prompt step, with what instructions and retries.

Every argument left out (or None) is *unset*: reading it gives the default, and a step's
judge inherits it from the scorer's judge (``step_judge.over(scorer_judge)``). Set fields
override field by field; processor lists replace, never merge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from scorers._errors import ScorerConfigError
from scorers.judge._model import JudgeModel

__all__ = ["JUDGE_DEFAULTS", "JsonPromptInjection", "Judge", "JudgeModel"]

JsonPromptInjection = bool | Literal["auto", "system", "inline"]

JUDGE_DEFAULTS: dict[str, Any] = {
    "model": None,
    "instructions": "",
    "json_prompt_injection": "auto",
    "input_processors": (),
    "output_processors": (),
    "error_processors": (),
    "max_processor_retries": None,
    "base_url": None,
    "api_key": None,
    "timeout": 60.0,
    "max_tokens": 1024,
    "temperature": None,
}
_FIELDS = tuple(JUDGE_DEFAULTS)


class Judge:
    """Judge settings for prompt steps.

    - ``model``: ``"openai/<model>"``, ``"anthropic/<model>"`` or a :class:`JudgeModel`.
    - ``instructions``: the judge's system instructions (after the standard preamble that
      says fenced content is data; see :func:`scorers.judge.fence`).
    - ``json_prompt_injection``: ``"auto"`` (default: native structured output when the model
      supports it, else schema instructions inline), ``True``/``"system"`` (schema
      instructions in the system message), ``"inline"`` (appended to the last user message),
      ``False`` (native only). Native output that does not parse or validate is retried once
      with the schema in the system message.
    - ``input_processors`` / ``output_processors`` / ``error_processors``: see
      ``scorers.judge._processors``; ``max_processor_retries`` caps the retries of one judge
      call (default 10 when error processors are set; no retries without them).
    - ``base_url`` / ``api_key``: override the SDK environment variables for string models.
    - ``timeout`` (seconds, default 60), ``max_tokens`` (default 1024), ``temperature``
      (default: the provider's).
    """

    __slots__ = ("_set", *_FIELDS)

    model: str | JudgeModel | None
    instructions: str
    json_prompt_injection: JsonPromptInjection
    input_processors: tuple[Any, ...]
    output_processors: tuple[Any, ...]
    error_processors: tuple[Any, ...]
    max_processor_retries: int | None
    base_url: str | None
    api_key: str | None
    timeout: float
    max_tokens: int
    temperature: float | None
    _set: frozenset[str]

    def __init__(
        self,
        model: str | JudgeModel | None = None,
        instructions: str | None = None,
        json_prompt_injection: JsonPromptInjection | None = None,
        input_processors: Sequence[Any] | None = None,
        output_processors: Sequence[Any] | None = None,
        error_processors: Sequence[Any] | None = None,
        max_processor_retries: int | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        given = {
            "model": model,
            "instructions": instructions,
            "json_prompt_injection": json_prompt_injection,
            "input_processors": input_processors,
            "output_processors": output_processors,
            "error_processors": error_processors,
            "max_processor_retries": max_processor_retries,
            "base_url": base_url,
            "api_key": api_key,
            "timeout": timeout,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        explicit = frozenset(k for k, v in given.items() if v is not None)
        values = {k: _check(k, given[k]) if k in explicit else JUDGE_DEFAULTS[k] for k in _FIELDS}
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_set", explicit)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Judge is immutable; build a new Judge instead of setting {name!r}")

    # Immutable: a copy is the same judge (the default copy protocol would set attributes).
    def __copy__(self) -> Judge:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Judge:
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Judge):
            return NotImplemented
        return self._set == other._set and all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash((self._set, *(repr(getattr(self, f)) for f in _FIELDS)))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f}={'***' if f == 'api_key' else repr(getattr(self, f))}" for f in _FIELDS if f in self._set
        )
        return f"Judge({shown})"

    @property
    def explicit_fields(self) -> frozenset[str]:
        """The fields this Judge sets itself (the rest are defaults or inherited)."""
        return self._set

    def over(self, base: Judge | None) -> Judge:
        """This judge's set fields on top of ``base``; lists replace, never merge."""
        if base is None:
            return self
        merged = {f: getattr(self if f in self._set else base, f) for f in _FIELDS if f in self._set | base._set}
        return Judge(**merged)

    @property
    def effective_max_processor_retries(self) -> int:
        """The retry cap of one judge call: as set, else 10 with error processors, else 0."""
        if self.max_processor_retries is not None:
            return self.max_processor_retries
        return 10 if self.error_processors else 0


def _check(name: str, value: Any) -> Any:
    where = f"Judge({name}=...)"
    if name == "model":
        if isinstance(value, str):
            provider, _, model = value.partition("/")
            if provider not in ("openai", "anthropic") or not model:
                raise ScorerConfigError(
                    f"{where}: {value!r} is not understood: use 'openai/<model>', "
                    "'anthropic/<model>', or an object implementing scorers.judge.JudgeModel"
                )
        elif not isinstance(value, JudgeModel):
            raise ScorerConfigError(
                f"{where}: expected 'openai/<model>', 'anthropic/<model>' or a JudgeModel "
                f"(model_id, provider, async generate(request)); got {type(value).__name__}"
            )
        return value
    if name == "instructions" and not isinstance(value, str):
        raise ScorerConfigError(f"{where}: instructions must be a string, got {type(value).__name__}")
    if name == "json_prompt_injection" and not (isinstance(value, bool) or value in ("auto", "system", "inline")):
        raise ScorerConfigError(f"{where}: {value!r} is not one of 'auto', True, 'system', 'inline', False")
    if name.endswith("_processors"):
        return _processors(name, value)
    if name == "max_processor_retries" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ScorerConfigError(f"{where}: must be an int >= 0, got {value!r}")
    if name == "timeout" and (
        not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0
    ):
        raise ScorerConfigError(f"{where}: must be a finite number of seconds > 0, got {value!r}")
    if name == "max_tokens" and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ScorerConfigError(f"{where}: must be an int > 0, got {value!r}")
    if name == "temperature" and (
        not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
    ):
        raise ScorerConfigError(f"{where}: must be a finite number, got {value!r}")
    if name in ("base_url", "api_key") and not isinstance(value, str):
        raise ScorerConfigError(f"{where}: must be a string, got {type(value).__name__}")
    return value


_PROCESSOR_METHOD = {
    "input_processors": "process_input",
    "output_processors": "process_output",
    "error_processors": "process_error",
}


def _processors(name: str, value: Any) -> tuple[Any, ...]:
    method = _PROCESSOR_METHOD[name]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ScorerConfigError(f"Judge({name}=...): expected a list of processors, got {type(value).__name__}")
    for p in value:
        if not (callable(getattr(p, method, None)) or callable(p)):
            raise ScorerConfigError(f"Judge({name}=...): {p!r} is neither callable nor has a {method}() method")
    return tuple(value)
