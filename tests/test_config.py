"""Every field of the configuration dataclasses refuses a bad value with a ValueError that names
the field, whatever the value's type: never a TypeError from deep inside, never silent."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from multiseq import RunnerConfig, SamplingParams
from multiseq.cli.main import cli

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


def test_multiseq_threads_sets_the_default_thread_count_and_a_bad_value_names_it(monkeypatch, tmp_path):
    """Runners sharing a machine's cores split them: MULTISEQ_THREADS is the default of
    RunnerConfig.threads and of every command's -t; an explicit -t still wins."""
    monkeypatch.setenv("MULTISEQ_THREADS", "3")
    assert RunnerConfig().threads == 3
    assert RunnerConfig(threads=2).threads == 2
    monkeypatch.setenv("MULTISEQ_THREADS", "many")
    with pytest.raises(ValueError, match="MULTISEQ_THREADS='many'"):
        RunnerConfig()
    monkeypatch.setenv("MULTISEQ_THREADS", "0")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n")
    result = CliRunner().invoke(cli, ["batch-run", "-m", "smollm2-135m", str(prompts)])
    assert result.exit_code == 2 and "'--threads'" in result.stderr and "0 is not in the range" in result.stderr
    monkeypatch.delenv("MULTISEQ_THREADS")
    assert RunnerConfig().threads >= 1
