"""Backend sampling's rules on the fake backend (milliseconds, no model): which rows a chain in
the graph samples, which stay on the host in the same step, greedy output equal on both paths,
seeded draws that survive a preemption. The same on llama.cpp: test_graph_sampling_real.py."""

from __future__ import annotations

from fakes import FakeBackend
from helpers import run_until_done
from multiseq import Priority, Request, RunnerConfig, SamplingParams
from multiseq.llama.batch import GREEDY_CHAIN
from multiseq.loop.engine import Engine

GREEDY = SamplingParams(max_tokens=12, temperature=0)
SAMPLED = SamplingParams(max_tokens=40, temperature=0.9, top_k=40, seed=11)


def make_engine(backend: FakeBackend, sampling: str = "backend") -> Engine:
    return Engine(RunnerConfig(parallel=backend.num_slots, slot_ctx=backend.window, n_batch=backend.n_batch,
                               threads=1, seed=0, sampling=sampling), backend)


def submit(engine: Engine, request_id: str, prompt: str, sampling: SamplingParams = GREEDY,
           priority: int = Priority.BATCH) -> None:
    request = Request(prompt=prompt, id=request_id, sampling=sampling, priority=priority)
    engine.add(engine.new_sequence(request, request_id))


def results(sampling: str, requests: dict[str, tuple[str, SamplingParams]], noisy: bool = False,
            num_slots: int = 4) -> tuple[dict, FakeBackend]:
    backend = FakeBackend(num_slots=num_slots, window=256, n_batch=128, noisy=noisy)
    engine = make_engine(backend, sampling)
    for request_id, (prompt, params) in requests.items():
        submit(engine, request_id, prompt, params)
    return run_until_done(engine), backend


def texts(sampling: str, requests: dict[str, tuple[str, SamplingParams]], noisy: bool = False,
          num_slots: int = 4) -> tuple[dict[str, str], FakeBackend]:
    by_id, backend = results(sampling, requests, noisy, num_slots)
    return {request_id: result.text for request_id, result in by_id.items()}, backend


def test_greedy_rows_are_chosen_in_the_graph_with_the_hosts_text():
    requests = {f"r{index}": (f"prompt {index}", GREEDY) for index in range(6)}
    on_host, host_backend = texts("host", requests, noisy=True)
    in_graph, backend = texts("backend", requests, noisy=True)
    assert in_graph == on_host
    assert host_backend.graph_sampling.sampled_rows == 0, "--sampling host never asks the graph"
    assert backend.graph_sampling.sampled_rows == 6 * GREEDY.max_tokens, "every greedy row came from the graph"


def test_a_greedy_chain_stays_on_its_slot_from_one_request_to_the_next():
    requests = {f"r{index}": (f"prompt {index}", GREEDY) for index in range(6)}
    _, backend = texts("backend", requests, num_slots=2)
    assert [spec for _, spec, _ in backend.graph_sampling.attaches] == [GREEDY_CHAIN] * 2, \
        "one greedy chain per slot, attached once: llama.cpp rebuilds its graph on every change"


def test_auto_samples_on_the_host():
    _, backend = texts("auto", {"a": ("prompt", GREEDY)})
    assert backend.graph_sampling.sampled_rows == 0 and not backend.graph_sampling.attaches


def test_rows_that_need_the_host_share_a_step_with_rows_sampled_in_the_graph():
    needs_host = {
        "min_tokens": SamplingParams(max_tokens=12, temperature=0, min_tokens=3),
        "penalty": SamplingParams(max_tokens=12, temperature=0, repeat_penalty=1.5),
        "logprobs": SamplingParams(max_tokens=12, temperature=0, logprobs=True),
        "schema": SamplingParams(max_tokens=12, temperature=0, json_schema={"type": "integer"}),
    }
    requests = {"greedy": ("prompt g", GREEDY), **{name: (f"prompt {name}", params) for name, params in needs_host.items()}}
    on_host, _ = texts("host", requests, noisy=True, num_slots=5)
    mixed, backend = texts("backend", requests, noisy=True, num_slots=5)
    assert mixed == on_host
    assert backend.graph_sampling.sampled_rows == GREEDY.max_tokens, "only the plain greedy request's rows"
    assert [spec for _, spec, _ in backend.graph_sampling.attaches] == [GREEDY_CHAIN]


def test_a_logit_bias_and_ignore_eos_ride_in_the_chain():
    requests = {
        "bias": ("prompt b", SamplingParams(max_tokens=12, temperature=0, logit_bias={ord("q"): 100.0})),
        "ban": ("prompt c", SamplingParams(max_tokens=12, temperature=0, logit_bias={ord("d"): -100.0})),
        "ignore_eos": ("hi", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)),
    }
    on_host, _ = texts("host", requests, noisy=True)
    in_graph, backend = results("backend", requests, noisy=True)
    assert {request_id: result.text for request_id, result in in_graph.items()} == on_host
    assert on_host["bias"] == "q" * 12 and "d" not in on_host["ban"], "the bias was applied"
    assert in_graph["ignore_eos"].completion_tokens == 6
    assert backend.graph_sampling.sampled_rows == sum(result.completion_tokens for result in in_graph.values())
    ignore_eos_spec = [spec for _, spec, _ in backend.graph_sampling.attaches if spec.logit_bias[0][1] == float("-inf")]
    assert ignore_eos_spec, "the end-of-generation tokens went to the chain as a -inf bias"


def test_a_seeded_sampled_request_gives_the_same_text_twice_and_follows_its_parameters():
    first, backend = texts("backend", {"a": ("prompt", SAMPLED)}, noisy=True)
    second, _ = texts("backend", {"a": ("prompt", SAMPLED)}, noisy=True)
    other_seed, _ = texts("backend", {"a": ("prompt", SamplingParams(max_tokens=40, temperature=0.9, top_k=40,
                                                                      seed=12))}, noisy=True)
    assert first == second and first != other_seed
    [(_, spec, accepted)] = backend.graph_sampling.attaches
    assert (spec.temperature, spec.top_k, accepted) == (0.9, 40, 0)
    assert backend.graph_sampling.sampled_rows == SAMPLED.max_tokens


def test_a_preempted_sampled_request_resumes_its_draws_where_they_were():
    alone, _ = texts("backend", {"batch": ("a long batch job", SAMPLED)}, noisy=True, num_slots=1)
    backend = FakeBackend(num_slots=1, window=512, n_batch=256, noisy=True, state_bytes_per_token=64)
    engine = make_engine(backend)
    submit(engine, "batch", "a long batch job", SAMPLED)
    for _ in range(10):
        engine.step()
    submit(engine, "chat", "hello", GREEDY, priority=Priority.INTERACTIVE)
    results = run_until_done(engine)
    assert engine.stats.snapshot().num_preempted == 1
    assert results["batch"].text == alone["batch"], "resumed as if never interrupted"
    resumed = [accepted for _, spec, accepted in backend.graph_sampling.attaches if not spec.is_greedy]
    assert resumed[0] == 0 and resumed[1] > 0, "the new chain was advanced past the tokens already drawn"


def test_a_chain_the_backend_cannot_run_leaves_the_row_to_the_host():
    backend = FakeBackend(num_slots=2, window=256, n_batch=128, noisy=True)
    backend.graph_sampling.refuse = True
    engine = make_engine(backend)
    submit(engine, "a", "prompt", GREEDY)
    assert run_until_done(engine)["a"].text == texts("host", {"a": ("prompt", GREEDY)}, noisy=True)[0]["a"]
    assert backend.graph_sampling.sampled_rows == 0


def test_a_slot_without_a_part_in_the_step_loses_its_chain():
    backend = FakeBackend(num_slots=2, window=256, n_batch=128)
    engine = make_engine(backend)
    submit(engine, "short", "a", SamplingParams(max_tokens=2, temperature=0))
    submit(engine, "long", "b", SamplingParams(max_tokens=8, temperature=0))
    run_until_done(engine)
    assert len(backend.graph_sampling.detaches) == 1, "the idle slot's chain went (llama.cpp would run it each step)"
    assert engine.row_sampling.num_chains == len(backend.graph_sampling.chains) == 1
