"""batch-run --images DIR: a folder of images as a prompts file, each image asked one question.

The lines are written to a temporary JSON lines file (removed when the command ends), one per
image file under DIR in path order, its id the file's path under DIR: a run's results name their
files, and --resume skips those done. The images are read from DIR as the run reaches them.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from pathlib import Path

DEFAULT_IMAGE_PROMPT = "Describe this image."
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def image_files(folder: Path) -> list[str]:
    """The image files under folder (by suffix), as paths relative to it, in sorted order."""
    found = []
    for root, _, names in os.walk(folder):
        found += [(Path(root) / name).relative_to(folder).as_posix() for name in names
                  if name.lower().endswith(IMAGE_SUFFIXES)]
    return sorted(found)


def image_prompts_file(folder: Path, prompt: str) -> Path:
    """A JSON lines prompts file asking `prompt` about each image under folder."""
    handle, name = tempfile.mkstemp(prefix="multiseq-images-", suffix=".jsonl")
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        for path in image_files(folder):
            file.write(json.dumps({"id": path, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": path}}, {"type": "text", "text": prompt}]}]},
                ensure_ascii=False) + "\n")
    return Path(name)
