"""Models from Hugging Face (hf:OWNER/REPO[:QUANT], hf:OWNER/REPO/FILE.gguf, -hf), resolved offline
against a Hugging Face cache folder built here by hand, in huggingface_hub's layout. No test
reaches the network: the conftest sets HF_HUB_OFFLINE and an empty cache for every test, and
listing a repository on the hub fails the test."""

from __future__ import annotations

import socket

import huggingface_hub
import pytest
from click.testing import CliRunner

from multiseq import models
from multiseq.cli.main import cli
from multiseq.models import hub
from helpers import add_hub_repo as add_repo

FAKE_GGUF = b"GGUF" + bytes(60)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Listing a repository on the hub, or opening any connection, fails the test (pytest.fail
    is no Exception: no fallback can swallow it)."""
    def refuse(*args, **kwargs):
        pytest.fail("a test tried to reach the network")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


# --- names and choices, no cache needed ---------------------------------------------------------

def test_the_two_spellings():
    assert hub.parse("hf:bartowski/SmolLM2-GGUF") == hub.HubRef("bartowski/SmolLM2-GGUF")
    assert hub.parse("hf:bartowski/SmolLM2-GGUF:q4_k_m") == hub.HubRef("bartowski/SmolLM2-GGUF", quant="q4_k_m")
    assert hub.parse("hf:owner/repo/sub/dir/model-Q8_0.gguf") == hub.HubRef("owner/repo", file="sub/dir/model-Q8_0.gguf")


@pytest.mark.parametrize("name", ["hf:", "hf:owner", "hf:owner/", "hf:/repo", "hf:owner/repo:", "hf:owner/repo/README.md",
                                  "hf:owner/repo:Q4 K", "hf:own er/repo"])
def test_a_malformed_name_says_what_a_name_is(name):
    with pytest.raises(models.ModelError, match=r"give hf:OWNER/REPO\[:QUANT\] or hf:OWNER/REPO/FILE.gguf"):
        hub.parse(name)


FILES = ["README.md", "model-Q2_K.gguf", "model-Q4_K.gguf", "model-Q4_K_M.gguf", "model-IQ4_XS.gguf",
         "model.Q8_0.gguf", "mmproj-model-f16.gguf", "big/model-F16-00002-of-00002.gguf",
         "big/model-F16-00001-of-00002.gguf"]


@pytest.mark.parametrize("quant, chosen", [
    (None, ["model-Q4_K_M.gguf"]), ("q4_k_m", ["model-Q4_K_M.gguf"]), ("Q4_K", ["model-Q4_K.gguf"]),
    ("Q8_0", ["model.Q8_0.gguf"]), ("iq4_xs", ["model-IQ4_XS.gguf"]),
    ("F16", ["big/model-F16-00001-of-00002.gguf", "big/model-F16-00002-of-00002.gguf"]),
])
def test_a_quant_picks_its_file_and_nothing_like_it(quant, chosen):
    assert hub.choose(hub.HubRef("owner/repo", quant=quant), FILES) == chosen


def test_a_quant_is_never_part_of_another():
    with pytest.raises(models.ModelError, match="no GGUF model of quantization Q4_XS"):
        hub.choose(hub.HubRef("owner/repo", quant="Q4_XS"), FILES)  # not IQ4_XS


def test_without_q4_k_m_q8_0_then_the_only_model():
    without = [name for name in FILES if "Q4_K_M" not in name]
    assert hub.choose(hub.HubRef("o/r"), without) == ["model.Q8_0.gguf"]
    assert hub.choose(hub.HubRef("o/r"), ["README.md", "mmproj-x.gguf", "tiny-f32.gguf"]) == ["tiny-f32.gguf"]


def test_an_ambiguous_quant_names_the_repo_and_the_files():
    files = ["base-Q4_K_M.gguf", "instruct-Q4_K_M.gguf"]
    with pytest.raises(models.ModelError) as error:
        hub.choose(hub.HubRef("o/r", quant="Q4_K_M"), files)
    assert str(error.value) == ("hf:o/r:Q4_K_M is ambiguous: 2 GGUF models match (base-Q4_K_M.gguf, instruct-Q4_K_M.gguf); "
                                "name one with hf:o/r/FILE.gguf")
    with pytest.raises(models.ModelError, match="hf:o/r:Q4_K_M is ambiguous"):
        hub.choose(hub.HubRef("o/r"), files)  # the default quant too


def test_several_models_and_no_default_quant_asks_for_one():
    with pytest.raises(models.ModelError, match=r"hf:o/r has 2 GGUF models and none is Q4_K_M or Q8_0: name one with "
                                                r"-hf o/r:QUANT .*\(it has a-Q2_K.gguf, a-Q3_K_S.gguf\)"):
        hub.choose(hub.HubRef("o/r"), ["a-Q2_K.gguf", "a-Q3_K_S.gguf"])


def test_a_missing_quant_lists_what_there_is():
    with pytest.raises(models.ModelError, match=r"hf:o/r has no GGUF model of quantization Q5_K_M \(it has a-Q2_K.gguf\)"):
        hub.choose(hub.HubRef("o/r", quant="Q5_K_M"), ["a-Q2_K.gguf"])


def test_a_repo_without_gguf_models_says_so():
    with pytest.raises(models.ModelError, match=r"^hf:o/r has no GGUF model files \(it has mmproj-f16.gguf\)$"):
        hub.choose(hub.HubRef("o/r"), ["config.json", "model.safetensors", "mmproj-f16.gguf"])


# --- offline, against a cache built by hand ---------------------------------------------------

def test_offline_resolution_finds_the_cached_file(hub_cache):
    snapshot = add_repo(hub_cache, "owner/tiny-GGUF", {"README.md": b"# tiny", "tiny-Q4_K_M.gguf": FAKE_GGUF,
                                                      "tiny-Q8_0.gguf": FAKE_GGUF + b"8", "sub/tiny-F16.gguf": FAKE_GGUF})
    resolved = models.resolve("hf:owner/tiny-GGUF")
    assert resolved.path == snapshot / "tiny-Q4_K_M.gguf" and resolved.path.read_bytes() == FAKE_GGUF
    assert resolved.name == "hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf" and resolved.spec is None
    assert models.resolve("hf:owner/tiny-GGUF:q8_0").path == snapshot / "tiny-Q8_0.gguf"
    assert models.resolve("hf:owner/tiny-GGUF/sub/tiny-F16.gguf").path == snapshot / "sub" / "tiny-F16.gguf"


@pytest.mark.parametrize("model, files, chosen", [
    ("m-Q4_K_M.gguf", ["m-Q4_K_M.gguf", "mmproj-m-f32.gguf", "mmproj-m-f16.gguf"], "mmproj-m-f16.gguf"),
    ("m-Q8_0.gguf", ["m-Q8_0.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-f16.gguf"], "mmproj-m-Q8_0.gguf"),
    ("sub/m-Q4_K_M.gguf", ["sub/m-Q4_K_M.gguf", "mmproj-f16.gguf", "sub/mmproj-f16.gguf"], "sub/mmproj-f16.gguf"),
    ("sub/m-Q4_K_M.gguf", ["sub/m-Q4_K_M.gguf", "mmproj-f16.gguf", "other/mmproj-f16.gguf"], "mmproj-f16.gguf"),
    ("m-Q4_K_M.gguf", ["m-Q4_K_M.gguf", "imatrix.gguf"], None),
])
def test_a_models_projector_is_its_repositorys_nearest_mmproj(model, files, chosen):
    """As llama.cpp's -hf: in the model's folder or above it, the deepest first, then the
    quantization closest to the model's."""
    assert hub.choose_projector(model, files) == chosen


def test_a_hub_model_resolves_with_its_projector(hub_cache):
    snapshot = add_repo(hub_cache, "owner/vision-GGUF", {"vision-Q4_K_M.gguf": FAKE_GGUF,
                                                        "mmproj-vision-f16.gguf": FAKE_GGUF + b"p"})
    resolved = models.resolve("hf:owner/vision-GGUF")
    assert resolved.path == snapshot / "vision-Q4_K_M.gguf" and resolved.projector == snapshot / "mmproj-vision-f16.gguf"


def test_a_split_model_resolves_to_its_first_part(hub_cache):
    snapshot = add_repo(hub_cache, "owner/big-GGUF", {f"big-Q8_0-0000{index}-of-00003.gguf": FAKE_GGUF
                                                     for index in (1, 2, 3)})
    assert models.resolve("hf:owner/big-GGUF").path == snapshot / "big-Q8_0-00001-of-00003.gguf"


def test_offline_and_not_cached_is_one_line_naming_the_repo(hub_cache):
    with pytest.raises(models.ModelError) as error:
        models.resolve("hf:owner/absent-GGUF:Q4_K_M")
    assert str(error.value) == (f"hf:owner/absent-GGUF is not in the Hugging Face cache {hub_cache}, and HF_HUB_OFFLINE "
                                f"is set: nothing is downloaded")


def test_offline_a_file_the_cache_lacks_is_one_line(hub_cache):
    add_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF})
    with pytest.raises(models.ModelError, match=r"^hf:owner/tiny-GGUF has no GGUF model file tiny-Q8_0.gguf "
                                                r"\(it has tiny-Q4_K_M.gguf\)$"):
        models.resolve("hf:owner/tiny-GGUF/tiny-Q8_0.gguf")


def test_a_cached_repo_without_gguf_files_is_one_line(hub_cache):
    add_repo(hub_cache, "owner/weights", {"config.json": b"{}", "model.safetensors": b"x"})
    with pytest.raises(models.ModelError, match=r"^hf:owner/weights has no GGUF model files$"):
        models.resolve("hf:owner/weights")


def test_hf_hub_offline_is_read_when_resolving(hub_cache, monkeypatch):
    """The environment at the call counts (huggingface_hub itself reads it once, at import)."""
    add_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF})
    other = hub_cache.parent / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    with pytest.raises(models.ModelError, match=f"not in the Hugging Face cache {other}"):
        models.resolve("hf:owner/tiny-GGUF")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(hub_cache.parent))
    assert hub.cache_dir() == hub_cache.parent / "hub"


def test_unreachable_hub_falls_back_to_the_cache(hub_cache, monkeypatch):
    """Online, a repository listing that fails (no network) falls back to what the cache holds."""
    add_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF})
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(repo):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(hub, "_remote_repo_files", unreachable)
    assert hub._repo_files("owner/tiny-GGUF") == ["tiny-Q4_K_M.gguf"]  # listed only: nothing is downloaded
    with pytest.raises(models.ModelError, match=r"^hf:owner/other: Hugging Face could not be reached \(no route to host\) "
                                                r"and the repository is not in the Hugging Face cache"):
        hub._repo_files("owner/other")


# --- the command line ---------------------------------------------------------------------------

def run_batch(tmp_path, *options: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "The sea is"}\n')
    return CliRunner().invoke(cli, ["batch-run", str(prompts), "-o", str(tmp_path / "out.jsonl"), "-n", "2", "-np", "1",
                                    "-t", "2", "--temperature", "0", "--no-dashboard", *options])


@pytest.mark.parametrize("options, code, message", [
    (["-hf", "owner/absent-GGUF"], 1, "Error: hf:owner/absent-GGUF is not in the Hugging Face cache"),
    (["-hf", "not-a-repo"], 2, "Error: -hf/--hf-repo: 'hf:not-a-repo' is not a Hugging Face model"),
    (["-m", "hf:owner"], 2, "Error: -m/--model: 'hf:owner' is not a Hugging Face model"),
    (["-m", "smollm2-135m", "-hf", "owner/repo"], 2, "Error: give -m/--model or -hf/--hf-repo, not both"),
])
def test_bad_hub_models_are_one_line(tmp_path, options, code, message):
    result = run_batch(tmp_path, *options)
    assert result.exit_code == code
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert line.startswith(message) and "Traceback" not in result.output


@pytest.mark.model
def test_a_run_on_a_hub_model_from_the_cache(tmp_path, hub_cache, read_jsonl):
    """-hf OWNER/REPO:QUANT, offline, the GGUF in the cache being (a link to) the registry model."""
    real = models.resolve("smollm2-135m").path
    add_repo(hub_cache, "someone/SmolLM2-135M-Instruct-GGUF",
             {"SmolLM2-135M-Instruct.Q4_1.gguf": real, "SmolLM2-135M-Instruct.Q8_0.gguf": FAKE_GGUF})
    result = run_batch(tmp_path, "-hf", "someone/SmolLM2-135M-Instruct-GGUF:Q4_1", "--ignore-eos")  # both tokens
    assert result.exit_code == 0, result.output
    [record] = read_jsonl(tmp_path / "out.jsonl")
    assert record["id"] == "a" and record["error"] is None and record["completion_tokens"] == 2
    assert "multiseq hf:someone/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf on " in result.stderr


def test_the_cache_lists_its_gguf_models(hub_cache):
    add_repo(hub_cache, "owner/tiny-GGUF", {"tiny-Q4_K_M.gguf": FAKE_GGUF, "README.md": b"x",
                                            "mmproj-tiny.gguf": FAKE_GGUF})
    [cached] = hub.cached_ggufs()
    assert (cached.name, cached.size_bytes) == ("hf:owner/tiny-GGUF/tiny-Q4_K_M.gguf", len(FAKE_GGUF))

