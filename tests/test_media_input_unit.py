"""Media as requests carry them: data URLs and files under the prompts file's folder, checked
(format, size, pixels from the header) before anything runs, each problem naming its part."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest
from tiny_projectors import image_of

from multiseq.formats.fields import ItemError, chat_messages
from multiseq.formats.media_input import MAX_IMAGE_PIXELS, checked, sniff


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and IHDR chunk: what says its size (the pixels need not follow)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr))


def image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.mark.parametrize("image_format, size", [("PNG", (80, 60)), ("JPEG", (50, 100)), ("GIF", (30, 20)),
                                                ("BMP", (17, 9))])
def test_an_images_size_is_read_from_its_header(image_format, size):
    assert sniff(image_of(*size, seed=1, image_format=image_format)) == ("image", size)


def test_a_decompression_bomb_is_refused_before_it_is_decoded():
    bomb = png_header(100_000, 100_000)  # 10 gigapixels in a few bytes
    with pytest.raises(ItemError, match=f"100000 x 100000 pixels; at most {MAX_IMAGE_PIXELS}"):
        checked(bomb, "messages[0].content[1].image_url.url", "image")


def test_a_data_url_becomes_the_images_bytes():
    png = image_of(8, 8, seed=2)
    [message] = chat_messages(image_message("data:image/png;base64," + base64.b64encode(png).decode()))
    assert message["content"] == [{"type": "text", "text": "What is it?"}, {"type": "image", "data": png}]


def test_a_file_is_read_under_the_prompts_folder_and_nowhere_else(tmp_path):
    (tmp_path / "photos").mkdir()
    png = image_of(8, 8, seed=3)
    (tmp_path / "photos" / "cat.png").write_bytes(png)
    [message] = chat_messages(image_message("photos/cat.png"), media_root=tmp_path)
    assert message["content"][1]["data"] == png
    with pytest.raises(ItemError, match="outside the folder media are read from") as outside:
        chat_messages(image_message("../elsewhere.png"), media_root=tmp_path / "photos")
    assert outside.value.param == "messages[0].content[1].image_url.url"
    with pytest.raises(ItemError, match="cannot read 'photos/dog.png'"):
        chat_messages(image_message("photos/dog.png"), media_root=tmp_path)
    with pytest.raises(ItemError, match="must be a data URL"):  # the server reads no files
        chat_messages(image_message("photos/cat.png"))
