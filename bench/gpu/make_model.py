"""Random-weight GGUF models in real models' shapes, with a real vocabulary, made where they run.

    python bench/gpu/make_model.py llama-1b OUT.gguf --vocab ggml-vocab-llama-bpe.gguf --template T.jinja
    python bench/gpu/make_model.py deepseek-1.5b OUT.gguf --vocab deepseek-r1-distill-qwen-7b.header.gguf

A dense model's step time does not depend on its weights' values, so the GPU benchmark writes its
models on the machine it measures on instead of carrying gigabytes there: every tensor has the
shape and type (f16 matrices, f32 norms) of the real model's, and the tokenizer (every
`tokenizer.*` key) is the real one, taken from llama.cpp's `models/ggml-vocab-*.gguf` or a real
GGUF's header. The values come from one small pool of normal numbers, tiled, so that an 8B model
is written at the disk's speed rather than the random generator's. Outputs are noise; runs use
`ignore_eos` so that every request generates what it asks for.

Shapes (llama.cpp architecture, layers, embedding, heads, KV heads, feed-forward):

- `llama-1b`: Llama-3.2-1B (llama, 16, 2048, 32, 8, 8192, output tied to the embeddings)
- `llama-8b`: Llama-3.1-8B (llama, 32, 4096, 32, 8, 14336)
- `deepseek-1.5b`: DeepSeek-R1-Distill-Qwen-1.5B (qwen2, 28, 1536, 12, 2, 8960), a reasoning model
- `tiny`, `tiny-qwen2`: 2 layers of 64, for the CPU dry run
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from gguf_lite import decoder_fields, encode_value, read_header, write_gguf  # noqa: E402
from tiny_models import decoder_tensors  # noqa: E402  (numpy only: gguf-py is not imported)

POOL_VALUES = 1 << 22
WEIGHT_SCALE = 0.02


@dataclass(frozen=True)
class Shape:
    arch: str
    layers: int
    embedding: int
    heads: int
    kv_heads: int
    feed_forward: int
    rope_base: float
    norm_eps: float
    tied_output: bool = False
    context: int = 8192

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"


SHAPES = {
    "llama-1b": Shape("llama", 16, 2048, 32, 8, 8192, 500000.0, 1e-5, tied_output=True),
    "llama-8b": Shape("llama", 32, 4096, 32, 8, 14336, 500000.0, 1e-5),
    "deepseek-1.5b": Shape("qwen2", 28, 1536, 12, 2, 8960, 10000.0, 1e-6),
    "tiny": Shape("llama", 2, 64, 4, 2, 128, 500000.0, 1e-5, tied_output=True),
    "tiny-qwen2": Shape("qwen2", 2, 64, 4, 2, 128, 10000.0, 1e-6),
}


class TiledWeights:
    """Arrays of any size cut from one pool of normal values, each starting somewhere else."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._pool = (self._rng.standard_normal(POOL_VALUES, dtype=np.float32) * WEIGHT_SCALE).astype(np.float16)

    def __call__(self, *dims: int, dtype=np.float16) -> np.ndarray:
        start = int(self._rng.integers(POOL_VALUES))
        flat = np.resize(np.roll(self._pool, -start) if start else self._pool, int(np.prod(dims)))
        return flat.reshape(dims).astype(dtype, copy=False)


def model_fields(shape: Shape, name: str, tokenizer_fields: dict, template: str | None) -> dict:
    fields = decoder_fields(shape.arch, name, shape.context, shape.embedding, shape.layers, shape.feed_forward,
                            shape.heads, shape.kv_heads, shape.rope_base, shape.norm_eps)
    fields.update(tokenizer_fields)
    if template is not None:
        fields["tokenizer.chat_template"] = encode_value(template)
    return fields


def model_tensors(shape: Shape, n_vocab: int, weights: TiledWeights) -> dict[str, np.ndarray]:
    return decoder_tensors(n_vocab, shape.layers, shape.embedding, shape.embedding // shape.heads * shape.kv_heads,
                           shape.feed_forward, weights, qkv_bias=shape.qkv_bias, tied_output=shape.tied_output)


def make_model(shape_name: str, out: Path, vocab_gguf: Path, template: str | None = None, seed: int = 0) -> Path:
    """Write the `shape_name` model with `vocab_gguf`'s tokenizer to `out` (kept if already there)."""
    out = Path(out)
    if out.is_file():
        return out
    shape = SHAPES[shape_name]
    header = read_header(vocab_gguf)
    tokenizer = {key: field for key, field in header.fields.items() if key.startswith("tokenizer.")}
    n_vocab = header.array_length("tokenizer.ggml.tokens")
    fields = model_fields(shape, f"random {shape_name} with the tokenizer of {Path(vocab_gguf).name}",
                          tokenizer, template)
    partial = out.with_suffix(".partial")
    write_gguf(partial, fields, model_tensors(shape, n_vocab, TiledWeights(seed)))
    partial.replace(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=Path, required=True, help="a GGUF whose tokenizer the model takes")
    parser.add_argument("--template", type=Path, default=None, help="a Jinja chat template to write into it")
    args = parser.parse_args()
    template = args.template.read_text() if args.template else None
    print(make_model(args.shape, args.out, args.vocab, template))


if __name__ == "__main__":
    main()
