"""The boundary between the engine and a backend: what one step hands over, and what the
engine needs from a backend (multiseq.llama.backend.LlamaBackend is the real one; the tests have a fake).

A backend sees slots, tokens and positions only; it never sees a request or a Sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# A slot's KV saved to host memory: bytes only the backend reads (llama.cpp's: a numpy array,
# allocated without the zero-filling bytearray does while holding the GIL).
SlotState = np.ndarray | bytearray


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One slot's tokens in one llama_decode, at consecutive positions from start_pos. A
    decoding slot's entry may end with draft tokens to verify (speculative decoding): then each
    of its last num_drafted + 1 tokens gets a logits row."""

    slot: int
    tokens: list[int]
    start_pos: int
    wants_output: bool  # a logits row is needed for the last token
    num_drafted: int = 0  # the last tokens that are a draft (each gets a row, as does the one before)
    scores_prompt: bool = False  # a prompt chunk whose every token gets a row (prompt log probabilities)
    # An embedding request's prompt chunk: every token gets an embedding row (Backend.last_embeddings),
    # no logits row.
    embeds: bool = False

    @property
    def num_outputs(self) -> int:
        if self.scores_prompt:
            return len(self.tokens)
        return self.num_drafted + 1 if self.wants_output else 0

    @property
    def is_prompt_chunk(self) -> bool:
        """A prompt chunk: tokens without a logits row each, or a scored one (a decoding slot's
        entry, its newest token and any draft, has a row for every token)."""
        return self.scores_prompt or self.num_outputs < len(self.tokens)


def micro_batches(entry_lengths: list[tuple[int, int]], n_ubatch: int, stream_per_slot: bool) -> list[int]:
    """The sizes of the micro-batches llama.cpp cuts a batch into, for entries given as (slot,
    tokens) in batch order; each is a pass over the weights. With one KV stream (a shared pool,
    or one slot), n_ubatch tokens each. With a stream per slot, a micro-batch takes the same
    number of tokens from each slot of a run of consecutive slots (llama_batch_allocr::
    split_equal, sequential): entries of unequal lengths, or a gap in the slots, cut a step in
    several."""
    if not stream_per_slot:
        total = sum(length for _, length in entry_lengths)
        return [n_ubatch] * (total // n_ubatch) + ([total % n_ubatch] if total % n_ubatch else [])
    left = [length for _, length in entry_lengths]
    slots = [slot for slot, _ in entry_lengths]
    sizes = []
    while any(left):
        run: list[int] = []
        for index, slot in enumerate(slots):
            if left[index] and (not run or slot == slots[run[-1]] + 1):
                run.append(index)
        per_slot = min(min(left[index] for index in run), max(1, n_ubatch // len(run)))
        for index in run:
            left[index] -= per_slot
        sizes.append(per_slot * len(run))
    return sizes


@dataclass(frozen=True)
class ChunkRules:
    """How a backend wants prompts cut: chunks of at least `min_tokens` (or a prompt's whole
    rest), each ending on a multiple of `alignment` (but for a prompt's last chunk), so that a
    token's numbers do not depend on where the cut fell and no chunk falls below a kernel's
    tile. With `exact_reuse`, reused prefixes follow the same rules, so a prompt that reuses a
    prefix is computed exactly as one computed whole; without it (where outputs depend on the
    batch anyway), a reused prefix leaves only the last prompt token to compute."""

    min_tokens: int = 1
    alignment: int = 1
    exact_reuse: bool = True

    def reusable(self, shared: int, prompt_length: int) -> int:
        """How many of `shared` leading tokens a prompt of prompt_length may take from a KV:
        at least its last token is computed (its logits start generation); with exact_reuse,
        its last min_tokens, and the prefix ends on the alignment."""
        if not self.exact_reuse:
            return max(0, min(shared, prompt_length - 1))
        most = min(shared, prompt_length - max(1, self.min_tokens))
        return max(0, most - most % self.alignment)

    def chunk_length(self, start: int, remaining: int, budget: int) -> int:
        """How much of a prompt's rest, from position `start`, fits in `budget` tokens: all of
        it, or a chunk that keeps the rules (0: none fits now)."""
        if remaining <= budget:
            return remaining
        end = start + min(budget, remaining - self.min_tokens)
        end -= end % self.alignment
        return end - start if end - start >= self.min_tokens else 0


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """A sampler chain llama.cpp can run inside the model's graph (backend sampling), so that
    only the chosen token leaves the device: a logit bias (banned tokens at -inf), then
    greedy, or llama.cpp's top-k, top-p, min-p, temperature and a seeded draw, in that order
    (the host sampler's order)."""

    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) pairs, each token once
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int = 0  # the draw's generator, 32 bits

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0


GREEDY_CHAIN = ChainSpec()


class GraphSampling(Protocol):
    """Sampler chains run in the model's graph, one per slot (a backend offers this or not).
    A chain's draws depend only on its seed and the tokens accepted so far."""

    def attach(self, slot: int, spec: ChainSpec, num_accepted: int) -> bool:
        """Give the slot a new chain, its draws advanced past `num_accepted` accepted tokens;
        False when the backend cannot run it (the slot then has none)."""

    def detach(self, slot: int) -> None:
        """The slot's rows are sampled on the host again."""

    def sampled_tokens(self, rows: list[int]) -> list[int]:
        """The tokens the last decode chose for these output rows (their slots had chains)."""

    def accept(self, slot: int, token: int) -> None:
        """The slot's chain takes its token as accepted (its next draw moves on)."""


class Backend(Protocol):
    """Exactly what the engine uses of a model and its context."""

    window: int  # the per-slot window the engine must enforce
    allocated_window: int  # the window llama.cpp allocated per slot (it rounds up; window <= it)
    pool_size: int | None  # the cells of one KV pool the slots share; None: each slot has its window
    layout_window: int | None  # a pool held in a window per slot while they fit (None: a fixed layout)
    device: str | None  # where the model runs, as llama.cpp placed it (None: not said)
    model_pooling: str | None  # how the model pools an input's rows into an embedding (its GGUF's)
    kv_bytes_per_token: int | None  # what one token's KV takes in this context (None: not known)
    modalities: dict[str, bool]  # what the model reads besides text: {"vision": ..., "audio": ...}
    media: Any  # the projector's decoder (multiseq.llama.media.MediaDecoder: counts); None without one
    ranks: bool  # a reranker's context: every input is scored, nothing generated
    embeds_whole: bool  # an input is computed whole in one decode (a reranker's pair, a BERT's input)
    n_vocab: int  # the width of a logits row
    n_batch: int  # the most tokens one llama_decode takes
    can_shift: bool  # whether a slot's KV positions can be moved (generation shift)
    add_bos: bool  # whether tokenize() puts a BOS token first
    last_decode_seconds: float  # time of the last decode() call's llama_decode alone
    chunk_rules: ChunkRules  # how to cut prompts so that the cut does not change their numbers
    chat_template_source: str | None  # the chat template's Jinja text (None: built-in or none)
    graph_sampling: GraphSampling | None  # sampler chains in the model's graph; None: host only
    n_embd: int  # the width of an embedding row
    facts: Any  # what the model is, for model lists (multiseq.llama.facts.ModelFacts)
    # Per slot whose entry embeds, in the last decode: its tokens' embedding rows (the final
    # hidden state after the output norm), (tokens, n_embd), owned by the caller.
    last_embeddings: dict[int, np.ndarray]

    def tokenize_media(self, texts: list[str], media: list[bytes]) -> Any:
        """Texts with media between them as tokens (multiseq.llama.media.MediaPrompt: a medium's
        tokens are placeholders); ValueError when a medium cannot be read, or the model has no
        projector."""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def render_chat(self, messages: Sequence[dict], tools: list[dict] | None = None,
                    options: dict | None = None, **shaping: Any) -> str: ...
    def token_bytes(self, token: int) -> bytes: ...
    def bos_and_eos_texts(self) -> tuple[str, str]:
        """The BOS and EOS tokens' texts, as templates write them ("" for none)."""

    def is_end_of_generation(self, token: int) -> bool: ...
    def end_of_generation_tokens(self) -> list[int]: ...
    def grammar_tokenizer(self) -> Any:
        """llguidance's LLTokenizer over the vocabulary (built on first use), for constraints."""

    def decode(self, entries: list[BatchEntry]) -> np.ndarray:
        """One llama_decode over entries in slot order: the logits rows of the entries that
        want output, in entry order (a row whose slot has a graph_sampling chain may hold no
        logits: its token is in graph_sampling.sampled_tokens). Raises NoKvSlot when a smaller batch may fit, and
        BackendError when the decode failed for good."""

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        """Make `slot`'s KV hold exactly positions [0, length) of `source_slot`'s (copying the
        KV when the slots differ, or in a shared pool giving it the same cells; length 0
        clears the slot). False when those positions are not all there (the slot is then
        cleared)."""

    def undo_failed_decode(self, slot: int, start_pos: int) -> bool:
        """After a failed decode (which may have kept the micro-batches before the one that
        failed): make the slot hold positions [0, start_pos) again. False when they are not all
        there any more (the slot is then cleared)."""

    def rewind_slot(self, slot: int, length: int) -> bool:
        """Keep positions [0, length) of the slot (a verified draft's rejected tokens go).
        False when what the next tokens need is not all there (the slot is then cleared)."""

    def save_slot(self, slot: int) -> SlotState | None:
        """The slot's KV state, to restore into some slot later (None when it cannot be saved)."""

    def restore_slot(self, slot: int, state: SlotState, length: int) -> bool:
        """Put a saved state into the slot, cut back to positions [0, length). False when not
        all of it is there (the slot is then cleared)."""

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None: ...
    def close(self) -> None: ...
