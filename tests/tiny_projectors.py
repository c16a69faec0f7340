"""Tiny random-weight projector GGUFs (llama.cpp's mmproj), written with gguf-py (llama.cpp's
own GGUF writer, its key names from its constants), and small test images.

    path = tiny_gemma3_projector(tmp_path / "mmproj.gguf", text_embedding=640)  # for Gemma 3 270M

A Gemma 3 projector: a SigLIP vision tower of one layer (56 x 56 pixels in 14-pixel patches,
16 patches pooled 2 x 2 into 4 image tokens) and the projection into the text model's width.
Its images mean nothing to the model, but every path an image takes through llama.cpp (decoding
the file, the encoder, the embeddings decoded without causal attention) is the real one.
"""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np


def tiny_gemma3_projector(out: Path, text_embedding: int, image_size: int = 56, patch: int = 14, merge: int = 2,
                          embedding: int = 32, heads: int = 2, feed_forward: int = 64, layers: int = 1,
                          seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    keys = gguf.Keys.ClipVision
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    writer.add_clip_has_vision_encoder(True)
    for key, value in ((keys.IMAGE_SIZE, image_size), (keys.PATCH_SIZE, patch), (keys.EMBEDDING_LENGTH, embedding),
                       (keys.FEED_FORWARD_LENGTH, feed_forward), (keys.PROJECTION_DIM, text_embedding),
                       (keys.BLOCK_COUNT, layers), (keys.Attention.HEAD_COUNT, heads),
                       (keys.Projector.SCALE_FACTOR, merge)):
        writer.add_uint32(key, value)
    writer.add_float32(keys.Attention.LAYERNORM_EPS, 1e-6)
    writer.add_array(keys.IMAGE_MEAN, [0.5, 0.5, 0.5])
    writer.add_array(keys.IMAGE_STD, [0.5, 0.5, 0.5])
    writer.add_bool(keys.USE_GELU, True)

    def weights(name: str, *shape: int, scale: float = 0.05, dtype=np.float32) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(dtype))

    def ones(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, np.float32))

    weights("v.patch_embd.weight", embedding, 3, patch, patch, dtype=np.float16)  # a convolution's kernel
    weights("v.patch_embd.bias", embedding)
    weights("v.position_embd.weight", (image_size // patch) ** 2, embedding)
    for layer in range(layers):
        block = f"v.blk.{layer}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            weights(block + part + ".weight", embedding, embedding)
            weights(block + part + ".bias", embedding)
        for norm in ("ln1", "ln2"):
            ones(block + norm + ".weight", embedding)
            writer.add_tensor(block + norm + ".bias", np.zeros(embedding, np.float32))
        weights(block + "ffn_up.weight", feed_forward, embedding)
        weights(block + "ffn_up.bias", feed_forward)
        weights(block + "ffn_down.weight", embedding, feed_forward)
        weights(block + "ffn_down.bias", embedding)
    ones("v.post_ln.weight", embedding)
    writer.add_tensor("v.post_ln.bias", np.zeros(embedding, np.float32))
    ones("mm.soft_emb_norm.weight", embedding)
    weights("mm.input_projection.weight", embedding, text_embedding, scale=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def image_of(width: int, height: int, seed: int, image_format: str = "PNG", alpha: bool = False) -> bytes:
    """An image of random pixels, encoded as `image_format` (PNG, JPEG, GIF, BMP)."""
    from PIL import Image

    channels = 4 if alpha else 3
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGBA" if alpha else "RGB").save(buffer, image_format)
    return buffer.getvalue()
