"""LoRA adapters (--lora, --lora-scaled) on SmolLM2, with an adapter of random weights built
here (tiny_models.lora_adapter_for): at scale 0 the model's own numbers to the last bit, at
scale 1 other ones, on every sequence of a batch alike; an adapter that does not fit the model
is refused saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiseq import Request, SamplingParams
from multiseq.errors import BackendError
from tiny_models import lora_adapter_for

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "Water boils at"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, smollm) -> str:
    return str(lora_adapter_for(Path(smollm.path), tmp_path_factory.mktemp("lora") / "smollm2-lora.gguf", std=0.3,
                                target="ffn_down"))


def greedy(runner, prompts=PROMPTS) -> list[tuple[str, list[float]]]:
    results = runner.run_batch([Request(prompt=prompt, id=prompt, sampling=SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)) for prompt in prompts])
    return [(result.text, [entry.logprob for entry in result.logprobs]) for result in results]


def test_an_adapter_at_scale_zero_is_the_model_and_at_scale_one_changes_it(smollm, real_runner, adapter):
    plain = greedy(real_runner(smollm, 2, flash_attn="off"))
    assert greedy(real_runner(smollm, 2, flash_attn="off", lora=((adapter, 0.0),))) == plain
    adapted = greedy(real_runner(smollm, 2, flash_attn="off", lora=((adapter, 1.0),)))
    assert all(abs(mine[1][0] - theirs[1][0]) > 0.05 for mine, theirs in zip(adapted, plain)), \
        "the adapter moved each prompt's first log probability"


def test_an_adapter_applies_to_every_sequence_of_a_batch_alike(unpacked_model, real_runner, adapter):
    model = unpacked_model("smollm2-135m")
    together = greedy(real_runner(model, 2, batch_invariant=True, lora=((adapter, 1.0),)))
    alone = [greedy(real_runner(model, 1, batch_invariant=True, lora=((adapter, 1.0),)), [prompt])[0]
             for prompt in PROMPTS]
    assert together == alone


def test_an_adapter_for_another_model_is_refused_saying_why(smollm, real_runner, gemma, tmp_path):
    other = str(lora_adapter_for(Path(gemma.path), tmp_path / "gemma-lora.gguf"))
    with pytest.raises(BackendError, match="could not load the LoRA adapter .*gemma-lora.gguf"):
        real_runner(smollm, 1, lora=((other, 1.0),))


def test_requests_naming_adapters_share_a_runner_and_each_gets_its_adapters_numbers(unpacked_model, real_runner,
                                                                                     adapter, tmp_path_factory):
    """Steps grouped by adapter set: each request's numbers are those of a runner whose whole
    model has its adapter (or none), to the last bit under --batch-invariant."""
    model = unpacked_model("smollm2-135m")
    other = str(lora_adapter_for(Path(model.path), tmp_path_factory.mktemp("lora2") / "other.gguf", std=0.3,
                                 target="ffn_down", seed=1))
    modules = (("style", adapter, 1.0), ("tone", other, 0.5))
    shared = real_runner(model, 3, batch_invariant=True, lora_modules=modules)
    wanted = [(PROMPTS[0], None), (PROMPTS[1], "style"), (PROMPTS[0], "tone")]
    results = shared.run_batch([Request(prompt=prompt, id=f"{index}", adapter=name, sampling=SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)) for index, (prompt, name) in enumerate(wanted)])
    together = [(result.text, [entry.logprob for entry in result.logprobs]) for result in results]
    alone = [greedy(real_runner(model, 1, batch_invariant=True, lora=lora), [prompt])[0]
             for prompt, lora in ((PROMPTS[0], ()), (PROMPTS[1], ((adapter, 1.0),)), (PROMPTS[0], ((other, 0.5),)))]
    assert together == alone
    assert together[0] != together[2], "the same prompt, through another adapter"
