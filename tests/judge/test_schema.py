"""Output schemas: JSON-schema validation, OpenAI strict transform, tolerant JSON parsing."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from scorers.judge._schema import OutputSpec, SchemaMismatch, drop_optional_nulls, parse_json_text, strict_openai_schema

SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "label": {"enum": ["good", "bad"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "maxItems": 2},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["score", "label"],
    "additionalProperties": False,
    "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}}},
}


def test_valid_answer_passes() -> None:
    """A conforming answer is returned unchanged."""
    answer = {"score": 1, "label": "good", "items": [{"n": 2}], "note": None}
    assert OutputSpec.of(SCHEMA).validate(answer) == answer


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"score": 1.5, "label": "good"}, "score: 1.5 is above the maximum 1"),
        ({"score": -1, "label": "good"}, "score: -1 is below the minimum 0"),
        ({"score": "high", "label": "good"}, "score: expected number"),
        ({"score": True, "label": "good"}, "score: expected number"),
        ({"label": "good"}, "score: required but missing"),
        ({"score": 0, "label": "meh"}, "label: must be one of"),
        ({"score": 0, "label": "good", "extra": 1}, "extra: unexpected property"),
        ({"score": 0, "label": "good", "items": [{"n": 0}]}, "items[0].n: 0 must be greater than 0"),
        ({"score": 0, "label": "good", "items": [{}, {}, {}]}, "items: more than 2 items"),
        ({"score": 0, "label": "good", "note": 3}, "note: matches none"),
    ],
)
def test_invalid_answers_name_the_problem(answer: dict[str, object], problem: str) -> None:
    """Each violation is reported with its path."""
    with pytest.raises(SchemaMismatch) as info:
        OutputSpec.of(SCHEMA).validate(answer)
    assert problem in str(info.value)


def test_pydantic_models_validate_ranges() -> None:
    """A pydantic output schema validates with pydantic and returns the model instance."""

    class Answer(BaseModel):
        score: float = Field(ge=0, le=10)

    spec = OutputSpec.of(Answer)
    assert spec.validate({"score": 3}) == Answer(score=3)
    assert spec.json_schema["properties"]["score"]["maximum"] == 10
    with pytest.raises(SchemaMismatch, match="less than or equal to 10"):
        spec.validate({"score": 11})


def test_strict_schema_closes_objects_and_nullables_optionals() -> None:
    """Strict mode: every object closed, all properties required, optionals nullable."""
    strict = strict_openai_schema(SCHEMA)
    assert sorted(strict["required"]) == ["items", "label", "note", "score"]
    assert strict["properties"]["items"] == {
        "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Item"}, "maxItems": 2}, {"type": "null"}]
    }
    item = strict["$defs"]["Item"]
    assert item["additionalProperties"] is False
    assert item["required"] == ["n"]
    assert SCHEMA["required"] == ["score", "label"]  # the original is untouched


def test_drop_optional_nulls() -> None:
    """Nulls for optional, non-nullable properties are dropped; declared nullables stay."""
    value = {"score": 0, "label": "good", "items": None, "note": None}
    assert drop_optional_nulls(value, SCHEMA) == {"score": 0, "label": "good", "note": None}


@pytest.mark.parametrize(
    "text",
    ['{"score": 1}', '```json\n{"score": 1}\n```', 'Here you go: {"score": 1} — done.', '  {"score":1}\n'],
)
def test_parse_json_text_accepts_common_wrappings(text: str) -> None:
    """Bare JSON, fenced JSON and JSON inside prose all parse."""
    assert parse_json_text(text) == {"score": 1}


@pytest.mark.parametrize(("text", "problem"), [("", "empty"), ("{score: 1", "not valid JSON")])
def test_parse_json_text_errors(text: str, problem: str) -> None:
    """Unparseable text raises ValueError saying why."""
    with pytest.raises(ValueError, match=problem):
        parse_json_text(text)
