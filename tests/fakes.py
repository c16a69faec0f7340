"""A fake backend: a byte-level "model" that runs in microseconds and checks the runner.

Tokens 0..255 are bytes, then BOS and EOS. The fake keeps each slot's KV as a list of tokens
and asserts what llama.cpp would need: positions continue where the slot's KV ends, no slot
outgrows its window, at most n_batch tokens per decode. Its next-token logits depend only on
the sequence's own state, like a real model's, so batching must not change any output.

Reusing a prefix copies one slot's KV list into another and cuts it back, as llama.cpp does
with a stream copy and seq_rm. With `sliding_window=W` the fake forgets positions more than W
behind the newest one, as a sliding-window cache that is not full-size may do, so a reused
prefix can be found not intact.

What it "generates" after a prompt: a scripted reply when the prompt text was registered in
`replies` (EOS after it), otherwise bytes cycling from the last token. With `noisy=True`
the logits get a seeded random component so that sampling has a real distribution to draw from.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from dataclasses import dataclass

import numpy as np

from multiseq.llama.batch import ChainSpec, ChunkRules
from multiseq.llama.facts import ModelFacts
from multiseq.llama.media import MediaChunk, MediaPrompt, MediaSpan, placeholder_of
from multiseq.llama.template_input import content_text
from multiseq.llama.text import FimTokens
from multiseq.loop.sequence import ADAPTER_MARK
from multiseq.errors import BackendError, NoKvSlot
from multiseq.sampling.grammar import tokenizer_from_pieces

BOS = 256
EOS = 257
VOCAB = 512  # bytes, BOS, EOS and unused ids; a multiple of 16 so the sampler's block path runs
# Fill-in-the-middle markers of the fake vocabulary (FakeBackend(fim=True)): prefix, suffix,
# middle, repository, file separator.
FIM_PRE, FIM_SUF, FIM_MID, FIM_REP, FIM_SEP = 260, 261, 262, 263, 264
PEAK = 20.0  # greedy and low-temperature sampling follow the script
NOISY_PEAK = 2.0  # with noise of the same size, sampling has many likely tokens
_grammar_tokenizer = None
FAKE_N_EMBD = 8  # the width of the fake model's embedding rows


def fake_embedding_rows(tokens: list[int]) -> np.ndarray:
    """The fake model's embedding row of each token: a function of the tokens up to it, as a
    causal model's hidden state is (so a prompt cut anywhere gives the same rows)."""
    rows, state = [], b""
    for token in tokens:
        state = hashlib.blake2b(state + token.to_bytes(4, "little"), digest_size=16).digest()
        rows.append(np.random.default_rng(int.from_bytes(state, "little")).standard_normal(FAKE_N_EMBD))
    return np.array(rows, dtype=np.float32).reshape(len(rows), FAKE_N_EMBD)


@dataclass
class DecodeCall:
    """What one decode saw: (slot, number of tokens, is_prefill) per entry, in batch order."""

    entries: list[tuple[int, int, bool]]
    num_tokens: int
    decoding_slots: list[int]  # slots whose entry is a generated token
    slots_with_pending_token: list[int]  # slots that had a sampled token not yet fed back
    started_at: float
    start_positions: list[int]  # of each entry, in batch order
    embedding_slots: tuple[int, ...] = ()  # slots whose entry is an embedding request's prompt chunk
    adapter_set: int = 0  # the adapter set the step ran through (0: the model's own)


class FakeGraphSampling:
    """Sampler chains 'in the graph' of the fake: greedy takes the row's argmax, a sampled
    chain draws from the tempered softmax of its top-k with a uniform that depends only on its
    seed and the tokens it accepted (as llama.cpp's dist chain does). Records what was asked."""

    def __init__(self, backend: FakeBackend) -> None:
        self._backend = backend
        self.chains: dict[int, list] = {}  # slot -> [spec, tokens accepted]
        self.attaches: list[tuple[int, ChainSpec, int]] = []  # (slot, spec, accepted before)
        self.detaches: list[int] = []
        self.sampled_rows = 0  # rows whose token a chain chose
        self.refuse = False  # attach() fails, as for a chain the device cannot run

    def attach(self, slot: int, spec: ChainSpec, num_accepted: int) -> bool:
        if self.refuse:
            self.chains.pop(slot, None)
            return False
        self.chains[slot] = [spec, num_accepted]
        self.attaches.append((slot, spec, num_accepted))
        return True

    def detach(self, slot: int) -> None:
        del self.chains[slot]
        self.detaches.append(slot)

    def sampled_tokens(self, rows: list[int]) -> list[int]:
        self.sampled_rows += len(rows)
        return [self._choose(self._backend.last_output_slots[row], self._backend.last_rows[row]) for row in rows]

    def _choose(self, slot: int, row: np.ndarray) -> int:
        if slot not in self.chains:
            return -1  # LLAMA_TOKEN_NULL: no chain on that slot
        spec, accepted = self.chains[slot]
        row = row.copy()
        for token, bias in spec.logit_bias:
            row[token] += bias
        if spec.is_greedy:
            return int(row.argmax())
        top = np.argsort(-row, kind="stable")[:spec.top_k or len(row)]
        weights = np.exp((row[top] - row[top[0]]) / spec.temperature)
        uniform = np.random.default_rng([spec.seed, accepted]).random()
        pick = int(np.searchsorted(np.cumsum(weights) / weights.sum(), uniform, side="right"))
        return int(top[min(pick, len(top) - 1)])

    def accept(self, slot: int, token: int) -> None:
        self.chains[slot][1] += 1


FAKE_MEDIA_TOKENS = 6  # the tokens a medium takes in the fake model


def fake_media_name(data: bytes) -> str:
    """How a medium stands in the fake's prompt text (replies are keyed by that text)."""
    return f"[media {hashlib.sha256(data).hexdigest()[:8]}]"


def fake_prompt_text(tokens: list[int]) -> str:
    """A fake prompt's text: its bytes, a medium's run of placeholders as its name."""
    text, previous = b"", None
    for token in tokens:
        if token < 0 and token != previous:
            text += FakeBackend.media_names.get(token, "[media]").encode()
        elif 0 <= token < 256:
            text += bytes([token])
        previous = token
    return text.decode("utf-8", "replace")


class FakeMediaChunk(MediaChunk):
    """A medium whose encoding beside the steps takes `backend.encode_checks` readiness checks."""

    def __init__(self, backend: FakeBackend, placeholder: int) -> None:
        super().__init__(None, None, placeholder, FAKE_MEDIA_TOKENS, backend.media_non_causal)
        self.backend = backend

    def ready(self, encode_beside: bool) -> bool:
        if not encode_beside:
            return True
        self.backend.beside_checks.append(self.placeholder)
        return self.backend.beside_checks.count(self.placeholder) > self.backend.encode_checks


class FakeBackend:
    media_names: dict[int, str] = {}  # placeholder -> fake_media_name, for every medium seen
    # What the engine reads of a backend's model and placement (batch.Backend): a generating
    # model on no device in particular, pooling embeddings by the mean.
    device: str | None = None
    model_pooling: str | None = None
    kv_bytes_per_token: int | None = None
    modalities = {"vision": False, "audio": False}  # what /props says (its media tests go through the engine)
    media = None  # no projector's counts
    ranks = False
    embeds_whole = False
    facts = ModelFacts("/models/fake.gguf", "fake", 1_000_000, 4_000_000, "F32", "1M", 256, 1.7e9)

    def __init__(self, num_slots: int = 4, window: int = 256, n_batch: int = 64, replies: dict[str, str] | None = None,
                 noisy: bool = False, can_shift: bool = True, decode_delay: float = 0.0,
                 no_kv_slot_above: int | None = None, sliding_window: int | None = None,
                 chunk_rules: ChunkRules = ChunkRules(exact_reuse=False), state_bytes_per_token: int = 0,
                 pool_size: int | None = None, windows_while_they_fit: bool = False, fim: bool = False) -> None:
        self.num_slots = num_slots
        self.fim = fim
        self.window = window
        # A pool held in a window per slot while they fit (LlamaBackend's windows_while_they_fit):
        # moves are recorded; the cells stay as they are, as a move keeps every slot's KV.
        self.layout_window = pool_size // num_slots if pool_size and windows_while_they_fit else None
        self.pooled = bool(pool_size) and not windows_while_they_fit
        self.layout_moves: list[bool] = []
        # One KV pool of pool_size cells shared by the slots: a prefix given to another slot is
        # the same cells (ids here), and a decode that needs more cells than are free finds no
        # KV slot, as llama_decode does. None: a window of its own per slot.
        self.pool_size = pool_size
        self.allocated_window = window
        self.cells: list[list[int]] = [[] for _ in range(num_slots)]
        self._next_cell = 0
        self.max_cells_used = 0
        self.n_batch = n_batch
        self.n_vocab = VOCAB
        self.n_embd = FAKE_N_EMBD
        self.last_embeddings: dict[int, np.ndarray] = {}
        self.can_shift = can_shift
        self.add_bos = True
        self.last_decode_seconds = 0.0
        self.replies = {prompt: reply.encode("utf-8") for prompt, reply in (replies or {}).items()}
        self.noisy = noisy
        self.decode_delay = decode_delay
        self.no_kv_slot_above = no_kv_slot_above  # simulate llama_decode returning 1 above this size
        # Fault injection: a decode whose batch holds this token fails (as llama_decode
        # returning an error, or finding no KV slot, for that sequence's tokens), before it
        # changes anything; fail_every_decode: the backend itself is broken.
        self.poison_token: int | None = None
        self.poison_error: type[BackendError] = BackendError
        self.fail_every_decode = False
        self.fail_decodes_after: int | None = None  # the backend breaks after this many decodes
        self.kv: list[list[int]] = [[] for _ in range(num_slots)]
        # What the slot's sequence is, whatever shifting did to its KV: its prompt, and how
        # many generated tokens were fed back.
        self.prompts: list[list[int]] = [[] for _ in range(num_slots)]
        self.num_generated_fed = [0] * num_slots
        self.has_pending_token = [False] * num_slots
        self.calls: list[DecodeCall] = []
        self.adapter_set = 0  # use_adapter_set's: what the next decode runs through
        self.media_decodes: list[tuple[int, int]] = []  # (slot, placeholder) of every medium decoded
        self.media_non_causal = True  # its media's tokens attend both ways (Gemma 3's images; audio: no)
        self.encode_checks = 3  # steps a medium encoded beside them takes (FakeMediaChunk)
        self.beside_checks: list[int] = []  # placeholders asked for while a stream was watched
        self.shifts: list[tuple[int, int, int]] = []
        self.reuses: list[tuple[int, int, int]] = []  # (slot, source slot, length) of every reused prefix
        self.saves: list[int] = []  # slots whose state was saved to host memory
        self.state_bytes_per_token = state_bytes_per_token  # padding, to give saved states a size
        self.restores: list[tuple[int, int]] = []  # (slot, length) of every state restored
        self.rewinds: list[tuple[int, int]] = []  # (slot, length) of every rejected draft removed
        self.num_drafted_fed = 0  # draft tokens decoded (verified)
        self.refused_reuses: list[tuple[int, int, int]] = []  # those whose source had lost its start
        self.sliding_window = sliding_window
        self.chunk_rules = chunk_rules
        self.forgotten_below = [0] * num_slots  # positions the sliding window has dropped
        self.closed = False
        # llama.cpp's KV may only change between decodes, on the thread that decodes: every KV
        # operation that came while a decode was running, from any thread, is noted here.
        self.is_decoding = False
        self.kv_changes_during_decode: list[str] = []
        self.during_decode = None  # called inside decode(): what another thread might do meanwhile
        self.graph_sampling: FakeGraphSampling | None = FakeGraphSampling(self)
        self.last_rows = np.empty((0, VOCAB), dtype=np.float32)  # the last decode's logits rows
        self.last_output_slots: list[int] = []  # and the slot of each

    # --- text --------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [BOS, *text.encode("utf-8")] if add_special else list(text.encode("utf-8"))

    def tokenize_media(self, texts: list[str], media: list[bytes]) -> MediaPrompt:
        """A medium takes FAKE_MEDIA_TOKENS placeholders (anything but b"not an image" reads)."""
        tokens, spans = self.tokenize(texts[0]), []
        for index, (data, text) in enumerate(zip(media, texts[1:])):
            if data == b"not an image":
                raise ValueError(f"media {index} is not an image or audio that llama.cpp can read ({len(data)} bytes)")
            placeholder = placeholder_of(b"fake projector", data)
            FakeBackend.media_names[placeholder] = fake_media_name(data)
            spans.append(MediaSpan(len(tokens), FakeMediaChunk(self, placeholder)))
            tokens += [placeholder] * FAKE_MEDIA_TOKENS + list(text.encode("utf-8"))
        return MediaPrompt(tokens, tuple(spans))

    bos_token = BOS

    def fim_tokens(self) -> FimTokens:
        return FimTokens(FIM_PRE, FIM_SUF, FIM_MID, FIM_REP, FIM_SEP) if self.fim else FimTokens()

    def render_tokens(self, tokens: list[int]) -> str:
        return "".join(chr(token) if token < 256 else f"<{token}>" for token in tokens)

    chat_template_source = None  # no Jinja template: tools take the generic format

    def render_chat(self, messages: tuple[dict, ...], tools: list[dict] | None = None,
                    options: dict | None = None, **shaping) -> str:
        assert tools is None, "a template that knows no tools is never given them"
        return "".join(f"<{m['role']}>{content_text(m['content'])}" for m in messages) + "<assistant>"

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""

    def is_end_of_generation(self, token: int) -> bool:
        return token == EOS

    def bos_and_eos_texts(self) -> tuple[str, str]:
        return "<s>", "</s>"

    def end_of_generation_tokens(self) -> list[int]:
        return [EOS]

    def grammar_tokenizer(self):
        """llguidance's view of the byte vocabulary: BOS and EOS are special, the unused ids
        stand for nothing. Built once per process (it depends on nothing but the vocabulary)."""
        global _grammar_tokenizer
        if _grammar_tokenizer is None:
            pieces = [bytes([token]) for token in range(256)] + [b"\xff<s>", b"\xff</s>"]
            pieces += [b""] * (VOCAB - len(pieces))
            _grammar_tokenizer = tokenizer_from_pieces(pieces, [EOS], [BOS, EOS], list)
        return _grammar_tokenizer

    # --- the model ---------------------------------------------------------------------------

    def _next_token(self, slot: int) -> int:
        prompt = fake_prompt_text(self.prompts[slot])
        reply = self.replies.get(prompt)
        if reply is not None:
            generated = self.num_generated_fed[slot]
            return reply[generated] if generated < len(reply) else EOS
        last = self.kv[slot][-1]
        return (last + 1) % 256 if last < 256 else ord("a")

    def _logits(self, slot: int) -> np.ndarray:
        row = np.zeros(VOCAB, dtype=np.float32)
        if self.noisy:
            context = self.kv[slot]
            seed = zlib.crc32(np.asarray(context[-4:] + [len(context)], dtype=np.int64).tobytes())
            row += np.random.default_rng(seed).normal(0, 2.0, VOCAB).astype(np.float32)
        row[self._next_token(slot)] += NOISY_PEAK if self.noisy else PEAK
        return row

    def relayout(self, pooled: bool, shares: dict) -> None:
        self.layout_moves.append(pooled)
        self.pooled = pooled

    def use_adapter_set(self, index: int) -> None:
        self.adapter_set = index

    def decode(self, entries: list) -> np.ndarray:
        self.is_decoding = True
        try:
            if self.during_decode is not None:
                self.during_decode()
            return self._decode(entries)
        finally:
            self.is_decoding = False

    def _note_kv_change(self, what: str) -> None:
        if self.is_decoding:
            self.kv_changes_during_decode.append(what)

    def _decode(self, entries: list) -> np.ndarray:
        started = time.perf_counter()
        num_tokens = sum(len(entry.tokens) for entry in entries)
        # (as the real backend: a medium is a decode of its own; one read causally, in pieces)
        text_tokens = sum(len(entry.tokens) for entry in entries if entry.tokens[0] >= 0)
        assert 0 < num_tokens and text_tokens <= self.n_batch, f"batch of {text_tokens} tokens exceeds n_batch"
        assert all(len(entry.tokens) <= self.n_batch or not self.media_non_causal for entry in entries
                   if entry.tokens[0] < 0), "a medium read both ways must fit one decode"
        slots = [entry.slot for entry in entries]
        assert slots == sorted(set(slots)), f"entries must be one per slot, in slot order: {slots}"
        if self.no_kv_slot_above is not None and num_tokens > self.no_kv_slot_above:
            raise NoKvSlot("fake: no KV slot")
        if self.fail_every_decode or (self.fail_decodes_after is not None and len(self.calls) >= self.fail_decodes_after):
            raise BackendError("llama_decode failed with code -3")
        if self.poison_token is not None and any(self.poison_token in entry.tokens for entry in entries):
            raise self.poison_error("llama_decode failed with code -1" if self.poison_error is BackendError
                                    else "llama_decode found no KV slot for the batch")
        # A slot with a sampled token not yet fed back is decoding: its entry is that token.
        # Any other slot's entry is prompt tokens.
        # (A draft comes only with a decoding slot's token, even one whose KV was just restored.)
        is_decode = [self.has_pending_token[entry.slot] or entry.num_drafted > 0 for entry in entries]
        self.calls.append(DecodeCall(
            entries=[(entry.slot, len(entry.tokens), not decode) for entry, decode in zip(entries, is_decode)],
            num_tokens=num_tokens,
            decoding_slots=[entry.slot for entry, decode in zip(entries, is_decode) if decode],
            slots_with_pending_token=[slot for slot in range(self.num_slots) if self.has_pending_token[slot]],
            started_at=started,
            start_positions=[entry.start_pos for entry in entries],
            embedding_slots=tuple(entry.slot for entry in entries if entry.embeds),
            adapter_set=self.adapter_set,
        ))
        if self.pool_size is not None and self.num_cells_used + num_tokens > self.pool_size:
            raise NoKvSlot(f"fake: {num_tokens} tokens, {self.pool_size - self.num_cells_used} cells free")
        rows = []
        self.last_embeddings = {}
        for entry, decode in zip(entries, is_decode):
            self._new_cells(entry.slot, len(entry.tokens))
            kv = self.kv[entry.slot]
            assert entry.start_pos == len(kv), f"slot {entry.slot}: token at {entry.start_pos}, KV holds {len(kv)}"
            assert entry.start_pos + len(entry.tokens) <= self.window, \
                f"slot {entry.slot} outgrew its {self.window}-token window"
            if decode:
                # Its token, then the draft to verify (if any): a row after each of them.
                assert len(entry.tokens) == entry.num_drafted + 1 and entry.wants_output, \
                    "a decoding slot feeds back exactly its token and its draft"
                self.num_drafted_fed += entry.num_drafted
                for token in entry.tokens:
                    kv.append(token)
                    self.num_generated_fed[entry.slot] += 1
                    rows.append(self._logits(entry.slot))
            elif entry.scores_prompt:  # a row after each prompt token, from what the KV holds by then
                for token in entry.tokens:
                    kv.append(token)
                    self.prompts[entry.slot].append(token)
                    rows.append(self._logits(entry.slot))
            elif entry.embeds:  # a row per token, from what the KV holds up to it (causal, as a model's)
                assert not entry.wants_output, "an embedding's chunk gets no logits row"
                kv.extend(entry.tokens)
                self.prompts[entry.slot].extend(entry.tokens)
                self.last_embeddings[entry.slot] = fake_embedding_rows(kv)[-len(entry.tokens):]
            else:
                assert not entry.num_drafted, "only a decoding slot's entry has a draft"
                if any(token < 0 for token in entry.tokens):  # a medium: whole, alone, no row
                    assert len(set(entry.tokens)) == 1 and len(entry.tokens) == FAKE_MEDIA_TOKENS, \
                        f"a medium is decoded whole and alone: {entry.tokens}"
                    assert not entry.wants_output, "a medium's entry gets no logits row"
                    self.media_decodes.append((entry.slot, entry.tokens[0]))
                kv.extend(entry.tokens)
                self.prompts[entry.slot].extend(entry.tokens)
                if entry.wants_output:
                    rows.append(self._logits(entry.slot))
            if self.sliding_window is not None:
                self.forgotten_below[entry.slot] = max(self.forgotten_below[entry.slot], len(kv) - self.sliding_window)
            self.has_pending_token[entry.slot] = entry.wants_output
        if self.decode_delay:
            time.sleep(self.decode_delay)
        self.last_decode_seconds = time.perf_counter() - started
        self.last_rows = np.array(rows, dtype=np.float32).reshape(len(rows), VOCAB)
        self.last_output_slots = [entry.slot for entry in entries for _ in range(entry.num_outputs)]
        return self.last_rows.copy()  # the engine may change its rows in place

    # --- KV ----------------------------------------------------------------------------------

    @property
    def num_cells_used(self) -> int:
        return len({cell for cells in self.cells for cell in cells})

    def _new_cells(self, slot: int, count: int) -> None:
        self.cells[slot] += range(self._next_cell, self._next_cell + count)
        self._next_cell += count
        self.max_cells_used = max(self.max_cells_used, self.num_cells_used)

    def clear_slot(self, slot: int) -> None:
        self._note_kv_change(f"clear slot {slot}")
        self.cells[slot] = []
        self.kv[slot] = []
        self.prompts[slot] = []
        self.num_generated_fed[slot] = 0
        self.has_pending_token[slot] = False
        self.forgotten_below[slot] = 0

    def reuse_prefix(self, slot: int, source_slot: int, length: int) -> bool:
        assert length <= len(self.kv[source_slot]), "a slot can only give what its KV holds"
        self._note_kv_change(f"reuse slot {source_slot} in slot {slot}")
        self.reuses.append((slot, source_slot, length))
        intact = self.forgotten_below[source_slot] == 0 or length == 0
        if not intact:
            self.refused_reuses.append((slot, source_slot, length))
        kept = self.kv[source_slot][:length] if intact else []
        shared = self.cells[source_slot][:len(kept)]
        self._hold(slot, kept)
        if self.pool_size is not None:
            self.cells[slot] = list(shared)
        else:
            self._new_cells(slot, len(kept))
        return intact

    def _hold(self, slot: int, tokens: list[int]) -> None:
        """The slot's KV becomes exactly `tokens`, the start of the next request's prompt."""
        self.clear_slot(slot)
        self.kv[slot] = list(tokens)
        self.prompts[slot] = list(tokens)

    def undo_failed_decode(self, slot: int, start_pos: int) -> bool:
        assert len(self.kv[slot]) == start_pos, "the fake's failed decodes write nothing"
        return True

    def rewind_slot(self, slot: int, length: int) -> bool:
        """A verified draft's rejected tokens go: they were the last generated tokens fed."""
        self._note_kv_change(f"rewind slot {slot}")
        removed = len(self.kv[slot]) - length
        assert 0 <= removed <= self.num_generated_fed[slot], "only fed-back generated tokens are rewound"
        self.rewinds.append((slot, length))
        del self.kv[slot][length:]
        del self.cells[slot][len(self.cells[slot]) - removed:]
        self.num_generated_fed[slot] -= removed
        return True

    def save_slot(self, slot: int) -> bytearray | None:
        """A saved state: the slot's KV as bytes (a sliding window's forgotten start is lost,
        as llama.cpp saves only the cells inside the window)."""
        self.saves.append(slot)
        kept = self.kv[slot][self.forgotten_below[slot]:]
        return bytearray(json.dumps([self.forgotten_below[slot], kept]).encode().ljust(
            len(kept) * self.state_bytes_per_token))

    def restore_slot(self, slot: int, state: bytearray, length: int) -> bool:
        self._note_kv_change(f"restore into slot {slot}")
        forgotten, kept = json.loads(bytes(state).rstrip())
        self.restores.append((slot, length))
        intact = forgotten == 0 and length <= len(kept)
        self._hold(slot, kept[:length] if intact else [])
        self._new_cells(slot, len(self.kv[slot]))
        return intact

    def shift_slot(self, slot: int, keep: int, discard: int, n_past: int) -> None:
        assert n_past == len(self.kv[slot]), "shift must start from the slot's actual length"
        self._note_kv_change(f"shift slot {slot}")
        shared = {cell for other in range(self.num_slots) if other != slot for cell in self.cells[other]}
        assert not shared.intersection(self.cells[slot][keep + discard:]), "a shift moved cells another slot holds"
        del self.kv[slot][keep:keep + discard]
        del self.cells[slot][keep:keep + discard]
        self.shifts.append((slot, keep, discard))

    def assert_free_slots_hold_only_kept_prompts(self, scheduler) -> None:
        """Every slot is free and its KV is exactly what the scheduler keeps for it (a prompt
        and what was generated after it): nothing beyond what a later request may reuse."""
        for slot in scheduler.slots:
            assert slot.is_free, f"slot {slot.index} is still busy"
            kept = slot.kept.tolist()
            if kept:  # (a prefix computed through an adapter is marked as its: sequence.adapter_marked)
                kept[0] %= ADAPTER_MARK
            assert self.kv[slot.index] == kept, f"slot {slot.index} holds {self.kv[slot.index]}, keeps {kept}"

    def slot_pos_max(self, slot: int) -> int:
        return len(self.kv[slot]) - 1

    def slot_pos_min(self, slot: int) -> int:
        return self.forgotten_below[slot] if self.kv[slot] else -1

    def close(self) -> None:
        self.closed = True


class LatestMention(dict):
    """Scripted replies for FakeBackend.replies, chosen by the key the prompt mentions last: a
    tool round trip's second prompt holds the question too, but the tool's result comes after it."""

    def get(self, prompt, default=None):
        mentioned = [(prompt.rfind(key), reply) for key, reply in self.items() if key in prompt]
        return max(mentioned)[1] if mentioned else default
