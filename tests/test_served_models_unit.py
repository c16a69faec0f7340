"""What `multiseq serve --models-dir` finds in a folder, checked on a folder of empty files."""

from __future__ import annotations

from multiseq.cli.served import folder_models


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
