"""Every chat template llama.cpp ships (in the llama-cpp-python version multiseq pins; copies in
tests/data/llama.cpp-templates/) is detected as its family: exact fingerprints, most specific
first, so that a template holding another family's markers (Qwen3-Coder's and GLM's
<tool_call>, Functionary's Llama 3 headers) is not taken for that family."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiseq.tools.families import all_families, detect, family_named

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"

# Templates that write no tool calls of their own (no tools, or tools only described): generic.
EXPECTED = {
    "Apertus-8B-Instruct": "apertus",
    "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "Bielik-11B-v3.0-Instruct": "hermes",
    "ByteDance-Seed-OSS": "seed-oss",
    "Cohere2MoE": "command-r7b",
    "CohereForAI-c4ai-command-r-plus-tool_use": "command-r-plus",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r7b",
    "GLM-4.6": "glm",
    "GLM-4.7-Flash": "glm",
    "GigaChat3-10B-A1.8B": "gigachat",
    "GigaChat3.1-10B-A1.8B": "gigachat",
    "HuggingFaceTB-SmolLM3-3B": "generic",
    "Kimi-K2-Instruct": "kimi",
    "Kimi-K2-Thinking": "kimi",
    "Kimi-K3": "kimi",
    "LFM2-8B-A1B": "lfm2",
    "LFM2.5-8B-A1B": "lfm2",
    "LFM2.5-Instruct": "lfm2",
    "MiMo-VL": "hermes",
    "MiniMax-M1": "minimax-m1",
    "MiniMax-M2": "minimax-m2",
    "MiniMax-M3": "minimax-m3",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3-xml",
    "NVIDIA-Nemotron-Nano-v2": "nemotron-v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen3-Coder": "qwen3-xml",
    "Qwen3.5-4B": "qwen3-xml",
    "Reka-Edge": "hermes",
    "Spark2.5": "glm",
    "StepFun3.5-Flash": "qwen3-xml",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek",
    "deepseek-ai-DeepSeek-V3.1": "deepseek",
    "deepseek-ai-DeepSeek-V3.2": "deepseek",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek",
    "deepseek-ai-DeepSeek-V4": "deepseek",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction-v2",
    "google-gemma-2-2b-it": "generic",
    "google-gemma-4-31B-it-interleaved": "gemma4",
    "google-gemma-4-31B-it": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "ibm-granite-granite-4.0": "hermes",
    "ibm-granite-granite-4.1": "hermes",
    "inclusionai-ling-3.0-flash": "glm",
    "llama-cpp-deepseek-r1": "deepseek",
    "llama-cpp-rwkv-world": "generic",
    "meetkai-functionary-medium-v3.1": "functionary-v3.1",
    "meetkai-functionary-medium-v3.2": "functionary-v3.2",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "microsoft-Phi-3.5-mini-instruct": "generic",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "moonshotai-Kimi-K2": "kimi",
    "muse-glimmer": "muse-glimmer",
    "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "minicpm5",
    "poolside-Laguna-S-2.1": "glm",
    "poolside-Laguna-XS-2.1": "glm",
    "poolside-Laguna-XS.2": "glm",
    "tencent-Hy3": "hy3",
    "unsloth-Apriel-1.5": "apriel",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "upstage-Solar-Open-100B": "solar-open",
}


def test_every_checked_in_template_has_an_expected_family():
    assert sorted(path.stem for path in TEMPLATES.glob("*.jinja")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_template_is_detected_as_its_family(name):
    assert detect((TEMPLATES / f"{name}.jinja").read_text()).name == EXPECTED[name]


def test_nothing_but_a_template_is_generic():
    assert detect(None).name == detect("").name == "generic"
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}").name == "generic"


def test_every_family_has_what_the_registry_needs():
    names = [family.name for family in all_families()]
    assert len(names) == len(set(names))
    for family in all_families():
        assert family_named(family.name) is family
        assert family.description and callable(family.parse)
        assert family.name == "generic" or family.fingerprints, f"{family.name} can never be detected"


def test_an_unknown_family_name_says_which_exist():
    with pytest.raises(ValueError, match="the formats are .*qwen3-xml"):
        family_named("qwen4-xml")


# A template no fingerprint knows (its markers built from pieces) that writes Qwen3-Coder's calls.
DISGUISED_QWEN3_CODER = (
    "{%- set open = '<' ~ 'function=' -%}{%- set param = '<' ~ 'parameter=' -%}"
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] -%}"
    "\n<tool_call>\n{{ open }}{{ call.function.name }}>\n"
    "{%- for key, value in call.function.arguments.items() -%}"
    "{{ param }}{{ key }}>\n{{ value }}\n</parameter>\n{%- endfor -%}</function>\n</tool_call>"
    "{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    "{%- if tools %}<|im_start|>system\nYou may call tools.<|im_end|>\n{% endif -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")


def test_a_template_without_a_fingerprint_is_known_by_the_calls_it_renders():
    assert not any(family.matches(DISGUISED_QWEN3_CODER) for family in all_families())
    assert detect(DISGUISED_QWEN3_CODER).name == "qwen3-xml"


def test_a_template_that_renders_calls_no_family_reads_is_generic():
    unknown = DISGUISED_QWEN3_CODER.replace("<tool_call>", "<<CALL>>").replace("</tool_call>", "<</CALL>>")
    assert detect(unknown).name == "generic"
