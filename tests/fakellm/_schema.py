"""Build a value that is valid for a JSON schema (the subset judges use)."""

from __future__ import annotations

from typing import Any

__all__ = ["instance_for"]


def instance_for(schema: Any, defs: dict[str, Any] | None = None) -> Any:
    """A deterministic instance of ``schema``: numbers sit in their declared range."""
    if not isinstance(schema, dict):
        return None
    defs = {**(defs or {}), **schema.get("$defs", {}), **schema.get("definitions", {})}
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return instance_for(defs.get(name, {}), defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return instance_for(options[0], defs)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "null":
        return None
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance_for(sub, defs) for name, sub in props.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        return [instance_for(schema.get("items", {}), defs) for _ in range(count)]
    if kind in ("number", "integer"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if low is not None and high is not None:
            value: float = (float(low) + float(high)) / 2
        elif low is not None:
            value = float(low) + 1
        elif high is not None:
            value = float(high) - 1
        else:
            value = 0.5 if kind == "number" else 1
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    text = "fake"
    low_len = int(schema.get("minLength", 0))
    return text + "x" * max(0, low_len - len(text))
