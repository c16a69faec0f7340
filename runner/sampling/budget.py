"""A reasoning budget: the tokens a sequence spends inside its reasoning block, counted, and at
the budget the block's close forced (after llama-server's budget message, where one is set).

The block is found in the text of the accepted tokens, by the family's open and close markers
(`<think>`, `</think>`; a control token's text as the family's parser reads it): a prompt that
opened the block (Qwen3's template) starts inside it, the prompt's tokens after the opener counted
toward the budget (as llama.cpp's sampler counts them). Once the count reaches the budget, the
next tokens are the forced ones (the message, then the close marker), one a step: the sampler
allows nothing else, as llama.cpp's reasoning-budget sampler does; the answer follows freely.
A budget of -1 only counts (usage's reasoning_tokens); 0 closes the block as soon as it opens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

UNLIMITED = -1


@dataclass
class _State:
    inside: bool
    spent: int = 0  # tokens inside the block (its markers not counted), the prompt's after its opener first
    tail: bytes = b""  # the end of the text so far, as long as the longest marker
    lengths: tuple[int, ...] = ()  # the byte lengths of the tokens the tail holds, last last
    forcing_at: int | None = None  # the index of the next forced token (None: not forcing)


class ReasoningBudget:
    """One sequence's reasoning: whether it is inside the block, what it spent, what to force."""

    def __init__(self, budget: int, markers: tuple[str, str], forced: Sequence[int], inside: bool,
                 token_text: Callable[[int], bytes], prompt_spent: int = 0) -> None:
        self.budget = budget
        self._opener, self._closer = (marker.encode("utf-8") for marker in markers)
        self._forced = list(forced)  # the message, then the close marker, as tokens
        self._token_text = token_text
        # A prompt that opened the block: its tokens after the opener count toward the budget, as
        # llama.cpp's sampler counts the generation prompt's (Qwen3's "<think>\n": one); not as spent.
        self._prompt_spent = prompt_spent if inside else 0
        self._state = _State(inside, self._prompt_spent)
        self._tail_bytes = max(len(self._opener), len(self._closer))

    @property
    def spent(self) -> int:
        """Tokens generated inside the reasoning block so far."""
        return self._state.spent - self._prompt_spent

    def forced_token(self) -> int | None:
        """The token the next draw must give (None: it draws freely)."""
        index = self._forcing_index()
        return None if index is None else self._forced[index]

    def _forcing_index(self) -> int | None:
        state = self._state
        if state.forcing_at is not None:
            return state.forcing_at
        if state.inside and self.budget != UNLIMITED and state.spent >= self.budget and self._forced:
            return 0
        return None

    def accept(self, token: int) -> None:
        state = self._state
        forcing = self._forcing_index()
        if forcing is not None:
            state.forcing_at = forcing + 1
            if state.forcing_at == len(self._forced):  # the block is closed, whatever its text reads as
                state.forcing_at, state.inside = None, False
        elif state.inside:
            state.spent += 1
        text = self._token_text(token)
        state.tail = (state.tail + text)[-self._tail_bytes:]
        state.lengths = (*state.lengths, len(text))[-self._tail_bytes:]
        if state.inside and state.forcing_at is None and state.tail.endswith(self._closer):
            state.inside = False
            state.spent -= self._tokens_written_as(self._closer)  # counted as they came: the marker is no reasoning
        elif not state.inside and state.forcing_at is None and state.tail.endswith(self._opener):
            state.inside = True

    def _tokens_written_as(self, marker: bytes) -> int:
        """How many of the last tokens wrote the marker that ends the text."""
        covered, count = 0, 0
        for length in reversed(self._state.lengths):
            if covered >= len(marker):
                break
            covered, count = covered + length, count + 1
        return count

    def saved(self) -> _State:
        """The state as it is now, for restore() (a draft's rows are sampled ahead, then undone)."""
        return dataclasses.replace(self._state)

    def restore(self, state: _State) -> None:
        self._state = state
