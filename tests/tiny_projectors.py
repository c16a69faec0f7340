"""Tiny random-weight projector GGUFs (llama.cpp's mmproj), written with gguf-py (llama.cpp's
own GGUF writer, its key names from its constants), and small test images.

    path = tiny_gemma3_projector(tmp_path / "mmproj.gguf", text_embedding=640)  # for Gemma 3 270M
    path = tiny_qwen2vl_projector(tmp_path / "mmproj.gguf", text_embedding=64)  # for a tiny qwen2vl

A Gemma 3 projector: a SigLIP vision tower of one layer (56 x 56 pixels in 14-pixel patches,
16 patches pooled 2 x 2 into 4 image tokens) and the projection into the text model's width.
A Qwen2-VL projector: a vision tower of one layer that reads an image at its own size (in
28-pixel squares, each one image token: 2 x 2 patches merged) and places its tokens with M-RoPE
(rows and columns), so that an image takes fewer positions than tokens.
Their images mean nothing to the model, but every path an image takes through llama.cpp
(decoding the file, the encoder, the embeddings decoded without causal attention or at 2-D
positions) is the real one.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from tiny_models import written


def tiny_gemma3_projector(out: Path, text_embedding: int, image_size: int = 56, patch: int = 14, merge: int = 2,
                          embedding: int = 32, heads: int = 2, feed_forward: int = 64, layers: int = 1,
                          seed: int = 0) -> Path:
    writer, weights = _tower_writer(out, gguf.VisionProjectorType.GEMMA3, image_size, patch, embedding, heads,
                                    feed_forward, layers, text_embedding, seed)
    writer.add_uint32(gguf.Keys.ClipVision.Projector.SCALE_FACTOR, merge)
    weights("v.patch_embd.weight", embedding, 3, patch, patch, dtype=np.float16)  # a convolution's kernel
    weights("v.patch_embd.bias", embedding)
    weights("v.position_embd.weight", (image_size // patch) ** 2, embedding)
    _layers(writer, weights, layers, embedding, feed_forward)
    writer.add_tensor("mm.soft_emb_norm.weight", np.ones(embedding, np.float32))
    weights("mm.input_projection.weight", embedding, text_embedding, scale=1.0)
    return written(writer, out)


def tiny_qwen2vl_projector(out: Path, text_embedding: int, patch: int = 14, embedding: int = 32, heads: int = 2,
                           feed_forward: int = 64, layers: int = 1, merger: int = 128, seed: int = 0) -> Path:
    """A Qwen2-VL projector (llama.cpp's "qwen2vl_merger"): two convolutions over the image's
    patches (one per video frame, both on a still image), the tower, and the merger that takes
    2 x 2 patches into one token of the text model's width."""
    writer, weights = _tower_writer(out, gguf.VisionProjectorType.QWEN2VL, 112, patch, embedding, heads,
                                    feed_forward, layers, text_embedding, seed)
    weights("v.patch_embd.weight", embedding, 3, patch, patch, dtype=np.float16)
    weights("v.patch_embd.weight.1", embedding, 3, patch, patch, dtype=np.float16)
    _layers(writer, weights, layers, embedding, feed_forward)
    weights("mm.0.weight", merger, 4 * embedding, scale=0.2)
    weights("mm.0.bias", merger)
    weights("mm.2.weight", text_embedding, merger, scale=0.5)
    weights("mm.2.bias", text_embedding)
    return written(writer, out)


def tiny_qwen2_audio_projector(out: Path, text_embedding: int, mel_bins: int = 128, embedding: int = 32,
                               heads: int = 2, feed_forward: int = 64, layers: int = 1, seed: int = 0) -> Path:
    """A Qwen2-Audio projector (llama.cpp's "qwen2a"): a Whisper-style encoder (two convolutions
    over the log-mel frames, the second halving them, 1,500 learned positions for 30 s) and a
    projection into the text model's width after pooling frames 2 by 2: 750 tokens a 30 s
    window, audio being padded to whole windows."""
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_clip_has_audio_encoder(True)
    writer.add_clip_audio_projector_type(gguf.VisionProjectorType.QWEN2A)
    writer.add_audio_num_mel_bins(mel_bins)
    writer.add_audio_embedding_length(embedding)
    writer.add_audio_feed_forward_length(feed_forward)
    writer.add_audio_block_count(layers)
    writer.add_audio_head_count(heads)
    writer.add_audio_projection_dim(text_embedding)
    writer.add_audio_attention_layernorm_eps(1e-5)
    weights = _random_weights(writer, seed)
    weights("a.conv1d.1.weight", embedding, mel_bins, 3, dtype=np.float16)
    weights("a.conv1d.1.bias", embedding, 1)  # (one per channel, across the frames)
    weights("a.conv1d.2.weight", embedding, embedding, 3, dtype=np.float16)
    weights("a.conv1d.2.bias", embedding, 1)
    weights("a.position_embd.weight", 1500, embedding)
    _layers(writer, weights, layers, embedding, feed_forward, tower="a", key_bias=False)  # Whisper's keys: no bias
    weights("mm.a.fc.weight", text_embedding, embedding, scale=1.0)
    weights("mm.a.fc.bias", text_embedding)
    return written(writer, out)


def wav_of(seconds: float, seed: int, rate: int = 16000) -> bytes:
    """A WAV file of noise, 16-bit mono."""
    import wave

    samples = (np.random.default_rng(seed).standard_normal(int(seconds * rate)) * 3000).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(samples.tobytes())
    return buffer.getvalue()


def _tower_writer(out: Path, projector_type: str, image_size: int, patch: int, embedding: int, heads: int,
                  feed_forward: int, layers: int, text_embedding: int,
                  seed: int) -> tuple[gguf.GGUFWriter, Callable[..., None]]:
    """A writer with a vision tower's hyperparameters, and a function adding random weights."""
    keys = gguf.Keys.ClipVision
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_clip_projector_type(projector_type)
    writer.add_clip_has_vision_encoder(True)
    for key, value in ((keys.IMAGE_SIZE, image_size), (keys.PATCH_SIZE, patch), (keys.EMBEDDING_LENGTH, embedding),
                       (keys.FEED_FORWARD_LENGTH, feed_forward), (keys.PROJECTION_DIM, text_embedding),
                       (keys.BLOCK_COUNT, layers), (keys.Attention.HEAD_COUNT, heads)):
        writer.add_uint32(key, value)
    writer.add_float32(keys.Attention.LAYERNORM_EPS, 1e-6)
    writer.add_array(keys.IMAGE_MEAN, [0.5, 0.5, 0.5])
    writer.add_array(keys.IMAGE_STD, [0.5, 0.5, 0.5])
    writer.add_bool(keys.USE_GELU, True)
    return writer, _random_weights(writer, seed)


def _random_weights(writer: gguf.GGUFWriter, seed: int) -> Callable[..., None]:
    """weights(name, *shape, scale=0.05, dtype=float32): a tensor of normal values into the writer."""
    rng = np.random.default_rng(seed)

    def weights(name: str, *shape: int, scale: float = 0.05, dtype=np.float32) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(dtype))

    return weights


def _layers(writer: gguf.GGUFWriter, weights: Callable[..., None], layers: int, embedding: int,
            feed_forward: int, tower: str = "v", key_bias: bool = True) -> None:
    """The tower's layers (attention and a GELU feed-forward, each after a layer norm) and the
    norm after them; `tower` "v" (vision) or "a" (audio) names them."""
    for layer in range(layers):
        block = f"{tower}.blk.{layer}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            weights(block + part + ".weight", embedding, embedding)
            if key_bias or part != "attn_k":
                weights(block + part + ".bias", embedding)
        for norm in ("ln1", "ln2"):
            writer.add_tensor(block + norm + ".weight", np.ones(embedding, np.float32))
            writer.add_tensor(block + norm + ".bias", np.zeros(embedding, np.float32))
        weights(block + "ffn_up.weight", feed_forward, embedding)
        weights(block + "ffn_up.bias", feed_forward)
        weights(block + "ffn_down.weight", embedding, feed_forward)
        weights(block + "ffn_down.bias", embedding)
    writer.add_tensor(f"{tower}.post_ln.weight", np.ones(embedding, np.float32))
    writer.add_tensor(f"{tower}.post_ln.bias", np.zeros(embedding, np.float32))


def image_of(width: int, height: int, seed: int, image_format: str = "PNG", alpha: bool = False) -> bytes:
    """An image of random pixels, encoded as `image_format` (PNG, JPEG, GIF, BMP)."""
    from PIL import Image

    channels = 4 if alpha else 3
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGBA" if alpha else "RGB").save(buffer, image_format)
    return buffer.getvalue()
