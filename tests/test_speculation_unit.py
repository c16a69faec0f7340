"""Speculative decoding on the fake backend: drafts from a session's own text (and from the pool
the sessions share) verified inside the step give exactly the tokens of plain decoding, greedy
and seeded, with stop strings, max_tokens, schemas, log probabilities, a shared KV pool and
preemption; and the rules that decide how long a draft is."""

from __future__ import annotations

import math

import pytest

from fakes import FakeBackend
from helpers import run_until_done
from multiseq import Engine, Priority, Request, RunnerConfig, SamplingParams
from multiseq.llama.batch import micro_batches
from multiseq.loop.speculation import OWN_TEXT, SHARED_POOL, SessionText, SharedNgrams, StepCost, _Drafting

# The fake's reply repeats text of its prompt, as an agent rewriting a file does.
FILE = "def area(width, height):\n    return width * height\n\n" * 3
REPLIES = {f"Rewrite:\n{FILE}": FILE.replace("area", "surface") + "done."}


class GpuLikeCost(StepCost):
    """Steps whose cost is mostly fixed (10 ms, 1 ms a token), as on a GPU: the fake's own
    timings are microseconds of host work and would make the rule depend on this machine."""

    def note(self, num_tokens: int, seconds: float) -> None:
        super().note(num_tokens, 0.010 + 0.001 * num_tokens)


def make_engine(spec_type: str = "ngram-simple", num_slots: int = 4, noisy: bool = False, pool: int | None = None,
                **config) -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(num_slots=num_slots, window=512 if pool is None else pool, n_batch=256, replies=REPLIES,
                          noisy=noisy, pool_size=pool, state_bytes_per_token=8)
    size = {"slot_ctx": 512} if pool is None else {"kv_pool": pool}
    engine = Engine(RunnerConfig(parallel=num_slots, n_batch=256, threads=1, seed=0, spec_type=spec_type,
                                 **size, **config), backend)
    if engine.speculator is not None:
        engine.speculator.cost = GpuLikeCost()
    return engine, backend


def run(requests: dict[str, SamplingParams], prompt: str = f"Rewrite:\n{FILE}", **engine_config):
    engine, backend = make_engine(**engine_config)
    for request_id, params in requests.items():
        engine.add(engine.new_sequence(Request(prompt=prompt, sampling=params), request_id))
    return run_until_done(engine), backend


GREEDY = SamplingParams(max_tokens=200, temperature=0)


def test_greedy_drafts_from_the_prompt_give_the_plain_text_in_fewer_steps():
    plain, plain_backend = run({"a": GREEDY}, spec_type="none")
    fast, backend = run({"a": GREEDY})
    assert fast["a"].text == plain["a"].text == REPLIES[f"Rewrite:\n{FILE}"]
    assert backend.num_drafted_fed > 0 and fast["a"].draft_tokens_accepted > 0
    assert fast["a"].draft_tokens == backend.num_drafted_fed
    assert len(backend.calls) < len(plain_backend.calls) * 0.6, "copied text takes fewer steps"
    assert plain["a"].draft_tokens == 0


def test_a_cycling_output_is_drafted_from_its_own_output():
    """The fake's default output counts bytes upward: after one lap, its own output predicts it."""
    params = SamplingParams(max_tokens=600, temperature=0, ignore_eos=True)
    plain, _ = run({"a": params}, prompt="x", spec_type="none")
    fast, backend = run({"a": params}, prompt="x", spec_type="ngram-simple")
    assert fast["a"].text == plain["a"].text and fast["a"].completion_tokens == 600 - 0
    assert fast["a"].draft_tokens_accepted > 200


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod"])
def test_seeded_sampling_gives_the_same_tokens_with_drafts(spec_type):
    """Each draft row is drawn with the uniform number of that token's index: a seeded request
    gives the same text with and without speculation. At temperature 10 and top_k 3 the fake's
    scripted token comes 79% of the time: drafts are kept and rejected."""
    requests = {f"r{seed}": SamplingParams(max_tokens=120, temperature=10.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed)
                for seed in range(6)}
    plain, _ = run(requests, spec_type="none")
    fast, backend = run(requests, spec_type=spec_type, spec_ngram_size=2)
    assert {key: result.text for key, result in fast.items()} == {key: result.text for key, result in plain.items()}
    drafted = sum(result.draft_tokens for result in fast.values())
    accepted = sum(result.draft_tokens_accepted for result in fast.values())
    assert 0 < accepted < drafted, "some drafts were kept, some rejected"


def test_a_drafted_token_is_kept_as_often_as_the_model_gives_it():
    """The standard rule for a draft that is one token with certainty: it is kept with the
    probability the model gives it. The fake scripts "c", "a", "b" after the prompt "abcab",
    each with probability p = 1/(1 + e^-1) (its peak of 20 at temperature 20 against one other
    candidate at top_k 2). After a "c", the draft is "ab" (what followed "c" in the prompt), and
    the row after the drafted "a" decides the third token: over 600 seeds it is "b" p of the
    time; a rule that kept drafts it should not would give more (about 0.93)."""
    p = 1 / (1 + math.exp(-1))
    backend = FakeBackend(num_slots=1, window=64, n_batch=64, replies={"abcab": "cabc"})
    engine = Engine(RunnerConfig(parallel=1, slot_ctx=64, n_batch=64, threads=1, seed=0, spec_type="ngram-simple",
                                 spec_ngram_size=1), backend)
    engine.speculator.cost = GpuLikeCost()
    trials, counts, drafted = 600, [0, 0, 0], 0
    for seed in range(trials):
        params = SamplingParams(max_tokens=4, temperature=20.0, top_k=2, top_p=1.0, min_p=0.0, seed=seed)
        seq = engine.new_sequence(Request(prompt="abcab", sampling=params), f"s{seed}")
        engine.add(seq)
        run_until_done(engine)
        engine.placement.clear()
        for index, scripted in enumerate(b"cab"):
            counts[index] += seq.output_tokens[index] == scripted
        drafted += seq.num_drafted > 0
    sigma = math.sqrt(p * (1 - p) / trials)
    for count in counts:
        assert abs(count / trials - p) < 4 * sigma, (counts, p)
    assert drafted > trials * p * 0.8, "after a 'c', the next tokens were verified as a draft"


def test_a_stop_string_inside_a_draft_ends_the_output_where_plain_decoding_does():
    params = SamplingParams(max_tokens=200, temperature=0, stop=("height\n\ndef",))
    plain, _ = run({"a": params}, spec_type="none")
    fast, backend = run({"a": params})
    assert fast["a"].text == plain["a"].text and fast["a"].stop_string == "height\n\ndef"
    assert backend.num_drafted_fed > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 40])
def test_max_tokens_holds_with_drafts(max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    fast, _ = run({"a": params})
    plain, _ = run({"a": params}, spec_type="none")
    assert fast["a"].completion_tokens == max_tokens and fast["a"].text == plain["a"].text


def test_log_probabilities_are_those_of_plain_decoding():
    params = SamplingParams(max_tokens=60, temperature=0, logprobs=True, top_logprobs=2)
    plain, _ = run({"a": params}, spec_type="none")
    fast, backend = run({"a": params})
    assert fast["a"].logprobs == plain["a"].logprobs and backend.num_drafted_fed > 0


def test_a_grammar_checks_every_drafted_token():
    """The grammar allows the file's text with "area" but never "surface": the drafted tokens
    pass through the constraint row by row, and the output is plain decoding's."""
    grammar = 'root ::= ( [a-z(), :*\\n] | "    " )+ "done."'
    params = SamplingParams(max_tokens=200, temperature=0, grammar=grammar)
    plain, _ = run({"a": params}, spec_type="none")
    fast, backend = run({"a": params})
    assert fast["a"].text == plain["a"].text and fast["a"].ok
    assert fast["a"].draft_tokens_accepted > 0


def test_a_shared_pool_counts_the_cells_a_rejected_draft_gives_back():
    params = SamplingParams(max_tokens=200, temperature=0)
    engine, backend = make_engine(pool=1024)
    for request_id in "abc":
        engine.add(engine.new_sequence(Request(prompt=f"Rewrite:\n{FILE}", sampling=params), request_id))

    def cells_agree() -> None:
        assert engine.pool.num_used == backend.num_cells_used
        for seq in engine.scheduler.running:
            assert len(backend.kv[seq.slot]) == seq.n_past

    results = run_until_done(engine, after_each_step=cells_agree)
    assert {result.text for result in results.values()} == {REPLIES[f"Rewrite:\n{FILE}"]}
    assert backend.rewinds, "rejected drafts left the KV"


def preempted_run(spec_type: str):
    """A batch request parked (its KV to host memory) for an interactive one once it has 300
    tokens out (drafting from its own output by then), then resumed: its result and the engine."""
    engine, backend = make_engine(spec_type, num_slots=1, cache_ram_mib=64)
    params = SamplingParams(max_tokens=450, temperature=0, ignore_eos=True)  # its bytes repeat after 256
    batch = engine.new_sequence(Request(prompt="x", sampling=params), "batch")
    engine.add(batch)
    while len(batch.output_tokens) < 300:
        engine.step()
    urgent = Request(prompt="y", sampling=SamplingParams(max_tokens=5, temperature=0), priority=Priority.INTERACTIVE)
    engine.add(engine.new_sequence(urgent, "urgent"))
    return run_until_done(engine)["batch"], engine


def test_a_preempted_drafting_sequence_resumes_with_the_plain_text():
    plain, _ = preempted_run("none")
    fast, engine = preempted_run("ngram-simple")
    assert engine.stats.num_preempted == 1 and fast.draft_tokens_accepted > 0
    assert fast.text == plain.text and fast.completion_tokens == 450


def test_session_text_drafts_what_followed_the_latest_match():
    text = SessionText([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2], ngram=2)
    assert text.draft(3) == [3, 5, 6], "the latest place [1, 2] occurred, not the first"
    text.extend([3])
    assert text.draft(2) == [5, 6]
    assert SessionText([1, 2], ngram=2).draft(4) == [], "no earlier place"


def test_the_shared_pool_follows_a_chain_and_forgets_its_oldest():
    shared = SharedNgrams(ngram=2, capacity=3)
    shared.note([1, 2, 3, 4, 5])
    assert shared.draft([0, 1, 2], 5) == [3, 4, 5]
    shared.note([7, 8, 9])
    assert shared.draft([1, 2], 5) == [], "the oldest n-gram went"


def test_the_step_cost_fit_finds_what_one_more_token_costs():
    cost = StepCost()
    assert cost.per_token() is None
    for tokens in (1, 4, 8, 16, 1, 8):
        cost.note(tokens, 0.010 + 0.002 * tokens)
    assert cost.per_token() == pytest.approx(0.002)
    assert cost.seconds(10) == pytest.approx(0.030)


def test_drafts_stand_aside_when_each_token_costs_its_share_of_the_step():
    """Where a step's cost is all per token (as on a busy CPU), a draft token pays only if it is
    surely kept: at a 60% chance, four decoding sequences get no draft, and their drafts are
    checked against what comes anyway (free), which raises the chance where they come true."""
    engine, _ = make_engine(num_slots=4)
    params = SamplingParams(max_tokens=120, temperature=0)
    for request_id in "abcd":
        engine.add(engine.new_sequence(Request(prompt=f"Rewrite:\n{FILE}", sampling=params), request_id))
    while sum(seq.status.value == "decode" for seq in engine.scheduler.running) < 4:
        engine.step()
    engine.speculator.cost = StepCost()  # what this machine's steps cost: 4 ms a token, nothing fixed
    for tokens in (1, 2, 4, 8, 12, 16):
        engine.speculator.cost.note(tokens, 0.004 * tokens)
    plan = engine.schedule()
    assert plan.num_decode_tokens == 4 and not any(chunk.entry.num_drafted for chunk in plan.chunks)
    engine.update(engine.execute(plan))
    run_until_done(engine)


def test_micro_batches_are_counted_as_llama_cpp_cuts_a_batch():
    """One KV stream: n_ubatch tokens a micro-batch. A stream per slot: a micro-batch takes as
    many tokens from each slot of a run of consecutive slots, so unequal entries or a gap in
    the slots cut the step."""
    assert micro_batches([(0, 1), (1, 5), (3, 1)], 512, stream_per_slot=False) == [7]
    assert micro_batches([(0, 300), (1, 300)], 512, stream_per_slot=False) == [512, 88]
    assert micro_batches([(0, 3), (1, 3), (2, 3)], 512, stream_per_slot=True) == [9]
    assert micro_batches([(0, 1), (1, 5), (2, 1)], 512, stream_per_slot=True) == [3, 4]
    assert micro_batches([(0, 1), (1, 1), (3, 1)], 512, stream_per_slot=True) == [2, 1]
    assert micro_batches([(0, 2), (1, 5), (2, 9)], 512, stream_per_slot=True) == [6, 6, 4]
    assert micro_batches([(0, 100), (1, 100)], 64, stream_per_slot=True) == [64, 64, 64, 8]  # 32 of each at a time


def _lengths_by_step(backend) -> list[dict[int, int]]:
    return [{slot: length for slot, length, prefill in call.entries if not prefill} for call in backend.calls]


class LearntCost(StepCost):
    """A cost already learnt: `fixed` seconds a micro-batch and 1 ms a token."""

    def __init__(self, fixed: float) -> None:
        super().__init__()
        self.fixed = fixed
        for tokens in (1, 64):
            self.note(tokens, 0)

    def note(self, num_tokens: int, seconds: float) -> None:
        super().note(num_tokens, self.fixed + 0.001 * num_tokens)


def test_with_a_window_per_slot_drafts_never_cut_a_step_in_more_micro_batches():
    """KV windows: llama.cpp decodes entries of unequal lengths as several micro-batches, each a
    pass over the weights. Two sessions copying a file and one counting bytes (which has no
    draft of its own) decode together: none drafts while the counter decodes, in one pass a
    step. In a pool (one micro-batch whatever the lengths) the copying sessions draft beside
    it. The texts are plain decoding's."""
    counter = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    def run_three(**config):
        engine, backend = make_engine(num_slots=3, **config)
        if engine.speculator is not None:
            engine.speculator.cost = LearntCost(fixed=0.010)
        for request_id in "ab":
            engine.add(engine.new_sequence(Request(prompt=f"Rewrite:\n{FILE}", sampling=GREEDY), request_id))
        engine.add(engine.new_sequence(Request(prompt="x", sampling=counter), "counter"))
        return run_until_done(engine), backend

    plain, _ = run_three(spec_type="none")
    windows, window_backend = run_three()
    pooled, pool_backend = run_three(pool=1536)
    for results in (windows, pooled):
        assert {key: result.text for key, result in results.items()} == {key: r.text for key, r in plain.items()}
    assert all(len(set(lengths.values())) == 1 for lengths in _lengths_by_step(window_backend) if lengths)
    assert windows["a"].draft_tokens == 0, "the counter had no draft while the copying sessions ran"
    assert any(len(lengths) == 3 and len(set(lengths.values())) > 1 for lengths in _lengths_by_step(pool_backend)), \
        "in a pool the copying sessions draft beside the counter"
    assert pooled["a"].draft_tokens_accepted > 0


def test_with_a_window_per_slot_sessions_that_all_copy_draft_the_same_length():
    requests = {name: SamplingParams(max_tokens=max_tokens, temperature=0)
                for name, max_tokens in (("a", 200), ("b", 150), ("c", 90))}
    plain, _ = run(requests, spec_type="none")
    fast, backend = run(requests)
    assert {key: result.text for key, result in fast.items()} == {key: result.text for key, result in plain.items()}
    steps = _lengths_by_step(backend)
    assert all(len(set(lengths.values())) == 1 for lengths in steps if lengths), "equal entries in every step"
    assert any(len(lengths) == 3 and min(lengths.values()) > 1 for lengths in steps), "all three drafted together"


class CpuLikeCost(StepCost):
    """SmolLM2's steps on one slot of a 2-core CPU: a lone token takes the matrix-vector path,
    so the first draft token costs more than a whole step, and the next ones about half a step."""

    CURVE = {1: 0.0084, 2: 0.0205, 3: 0.0209, 5: 0.0312, 9: 0.0497, 17: 0.083}

    def __init__(self) -> None:
        super().__init__()
        for tokens, seconds in self.CURVE.items():
            super().note(tokens, seconds)

    def note(self, num_tokens: int, seconds: float) -> None:
        pass


def test_the_step_cost_is_read_per_size_between_and_beyond_the_sizes_seen():
    cost = CpuLikeCost()
    assert cost.seconds(2) == pytest.approx(0.0205), "a size seen is its own average"
    assert cost.seconds(4) == pytest.approx((0.0209 + 0.0312) / 2), "between sizes seen, a straight line"
    assert cost.seconds(21) > cost.seconds(17) > cost.seconds(16), "beyond them, the fitted slope"


def test_a_draft_is_as_long_as_pays_on_a_cost_that_is_not_a_straight_line():
    """With a CPU's cost curve a one-token draft never pays (it more than doubles the step for
    less than one token more), while long drafts of a session that copies do: no step verifies
    a single draft token, some verify eight or more, and the text is plain decoding's."""
    plain, _ = run({"a": GREEDY}, spec_type="none")
    engine, backend = make_engine(num_slots=1)
    engine.speculator.cost = CpuLikeCost()
    engine.add(engine.new_sequence(Request(prompt=f"Rewrite:\n{FILE}", sampling=GREEDY), "a"))
    fast = run_until_done(engine)
    assert fast["a"].text == plain["a"].text
    drafts = [length - 1 for lengths in _lengths_by_step(backend) for length in lengths.values() if length > 1]
    assert drafts and min(drafts) >= 2 and max(drafts) >= 8, drafts


def test_drafts_from_the_shared_pool_that_fail_do_not_hold_back_the_sessions_own():
    """Each source of drafts keeps its own record: shared-pool chains rejected at their first
    token leave the estimate for drafts from the session's own text where it was."""
    engine, _ = make_engine(spec_type="ngram-mod", num_slots=1)
    seq = engine.new_sequence(Request(prompt=f"Rewrite:\n{FILE}", sampling=GREEDY), "a")
    state = _Drafting(seq, ngram=4)
    state.source = OWN_TEXT
    state.note_verified(8, 8)
    own = state.acceptance
    state.source = SHARED_POOL
    for _ in range(5):
        state.note_verified(8, 0)
    assert state.acceptance < 0.15
    state.source = OWN_TEXT
    assert state.acceptance == own > 0.6
