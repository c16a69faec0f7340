"""Audio through llama.cpp's multimodal library: Gemma 3 270M (a model of its own, not the
session's) with a tiny random Qwen2-Audio projector (tests/tiny_projectors.py). A WAV is cut into
30 s windows of 750 tokens each; the answer does not depend on what runs beside it, a clip asked
again is not computed again, Chat Completions' input_audio reaches the engine, and a window
larger than one llama_decode is decoded in pieces."""

from __future__ import annotations

import base64
import json
import urllib.request

import openai
import pytest
from helpers import serving
from tiny_projectors import image_of, tiny_qwen2_audio_projector, wav_of

from multiseq import Request, SamplingParams
from multiseq.loading import open_model
from multiseq.server import ServerSettings, create_app

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
CLIP = wav_of(2.0, seed=1)
WINDOW_TOKENS = 750  # 3,000 mel frames, halved by the convolution, pooled 2 by 2


@pytest.fixture(scope="module")
def hearing_gemma(tmp_path_factory):
    model = open_model("gemma3-270m", repack_weights=False)
    model.load_projector(str(tiny_qwen2_audio_projector(tmp_path_factory.mktemp("audio") / "mmproj.gguf",
                                                        text_embedding=640)), threads=2, flash_attn="off")
    assert model.projector.reads_audio and not model.projector.reads_images
    yield model
    model.close()


def hear(clip: bytes, question: str = "What is said?") -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "audio", "data": clip},
                                                         {"type": "text", "text": question}]}], sampling=GREEDY)


def test_a_clip_is_answered_the_same_beside_another_and_alone_and_computed_once(hearing_gemma, real_runner):
    together = real_runner(hearing_gemma, 2, slot_ctx=2048, n_batch=1024, batch_invariant=True).run_batch(
        [hear(CLIP), hear(wav_of(1.0, seed=2))])
    alone = real_runner(hearing_gemma, 1, slot_ctx=2048, n_batch=1024, batch_invariant=True)
    first = alone.run_batch([hear(CLIP)])[0]
    encoded = hearing_gemma.projector.encoded
    again = alone.run_batch([hear(CLIP, "What is said in it?")])[0]
    assert [result.error for result in together] == [None, None]
    assert together[0].text == first.text and together[0].prompt_tokens > WINDOW_TOKENS
    assert again.prompt_tokens_cached >= WINDOW_TOKENS and hearing_gemma.projector.encoded == encoded


def test_input_audio_reaches_the_engine_and_an_image_to_an_audio_projector_is_refused(hearing_gemma, real_runner):
    runner = real_runner(hearing_gemma, 1, slot_ctx=2048, n_batch=1024, batch_invariant=True)
    expected = runner.run_batch([hear(CLIP)])[0].text
    clip = base64.b64encode(CLIP).decode()
    with serving(create_app(runner, ServerSettings(model_name="gemma"))) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        chat = client.chat.completions.create(
            model="gemma", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, messages=[
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
                                             {"type": "text", "text": "What is said?"}]}])
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="gemma", max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(image_of(32, 32, 1)).decode()}}]}])
        props = json.loads(urllib.request.urlopen(f"{base}/props").read())
    assert chat.choices[0].message.content == expected
    assert "is an image, and this model's projector reads audio only" in refused.value.message
    assert props["modalities"] == {"vision": False, "audio": True}


def test_a_window_larger_than_one_decode_is_decoded_in_pieces_to_the_same_answer(hearing_gemma, real_runner):
    """-b 512 against a 750-token window: decoded in two pieces (its tokens are read causally),
    as llama.cpp's helper does, the answer the one from a single decode (batch-invariant)."""
    whole = real_runner(hearing_gemma, 1, slot_ctx=2048, n_batch=1024, batch_invariant=True).run_batch([hear(CLIP)])
    pieces = real_runner(hearing_gemma, 2, slot_ctx=2048, n_batch=512, batch_invariant=True).run_batch(
        [hear(CLIP), Request(prompt="The weather today is", sampling=GREEDY)])
    assert [result.error for result in pieces] == [None, None]
    assert pieces[0].text == whole[0].text and pieces[0].prompt_tokens == whole[0].prompt_tokens
