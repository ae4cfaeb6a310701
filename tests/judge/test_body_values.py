"""``over_values`` against the values ``json.loads`` really builds (property test)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scorers.judge._body import over_values

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    # Text with what a count could take for structure: brackets, commas, quotes, backslashes.
    | st.text(alphabet=st.sampled_from(list('ab,[]{}:"\\ \n\u00e9\u2028\U0001f600')), max_size=12)
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(alphabet='k,[{"\\', max_size=4), inner, max_size=6)
    ),
    max_leaves=60,
)


def _nodes(value: Any) -> int:
    """The objects the parsed tree holds, its keys too."""
    if isinstance(value, list):
        return 1 + sum(_nodes(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(1 + _nodes(v) for v in value.values())
    return 1


@settings(max_examples=600, deadline=None)
@given(
    value=_JSON,
    ascii_only=st.booleans(),
    layout=st.sampled_from([None, 0, 2, "\t"]),
    slack=st.integers(0, 3),
)
def test_over_values_never_says_over_when_the_parsed_tree_is_within_the_bound(
    value: Any, ascii_only: bool, layout: int | str | None, slack: int
) -> None:
    """Whatever the body's layout (compact, indented, \\u escapes or not), a body whose parsed
    tree has at most ``bound`` values is parsed; one with more is refused."""
    body = json.dumps(value, ensure_ascii=ascii_only, indent=layout).encode()
    true = _nodes(json.loads(body))
    assert not over_values(body, true + slack), (body, true)
    if true > 1:
        assert over_values(body, true - 1), (body, true)


def test_an_array_of_short_strings_is_counted_once_a_string() -> None:
    """``["a","b",…]`` is one list and n strings: each string was counted twice (its comma and
    its quotes), so an answer of n short values was refused at a bound of n + 1; ``[0]``s were
    counted twice too (comma and bracket)."""
    body = json.dumps(["a"] * 1_000).encode()
    assert not over_values(body, 1_001)
    body = json.dumps([[0]] * 1_000).encode()
    assert not over_values(body, 2_001)


def test_the_longest_answer_of_text_and_an_answer_of_many_short_values_are_parsed() -> None:
    """At a large max_tokens, the longest answer ``_too_long`` keeps (64 characters a token) of
    prose quoting brackets, commas, quotes and non-ASCII (escaped), and a structured answer of
    one short value a character of it, stay under the bound beside a real envelope."""
    from scorers.judge._body import MAX_CHARS_PER_TOKEN, values_bound

    max_tokens = 32_768
    chars = max_tokens * MAX_CHARS_PER_TOKEN
    prose = ('a, [b], {c}: "d" \\ é \U0001f600 ' * chars)[:chars]
    envelope = {"id": "x", "usage": {"input_tokens": 1, "output_tokens": max_tokens}, "stop_reason": "end_turn"}
    text = {**envelope, "content": [{"type": "text", "text": prose}]}
    assert not over_values(json.dumps(text).encode(), values_bound(max_tokens))
    values = [0] * (chars // 2 - 1)  # "0," a value: half a value a character
    tool = {**envelope, "content": [{"type": "tool_use", "name": "t", "input": {"scores": values}}]}
    assert not over_values(json.dumps(tool, separators=(",", ":")).encode(), values_bound(max_tokens))
