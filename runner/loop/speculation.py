"""Speculative decoding without a draft model: drafts from the text a session already holds,
verified inside the shared step.

Coding agents copy: a file written back with one change, a patch whose context lines repeat
the file, a path from the prompt. Those tokens are in the session's prompt or output already.
A draft is the continuation of the latest earlier place where the session's last `ngram`
tokens occurred (its own prompt and output: "ngram-simple"), or, with "ngram-mod", failing
that, the continuation that n-gram had last in any session of this runner (a bounded pool
shared by the sessions: agents on one model repeat the same tools and files).

Verification is part of the step. A decoding sequence's entry in the llama_batch becomes its
newest token followed by the draft, each with a logits row, beside the other sequences' tokens
and prompt chunks. Its rows are sampled in order, each exactly as a plain step would sample it
(the same filters, the same uniform draw for that token's index, a constraint advanced by the
tokens before it); the draft is kept while the sampled token equals the drafted one, and the
first token that differs is the step's last. So a greedy or seeded request gives the same
tokens with speculation as without, given the same logits: for a draft that is one token with
certainty, this is the standard rejection rule (accept with probability p(d), else draw from p
without d). The rejected draft positions leave the slot's KV before the next step.

Whether drafting pays is decided per step from what steps cost here (`StepCost`: decode
seconds against the tokens in the batch, fitted as they run) and each sequence's recent
acceptance: a draft token goes in while its chance of being kept, times the step's cost per
token it yields, is worth more than what the token adds to the step. On a CPU a token costs
nearly its share of the step, so drafts go where they are likely kept and nowhere when a full
batch already keeps the cores busy.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence as Seq
import numpy as np

from ..llama.batch import BatchEntry, micro_batches
from ..llama.media import is_placeholder
from ..config import RunnerConfig
from ..errors import RequestFault, request_fault
from .planning import Chunk, StepPlan
from ..sampling.sampler import Sampled, SequenceSampler, sample_rows
from .sequence import Sequence

SHARED_NGRAMS = 1 << 18  # n-grams the shared pool remembers (about 40 MB of Python objects at most)
PRIOR_ACCEPTANCE = 0.6  # a new sequence's chance that a draft token is kept, until it has drafted
ACCEPTANCE_MEMORY = 0.7  # weight of the past in a sequence's acceptance estimate, per verification
OWN_TEXT, SHARED_POOL = "own text", "shared pool"  # where a draft came from


class SessionText:
    """A sequence's tokens (prompt, then output) and where each n-gram of them last occurred,
    kept up to date as tokens come: finding a draft is one dictionary lookup."""

    def __init__(self, tokens: Seq[int], ngram: int) -> None:
        self.ngram = ngram
        self.tokens: list[int] = []
        self._next_after: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest place
        self.extend(tokens)

    def extend(self, tokens: Seq[int]) -> None:
        n = self.ngram
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1  # the n-gram before this token now has a continuation
            if end >= n:
                self._next_after[tuple(self.tokens[end - n:end])] = end

    def draft(self, max_tokens: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the last n-gram."""
        if len(self.tokens) <= self.ngram:
            return []
        start = self._next_after.get(tuple(self.tokens[-self.ngram:]))
        return [] if start is None else self.tokens[start:start + max_tokens]


class SharedNgrams:
    """N-gram -> the token that followed it last, over every session of the runner, bounded (the
    oldest are forgotten first). A draft follows the chain as far as it goes."""

    def __init__(self, ngram: int, capacity: int = SHARED_NGRAMS) -> None:
        self.ngram = ngram
        self.capacity = capacity
        self._next: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def note(self, tokens: Seq[int]) -> None:
        """Learn the continuations inside `tokens` (consecutive tokens of one session)."""
        n = self.ngram
        for end in range(n, len(tokens)):
            key = tuple(tokens[end - n:end])
            self._next[key] = tokens[end]
            self._next.move_to_end(key)
        while len(self._next) > self.capacity:
            self._next.popitem(last=False)

    def draft(self, context: Seq[int], max_tokens: int) -> list[int]:
        window = list(context[-self.ngram:])
        if len(window) < self.ngram:
            return []
        drafted: list[int] = []
        while len(drafted) < max_tokens:
            token = self._next.get(tuple(window))
            if token is None:
                break
            drafted.append(token)
            window = window[1:] + [token]
        return drafted


class StepCost:
    """What a step costs by the tokens in it, learnt as steps run. A step's cost is not a
    straight line in its tokens: a lone token takes llama.cpp's matrix-vector path and several
    take its tiled matrix products, so the first draft token costs more than the next ones
    (SmolLM2, one slot, 2 cores: 8.4 ms for 1 token, 20.5 for 2, 42 for 8). So each size seen
    keeps a fading average of its seconds; between sizes seen the cost is read off a straight
    line, and beyond them it grows by the slope of a least-squares line over every step."""

    MEMORY = 0.98  # weight of the past in the line, per step
    SIZE_MEMORY = 0.7  # weight of the past in a size's average, per step of that size

    def __init__(self) -> None:
        self._n = self._x = self._y = self._xx = self._xy = 0.0
        self._by_size: dict[int, float] = {}
        self._sizes: list[int] = []  # the sizes seen, in order

    def note(self, num_tokens: int, seconds: float) -> None:
        m = self.MEMORY
        self._n = self._n * m + 1
        self._x = self._x * m + num_tokens
        self._y = self._y * m + seconds
        self._xx = self._xx * m + num_tokens * num_tokens
        self._xy = self._xy * m + num_tokens * seconds
        self._note_size(num_tokens, seconds)

    def note_parts(self, sizes: list[int], seconds: float) -> None:
        """A step of several micro-batches: its seconds shared among them as the current costs
        share them (so that a size only ever seen inside such steps is learnt too)."""
        if len(sizes) == 1:
            self.note(sizes[0], seconds)
            return
        parts = [self.seconds(size) for size in sizes]
        if None in parts:
            return
        scale = seconds / sum(parts)
        for size, part in zip(sizes, parts):
            self._note_size(size, part * scale)

    def _note_size(self, num_tokens: int, seconds: float) -> None:
        known = self._by_size.get(num_tokens)
        if known is None:
            bisect.insort(self._sizes, num_tokens)
            self._by_size[num_tokens] = seconds
        else:
            self._by_size[num_tokens] = self.SIZE_MEMORY * known + (1 - self.SIZE_MEMORY) * seconds

    def per_token(self) -> float | None:
        """Seconds one more token adds to a step, on the least-squares line; None until steps
        of different sizes were seen."""
        spread = self._n * self._xx - self._x * self._x
        if self._n < 2 or spread <= 1e-9 * max(1.0, self._xx * self._n):
            return None
        slope = (self._n * self._xy - self._x * self._y) / spread
        return max(slope, 0.0)

    def seconds(self, num_tokens: int) -> float | None:
        """The cost of a step of num_tokens (None until steps of two sizes were seen)."""
        known = self._by_size.get(num_tokens)
        if known is not None:
            return known
        slope = self.per_token()
        if slope is None:
            return None
        sizes, costs = self._sizes, self._by_size
        above = bisect.bisect(sizes, num_tokens)
        if above == 0:
            return max(costs[sizes[0]] - slope * (sizes[0] - num_tokens), 1e-6)
        if above == len(sizes):
            return costs[sizes[-1]] + slope * (num_tokens - sizes[-1])
        low, high = sizes[above - 1], sizes[above]
        share = (num_tokens - low) / (high - low)
        return costs[low] + share * (costs[high] - costs[low])


class _Drafting:
    """One sequence's speculation state: its text's index and how often its drafts are kept."""

    def __init__(self, seq: Sequence, ngram: int) -> None:
        self.text = SessionText(seq.prompt_tokens + seq.output_tokens, ngram)
        # How often draft tokens are kept, per source: the session's own text, or the pool the
        # sessions share (whose chains guess more often wrong: one estimate would let them pull
        # the session's own good drafts down).
        self.estimates = {OWN_TEXT: PRIOR_ACCEPTANCE, SHARED_POOL: PRIOR_ACCEPTANCE}
        self.source = OWN_TEXT  # of the latest draft found (sent or not)
        self.num_shared_noted = 0  # of its output tokens, how many the shared pool has learnt
        # A draft found but not worth verifying: the tokens that come next are checked against
        # it for free, so that a sequence whose drafts would be kept is found out.
        self.unsent: list[int] = []

    def catch_up(self, seq: Sequence) -> None:
        known = len(self.text.tokens) - len(seq.prompt_tokens)
        if known < len(seq.output_tokens):
            new = seq.output_tokens[known:]
            self._check_unsent(new)
            self.text.extend(new)

    def _check_unsent(self, new: Seq[int]) -> None:
        if not self.unsent:
            return
        kept = 0
        for token, drafted in zip(new, self.unsent):
            if token != drafted:
                break
            kept += 1
        if kept < len(self.unsent) and kept < len(new):  # a token differed: the outcome is known
            self.note_verified(len(self.unsent), kept)
            self.unsent = []
        elif kept == len(self.unsent):
            self.note_verified(kept, kept)
            self.unsent = []
        else:  # all the new tokens matched, and the draft goes on: wait for more
            self.unsent = self.unsent[kept:]
            self.note_partial(kept)

    @property
    def acceptance(self) -> float:
        """The chance that a token of the latest draft is kept, by its source's record."""
        return self.estimates[self.source]

    def note_partial(self, num_kept: int) -> None:
        """Tokens of an unsent draft came true, and the rest is still open."""
        for _ in range(num_kept):
            self._note_rate(1.0)

    def note_verified(self, num_drafted: int, num_kept: int) -> None:
        """A verification of the latest draft kept num_kept of num_drafted tokens: the kept
        ones were each a token kept, the first rejected one a token lost."""
        trials = min(num_drafted, num_kept + 1)
        self._note_rate(num_kept / trials)

    def _note_rate(self, rate: float) -> None:
        estimate = self.estimates[self.source]
        self.estimates[self.source] = ACCEPTANCE_MEMORY * estimate + (1 - ACCEPTANCE_MEMORY) * rate


class Speculator:
    """Adds drafts to a step's plan, verifies them after the decode, and learns from both."""

    def __init__(self, config: RunnerConfig, window: int, stream_per_slot: bool) -> None:
        self.ngram = config.spec_ngram_size
        self.draft_max = config.spec_draft_max
        self.draft_min = config.spec_draft_min
        self.window = window
        self.n_ubatch = config.n_batch  # the backend makes micro-batches as large as its batch
        self.stream_per_slot = stream_per_slot  # KV windows: unequal entries split a step
        self.cost = StepCost()
        self.shared = SharedNgrams(self.ngram) if config.spec_type == "ngram-mod" else None
        self._drafting: dict[Sequence, _Drafting] = {}  # of the sequences decoding lately

    # --- before the decode ------------------------------------------------------------------

    def with_drafts(self, plan: StepPlan, max_batch_tokens: int, free_cells: int | None) -> StepPlan:
        """The plan with drafts appended to decoding sequences' tokens where they pay."""
        decoding = plan.decoding_chunks
        self._forget_others({chunk.seq for chunk in decoding})
        room = max_batch_tokens - plan.num_tokens
        if free_cells is not None:
            room = min(room, free_cells - plan.num_tokens)
        if not decoding or room <= 0:
            return plan
        candidates = {}
        for chunk in decoding:
            draft = self._draft(chunk.seq)
            if len(draft) >= self.draft_min:
                candidates[chunk.seq.slot] = draft
        if not candidates:
            return plan
        lengths = self._worthwhile_lengths(plan, candidates, room)
        for chunk in decoding:
            if chunk.seq.slot in candidates and lengths.get(chunk.seq.slot, 0) < self.draft_min:
                self._drafting[chunk.seq].unsent = candidates[chunk.seq.slot]
        chunks = []
        for chunk in plan.chunks:
            length = lengths.get(chunk.seq.slot, 0)
            if length >= self.draft_min:
                entry = chunk.entry
                draft = candidates[chunk.seq.slot][:length]
                chunk = Chunk(chunk.seq, BatchEntry(entry.slot, [*entry.tokens, *draft], entry.start_pos, True,
                                                    len(draft)), False)
            chunks.append(chunk)
        return StepPlan(chunks)

    def _forget_others(self, running: set[Sequence]) -> None:
        for key in [key for key in self._drafting if key not in running]:
            del self._drafting[key]

    def _state(self, seq: Sequence) -> _Drafting:
        state = self._drafting.get(seq)
        if state is None:
            state = self._drafting[seq] = _Drafting(seq, self.ngram)
            if self.shared is not None:
                self.shared.note(seq.prompt_tokens)
        state.catch_up(seq)
        if self.shared is not None and state.num_shared_noted < len(seq.output_tokens):
            start = max(0, state.num_shared_noted - self.ngram)
            self.shared.note(seq.output_tokens[start:])
            state.num_shared_noted = len(seq.output_tokens)
        return state

    def _draft(self, seq: Sequence) -> list[int]:
        """What seq's text says comes next, as long as its window and max_tokens allow."""
        most = min(self.draft_max,
                   seq.max_tokens - len(seq.output_tokens) - 1,  # every kept token is an output token
                   self.window - seq.n_past - 1)  # every draft token takes a position in the window
        if most < self.draft_min:
            return []
        state = self._state(seq)
        draft, state.source = state.text.draft(most), OWN_TEXT
        if not draft and self.shared is not None:
            draft, state.source = self.shared.draft(state.text.tokens, most), SHARED_POOL
        # A medium's placeholder (a negative id) is not a token the model can write: a draft
        # ends before one.
        return draft[:next((index for index, token in enumerate(draft) if is_placeholder(token)), len(draft))]

    def _worthwhile_lengths(self, plan: StepPlan, candidates: dict[int, list[int]], room: int) -> dict[int, int]:
        """How many of each candidate's draft tokens to verify: the most likely tokens first, as
        many as give the step the most tokens per second of its cost (none when plain decoding
        gives more). The i-th token of a draft is kept with chance acceptance**i. Before any
        cost is known, every token the room allows (so that larger steps' cost is learnt)."""
        if self.stream_per_slot and len(plan.chunks) > 1:
            return self._uniform(plan, candidates, room)
        offers = self._offers(plan, candidates)[:room]
        count = len(offers)
        if self.cost.per_token() is not None:
            # The drafts join the decoding tokens' pass; a pass of prompt chunks costs the same.
            *prompt_passes, tokens = self._micro_batches(plan, {})
            prompt_seconds = sum(self.cost.seconds(size) for size in prompt_passes)
            expected = float(plan.num_decode_tokens)  # tokens the step yields without drafts
            count, best_rate = 0, expected / (prompt_seconds + self.cost.seconds(tokens))
            for index, (chance, _) in enumerate(offers):
                expected += chance
                rate = expected / (prompt_seconds + self.cost.seconds(tokens + index + 1))
                if rate > best_rate:
                    count, best_rate = index + 1, rate
        return _first_offers(candidates, offers, count)

    def _offers(self, plan: StepPlan, candidates: dict[int, list[int]]) -> list[tuple[float, int]]:
        """Every draft token as (the chance it is kept, its slot), most likely first."""
        offers = []
        for chunk in plan.chunks:
            draft = candidates.get(chunk.seq.slot)
            if draft:
                acceptance = self._drafting[chunk.seq].acceptance
                offers += [(acceptance ** (index + 1), chunk.seq.slot) for index in range(len(draft))]
        offers.sort(key=lambda offer: -offer[0])
        return offers

    def _uniform(self, plan: StepPlan, candidates: dict[int, list[int]], room: int) -> dict[int, int]:
        """With a KV stream per slot, llama.cpp cuts entries of unequal lengths into several
        micro-batches, each a pass over the weights; a draft there is one length for every
        decoding sequence, which keeps the step whole, or none. (Pricing the cut steps by their
        micro-batches' sizes lost: Gemma 3 270M, 4 edit sessions, 95-106 against 106-117 tok/s;
        a micro-batch's cost jumps between sizes, 16 tokens of a sequence 64.5 ms, 17 82 ms.)"""
        decoding = [chunk.seq for chunk in plan.decoding_chunks]
        if any(seq.slot not in candidates for seq in decoding):
            return {}
        most = min(min(len(candidates[seq.slot]) for seq in decoding), room // len(decoding))
        options = [dict.fromkeys((seq.slot for seq in decoding), length) for length in range(1, most + 1)]
        if self.cost.per_token() is None:  # before a cost is known: drafts are tried
            return options[-1] if options else {}
        acceptance = {seq.slot: self._drafting[seq].acceptance for seq in decoding}
        best, best_rate = {}, self._rate(plan, {}, acceptance)
        for lengths in options:
            rate = self._rate(plan, lengths, acceptance)
            if rate > best_rate:
                best, best_rate = lengths, rate
        return best

    def _rate(self, plan: StepPlan, lengths: dict[int, int], acceptance: dict[int, float]) -> float:
        """Tokens the step is expected to yield per second of its cost, with these drafts."""
        expected = plan.num_decode_tokens + sum(
            sum(acceptance[slot] ** (index + 1) for index in range(length)) for slot, length in lengths.items())
        return expected / sum(self.cost.seconds(size) for size in self._micro_batches(plan, lengths))

    def _micro_batches(self, plan: StepPlan, lengths: dict[int, int]) -> list[int]:
        """The sizes of the passes the step takes. With one KV stream the backend decodes
        prompt chunks and decoding tokens apart (LlamaBackend.decode), each in n_ubatch pieces."""
        entries = [(chunk.seq.slot, len(chunk.entry.tokens) + lengths.get(chunk.seq.slot, 0)) for chunk in plan.chunks]
        if self.stream_per_slot:
            return micro_batches(entries, self.n_ubatch, True)
        prompt = [entry for entry, chunk in zip(entries, plan.chunks) if chunk.entry.is_prompt_chunk]
        tokens = [entry for entry, chunk in zip(entries, plan.chunks) if not chunk.entry.is_prompt_chunk]
        return micro_batches(prompt, self.n_ubatch, False) + micro_batches(tokens, self.n_ubatch, False)

    # --- after the decode ---------------------------------------------------------------------

    def note_step(self, plan: StepPlan, seconds: float) -> None:
        """What a step cost (its decode and sampling), by the sizes of its micro-batches."""
        self.cost.note_parts(self._micro_batches(plan, {}), seconds)

    def note_verified(self, seq: Sequence, num_drafted: int, num_kept: int) -> None:
        state = self._drafting.get(seq)
        if state is not None:
            state.note_verified(num_drafted, num_kept)


def _first_offers(candidates: dict[int, list[int]], offers: list[tuple[float, int]], count: int) -> dict[int, int]:
    """The draft lengths that the first `count` offers make."""
    lengths = dict.fromkeys(candidates, 0)
    for _, slot in offers[:count]:
        lengths[slot] += 1
    return lengths


def verify_draft(rows: np.ndarray, sampler: SequenceSampler, first: Sampled, draft: Seq[int]) -> list[Sampled]:
    """The tokens after `first` that the draft's rows give, sampled one row at a time as plain
    steps would sample them: row i is sampled with the sampler advanced by the tokens before it,
    while the token before was the drafted one. rows[0] is first's row (already sampled)."""
    taken: list[Sampled] = []
    token = first.token
    for index, drafted in enumerate(draft):
        if token != drafted:
            break
        ahead = [first.token, *(sampled.token for sampled in taken)]
        with sampler.advanced(ahead):  # each draft row is sampled once: scratch space, as sample_rows allows
            [sampled] = sample_rows(rows[index + 1:index + 2], [sampler])
        taken.append(sampled)
        token = sampled.token
    return taken


def verify_all(logits: np.ndarray, plan: StepPlan, firsts: list[Sampled | RequestFault]
               ) -> list[list[Sampled] | RequestFault]:
    """For every output sequence of the plan (in row order), the tokens its draft adds after its
    first (none without a draft); a fault while verifying is that sequence's alone."""
    more: list[list[Sampled] | RequestFault] = []
    row = 0
    index = 0
    for chunk in plan.chunks:
        entry = chunk.entry
        if not entry.wants_output:
            row += entry.num_outputs  # a scored prompt chunk's rows
            continue
        first = firsts[index]
        if entry.num_drafted and isinstance(first, Sampled):
            draft = entry.tokens[-entry.num_drafted:]
            try:
                more.append(verify_draft(logits[row:row + entry.num_outputs], chunk.seq.sampler, first, draft))
            except Exception as error:  # noqa: BLE001 - one request's failure stays with that request
                more.append(request_fault("verifying its draft", error))
        else:
            more.append([])
        row += entry.num_outputs
        index += 1
    return more


def first_rows(plan: StepPlan) -> list[int] | None:
    """The row of each output sequence's next token in a decode's logits (None when every
    entry has one row: the logits are those rows already). A scored prompt chunk's rows come
    before its last, the one its next token is drawn from."""
    if not any(chunk.entry.num_drafted or chunk.entry.scores_prompt for chunk in plan.chunks):
        return None
    rows, row = [], 0
    for chunk in plan.chunks:
        entry = chunk.entry
        if entry.wants_output:
            rows.append(row + entry.num_outputs - 1 if entry.scores_prompt else row)
        row += entry.num_outputs
    return rows


def settle_drafts(plan: StepPlan, num_taken: dict[Sequence, int], backend, stats,
                  speculator: Speculator | None) -> int:
    """After a step's tokens were taken (`num_taken`: how many each sequence took), the draft
    positions whose tokens were not taken leave the slot's KV: its newest token and the draft
    tokens that came true stay (the last token taken is decoded next step). Returns how many
    draft tokens came true."""
    num_drafts_kept = 0
    for chunk in plan.chunks:
        num_drafted = chunk.entry.num_drafted
        if not num_drafted:
            continue
        seq = chunk.seq
        num_kept = max(num_taken.get(seq, 0) - 1, 0)
        seq.record_draft(num_drafted, num_kept)
        stats.note_draft(num_drafted, num_kept)
        num_drafts_kept += num_kept
        if speculator is not None:
            speculator.note_verified(seq, num_drafted, num_kept)
        if num_kept < num_drafted and not backend.rewind_slot(seq.slot, seq.n_past):
            seq.fail("its KV lost positions while a rejected draft was removed", overriding=True)
    return num_drafts_kept
