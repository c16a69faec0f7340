"""The pytest plugin users get with multiseq: cheap to load, and a working runner fixture."""

from __future__ import annotations

import pytest

from multiseq import models


def test_loading_the_plugin_loads_neither_llama_cpp_nor_a_model(pytester):
    pytester.makepyfile(test_cheap="""
        import sys

        def test_nothing_heavy_was_imported(pytestconfig):
            assert pytestconfig.pluginmanager.hasplugin("multiseq")
            assert pytestconfig.getoption("--multiseq-model") == "smollm2-135m"
            assert "llama_cpp" not in sys.modules
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_plugin_options_are_documented(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--multiseq-model*", "*--multiseq-parallel*"])


@pytest.mark.model
def test_a_users_own_test_file_runs_on_the_runner_fixture(pytester, monkeypatch):
    monkeypatch.setenv("MULTISEQ_MODELS_DIR", str(models.models_dir()))  # pytester gives the run its own HOME
    pytester.makepyfile(test_prompts="""
        from multiseq import Request, SamplingParams

        def test_the_capital_of_france(multiseq_runner):
            # Constrained: the runner's answer, whatever this machine's greedy choices would be.
            [result] = multiseq_runner.run_batch([Request(prompt="The capital of France is", sampling=SamplingParams(
                max_tokens=8, temperature=0, grammar='root ::= " Paris" "."?'))])
            assert result.ok and result.text.startswith(" Paris")

        def test_the_runner_is_shared_and_has_the_asked_slots(multiseq_runner):
            assert multiseq_runner.config.parallel == 3
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--multiseq-parallel", "3")
    result.assert_outcomes(passed=2)
