"""The settled start of a JSON value's normalized text (multiseq.tools.partial_json), read from
the start of the text that writes it: always a prefix of json.dumps of the whole value, all of
it once the value is whole, wherever the text is cut and however it was formatted."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from multiseq.tools.partial_json import settled_prefix

SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUES = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=6), children, max_size=4), max_leaves=12)
OBJECTS = st.dictionaries(st.text(max_size=6), VALUES, max_size=5)


def written(value, style: int) -> str:
    """The value as a model might write it: compact, spaced, indented, ASCII-escaped."""
    return [json.dumps(value), json.dumps(value, separators=(",", ":"), ensure_ascii=False),
            json.dumps(value, indent=2, ensure_ascii=False), json.dumps(value, indent="\t")][style]


@settings(max_examples=300, deadline=None)
@given(value=OBJECTS, style=st.integers(0, 3), data=st.data())
def test_a_cut_anywhere_gives_a_prefix_of_the_normalized_text_and_the_whole_gives_all(value, style, data):
    text = written(value, style)
    normalized = json.dumps(json.loads(text), ensure_ascii=False)
    cut = data.draw(st.integers(0, len(text)), label="cut")
    assert normalized.startswith(settled_prefix(text[:cut]))
    assert settled_prefix(text) == normalized


def test_a_string_streams_character_by_character_and_a_number_once_it_ended():
    assert settled_prefix('{"path": "main.py", "content": "line 1\\nline 2\\u00e9') == \
        '{"path": "main.py", "content": "line 1\\nline 2é'
    assert settled_prefix('{"n": 1.50') == '{"n": '
    assert settled_prefix('{"n": 1.50,') == '{"n": 1.5, '
    assert settled_prefix('{"emoji": "\\ud83d') == '{"emoji": "'  # half a surrogate pair waits for the other


def test_a_repeated_key_or_text_that_is_not_json_stops_it():
    """(A repeated key's first value was given already: no prefix of json.loads' whole value,
    which the reader handles by sending the whole call anew.)"""
    assert settled_prefix('{"a": 1, "a": 2}') == '{"a": 1, '
    assert settled_prefix('{"a": tru}') == '{"a": '
