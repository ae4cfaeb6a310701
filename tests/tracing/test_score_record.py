"""ScoreRecord keeps only text that encodes as UTF-8, in every field that can hold text."""

from __future__ import annotations

import typing

from tracing import ScoreRecord

_LONE = "a\ud83db"


def _text_fields() -> list[str]:
    """Every field whose type admits a str (directly, optional, or as list items)."""
    names = []
    for name, field in ScoreRecord.model_fields.items():
        annotation = field.annotation
        args = typing.get_args(annotation)
        nested = [a for arg in args for a in (arg, *typing.get_args(arg))]
        if annotation is str or str in nested:
            names.append(name)
    return names


def test_every_text_field_drops_lone_surrogates() -> None:
    fields = _text_fields()
    assert len(fields) >= 16  # ids, names, reasons, messages, judge_models
    values: dict[str, object] = dict.fromkeys(fields, _LONE)
    values["judge_models"] = [_LONE, "gpt-4o"]
    record = ScoreRecord(**values)  # type: ignore[arg-type]
    for name in fields:
        value = getattr(record, name)
        texts = value if isinstance(value, list) else [value]
        for text in texts:
            assert "\ud83d" not in text, name
            text.encode("utf-8")
    assert record.reason == "a\ufffdb"
    assert record.judge_models == ["a\ufffdb", "gpt-4o"]
    record.model_dump_json().encode("utf-8")


def test_valid_text_is_kept_as_it_is() -> None:
    text = "naïve 🙂 ok"  # non-ASCII, a surrogate pair as one code point: nothing to replace
    record = ScoreRecord(score_id="s", trace_id="t", span_id="p", scorer_id="x", reason=text, label="ascii")
    assert record.reason == text
    assert record.label == "ascii"
