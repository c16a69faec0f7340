"""A small reader and writer of the GGUF format (llama.cpp's docs/gguf.md), for the GPU check's
model maker (make_model.py): it runs on the device, which has numpy but not gguf-py (the kit
brings only what the device lacks of multiseq's own dependencies). The tests build their models
with gguf-py (tests/tiny_models.py).

The reader reads the key/value section and tensor infos of a header (also of a file cut short
after its header); key/value pairs are kept as their encoded bytes and copied into a new file
unchanged.
"""

from __future__ import annotations

import os
import struct
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
