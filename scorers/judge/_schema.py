"""Output schemas: a pydantic model (or any type pydantic can validate) or a JSON-schema dict.

``OutputSpec`` turns either into the JSON schema sent to the model and a validator for the
answer. Pydantic types are validated by pydantic; JSON-schema dicts by a small validator for
the keywords judges use (type, properties, required, additionalProperties, items, enum,
const, minimum/maximum and their exclusive forms, string/array lengths, anyOf/oneOf/allOf,
$ref into $defs). Numbers outside a declared range fail validation either way, as do NaN, the
infinities and integers no float holds, wherever they are in the answer.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, get_args

from pydantic import TypeAdapter, ValidationError
from pydantic_core.core_schema import ErrorType

__all__ = ["OutputSpec", "SchemaMismatch", "parse_json_text", "strict_openai_schema"]


class SchemaMismatch(ValueError):
    """The answer does not fit the schema; ``problems`` lists each as 'path: what' with the
    value that failed (for the step record), ``described`` each as (path, what) without it (for
    an error's message, which goes wherever the error is logged: a claims step's values are the
    agent's text, and a path may hold a key the answer made up, colons and all)."""

    def __init__(self, problems: list[str], described: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(problems[:8]) + (" ..." if len(problems) > 8 else ""))
        self.problems = problems
        self.described = described


class _Problems(list[str]):
    """What ``_check`` finds, each with its value (the list) and without it (``described``)."""

    def __init__(self) -> None:
        super().__init__()
        self.described: list[tuple[str, str]] = []

    def add(self, where: str, what: str, value: str = "") -> None:
        self.append(f"{where}: {what}{value}")
        self.described.append((where, what))


@dataclass(frozen=True)
class OutputSpec:
    """The JSON schema to ask for and how to validate the answer."""

    json_schema: dict[str, Any]
    name: str
    adapter: TypeAdapter[Any] | None = None

    @classmethod
    def of(cls, schema: type[Any] | Mapping[str, Any]) -> OutputSpec:
        if isinstance(schema, Mapping):
            data = copy.deepcopy(dict(schema))
            name = str(data.get("title") or "answer")
            return cls(json_schema=data, name=_identifier(name))
        adapter = _adapter(schema)  # type: ignore[arg-type]  # types are hashable
        name = schema.__name__ if isinstance(schema, type) else "answer"
        return cls(json_schema=adapter.json_schema(), name=_identifier(name), adapter=adapter)

    @cached_property
    def property_names(self) -> frozenset[str]:
        """Every property name the schema declares, at any depth (its ``$defs`` included)."""
        names: set[str] = set()
        stack: list[Any] = [self.json_schema]
        while stack:
            node = stack.pop()
            if isinstance(node, Mapping):
                properties = node.get("properties")
                if isinstance(properties, Mapping):
                    names.update(str(k) for k in properties)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return frozenset(names)

    @property
    def is_object(self) -> bool:
        root: Mapping[str, Any] = self.json_schema
        if "$ref" in root:
            root = _resolve(root, root.get("$defs", {}))
        return root.get("type") == "object" or "properties" in root

    def validate(self, data: Any) -> Any:
        """The validated value (a model instance for pydantic types), or ``SchemaMismatch``."""
        out_of_range = _non_finite(data)
        if out_of_range:
            raise SchemaMismatch(out_of_range, out_of_range.described)
        if self.adapter is not None:
            try:
                return self.adapter.validate_python(data)
            except ValidationError as exc:
                errors = exc.errors()
                raise SchemaMismatch(
                    [f"{_loc(e)}: {e.get('msg')} (got {e.get('input')!r:.60})" for e in errors],
                    [(_loc(e), _told(e)) for e in errors],
                ) from exc
        problems = _Problems()
        _check(data, self.json_schema, "", self.json_schema.get("$defs", {}), problems)
        if problems:
            raise SchemaMismatch(problems, problems.described)
        return data


@lru_cache(maxsize=256)
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _non_finite(data: Any) -> _Problems:
    """Where ``data`` holds a number JSON cannot carry: NaN or an infinity (Anthropic's tool input
    and ``1e999``, which Python's parser reads as inf, bring them), or an integer no float holds.
    Pydantic's floats take NaN and infinities, and a built-in's clamp then made a NaN a 0 and an
    infinity a full score. Paths are spelled only for what is found: built for every node, a
    long key over a wide list cost hundreds of MiB on an answer of 64 KB."""
    problems = _Problems()
    # (value, (key, parent's link) or None): each node holds a link, not a string.
    stack: list[tuple[Any, tuple[Any, Any] | None]] = [(data, None)]
    while stack and len(problems) < 8:
        node, link = stack.pop()
        if isinstance(node, float):
            if not math.isfinite(node):
                problems.add(_path(link), f"{node!r} is not a finite number")
        elif isinstance(node, int) and not isinstance(node, bool) and node.bit_length() > 1000:
            try:
                float(node)
            except OverflowError:
                problems.add(_path(link), f"an integer of {node.bit_length()} bits is out of a number's range")
        elif isinstance(node, dict):
            stack.extend((value, (key, link)) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, (n, link)) for n, value in enumerate(node))
    return problems


def _path(link: tuple[Any, Any] | None) -> str:
    keys: list[str] = []
    while link is not None:
        key, link = link
        keys.append(str(key)[:40])
    return ".".join(reversed(keys)) or "(root)"


def _identifier(name: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return clean or "answer"


def _loc(error: Any) -> str:
    """pydantic's place as the JSON Schema checks spell it (``verdicts[0].claim``): its list
    index, a number, read as a key was named a property the schema does not have."""
    place = ""
    for part in error.get("loc", ()):
        place += f"[{part}]" if isinstance(part, int) else f".{part}" if place else str(part)
    return place or "(root)"


# pydantic's messages that may hold what the answer said: the tag a discriminated union found, a
# validator's own text (its author's: often the value), a UUID parser's character. An error type
# of a user's own (``PydanticCustomError``) may say anything. These are told by their type alone.
_QUOTING = frozenset({"union_tag_invalid", "value_error", "assertion_error", "uuid_parsing"})
_BUILT_IN = frozenset(get_args(ErrorType))


def _told(error: Any) -> str:
    kind = str(error.get("type"))
    if kind in _QUOTING or kind not in _BUILT_IN:
        return f"not valid ({kind})"
    return str(error.get("msg"))


def _not_json(name: str) -> Any:
    # Python's parser takes NaN and Infinity; JSON has neither, and a NaN score or confidence
    # then failed later as a bug in the scorer instead of an answer that does not fit.
    raise ValueError(f"{name} is not a JSON number")


def parse_json_text(text: str) -> Any:
    """JSON from a model's text: bare, in a ```json fence, or the outermost {...} in prose.

    Raises ``ValueError`` saying what was wrong.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("the answer is empty")
    candidates = [stripped]
    fenced = re.search(r"```(?:json)?\s*\n?(.*?)\n?```", stripped, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = stripped.find("{"), stripped.rfind("}")
    if 0 <= start < end:
        candidates.append(stripped[start : end + 1])
    first_error: ValueError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate, parse_constant=_not_json)
        except ValueError as exc:
            first_error = first_error or exc
        except RecursionError:  # past Python's stack: no judge's answer nests like that
            first_error = first_error or ValueError("it is nested too deeply to read")
    raise ValueError(f"the answer is not valid JSON ({first_error})")


# --- OpenAI strict mode ------------------------------------------------------------------


def strict_openai_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy fit for ``response_format`` strict mode: every object closes
    (``additionalProperties: false``) and lists all properties as required; properties that
    were optional become nullable (the nulls are dropped again by :func:`drop_optional_nulls`).
    ``default`` is removed (strict mode rejects it).
    """
    strict: dict[str, Any] = _strictify(copy.deepcopy(dict(schema)))
    return strict


def _strictify(node: Any) -> Any:
    if isinstance(node, list):
        return [_strictify(n) for n in node]
    if not isinstance(node, dict):
        return node
    node.pop("default", None)
    for key, value in list(node.items()):
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            node[key] = {k: _strictify(v) for k, v in value.items()}
        elif isinstance(value, dict | list):
            node[key] = _strictify(value)
    if node.get("type") == "object" or "properties" in node:
        props: dict[str, Any] = node.setdefault("properties", {})
        required = set(node.get("required", []))
        for name, sub in props.items():
            if name not in required:
                props[name] = {"anyOf": [sub, {"type": "null"}]}
        node["required"] = list(props)
        node["additionalProperties"] = False
    return node


def drop_optional_nulls(value: Any, schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> Any:
    """Undo the nullable optionals of strict mode: drop ``None`` for non-required properties."""
    defs = defs if defs is not None else schema.get("$defs", {})
    node = _resolve(schema, defs)
    if isinstance(value, dict) and isinstance(node.get("properties"), Mapping):
        required = set(node.get("required", []))
        out = {}
        for key, item in value.items():
            sub = node["properties"].get(key)
            if item is None and key not in required and sub is not None and not _allows_null(sub, defs):
                continue
            out[key] = drop_optional_nulls(item, sub, defs) if isinstance(sub, Mapping) else item
        return out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [drop_optional_nulls(v, node["items"], defs) for v in value]
    return value


def _allows_null(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> bool:
    node = _resolve(schema, defs)
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_allows_null(s, defs) for s in node.get("anyOf", []) + node.get("oneOf", []))


# --- a small JSON-schema validator -------------------------------------------------------

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
}


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 32:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        schema = defs.get(name, {})
        seen += 1
    return schema


def _check(value: Any, schema: Any, path: str, defs: Mapping[str, Any], problems: _Problems) -> None:
    if not isinstance(schema, Mapping):
        return
    schema = _resolve(schema, defs)
    where = path or "(root)"
    if "const" in schema and value != schema["const"]:
        problems.add(where, f"must be {schema['const']!r}", f", got {value!r:.60}")
    if "enum" in schema and value not in schema["enum"]:
        problems.add(where, f"must be one of {schema['enum']!r}", f", got {value!r:.60}")
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options:
            if not any(_fits(value, o, defs) for o in options):
                problems.add(where, f"matches none of the allowed {key} shapes")
            return
    for sub in schema.get("allOf", []):
        _check(value, sub, path, defs, problems)
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            problems.add(where, f"expected {' or '.join(kinds)}, got {type(value).__name__}", f" {value!r:.60}")
            return
    if isinstance(value, int | float) and not isinstance(value, bool):
        _check_range(value, schema, where, problems)
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            problems.add(where, f"shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.add(where, f"longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.add(where, f"does not match pattern {schema['pattern']!r}")
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.add(where, f"fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.add(where, f"more than {schema['maxItems']} items")
        items = schema.get("items")
        for i, item in enumerate(value):
            _check(item, items, f"{path}[{i}]", defs, problems)
    elif isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                problems.add(_join(path, name), "required but missing")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                _check(item, props[name], _join(path, name), defs, problems)
            elif extra is False:
                problems.add(_join(path, name), "unexpected property")
            elif isinstance(extra, Mapping):
                _check(item, extra, _join(path, name), defs, problems)


def _check_range(value: float, schema: Mapping[str, Any], where: str, problems: _Problems) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        problems.add(where, f"{value} is below the minimum {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        problems.add(where, f"{value} is above the maximum {schema['maximum']}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        problems.add(where, f"{value} must be greater than {schema['exclusiveMinimum']}")
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        problems.add(where, f"{value} must be less than {schema['exclusiveMaximum']}")


def _fits(value: Any, schema: Any, defs: Mapping[str, Any]) -> bool:
    problems = _Problems()
    _check(value, schema, "", defs, problems)
    return not problems


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
