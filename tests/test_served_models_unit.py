"""What `multiseq serve --models-dir` finds in a folder (checked on a folder of empty files), and
what a `--models-preset` file gives each model."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from multiseq.cli.main import serve
from multiseq.cli.presets import preset_models, served_names
from multiseq.cli.served import MemorySize, folder_models, serve_config


def test_a_folder_holds_its_gguf_files_and_its_subfolders_models(tmp_path):
    for name in ("chat.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj-chat-f16.gguf",
                 "vision/model-Q4_K_M.gguf", "vision/mmproj-model-f16.gguf", "two/a.gguf", "two/b.gguf",
                 "notes/readme.txt", "weights.bin"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert folder_models(tmp_path) == [
        ("big-00001-of-00002.gguf", tmp_path / "big-00001-of-00002.gguf", None),  # a split model's first part
        ("chat.gguf", tmp_path / "chat.gguf", None),  # (a projector beside files is no model of its own)
        ("vision", tmp_path / "vision/model-Q4_K_M.gguf", tmp_path / "vision/mmproj-model-f16.gguf"),
    ]  # "two" holds two models and names neither; "notes" and weights.bin hold no GGUF


PRESET = """
; llama-server's preset shape
version = 1

[*]
c = 4096
np = 2
cache-type-k = q8_0

[chat]
model = smollm2-135m
alias = small, tiny
ctk = f16

[ranker]  # a comment
model = ~/models/bge-reranker.gguf  ; another
pooling = rank
np = 8
no-kv-unified = true
prefix-cache = false
load-on-startup = false
stop-timeout = 10
"""


def presets_of(tmp_path, text: str, *command_line: str):
    file = tmp_path / "models.ini"
    file.write_text(text)
    return preset_models(file, serve, serve.make_context("serve", [*command_line, "--models-preset", str(file)]))


def test_a_models_file_gives_each_model_its_settings_under_the_command_lines(tmp_path):
    chat, ranker = presets_of(tmp_path, PRESET, "-t", "3", "-np", "4")
    assert (chat.name, chat.aliases, chat.load_on_startup) == ("chat", ("small", "tiny"), True)
    assert (ranker.name, ranker.aliases, ranker.load_on_startup) == ("ranker", (), False)
    chat_config, ranker_config = serve_config(chat.options), serve_config(ranker.options)
    assert (chat_config.model, chat_config.kv_pool, chat_config.cache_type_k) == ("smollm2-135m", 4096, "f16")
    assert chat_config.parallel == ranker_config.parallel == 4, "-np on the command line wins over the file"
    assert chat_config.threads == ranker_config.threads == 3, "what the file leaves is the command line's"
    assert (ranker_config.pooling, ranker_config.prefix_cache, ranker_config.cache_type_k) == ("rank", False, "q8_0")
    assert (ranker_config.kv_pool, ranker_config.slot_ctx) == (None, 1024), "-c 4096 over 4 slots, one window each"
    assert ranker_config.model == str(Path.home() / "models/bge-reranker.gguf")


def test_a_models_file_that_does_not_go_is_refused_naming_the_key(tmp_path):
    for text, said in (("[chat]\nmodel = x.gguf\nport = 9000\n", "[chat]: port applies to the whole server"),
                       ("[chat]\nmodel = x.gguf\nctx = 4096\n", "[chat]: 'ctx' is not an option of multiseq serve"),
                       ("[chat]\nnp = many\n", "[chat]: Invalid value for '-np'"),
                       ("[chat]\nprefix-cache = maybe\n", "[chat] prefix-cache: 'maybe' is not true or false"),
                       ("[*]\nc = 4096\n", "describes no model"),
                       ("[chat\nnp = 2\n", "cannot be read")):
        with pytest.raises(click.UsageError) as raised:
            presets_of(tmp_path, text)
        assert said in raised.value.format_message(), text


def test_a_models_files_alias_may_not_take_a_served_name(tmp_path):
    chat, ranker = presets_of(tmp_path, PRESET)
    assert served_names([chat, ranker], ("other", "chat", "ranker")) == \
        ((("small", "chat"), ("tiny", "chat")), ("ranker",))
    with pytest.raises(click.UsageError, match="the alias 'small' of \\[chat\\] is already a served model's name"):
        served_names([chat, ranker], ("small", "chat", "ranker"))


def test_a_memory_budget_is_read_in_the_units_people_write():
    size = MemorySize()
    assert [size.convert(text, None, None) for text in ("8G", "6000M", "1.5GiB", "512mb", "1048576")] == \
        [8 * 2**30, 6000 * 2**20, 3 * 2**29, 512 * 2**20, 2**20]
    for text in ("lots", "0G", "-1G", "8X"):
        with pytest.raises(click.BadParameter, match="is not an amount of memory"):
            size.convert(text, None, None)
