"""JSON extraction from fenced or chatty model output."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.jsonrepair import extract_json, first_balanced_object


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('Answer: {"a": "x}y"} done', {"a": "x}y"}),
        ('Here {oops} and {"a": {"b": [1, 2]}} end', {"a": {"b": [1, 2]}}),
        ('{"a": "quote \\" {"}', {"a": 'quote " {'}),
    ],
)
def test_extract(text, expected):
    assert extract_json(text) == expected


def test_nothing_found():
    with pytest.raises(ValueError):
        extract_json("no json at all {")
    assert first_balanced_object('{"a": 1') is None


json_obj = st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=8), st.none()), max_size=4)


@settings(max_examples=100, deadline=None)
@given(obj=json_obj, prefix=st.text(alphabet="abc :\n.", max_size=20), suffix=st.text(alphabet="abc :}\n.", max_size=20))
def test_object_survives_chatter(obj, prefix, suffix):
    text = prefix + orjson.dumps(obj).decode() + suffix
    assert extract_json(text) == obj
