"""The projector's encoding without llama.cpp: a stand-in for mtmd's calls, whose encode takes
a while and counts itself. An image is encoded once however many threads want it at once, and
the encoder thread is not started for an image the step encodes itself."""

from __future__ import annotations

import ctypes
import threading
import time
from types import SimpleNamespace

import numpy as np

from multiseq.llama.media import MediaChunk, Projector

TOKENS, EMBD = 4, 8
ENCODER_THREAD = "multiseq-media-encoder"


class StandInMtmd:
    """The mtmd calls a Projector makes to load and encode; each encode takes 20 ms."""

    def __init__(self) -> None:
        self.encodes = 0
        self._rows = (ctypes.c_float * (TOKENS * EMBD))(*range(TOKENS * EMBD))

    def mtmd_context_params_default(self):
        return SimpleNamespace()

    def mtmd_init_from_file(self, path, model, params):
        return 1

    def mtmd_support_vision(self, ctx):
        return True

    def mtmd_support_audio(self, ctx):
        return False

    def mtmd_decode_use_mrope(self, ctx):
        return False

    def mtmd_encode_chunk(self, ctx, chunk):
        time.sleep(0.02)
        self.encodes += 1
        return 0

    def mtmd_get_output_embd(self, ctx):
        return ctypes.cast(self._rows, ctypes.POINTER(ctypes.c_float))

    def mtmd_free(self, ctx):
        pass


def projector_and_image(tmp_path) -> tuple[Projector, MediaChunk, StandInMtmd]:
    mtmd = StandInMtmd()
    path = tmp_path / "mmproj.gguf"
    path.write_bytes(b"a projector")
    projector = Projector(SimpleNamespace(llama_model_n_embd_inp=lambda handle: EMBD), mtmd, None, str(path),
                          threads=1, use_gpu=False, flash_attn_type=0)
    return projector, MediaChunk(mtmd, None, -5, TOKENS, non_causal=True, projector=projector), mtmd


def test_an_image_wanted_by_several_threads_at_once_is_encoded_once(tmp_path):
    """The step and the encoder thread may both want an image: one encodes, the others wait and
    take its rows."""
    projector, image, mtmd = projector_and_image(tmp_path)
    rows = []
    threads = [threading.Thread(target=lambda: rows.append(projector.embeddings(image))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    projector.close()
    assert mtmd.encodes == 1 and projector.encoded == 1
    assert len(rows) == 4 and all(np.array_equal(found, rows[0]) for found in rows)
    assert rows[0].shape == (TOKENS, EMBD)


def test_an_image_the_step_encodes_itself_is_not_queued_for_the_encoder_thread(tmp_path):
    projector, image, mtmd = projector_and_image(tmp_path)
    assert image.ready(encode_beside=False), "no stream is watched: the step encodes it"
    assert ENCODER_THREAD not in {thread.name for thread in threading.enumerate()}
    projector.embeddings(image)
    assert image.ready(encode_beside=True), "its rows are kept: ready beside the streams too"
    projector.close()
    assert mtmd.encodes == 1
