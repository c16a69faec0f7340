"""Step planning: which tokens of which running sequences go into the next llama_decode.

Pure Python over Sequence objects, like the scheduler that owns the planner: it reads the
running sequences and never changes them. The scheduler decides who holds a slot; the planner
decides, from those, what one step computes (decoding tokens, then prompt chunks cut by the
backend's chunk rules, up to the step's token budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..llama.batch import BatchEntry, ChunkRules
from .sequence import Sequence, SequenceStatus, scores_prompt


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sequence's part of a step: the batch entry, and whether it is prompt tokens
    (rather than the sequence's newest generated token)."""

    seq: Sequence
    entry: BatchEntry
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return len(self.entry.tokens)


@dataclass(frozen=True)
class StepPlan:
    """One llama_decode call: chunks ordered by slot, at most one per slot.

    Ordering by slot matters: with one KV stream per slot, llama.cpp groups sequences into a
    micro-batch only while their ids are consecutive in batch order."""

    chunks: list[Chunk]

    @property
    def entries(self) -> list[BatchEntry]:
        return [chunk.entry for chunk in self.chunks]

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_decode_tokens(self) -> int:
        """Decoding sequences' newest tokens (a draft's tokens not counted)."""
        return len(self.decoding_chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks if chunk.is_prefill)

    @property
    def decoding_chunks(self) -> list[Chunk]:
        """The chunks of sequences decoding (their newest token, and any draft)."""
        return [chunk for chunk in self.chunks if not chunk.is_prefill]

    @property
    def output_seqs(self) -> list[Sequence]:
        """Sequences that get a logits row, in row order."""
        return [chunk.seq for chunk in self.chunks if chunk.entry.wants_output]

    def __bool__(self) -> bool:
        return bool(self.chunks)

    @property
    def adapter(self) -> int:
        """The adapter set the step runs through (every chunk's: a step runs one)."""
        return self.chunks[0].seq.adapter if self.chunks else 0

    def with_halved_prefill(self) -> StepPlan | None:
        """The same step with every prompt chunk halved, for a retry when the KV had no room (an
        input computed whole, or a media chunk, is left for a later step instead: cut, it would
        pool to another vector, or be another image); None when no chunk can shrink any more."""
        if all(chunk.num_tokens <= 1 or not chunk.is_prefill for chunk in self.chunks):
            return None
        chunks = []
        for chunk in self.chunks:
            if chunk.is_prefill and (chunk.seq.embedding is not None and chunk.seq.embedding.whole
                                     or chunk.seq.media.at(chunk.entry.start_pos) is not None):
                continue
            if chunk.is_prefill and chunk.num_tokens > 1:
                entry = chunk.entry
                half = BatchEntry(entry.slot, entry.tokens[: len(entry.tokens) // 2], entry.start_pos, False,
                                  scores_prompt=entry.scores_prompt, embeds=entry.embeds)
                chunk = Chunk(chunk.seq, half, True)
            chunks.append(chunk)
        return StepPlan(chunks) if chunks else None


class StepPlanner:
    """Plans each step from the running sequences. Stateful only when prefill is isolated: it
    remembers whether the last step prefilled, so that prompt chunks and decoding alternate."""

    def __init__(self, num_slots: int, max_batch_tokens: int, step_tokens: int | None = None,
                 chunk_rules: ChunkRules = ChunkRules(), isolate_prefill: bool = False) -> None:
        assert max_batch_tokens >= num_slots, "every slot must be able to decode each step"
        self.num_slots = num_slots
        self.max_batch_tokens = max_batch_tokens
        # The step's token budget: every decoding token, then prompt chunks up to it, so that a
        # long prompt is prefilled over several steps while the others keep decoding.
        self.step_tokens = min(step_tokens or max_batch_tokens, max_batch_tokens)
        self.chunk_rules = chunk_rules
        # llama.cpp cuts a batch into micro-batches of equal tokens per sequence, so a prompt
        # chunk beside decoding sequences has its first token computed as a lone row, which
        # other kernels do with other rounding. Isolated, a step holds one prompt chunk or the
        # decoding tokens, never both (they alternate, so neither starves).
        self.isolate_prefill = isolate_prefill
        self._last_step_prefilled = False
        self._last_adapter = 0  # the adapter set of the last step that had a choice of several

    def plan(self, running: list[Sequence], free_cells: int | None = None) -> StepPlan:
        """One token for every decoding sequence, then prompt chunks by priority, then age, up
        to the step's token budget (isolated: one or the other). Prompt chunks always get room
        for one chunk the backend's rules allow, so that prefill progresses beside any number
        of decoding slots; in a shared KV pool (free_cells given), only as much as is free. A
        step runs one adapter set (llama.cpp applies adapters to a whole context): with several
        among the running sequences, the steps take them in turn."""
        sets = sorted({seq.adapter for seq in running})
        if len(sets) <= 1:
            return self._plan_of(running, free_cells)
        turn = [index for index in sets if index > self._last_adapter] + [index for index in sets
                                                                         if index <= self._last_adapter]
        for index in turn:  # the next set with something to run now
            plan = self._plan_of([seq for seq in running if seq.adapter == index], free_cells)
            if plan:
                self._last_adapter = index
                return plan
        return StepPlan([])

    def _plan_of(self, running: list[Sequence], free_cells: int | None) -> StepPlan:
        prefilling = _prefilling_in_order(running)
        decoding = [seq for seq in running if seq.status is SequenceStatus.DECODING]
        if prefilling and not self.isolate_prefill:
            # A prompt is prefilled without lower-priority work beside it (their streams and
            # prompts): on a CPU each token in a step costs, and a waiting person's first token
            # comes before batch work's next.
            top = prefilling[0].priority
            decoding = [seq for seq in decoding if seq.priority >= top]
            prefilling = [seq for seq in prefilling if seq.priority >= top]
        if prefilling:
            # A step's prompt chunks are all embedding ones or none: llama.cpp computes a row
            # of logits for every token of a decode that outputs embeddings.
            embeds = prefilling[0].embedding is not None
            prefilling = [seq for seq in prefilling if (seq.embedding is not None) == embeds]
        if self.isolate_prefill:
            self._last_step_prefilled = bool(prefilling) and not (decoding and self._last_step_prefilled)
            if self._last_step_prefilled:
                prefilling, decoding = prefilling[:1], []
            else:
                prefilling = []
        # A medium not encoded yet is encoded beside the steps while a stream is being watched
        # (it would stop for the encoding), in the step that needs it otherwise (faster).
        streaming = any(seq.streams for seq in decoding)
        chunks: dict[int, Chunk] = {}
        for seq in decoding:
            chunks[seq.slot] = Chunk(seq, BatchEntry(seq.slot, [seq.last_token], seq.n_past, True), False)
        budget = self.step_tokens - len(chunks)
        room = self.max_batch_tokens - len(chunks)
        if free_cells is not None:
            room = min(room, free_cells - len(chunks))
        for seq in prefilling:
            if room <= 0:
                break
            first = len(chunks) == len(decoding)  # the step's first prompt chunk
            cells = None if free_cells is None else free_cells - len(chunks)
            length = self._prompt_length(seq, room, budget, first, cells, streaming)
            if length == 0:
                continue
            start = seq.num_prefilled
            tokens = seq.prompt_tokens[start:start + length]
            is_last = start + length == len(seq.prompt_tokens)
            embeds = seq.embedding is not None
            chunks[seq.slot] = Chunk(seq, BatchEntry(seq.slot, tokens, seq.n_past, is_last and not embeds,
                                                     scores_prompt=scores_prompt(seq), embeds=embeds), True)
            budget -= length
            room -= length
        return StepPlan([chunks[slot] for slot in sorted(chunks)])

    def _prompt_length(self, seq: Sequence, room: int, budget: int, first: bool, cells: int | None,
                       streaming: bool) -> int:
        """How much of seq's prompt goes into this step (0: none now), with `room` left in the
        decode, `budget` in the step, `cells` free in a shared pool (None: windows)."""
        start = seq.num_prefilled
        media = seq.media.at(start)
        if seq.embedding is not None and seq.embedding.whole:
            # Whole or not at all: it waits for a decode with room (the step budget, there for
            # streams, is the whole decode for a model that does not generate).
            return seq.num_prompt_remaining if seq.num_prompt_remaining <= room else 0
        if media is not None:
            # A media chunk goes whole, in a chunk of its own (its embeddings are a decode of
            # their own), when the decode has room for it and its embeddings are at hand.
            fits = media.media.num_tokens <= room or (first and self._fits_alone(media.media, cells))
            return media.media.num_tokens if fits and media.media.ready(encode_beside=streaming) else 0
        # Text up to the next media chunk, cut by the rules as a prompt's rest would be; the
        # first prompt chunk of a step goes whatever the budget, so prompts progress.
        floor = self._least_progress(seq) if first else 0
        return self._chunk_length(start, seq.media.text_before(start), min(room, max(budget, floor)))

    def _fits_alone(self, media, cells: int | None) -> bool:
        """A medium larger than one llama_decode (audio: 750 tokens a 30 s window) goes as the
        step's only prompt chunk, where the backend decodes it in pieces: only where the model
        reads it causally (Gemma 3's images attend both ways, whole in one decode) and the cells
        are free."""
        return (media.num_tokens > self.max_batch_tokens and media.decodable_within(self.max_batch_tokens)
                and (cells is None or media.num_tokens <= cells))

    def _chunk_length(self, start: int, remaining: int, budget: int) -> int:
        """How much of a prompt's rest goes into this step, by the backend's chunk rules. When
        the batch is too small to ever hold two chunks the rules allow, whatever fits goes, so
        that every prompt makes progress."""
        rules = self.chunk_rules
        if self.max_batch_tokens < 2 * (rules.min_tokens + rules.alignment) + self.num_slots:
            return min(remaining, budget)
        return rules.chunk_length(start, remaining, budget)

    def _least_progress(self, seq: Sequence) -> int:
        """Room enough for one chunk of seq's prompt that the rules allow: the smallest chunk,
        or its whole rest when no cut would leave a rest the rules allow (a media chunk: whole)."""
        rules = self.chunk_rules
        media = seq.media.at(seq.num_prefilled)
        if media is not None:
            return media.media.num_tokens
        remaining = seq.media.text_before(seq.num_prefilled)
        return remaining if remaining <= 2 * rules.min_tokens + rules.alignment else rules.min_tokens + rules.alignment - 1


def _prefilling_in_order(running: list[Sequence]) -> list[Sequence]:
    """The sequences still prefilling their prompts, highest priority first, then oldest."""
    prefilling = [seq for seq in running if seq.status is SequenceStatus.PREFILLING]
    return sorted(prefilling, key=lambda seq: (-seq.priority, seq.admitted_at))
