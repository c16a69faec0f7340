"""Every chat template llama.cpp ships renders as llama-server renders it.

tests/data/llama-server-renderings.json holds llama-server's /apply-template output (by its
SHA-256) or error for each template and conversation, and its capabilities of each template,
recorded by `python bench/templates.py --record ...` on SmolLM2 (whose BOS and EOS texts the
templates write). Each conversation goes here through the same translation and rendering as a
chat through multiseq's server; the few renderings that differ on purpose are DELIBERATE, each
with its reason (docs/formats.md says the same).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pytest
from helpers import TemplateModel

from multiseq.config import SamplingParams
from multiseq.errors import BackendError
from multiseq.formats.fields import ItemError
from multiseq.formats.reader import openai_body_item
from multiseq.tools.support import ToolSupport

DATA = Path(__file__).parent / "data"
TEMPLATES = DATA / "llama.cpp-templates"
RECORDED = json.loads((DATA / "llama-server-renderings.json").read_text())
RENDERED_ON = datetime.datetime.strptime(RECORDED["rendered_on"], "%Y-%m-%d")
# The recording's model, SmolLM2: its BOS and EOS texts; its tokenizer adds neither.
BOS, EOS = "<|im_start|>", "<|im_end|>"

GENERIC_TOOLS = ("tool_call", "tools", "reasoning_call", "two_calls")
NINE_CHARACTER_IDS = ("tool_call", "reasoning_call", "two_calls")
DELIBERATE = {
    # Templates that render no tools: llama-server hands them the tools, which they leave out
    # (the model never learns of them, a past call renders as an empty turn); multiseq describes
    # the tools in a system part and writes past calls and results as text (the generic format).
    "HuggingFaceTB-SmolLM3-3B.jinja": GENERIC_TOOLS,
    "llama-cpp-rwkv-world.jinja": GENERIC_TOOLS,
    "microsoft-Phi-3.5-mini-instruct.jinja": GENERIC_TOOLS,
    # ... and Gemma 2's refuses a tool message, or two user turns in a row (llama-server answers
    # 400), where the generic format writes a turn's results as one user turn.
    "google-gemma-2-2b-it.jinja": GENERIC_TOOLS,
    # Mistral's templates refuse a call id that is not 9 alphanumeric characters (llama-server
    # answers 400 to OpenAI's call_...); multiseq renames each id the same way on every turn.
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": NINE_CHARACTER_IDS,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": NINE_CHARACTER_IDS,
}


def rendering(model: TemplateModel, support: ToolSupport, body: dict) -> dict:
    """A conversation as multiseq's /apply-template renders it: the prompt's digest, or the error."""
    try:
        request = openai_body_item("x", body, True, SamplingParams()).request
        prompt = support.render(model, request, now=RENDERED_ON)
    except (ItemError, BackendError) as error:
        return {"error": str(error)}
    return {"sha256": hashlib.sha256(prompt.encode("utf-8")).hexdigest(), "chars": len(prompt)}


@pytest.mark.parametrize("template", sorted(RECORDED["renderings"]))
def test_a_template_renders_every_conversation_as_llama_server_does(template):
    source = (TEMPLATES / template).read_text()
    model, support = TemplateModel(source, BOS, EOS), ToolSupport(source)
    recorded = RECORDED["renderings"][template]
    assert vars(model.renderer.caps) == recorded["caps"], "what the template does, as llama.cpp finds it"
    for name, body in RECORDED["conversations"].items():
        ours, theirs = rendering(model, support, body), recorded[name]
        if name in DELIBERATE.get(template, ()):
            assert "sha256" in ours and ours != theirs, f"{name}: the deliberate difference is gone"
        elif "error" in theirs:
            assert "error" in ours, f"{name}: llama-server refuses it ({theirs['error'][-120:]}), multiseq renders it"
        else:
            assert ours == theirs, f"{name}: differs from llama-server's prompt (bench/templates.py --show-diffs)"


def test_every_template_llama_cpp_ships_was_recorded():
    assert sorted(path.name for path in TEMPLATES.glob("*.jinja")) == sorted(RECORDED["renderings"])


@pytest.mark.model
def test_the_recording_models_texts_are_smollm2s(smollm):
    assert smollm.bos_and_eos_texts() == (BOS, EOS) and not smollm.add_bos
