"""Shared-prefix reuse on the fake backend: computed once, exact, never from a stale slot."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.llama.batch import ChunkRules
from multiseq.kv.prefix import MIN_WAIT_TOKENS

SHARED = "Rules: " + "label each ticket as bug, feature or question. " * 3  # 148 characters, one token each
GREEDY = SamplingParams(max_tokens=6, temperature=0)


def tickets(count: int, shared: str = SHARED, max_tokens: int = 6) -> list[Request]:
    return [Request(prompt=f"{shared}Ticket {index}: it crashes{'!' * index}", id=f"t{index}",
                    sampling=SamplingParams(max_tokens=max_tokens, temperature=0)) for index in range(count)]


def prefilled_tokens(backend: FakeBackend) -> int:
    return sum(n for call in backend.calls for _, n, is_prefill in call.entries if is_prefill)


def run(make_runner, requests, prefix_cache: bool, **backend_options):
    backend = FakeBackend(**{"num_slots": 4, "window": 256, "n_batch": 64, "noisy": True, **backend_options})
    with make_runner(backend, prefix_cache=prefix_cache) as runner:
        results = runner.run_batch(requests)
        stats = runner.stats()
        backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
    return results, stats, backend


def test_a_shared_prefix_is_computed_once_and_the_output_is_unchanged(make_runner):
    requests = tickets(12)
    reused, stats, backend = run(make_runner, requests, prefix_cache=True, n_batch=256)
    plain, plain_stats, plain_backend = run(make_runner, requests, prefix_cache=False, n_batch=256)
    assert [r.text for r in reused] == [r.text for r in plain]
    prompt_lengths = [len(backend.tokenize(request.prompt)) for request in requests]
    shared = 1 + len(SHARED) + len("Ticket ")  # BOS, the rules, and "Ticket " are common to all
    assert prefilled_tokens(plain_backend) == sum(prompt_lengths)
    assert prefilled_tokens(backend) == sum(prompt_lengths) - 11 * shared, "the shared tokens were prefilled once"
    assert [r.prompt_tokens_cached for r in reused] == [0] + [shared] * 11
    assert [r.prompt_tokens for r in reused] == prompt_lengths
    assert stats.prompt_tokens_reused == 11 * shared and stats.num_prefix_hits == 11 and stats.num_admitted == 12
    assert stats.prompt_tokens == prefilled_tokens(backend) and plain_stats.prompt_tokens_reused == 0


def test_requests_wait_for_a_prefix_being_prefilled_instead_of_computing_it_too(make_runner):
    requests = tickets(4)
    shared = 1 + len(SHARED) + len("Ticket ")
    _, _, backend = run(make_runner, requests, prefix_cache=True, n_batch=32)
    copies = [reuse for reuse in backend.reuses if reuse[0] != reuse[1]]
    assert sorted(slot for slot, _, _ in copies) == [1, 2, 3] and all(source == 0 for _, source, _ in copies)
    first_other = next(index for index, call in enumerate(backend.calls) if any(slot > 0 for slot, _, _ in call.entries))
    prefilled_alone = sum(n for call in backend.calls[:first_other] for _, n, _ in call.entries)
    [copied] = {length for _, _, length in copies}
    # The others start once what is left of the shared prefix is too short to be worth waiting
    # for, and each copy takes all of the prefix that was there.
    assert shared - MIN_WAIT_TOKENS < copied < shared and copied < prefilled_alone


def test_a_free_slot_reuses_its_own_kept_prompt_without_a_copy(make_runner):
    backend = FakeBackend(num_slots=1, window=256, n_batch=64)
    with make_runner(backend) as runner:
        first, again = [runner.run_batch([request])[0] for request in tickets(1) * 2]
    assert again.text == first.text and again.prompt_tokens_cached == again.prompt_tokens - 1
    assert (0, 0, again.prompt_tokens - 1) in backend.reuses, "kept in place: the slot itself is the source"
    assert all(slot == source for slot, source, _ in backend.reuses)


def test_identical_prompts_prefill_once_and_decode_only_their_last_token(make_runner):
    requests = [Request(prompt=SHARED, id=f"same{index}", sampling=GREEDY) for index in range(4)]
    results, _, backend = run(make_runner, requests, prefix_cache=True, n_batch=256)
    assert len({r.text for r in results}) == 1
    assert prefilled_tokens(backend) == len(backend.tokenize(SHARED)) + 3


def test_a_shifted_slot_is_never_a_source_for_positions_it_no_longer_holds(make_runner, stepped_engine):
    long = Request(prompt=SHARED, id="long", sampling=SamplingParams(max_tokens=200, temperature=0))
    late = Request(prompt=SHARED + "and more", id="late", sampling=GREEDY)
    backend = FakeBackend(num_slots=2, window=180, n_batch=64, noisy=True)
    stepped = stepped_engine(backend)
    stepped.submit(long)
    while not backend.shifts:
        stepped.step()
    stepped.submit(late)
    stepped.run()
    results = [stepped.result("long"), stepped.result("late")]
    keep = 1  # BOS, kept by the shift
    assert results[0].tokens_shifted_out > 0 and results[1].prompt_tokens_cached <= keep
    assert all(length <= keep for slot, source, length in backend.reuses if source == 0 and slot == 1)
    plain, _, _ = run(make_runner, [late], prefix_cache=False, num_slots=2, window=180)
    assert results[1].text == plain[0].text


def test_a_prefix_lost_from_a_sliding_window_cache_is_prefilled_in_full(make_runner):
    requests = tickets(6, max_tokens=40)
    reused, stats, backend = run(make_runner, requests, prefix_cache=True, sliding_window=120)
    plain, _, _ = run(make_runner, requests, prefix_cache=False, sliding_window=120)
    assert [r.text for r in reused] == [r.text for r in plain]
    # Each prompt (169 to 174 tokens) outgrows the 120-token window as it is prefilled, so every
    # prefix offered, copied from another slot or kept in a slot's own, has lost its start.
    copies = [reuse for reuse in backend.refused_reuses if reuse[0] != reuse[1]]
    assert len(copies) == len(requests) - 1, f"each later request is offered a broken copy: {backend.reuses}"
    assert backend.refused_reuses == [reuse for reuse in backend.reuses if reuse[2] > 0], "no prefix was intact"
    prompt_lengths = [len(backend.tokenize(request.prompt)) for request in requests]
    assert [r.prompt_tokens_cached for r in reused] == [0] * len(requests)
    assert prefilled_tokens(backend) == sum(prompt_lengths), "every prompt was prefilled in full"
    assert stats.num_prefix_hits == 0 and stats.prompt_tokens_reused == 0


def test_a_copy_evicts_the_least_recently_used_free_slot(stepped_engine):
    backend = FakeBackend(num_slots=3, window=256, n_batch=64)
    other = "Some other long instruction that has nothing to do with tickets at all, " * 2
    stepped = stepped_engine(backend)

    def run_alone(prompt: str, **sampling) -> None:
        stepped.submit(Request(prompt=prompt, sampling=SamplingParams(temperature=0, **{"max_tokens": 4, **sampling})))
        while stepped.step() and stepped.engine.scheduler.running[0].num_prompt_remaining:
            pass

    for prompt in ("A" * 40, "B" * 40, "C" * 40, "A" * 41):  # slots 0, 1, 2, then 0 again (its own prefix)
        run_alone(prompt)
        stepped.run()
    run_alone(other, max_tokens=30)  # no match anywhere: the LRU free slot, 1
    stepped.submit(Request(prompt=other + "?", id="copy", sampling=GREEDY))
    stepped.step()
    slots = {seq.id: seq.slot for seq in stepped.engine.scheduler.running}
    busy_slot = next(slot for request_id, slot in slots.items() if request_id != "copy")
    assert busy_slot == 1 and slots["copy"] == 2, "of the free slots 0 and 2, slot 2 was used longest ago"
    assert (2, 1, len(backend.tokenize(other))) in backend.reuses


def test_clear_prefix_cache_empties_every_slot(make_runner):
    backend = FakeBackend(num_slots=3)
    with make_runner(backend) as runner:
        runner.run_batch(tickets(5))
        assert any(backend.kv)
        runner.clear_prefix_cache()
        assert backend.kv == [[], [], []] and all(slot.kept.size == 0 for slot in runner.engine.scheduler.slots)
        assert runner.run_batch(tickets(1))[0].prompt_tokens_cached == 0


def test_without_the_prefix_cache_every_slot_is_empty_after_the_batch(make_runner):
    _, stats, backend = run(make_runner, tickets(6), prefix_cache=False)
    assert backend.kv == [[]] * 4 and stats.num_prefix_hits == 0 and not backend.reuses[0][2]


PIECES = st.sampled_from(["The rules are long. ", "Ticket: ", "bug ", "feature ", "?", "x" * 30])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.lists(PIECES, min_size=1, max_size=5).map("".join), min_size=1, max_size=9),
       budgets=st.lists(st.integers(1, 30), min_size=9, max_size=9), num_slots=st.integers(1, 4),
       n_batch=st.sampled_from([8, 16, 64]))
def test_reuse_never_changes_any_output(make_runner, prompts, budgets, num_slots, n_batch):
    requests = [Request(prompt=prompt, id=f"r{index}", sampling=SamplingParams(max_tokens=budgets[index], temperature=1.0,
                                                                               seed=index))
                for index, prompt in enumerate(prompts)]
    options = dict(num_slots=num_slots, n_batch=max(n_batch, num_slots), window=96)
    reused, _, _ = run(make_runner, requests, prefix_cache=True, **options)
    plain, _, _ = run(make_runner, requests, prefix_cache=False, **options)
    assert [r.text for r in reused] == [r.text for r in plain]


def test_prompt_chunks_are_never_shorter_than_the_backend_computes_exactly(make_runner):
    backend = FakeBackend(num_slots=3, window=256, n_batch=42, chunk_rules=ChunkRules(min_tokens=8, alignment=4))
    requests = tickets(6, max_tokens=5) + [Request(prompt="tiny", sampling=GREEDY)]
    with make_runner(backend) as runner:
        results = runner.run_batch(requests)
    prompt_lengths = {len(backend.tokenize(request.prompt)) for request in requests}
    chunks = [n for call in backend.calls for _, n, is_prefill in call.entries if is_prefill]
    assert all(n >= 8 or n in prompt_lengths for n in chunks), chunks
    ends = [start + n for call in backend.calls
            for (_, n, is_prefill), start in zip(call.entries, call.start_positions) if is_prefill]
    assert all(end % 4 == 0 or end in prompt_lengths for end in ends), "every chunk but a prompt's last ends on 4k"
    assert all(r.prompt_tokens - r.prompt_tokens_cached >= 8 for r in results if r.prompt_tokens_cached)
    assert all(r.prompt_tokens_cached % 4 == 0 for r in results)
    assert sum(r.prompt_tokens_cached > 0 for r in results) >= 4


def test_a_repeated_prompt_still_computes_its_last_chunk_in_full(make_runner):
    backend = FakeBackend(num_slots=1, window=256, n_batch=64, chunk_rules=ChunkRules(min_tokens=8, alignment=4))
    with make_runner(backend) as runner:
        first, again = [runner.run_batch([request])[0] for request in tickets(1) * 2]
    most = again.prompt_tokens - 8
    assert again.prompt_tokens_cached == most - most % 4 and again.text == first.text


def test_isolated_prefill_steps_hold_one_prompt_chunk_and_no_decoding_token(make_runner):
    backend = FakeBackend(num_slots=3, window=256, n_batch=64)
    with make_runner(backend, batch_invariant=True) as runner:
        isolated = runner.run_batch(tickets(6, max_tokens=8))
    for call in backend.calls:
        prefills = [entry for entry in call.entries if entry[2]]
        assert not prefills or (len(prefills) == 1 and not call.decoding_slots), call.entries
    mixed, _, _ = run(make_runner, tickets(6, max_tokens=8), prefix_cache=True, num_slots=3, noisy=False)
    assert [r.text for r in isolated] == [r.text for r in mixed]
    # A sequence waiting to feed back its token is never held for two prefill steps in a row.
    held = [bool(call.slots_with_pending_token) and not call.decoding_slots for call in backend.calls]
    assert any(held) and not any(first and second for first, second in zip(held, held[1:]))


def test_without_exact_reuse_a_prefix_leaves_only_the_last_prompt_token_to_compute():
    exact, fast = ChunkRules(min_tokens=65, alignment=4), ChunkRules(min_tokens=65, alignment=4, exact_reuse=False)
    assert exact.reusable(shared=30, prompt_length=40) == 0 and fast.reusable(shared=30, prompt_length=40) == 30
    assert exact.reusable(shared=200, prompt_length=200) == 132 and fast.reusable(shared=200, prompt_length=200) == 199
    assert fast.chunk_length(0, 300, 100) == exact.chunk_length(0, 300, 100) == 100, "chunking keeps its shape"
