"""Every field of the configuration dataclasses refuses a bad value with a ValueError that names
the field, whatever the value's type: never a TypeError from deep inside, never silent."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multiseq import RunnerConfig, SamplingParams

ANY_JSON_LIKE = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                          st.text(max_size=5), st.lists(st.integers(), max_size=3),
                          st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(object()))


@pytest.mark.parametrize("cls", [SamplingParams, RunnerConfig])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_bad_value_of_any_type_is_a_value_error_naming_its_field(cls, data):
    field = data.draw(st.sampled_from([field.name for field in dataclasses.fields(cls)]))
    value = data.draw(ANY_JSON_LIKE)
    try:
        cls(**{field: value})
    except ValueError as error:
        assert field in str(error), f"{field}={value!r}: {error}"


@pytest.mark.parametrize("cls, field, value", [
    (SamplingParams, "temperature", "x"), (SamplingParams, "top_p", None), (SamplingParams, "min_p", [0.1]),
    (SamplingParams, "repeat_penalty", "1"), (SamplingParams, "stop", 5), (SamplingParams, "ignore_eos", "yes"),
    (SamplingParams, "max_tokens", True), (RunnerConfig, "overflow", "drop"), (RunnerConfig, "seed", -1),
    (RunnerConfig, "prefix_cache", 1), (RunnerConfig, "model", 3), (RunnerConfig, "threads", 1.5),
])
def test_values_of_the_wrong_type_are_refused(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})
