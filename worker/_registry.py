"""The scorer registry: scorers looked up by id from a user module (``--scorers pkg.module``).

Messages carry runs, never code, so every process that scores loads the same module. The
module either defines ``SCORERS`` (a list of scorers, or a dict id → scorer) or simply has
scorers as module-level names.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping

from scorers import Scorer
from worker._errors import RegistryError, UnknownScorerError

__all__ = ["Registry", "RegistryError", "UnknownScorerError", "load_registry"]


class Registry(Mapping[str, Scorer]):
    """Scorers by id; ``registry[id]`` raises ``UnknownScorerError`` naming the known ids."""

    def __init__(self, scorers: Iterable[Scorer], module: str = "") -> None:
        self.module = module
        self._by_id: dict[str, Scorer] = {}
        for scorer in scorers:
            if scorer.id in self._by_id and self._by_id[scorer.id] is not scorer:
                raise RegistryError(f"scorer id {scorer.id!r} is defined twice in {module or 'the registry'}")
            self._by_id[scorer.id] = scorer

    def __getitem__(self, scorer_id: str) -> Scorer:
        try:
            return self._by_id[scorer_id]
        except KeyError:
            raise UnknownScorerError(scorer_id, self._by_id) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)


def _path_hint(name: str) -> str:
    """What to give instead of a file path given for the scorer module (as a new user types it):
    its dotted name, relative to the current directory, when the file lies under it."""
    relative = os.path.relpath(os.path.abspath(name.removesuffix(".py")))
    if relative.startswith(".."):
        return (
            "that is a file path: give a module's name (--scorers a.module, or TRACESCORE_SCORERS),"
            " from the directory holding its package"
        )
    dotted = relative.replace(os.sep, ".")
    return f"that is a file path: give the module's name, --scorers {dotted} (or TRACESCORE_SCORERS)"


def load_registry(module_name: str) -> Registry:
    """Import ``module_name`` (the current directory is importable, as for ``celery -A``)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if "/" in module_name or os.sep in module_name:  # (no module's name: importing "./x.py" was a TypeError)
        raise RegistryError(f"cannot import scorer module {module_name!r}: {_path_hint(module_name)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; {_path_hint(module_name)}" if module_name.endswith(".py") else ""
        raise RegistryError(f"cannot import scorer module {module_name!r}: {exc}{hint}") from exc
    except Exception as exc:  # its own code failed (a variable unset, a syntax error): say where
        if isinstance(exc, SyntaxError):
            where = f" at {exc.filename}:{exc.lineno}"
        else:  # the innermost frame of a file (not the import machinery's or a frozen module's)
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
            where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise RegistryError(
            f"scorer module {module_name!r} failed while importing{where}: {type(exc).__name__}: {exc}"
        ) from exc
    declared = getattr(module, "SCORERS", None)
    found: list[Scorer]
    if declared is None:
        found = [v for v in vars(module).values() if isinstance(v, Scorer)]
    elif isinstance(declared, Mapping):
        found = list(declared.values())
    elif isinstance(declared, Iterable) and not isinstance(declared, (str, bytes)):
        found = list(declared)
    else:
        raise RegistryError(
            f"scorer module {module_name!r}: SCORERS is {_a(declared)},"
            " not a list of scorers (or a dict of id -> scorer)"
        )
    # By type, not repr: a value's text may be a prompt or a key.
    bad = sorted({_a(s) for s in found if not isinstance(s, Scorer)})
    if bad:
        raise RegistryError(
            f"scorer module {module_name!r}: SCORERS holds things that are not scorers: {', '.join(bad[:3])}"
        )
    if not found:
        raise RegistryError(
            f"scorer module {module_name!r} defines no scorers: add SCORERS = [...] or module-level scorers"
        )
    return Registry(found, module_name)


def _a(value: object) -> str:
    """``an int``, ``a str``: what a value is, by its type's name alone."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
