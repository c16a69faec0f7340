"""Requests that name LoRA adapters (RunnerConfig.lora_modules), on the fake backend: llama.cpp
applies adapters to a whole context, so a step runs one adapter set, the sets take the steps in
turn, and no prefix computed through one set is reused by another."""

from __future__ import annotations

import pytest

from fakes import FakeBackend
from multiseq import Request, SamplingParams

MODULES = (("style", "/adapters/style.gguf", 1.0), ("tone", "/adapters/tone.gguf", 0.5))
PROMPT = "Summarize the ticket: the app crashes on upload."


def request(name: str, adapter: str | None, prompt: str = PROMPT, max_tokens: int = 6) -> Request:
    return Request(prompt=f"{prompt} ({name})", id=name, adapter=adapter,
                   sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def slot_sets(backend: FakeBackend, requests: list[Request]) -> dict[int, int]:
    """Which adapter set each slot's sequence ran through, found by the prompt its KV holds."""
    sets = {None: 0, "style": 1, "tone": 2}
    prompts = {req.adapter: backend.tokenize(req.prompt) for req in requests}
    return {slot: sets[adapter] for adapter, tokens in prompts.items() for slot, held in enumerate(backend.kv)
            if held[:len(tokens)] == tokens}


def test_a_step_runs_one_adapter_set_and_the_sets_take_the_steps_in_turn(make_runner):
    backend = FakeBackend(num_slots=3, window=256, n_batch=64)
    requests = [request("plain", None), request("styled", "style"), request("toned", "tone")]
    with make_runner(backend, lora_modules=MODULES) as runner:
        results = runner.run_batch(requests)
    assert all(result.completion_tokens == 6 for result in results)
    owner = slot_sets(backend, requests)
    assert sorted(owner.values()) == [0, 1, 2]
    for call in backend.calls:
        assert {owner[slot] for slot, _, _ in call.entries} == {call.adapter_set}, "one set a step, its own"
    decoding = [call.adapter_set for call in backend.calls if call.decoding_slots]
    assert all(first != second for first, second in zip(decoding, decoding[1:])), "while all three decode"


def test_a_prefix_is_reused_only_through_the_adapter_set_that_computed_it(make_runner):
    backend = FakeBackend(num_slots=2, window=256, n_batch=64)
    with make_runner(backend, lora_modules=MODULES) as runner:
        [first] = runner.run_batch([request("a", "style", max_tokens=2)])
        [again] = runner.run_batch([request("a", "style", max_tokens=2)])
        [other] = runner.run_batch([request("a", "tone", max_tokens=2)])
        [plain] = runner.run_batch([request("a", None, max_tokens=2)])
        backend.assert_free_slots_hold_only_kept_prompts(runner.engine.scheduler)
    assert first.prompt_tokens_cached == 0 and again.prompt_tokens_cached == again.prompt_tokens - 1
    assert other.prompt_tokens_cached == 0 and plain.prompt_tokens_cached == 0


def test_an_adapter_the_runner_does_not_have_is_refused_naming_them(make_runner):
    with make_runner(FakeBackend(num_slots=1, window=256, n_batch=64), lora_modules=MODULES) as runner:
        [result] = runner.run_batch([request("a", "sarcasm")])
    assert result.finish_reason.value == "error"
    assert result.error == "no LoRA adapter is named 'sarcasm' here (there are style, tone)"


def test_lora_modules_are_named_once_each():
    from multiseq import RunnerConfig

    with pytest.raises(ValueError, match="each name once"):
        RunnerConfig(lora_modules=(("style", "/a.gguf", 1.0), ("style", "/b.gguf", 1.0)))


def test_an_adapter_served_as_a_model_runs_on_its_bases_slots_and_answers_as_itself(make_runner, serve_app):
    import openai

    from multiseq.server import ServerSettings, create_app

    backend = FakeBackend(num_slots=2, window=256, n_batch=64)
    runner = make_runner(backend, lora_modules=MODULES)
    app = create_app(runner, ServerSettings(model_name="base", adapter_models=(("style", "base"), ("tone", "base"))))
    client = openai.OpenAI(base_url=f"{serve_app(app)}/v1", api_key="unused", max_retries=0)
    cards = {model.id: model for model in client.models.list().data}
    assert list(cards) == ["base", "style", "tone"] and cards["tone"].model_extra["parent"] == "base"
    for name, adapter_set in (("tone", 2), ("base", 0), ("style", 1)):
        reply = client.completions.create(model=name, prompt=f"{PROMPT} ({name})", max_tokens=3, temperature=0)
        assert reply.model == name
        assert {call.adapter_set for call in backend.calls} == {adapter_set}, name
        backend.calls.clear()


def test_llama_servers_per_request_lora_field_picks_a_module_by_its_id(make_runner, serve_app):
    from helpers import post_json
    from multiseq.server import ServerSettings, create_app

    backend = FakeBackend(num_slots=2, window=256, n_batch=64)
    runner = make_runner(backend, lora=(("/adapters/base.gguf", 1.0),), lora_modules=MODULES)
    base = serve_app(create_app(runner, ServerSettings(model_name="base")))
    status, _ = post_json(base, "/lora-adapters", {})  # (a POST: refused)
    assert status == 400
    for lora, adapter_set in (([{"id": 2, "scale": 0.5}], 2), ([{"id": 1, "scale": 1.0}, {"id": 2}], 1), ([], 0),
                              ([{"id": 0, "scale": 1.0}], 0)):
        status, _ = post_json(base, "/v1/completions", {"prompt": f"{PROMPT}", "max_tokens": 2, "lora": lora})
        assert status == 200 and {call.adapter_set for call in backend.calls} == {adapter_set}, lora
        backend.calls.clear()
    for lora, said in (([{"id": 2, "scale": 1.0}], "adapter 2 runs at scale 0.5 here"),
                       ([{"id": 1, "scale": 1.0}, {"id": 2, "scale": 0.5}], "one of the --lora-modules at a time"),
                       ([{"id": 0, "scale": 0.0}], "adapter 0 runs at scale 1 here"),
                       ([{"id": 3, "scale": 1.0}], "/lora-adapters lists 3"), ("style", "must be a list")):
        status, body = post_json(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "lora": lora})
        assert status == 400 and said in body, lora
