"""Where a slot's tokens stand in the model's positions, for models whose images take fewer
positions than tokens.

The engine counts a slot's content in tokens: a token's index is its place in the prompt and
what the slot's KV cells, prefixes and caps are measured in. For most models that index is also
the token's position. Models with M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) place an image's tokens
at one position in time and at their row and column, and the text after it resumes at the
image's position plus the larger of its width and height in tokens (llama.cpp's
mtmd_input_chunk_get_n_pos): an image of 12 tokens in 4 x 3 takes 4 positions. Each slot keeps
its such images (Stretch), and every position the backend hands llama.cpp (a batch's, a KV
range's) is its index translated here. Imports nothing of llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Stretch:
    """A medium whose `num_tokens` tokens, from index `start`, take `num_positions` positions."""

    start: int
    num_tokens: int
    num_positions: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def saved(self) -> int:
        """The positions it takes fewer than its tokens."""
        return self.num_tokens - self.num_positions


class SlotPositions:
    """Each slot's stretches, in index order; a slot without any places token i at i."""

    def __init__(self) -> None:
        self._stretches: dict[int, list[Stretch]] = {}

    def position(self, slot: int, index: int) -> int:
        """The position of the token at `index` (a medium's tokens share their first one's
        time position), or of the next token to come where index is the slot's length."""
        stretches = self._stretches.get(slot)
        if not stretches:
            return index
        saved = 0
        for stretch in stretches:
            if stretch.end <= index:
                saved += stretch.saved
            elif stretch.start <= index:
                return stretch.start - saved
            else:
                break
        return index - saved

    def last_position(self, slot: int, length: int) -> int:
        """The largest position the first `length` tokens hold (-1: none)."""
        return self.position(slot, length - 1) if length > 0 else -1

    def placed(self, slot: int, start: int, num_tokens: int, num_positions: int) -> None:
        """A medium was decoded at index `start` (whatever stood from there on is gone)."""
        self.cut(slot, start)
        if num_positions != num_tokens:
            self._stretches.setdefault(slot, []).append(Stretch(start, num_tokens, num_positions))

    def cut(self, slot: int, length: int) -> None:
        """The slot keeps its first `length` tokens (a medium cut through goes whole)."""
        stretches = self._stretches.get(slot)
        if stretches:
            self._stretches[slot] = [stretch for stretch in stretches if stretch.end <= length]

    def copy(self, slot: int, source: int) -> None:
        """The slot holds what the source holds."""
        if slot != source:
            self._stretches[slot] = list(self._stretches.get(source, ()))

    def clear(self, slot: int) -> None:
        self._stretches.pop(slot, None)

    def read_cells(self, slot: int, cells: np.ndarray) -> None:
        """The slot's stretches as its KV cells say (a saved state's: rows of time position, x,
        y): an image's cells share one time position, and span its columns in x and its rows
        in y from there; a text token's cell has a time position of its own."""
        self._stretches.pop(slot, None)
        if len(cells) == 0:
            return
        order = np.argsort(cells[:, 0], kind="stable")
        times, first, counts = np.unique(cells[order, 0], return_index=True, return_counts=True)
        index = 0
        for time, at, count in zip(times.tolist(), first.tolist(), counts.tolist()):
            if count > 1:
                rows = cells[order[at:at + count]]
                extent = int(max(rows[:, 1].max(), rows[:, 2].max())) - time + 1
                self.placed(slot, index, count, extent)
            index += count
