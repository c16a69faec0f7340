"""Logits rows -> tokens for many sequences at once, with numpy.

One decode step yields a (num_outputs, vocab) logits matrix. Greedy rows take an argmax over
the whole matrix in one call. Sampled rows share the costly part, finding the top-k
candidates of a 262k-entry row, as a few vectorized calls over all rows (multiseq.sampling.topk).

The rest (top-p, min-p, temperature, the draw) works on k candidates per row. The filters run
in llama.cpp's order, so a request samples from the same distribution it would in llama-server:
logit bias, penalties, top-k, top-p, min-p, temperature, draw.

Constrained rows (multiseq.sampling.grammar) get their bitmasks in one parallel call per step; their
candidates are checked against the mask and replaced, only where needed, by the exact
candidates of the masked row (multiseq.sampling.constrained). Log probabilities are taken from the rows
as the model produced them, before anything here changes them (multiseq.sampling.logprobs).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..llama.batch import ChainSpec
from ..llama.media import is_placeholder
from ..config import SamplingParams
from .budget import ReasoningBudget
from .constrained import candidates_allowed, masked_argmax, masked_top_k, pad_candidates
from .grammar import TokenConstraint, allowed_bits, fill_bitmasks
from .logprobs import TokenLogprob, token_logprob
from .topk import top_k_sorted

_UNUSED_BITS = 11  # a double holds 53 random bits
_UNIT = 2.0 ** -53


@dataclass(frozen=True, slots=True)
class Sampled:
    """What sampling chose for one row: the token, and its log probability when asked for.
    Plain data: sampling changes no sequence's state; the engine's update() applies it."""

    token: int
    logprob: TokenLogprob | None = None


def uniform_draw(seed: int, index: int) -> float:
    """The uniform number in [0, 1) behind the draw of a sequence's token number `index`: a
    function of the seed and the index alone (a keyed hash), so a draw depends on nothing that
    happened before it. Sampling then has no state to change, and a sequence computed again
    from its tokens (after a preemption, say) draws exactly what it would have drawn."""
    digest = hashlib.blake2b(index.to_bytes(8, "little"), key=seed.to_bytes(8, "little"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> _UNUSED_BITS) * _UNIT


class SequenceSampler:
    """The sampling state of one sequence: parameters, its seed, the recent tokens the
    penalties look at, and its constraint. Its draws depend on nothing but its seed, the
    number of tokens it accepted and its own logits, so a seeded request is reproducible
    whatever else is in the batch."""

    def __init__(self, params: SamplingParams, seed: int, prompt_tokens: Sequence[int],
                 banned_tokens: Sequence[int] = (), constraint: TokenConstraint | None = None,
                 token_bytes: Callable[[int], bytes] | None = None,
                 banned_until_min_tokens: Sequence[int] = (), budget: ReasoningBudget | None = None) -> None:
        self.params = params
        self.seed = seed % 2**64
        self.num_accepted = 0  # tokens accepted so far: the index of the next draw
        # Tokens never to sample, e.g. end-of-generation tokens under ignore_eos (as llama.cpp
        # does it: a -inf bias, so the model keeps writing instead of emitting EOS).
        self.banned = np.asarray(banned_tokens, dtype=np.int64) if len(banned_tokens) else None
        # Banned only until params.min_tokens tokens are out (end-of-generation tokens, so the
        # output cannot end sooner).
        self.banned_early = (np.asarray(banned_until_min_tokens, dtype=np.int64)
                             if len(banned_until_min_tokens) and params.min_tokens else None)
        self.bias_ids = self.bias_values = None
        if params.logit_bias:
            self.bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
            self.bias_values = np.fromiter(params.logit_bias.values(), dtype=np.float32)
        self.recent: deque[int] | None = None
        if params.uses_penalties:
            # A medium's placeholders (negative ids) are no tokens to penalize.
            self.recent = deque((token for token in prompt_tokens[-params.repeat_last_n:] if not is_placeholder(token)),
                                maxlen=params.repeat_last_n)
        self.constraint = constraint
        self.token_bytes = token_bytes or (lambda token: b"")
        self.budget = budget  # the reasoning block's tokens counted, and its close forced at the budget

    @property
    def chain_spec(self) -> ChainSpec | None:
        """The llama.cpp sampler chain that samples this sequence's rows as this sampler would
        (the same distribution, another generator); None when the host is needed: a
        constraint, penalties, tokens banned until min_tokens, log probabilities, or a token
        forced by the reasoning budget."""
        if self.budget is not None and self.budget.forced_token() is not None:
            return None
        return self._chain_spec

    @cached_property
    def _chain_spec(self) -> ChainSpec | None:
        """chain_spec but for the budget: what it depends on is set when the sampler is made,
        so it is built once."""
        if (self.constraint is not None or self.recent is not None or self.banned_early is not None
                or self.params.logprobs):
            return None
        bias = self._chain_bias()
        if self.params.is_greedy:
            return ChainSpec(logit_bias=bias)
        seed = (self.seed ^ (self.seed >> 32)) & 0xFFFFFFFF  # all 64 bits count in the chain's 32
        return ChainSpec(logit_bias=bias, temperature=self.params.temperature, top_k=self.params.top_k,
                         top_p=self.params.top_p, min_p=self.params.min_p, seed=seed)

    def _chain_bias(self) -> tuple[tuple[int, float], ...]:
        """The logit bias and the bans as one (token, bias) list, as adjust() applies them."""
        bias: dict[int, float] = {}
        if self.bias_ids is not None:
            bias.update(zip(self.bias_ids.tolist(), self.bias_values.tolist()))
        if self.banned is not None:
            bias.update(dict.fromkeys(self.banned.tolist(), -np.inf))
        return tuple(sorted(bias.items()))

    def next_uniform(self) -> float:
        """The uniform number of the next draw (the same until a token is accepted)."""
        return uniform_draw(self.seed, self.num_accepted)

    def accept(self, token: int) -> None:
        self.num_accepted += 1
        if self.budget is not None:
            self.budget.accept(token)
        if self.recent is not None:
            self.recent.append(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    @contextmanager
    def advanced(self, tokens: Sequence[int]) -> Iterator[SequenceSampler]:
        """This sampler as it will be once `tokens` are accepted (a draft's later rows are
        sampled so), and as it was again afterwards, whatever happens inside."""
        recent = None if self.recent is None else self.recent.copy()
        budget = None if self.budget is None else self.budget.saved()
        num_consumed = 0
        try:
            self.num_accepted += len(tokens)
            if self.budget is not None:
                for token in tokens:
                    self.budget.accept(token)
            if self.recent is not None:
                self.recent.extend(tokens)
            if self.constraint is not None:
                for token in tokens:
                    self.constraint.accept(token)
                    num_consumed += 1
            yield self
        finally:
            self.num_accepted -= len(tokens)
            self.recent = recent
            if budget is not None:
                self.budget.restore(budget)
            if num_consumed:
                self.constraint.rollback(num_consumed)

    @property
    def is_constraint_complete(self) -> bool:
        """The constrained output is a whole document: nothing may follow but the end."""
        return self.constraint is not None and self.constraint.is_complete

    @property
    def approximated(self) -> tuple[str, ...]:
        """What the constraint leaves out of the request's JSON schema (empty when exact)."""
        return () if self.constraint is None else self.constraint.approximated

    def output_error(self, text: str) -> str | None:
        """Why an output that ended does not satisfy the request's JSON schema (None when it
        does, or when there is no schema to check)."""
        return None if self.constraint is None else self.constraint.output_error(text)

    @cached_property
    def _fixed_adjusted_ids(self) -> np.ndarray | None:
        parts = [ids for ids in (self.bias_ids, self.banned, self.banned_early) if ids is not None]
        return np.concatenate(parts) if parts else None

    def adjusted_ids(self) -> np.ndarray | slice | None:
        """The ids adjust() may change in a row (None: it changes none; a slice: all of them),
        so that a step whose sampling failed can put them back before the rows are sampled
        again one by one."""
        if self.budget is not None and self.budget.forced_token() is not None:
            return slice(None)
        if not self.recent:
            return self._fixed_adjusted_ids
        recent = np.fromiter(self.recent, dtype=np.int64, count=len(self.recent))
        return recent if self._fixed_adjusted_ids is None else np.concatenate([self._fixed_adjusted_ids, recent])

    def adjust(self, row: np.ndarray) -> None:
        """The chain's steps before top-k, in llama.cpp's order: logit bias, penalties, bans."""
        if self.bias_ids is not None:
            row[self.bias_ids] += self.bias_values
        if self.recent:
            apply_penalties(row, self.recent, self.params)
        if self.banned is not None:
            row[self.banned] = -np.inf
        if self.banned_early is not None and self.num_accepted < self.params.min_tokens:
            row[self.banned_early] = -np.inf
        forced = None if self.budget is None else self.budget.forced_token()
        if forced is not None:  # the reasoning budget is spent: this token and no other
            row[:forced] = -np.inf
            row[forced] = 0.0
            row[forced + 1:] = -np.inf


def sample_rows(logits: np.ndarray, samplers: Sequence[SequenceSampler]) -> list[Sampled]:
    """One token for each row of `logits` (rows in the order of `samplers`), with its log
    probability where the sampler asks for it. No sampler changes.

    Rows with a bias, penalties or banned tokens are modified in place (the matrix is scratch
    space owned by the caller until the next decode), and put back as they were when sampling
    raises, so that the rows can be sampled again. Rows of constrained samplers draw only
    allowed tokens, exactly as if the forbidden ones had been masked out first."""
    assert logits.shape[0] == len(samplers), "one sampler per logits row"
    adjusted = [(row, ids, logits[row, ids]) for row, sampler in enumerate(samplers)
                if (ids := sampler.adjusted_ids()) is not None]  # fancy indexing: copies
    try:
        return _sample_adjusted_rows(logits, samplers)
    except Exception:
        for row, ids, values in reversed(adjusted):
            logits[row, ids] = values
        raise


def _sample_adjusted_rows(logits: np.ndarray, samplers: Sequence[SequenceSampler]) -> list[Sampled]:
    raw_rows = {row: logits[row].copy() for row, sampler in enumerate(samplers) if sampler.params.logprobs}
    for row, sampler in enumerate(samplers):
        sampler.adjust(logits[row])
    bitmasks = _constraint_bitmasks(samplers)
    tokens = _greedy_tokens(logits, samplers, bitmasks)
    for top_k, rows in _sampled_rows_by_top_k(samplers, logits.shape[1]).items():
        matrix = logits if len(rows) == logits.shape[0] else logits[rows]
        ids, values = top_k_sorted(matrix, top_k)
        for index, row in enumerate(rows):
            if row in bitmasks and not candidates_allowed(bitmasks[row], ids[index]):
                ids[index], values[index] = pad_candidates(*masked_top_k(logits[row], bitmasks[row], top_k), top_k)
        picks = draw_from_sorted(values, [samplers[row] for row in rows])
        for row, token in zip(rows, ids[np.arange(len(rows)), picks].tolist()):
            tokens[row] = token
    logprobs = {row: token_logprob(raw_row, tokens[row], samplers[row].params.top_logprobs, samplers[row].token_bytes)
                for row, raw_row in raw_rows.items()}
    return [Sampled(token, logprobs.get(row)) for row, token in enumerate(tokens)]


def _constraint_bitmasks(samplers: Sequence[SequenceSampler]) -> dict[int, np.ndarray]:
    """The bitmask of every constrained row, by row, computed in one parallel call."""
    rows = [row for row, sampler in enumerate(samplers) if sampler.constraint is not None]
    if not rows:
        return {}
    bitmasks = fill_bitmasks([samplers[row].constraint for row in rows])
    return dict(zip(rows, bitmasks))


def _greedy_tokens(logits: np.ndarray, samplers: Sequence[SequenceSampler],
                   bitmasks: dict[int, np.ndarray]) -> list[int]:
    """Tokens of the greedy rows (0 for the others): the argmax, or the argmax over the
    allowed tokens when a constrained row's argmax is forbidden."""
    if all(sampler.params.is_greedy for sampler in samplers):
        tokens = logits.argmax(axis=1).tolist()
    else:
        tokens = [int(logits[row].argmax()) if sampler.params.is_greedy else 0
                  for row, sampler in enumerate(samplers)]
    for row, bitmask in bitmasks.items():
        if samplers[row].params.is_greedy and not allowed_bits(bitmask, np.array([tokens[row]]))[0]:
            tokens[row] = masked_argmax(logits[row], bitmask)
    return tokens


def _sampled_rows_by_top_k(samplers: Sequence[SequenceSampler], vocab_size: int) -> dict[int, list[int]]:
    """Sampled rows grouped by k. top_k=0 (disabled) means the whole vocabulary: exact, but a
    full sort of a 262k row costs milliseconds, so such requests sample slower."""
    groups: dict[int, list[int]] = {}
    for row, sampler in enumerate(samplers):
        if not sampler.params.is_greedy:
            top_k = sampler.params.top_k
            groups.setdefault(top_k if 0 < top_k < vocab_size else vocab_size, []).append(row)
    return groups


def apply_penalties(row: np.ndarray, recent: deque[int], params: SamplingParams) -> None:
    """llama.cpp's penalties sampler over the recent tokens: each seen token's logit is divided
    by the repeat penalty when positive and multiplied by it otherwise, then lowered by
    count * frequency_penalty + presence_penalty (count: its occurrences in the window)."""
    seen, counts = np.unique(np.fromiter(recent, dtype=np.int64, count=len(recent)), return_counts=True)
    values = row[seen]
    penalty = params.repeat_penalty
    values = np.where(values > 0, values / penalty, values * penalty)
    row[seen] = values - (counts * params.frequency_penalty + params.presence_penalty)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def draw_from_sorted(values: np.ndarray, samplers: Sequence[SequenceSampler]) -> np.ndarray:
    """Apply top-p, min-p and temperature to candidates sorted largest first, then draw one
    index per row with each row's own uniform number."""
    logits = values.astype(np.float64)
    top_p = np.array([s.params.top_p for s in samplers])[:, None]
    min_p = np.array([s.params.min_p for s in samplers])[:, None]
    temperature = np.array([s.params.temperature for s in samplers])[:, None]
    # top-p keeps the smallest prefix whose probability reaches top_p (at least one token).
    cumulative = np.cumsum(_softmax(logits), axis=1)
    keep = np.ones_like(logits, dtype=bool)
    keep[:, 1:] = cumulative[:, :-1] < top_p
    # min-p keeps tokens whose probability is at least min_p times the largest one.
    with np.errstate(divide="ignore"):
        keep &= logits >= logits[:, :1] + np.log(min_p)
    tempered = np.where(keep, logits / temperature, -np.inf)
    cumulative = np.cumsum(_softmax(tempered), axis=1)
    uniform = np.array([s.next_uniform() for s in samplers])[:, None] * cumulative[:, -1:]
    picks = (cumulative <= uniform).sum(axis=1)
    # Rounding can put the draw past the last kept candidate: take the last kept one then.
    last_kept = keep.sum(axis=1) - 1
    return np.minimum(picks, last_kept)
