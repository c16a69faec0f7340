"""Where a slot's tokens stand in a model's positions when an image takes fewer positions than
tokens (M-RoPE): the translation every KV range and batch position goes through."""

from __future__ import annotations

import numpy as np

from multiseq.llama.positions import SlotPositions


def image_12_tokens_4_positions_at(start: int) -> SlotPositions:
    positions = SlotPositions()
    positions.placed(0, start, 12, 4)
    return positions


def test_a_slot_without_images_places_token_i_at_i():
    positions = SlotPositions()
    assert [positions.position(3, index) for index in (0, 5, 100)] == [0, 5, 100]
    assert positions.last_position(3, 10) == 9 and positions.last_position(3, 0) == -1


def test_text_after_an_image_resumes_at_its_start_plus_its_extent():
    positions = image_12_tokens_4_positions_at(3)
    assert [positions.position(0, index) for index in (0, 2, 3, 9, 14, 15, 16)] == [0, 2, 3, 3, 3, 7, 8]
    assert positions.last_position(0, 15) == 3  # the image's last token shares its time position
    assert positions.position(1, 15) == 15  # another slot is untouched


def test_cutting_keeps_an_image_whole_or_drops_it_and_a_copy_follows_the_source():
    positions = image_12_tokens_4_positions_at(3)
    positions.copy(1, 0)
    positions.cut(0, 10)  # through the image: it goes
    assert positions.position(0, 20) == 20 and positions.position(1, 20) == 12
    positions.cut(1, 15)  # at its end: it stays
    assert positions.position(1, 20) == 12
    positions.placed(1, 2, 6, 6)  # a medium at as many positions as tokens, over the image: no stretch left
    assert positions.position(1, 20) == 20


def test_a_saved_states_cells_give_back_its_images():
    """Cells as llama.cpp saves them (time position, x, y): text, an image of 4 x 3 tokens
    (x over 4 columns, y over 3 rows), text again; in the order the cells lie, not by position."""
    image = [(3, 3 + column, 3 + row) for row in range(3) for column in range(4)]
    text = [(position, 0, 0) for position in (0, 1, 2, 7, 8)]
    cells = np.array(text[3:] + image + text[:3], dtype=np.int32)
    positions = SlotPositions()
    positions.read_cells(2, cells)
    assert [positions.position(2, index) for index in (2, 3, 14, 15, 16, 17)] == [2, 3, 3, 7, 8, 9]
