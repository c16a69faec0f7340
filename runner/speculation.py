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

from collections import OrderedDict
from collections.abc import Sequence as Seq
import numpy as np

from .batch import BatchEntry
from .config import RunnerConfig
from .errors import RequestFault, request_fault
from .planning import Chunk, StepPlan
from .sampling import Sampled, SequenceSampler, sample_rows
from .sequence import Sequence

SHARED_NGRAMS = 1 << 18  # n-grams the shared pool remembers (about 40 MB of Python objects at most)
PRIOR_ACCEPTANCE = 0.6  # a new sequence's chance that a draft token is kept, until it has drafted
ACCEPTANCE_MEMORY = 0.7  # weight of the past in a sequence's acceptance estimate, per verification
# Most sequences decoding in a step for drafts to go in. llama.cpp splits a step whose sequences
# hold unequal numbers of tokens into several micro-batches: 16 chats with drafts (98% kept) ran
# at 0.66x of no drafts, Gemma 3 270M, 2 cores; 4 edit sessions gained 1.13x.
MAX_DRAFTING_SEQUENCES = 4


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
    """What a decode costs against the tokens in its batch, fitted as steps run: seconds =
    fixed + per_token * tokens (least squares with a fading memory, so the fit follows the load)."""

    MEMORY = 0.98

    def __init__(self) -> None:
        self._n = self._x = self._y = self._xx = self._xy = 0.0

    def note(self, num_tokens: int, seconds: float) -> None:
        m = self.MEMORY
        self._n = self._n * m + 1
        self._x = self._x * m + num_tokens
        self._y = self._y * m + seconds
        self._xx = self._xx * m + num_tokens * num_tokens
        self._xy = self._xy * m + num_tokens * seconds

    def per_token(self) -> float | None:
        """Seconds one more token adds to a step; None until steps of different sizes were seen."""
        spread = self._n * self._xx - self._x * self._x
        if self._n < 2 or spread <= 1e-9 * max(1.0, self._xx * self._n):
            return None
        slope = (self._n * self._xy - self._x * self._y) / spread
        return max(slope, 0.0)

    def seconds(self, num_tokens: int) -> float | None:
        """The fitted cost of a step of num_tokens (None before any step)."""
        if self._n == 0:
            return None
        slope = self.per_token()
        mean_x, mean_y = self._x / self._n, self._y / self._n
        if slope is None:
            return mean_y
        return max(mean_y + slope * (num_tokens - mean_x), 1e-6)


class _Drafting:
    """One sequence's speculation state: its text's index and how often its drafts are kept."""

    def __init__(self, seq: Sequence, ngram: int) -> None:
        self.text = SessionText(seq.prompt_tokens + seq.output_tokens, ngram)
        self.acceptance = PRIOR_ACCEPTANCE
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

    def note_partial(self, num_kept: int) -> None:
        """Tokens of an unsent draft came true, and the rest is still open."""
        for _ in range(num_kept):
            self.acceptance = ACCEPTANCE_MEMORY * self.acceptance + (1 - ACCEPTANCE_MEMORY)

    def note_verified(self, num_drafted: int, num_kept: int) -> None:
        """A verification kept num_kept of num_drafted tokens: the kept ones were each a token
        kept, the first rejected one a token lost."""
        trials = min(num_drafted, num_kept + 1)
        rate = num_kept / trials
        self.acceptance = ACCEPTANCE_MEMORY * self.acceptance + (1 - ACCEPTANCE_MEMORY) * rate


class Speculator:
    """Adds drafts to a step's plan, verifies them after the decode, and learns from both."""

    def __init__(self, config: RunnerConfig, window: int) -> None:
        self.ngram = config.spec_ngram_size
        self.draft_max = config.spec_draft_max
        self.draft_min = config.spec_draft_min
        self.window = window
        self.cost = StepCost()
        self.shared = SharedNgrams(self.ngram) if config.spec_type == "ngram-mod" else None
        self._drafting: dict[Sequence, _Drafting] = {}  # of the sequences decoding lately

    # --- before the decode ------------------------------------------------------------------

    def with_drafts(self, plan: StepPlan, max_batch_tokens: int, free_cells: int | None) -> StepPlan:
        """The plan with drafts appended to decoding sequences' tokens where they pay."""
        decoding = [chunk for chunk in plan.chunks if not chunk.is_prefill and chunk.entry.wants_output]
        self._forget_others({chunk.seq for chunk in decoding})
        room = max_batch_tokens - plan.num_tokens
        if free_cells is not None:
            room = min(room, free_cells - plan.num_tokens)
        if not decoding or room <= 0 or len(decoding) > MAX_DRAFTING_SEQUENCES:
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
            if chunk.seq.slot in candidates and lengths[chunk.seq.slot] < self.draft_min:
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
        draft = state.text.draft(most)
        if not draft and self.shared is not None:
            draft = self.shared.draft(state.text.tokens, most)
        return draft

    def _worthwhile_lengths(self, plan: StepPlan, candidates: dict[int, list[int]], room: int) -> dict[int, int]:
        """How many of each candidate's draft tokens to verify. The i-th token of a draft is
        kept with chance acceptance**i; it goes in while that chance, times the step's cost per
        token it yields, is more than what one token adds to the step (before any cost is known:
        every token the room allows)."""
        per_token = self.cost.per_token()
        offers = []  # (chance the token is kept, slot)
        for chunk in plan.chunks:
            draft = candidates.get(chunk.seq.slot)
            if draft:
                acceptance = self._drafting[chunk.seq].acceptance
                offers += [(acceptance ** (index + 1), chunk.seq.slot) for index in range(len(draft))]
        offers.sort(key=lambda offer: -offer[0])
        lengths = dict.fromkeys(candidates, 0)
        expected = float(plan.num_decode_tokens)  # tokens the step yields without drafts
        num_tokens = plan.num_tokens
        for chance, slot in offers[:room]:
            if per_token is not None:
                step = self.cost.seconds(num_tokens)
                if chance * step <= per_token * expected:  # (expected + chance) / (step + per_token) would fall
                    break
            lengths[slot] += 1
            expected += chance
            num_tokens += 1
        return lengths

    # --- after the decode ---------------------------------------------------------------------

    def note_step(self, num_tokens: int, seconds: float) -> None:
        self.cost.note(num_tokens, seconds)

    def note_verified(self, seq: Sequence, num_drafted: int, num_kept: int) -> None:
        state = self._drafting.get(seq)
        if state is not None:
            state.note_verified(num_drafted, num_kept)


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
    entry has one row: the logits are those rows already)."""
    if not any(chunk.entry.num_drafted for chunk in plan.chunks):
        return None
    rows, row = [], 0
    for chunk in plan.chunks:
        if chunk.entry.wants_output:
            rows.append(row)
            row += chunk.entry.num_outputs
    return rows
