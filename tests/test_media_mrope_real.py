"""Images on a model with M-RoPE (Qwen2-VL's text model, tiny and random, with a tiny random
Qwen2-VL projector: tests/tiny_models.py and tiny_projectors.py). An image's tokens stand at one
time position and at their row and column, and the text after it resumes at the image's
position plus its larger side in tokens: the slot's KV holds fewer positions than tokens, and a
prefix reused in place, from another slot, from the RAM tier or across KV layouts lands where it
was. Skipped when DeepSeek-R1-Distill-Qwen-7B's header (the tokenizer) cannot be fetched."""

from __future__ import annotations

import pytest
from tiny_models import DataUnavailable, deepseek_qwen_header, tiny_model_with_tokenizer_of
from tiny_projectors import image_of, tiny_qwen2vl_projector

from multiseq import Request, SamplingParams
from multiseq.llama.kv_states import cell_positions
from multiseq.loading import open_model

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
# A second question that starts as the first: a batch-invariant prefix (a multiple of 4 tokens)
# then ends in its words, past the image, rather than inside it (where it is cut back to its start).
AGAIN = "Describe this image in a few words, then say its color."
AND_AGAIN = "Describe this image in a few words, then say its shape."
# 112 x 84 pixels: 4 x 3 tokens of 28 pixels, 4 positions; 200 x 60: resized to 8 x 2 (or so) tokens
WIDE, SQUARE, TALL = image_of(200, 60, 1), image_of(112, 84, 2, "JPEG"), image_of(56, 140, 3, alpha=True)


@pytest.fixture(scope="module")
def qwen_vl(tmp_path_factory):
    try:
        header = deepseek_qwen_header()
    except DataUnavailable as error:
        pytest.skip(f"DeepSeek-R1-Distill-Qwen-7B's GGUF header is not cached and could not be fetched: {error}")
    folder = tmp_path_factory.mktemp("qwen2vl")
    model = open_model(tiny_model_with_tokenizer_of(header, folder / "qwen2vl.gguf", arch="qwen2vl"),
                       repack_weights=False)  # for batch-invariant runners
    model.load_projector(str(tiny_qwen2vl_projector(folder / "mmproj.gguf", text_embedding=64)), threads=2,
                         flash_attn="off")
    assert model.projector.uses_mrope
    yield model
    model.projector.close()
    model.close()


def ask(image: bytes, question: str = "Describe this image in a few words, please.") -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "image", "data": image},
                                                         {"type": "text", "text": question}]}], sampling=GREEDY)


def image_layout(model, image: bytes) -> tuple[int, int, int]:
    """The image's placeholder token, its tokens and its positions, as the projector cuts it."""
    [span] = model.tokenize_media(["", ""], [image]).spans
    return span.media.placeholder, span.media.num_tokens, span.media.num_positions


def held_positions(runner, slot: int) -> list[int]:
    """The positions of the slot's KV cells, as llama.cpp saves them (time positions, in order)."""
    state = runner.backend.save_slot(slot)
    return sorted(cell_positions(state)[:, 0].tolist()) if state is not None else []


def expected_positions(model, tokens, images: list[bytes]) -> list[int]:
    """Where llama.cpp's multimodal helper puts these tokens: text one after another, an
    image's tokens at one position, the text after it that many positions on as its larger side."""
    layouts = {placeholder: (count, extent) for placeholder, count, extent in
               (image_layout(model, image) for image in images)}
    tokens, positions, at, index = [int(token) for token in tokens], [], 0, 0
    while index < len(tokens):
        count, extent = layouts.get(tokens[index], (1, 1))
        positions += [at] * count
        at, index = at + extent, index + count
    return positions


def kept_tokens(runner, slot: int):
    return runner.engine.scheduler.slots[slot].kept


def test_text_after_an_image_resumes_at_its_extent_not_its_token_count(qwen_vl, real_runner):
    runner = real_runner(qwen_vl, 1, slot_ctx=1024)
    [result] = runner.run_batch([ask(WIDE)])
    _, tokens, positions = image_layout(qwen_vl, WIDE)
    assert result.error is None and tokens > positions > 1
    kept = kept_tokens(runner, 0)  # the conversation, kept in the slot for a later turn
    assert held_positions(runner, 0) == expected_positions(qwen_vl, kept, [WIDE])
    assert held_positions(runner, 0)[-1] == len(kept) - 1 - (tokens - positions)


def test_images_answer_the_same_batched_and_alone(qwen_vl, real_runner):
    requests = [ask(image) for image in (WIDE, SQUARE, TALL)]
    together = real_runner(qwen_vl, 3, slot_ctx=1024, batch_invariant=True).run_batch(requests)
    alone = [real_runner(qwen_vl, 1, slot_ctx=1024, batch_invariant=True).run_batch([request])[0]
             for request in requests]
    assert [result.error for result in together] == [None] * 3
    assert [result.text for result in together] == [result.text for result in alone]


def test_in_one_pool_a_slot_takes_an_images_cells_from_another(qwen_vl, real_runner):
    runner = real_runner(qwen_vl, 2, kv_pool=2048, kv_layout="pool")
    first = runner.run_batch([ask(TALL)])
    both = runner.run_batch([ask(TALL, AGAIN), ask(TALL, AND_AGAIN)])  # one in place, one beside it
    assert [result.error for result in first + both] == [None] * 3
    assert min(result.prompt_tokens_cached for result in both) >= image_layout(qwen_vl, TALL)[1]
    for slot in range(2):
        assert held_positions(runner, slot) == expected_positions(qwen_vl, kept_tokens(runner, slot), [TALL])


def test_a_prefix_reused_in_place_from_another_slot_or_from_ram_stands_where_it_was(qwen_vl, real_runner):
    """Each time the slot's KV holds its tokens at llama.cpp's positions, and the answer is the
    one computed afresh (batch-invariant runners)."""
    afresh = [real_runner(qwen_vl, 1, slot_ctx=1024, batch_invariant=True, prefix_cache=False).run_batch(
        [ask(image, question)])[0].text for image, question in ((WIDE, AGAIN), (SQUARE, AGAIN), (SQUARE, AND_AGAIN))]
    runner = real_runner(qwen_vl, 1, slot_ctx=1024, batch_invariant=True)
    runner.run_batch([ask(WIDE)])
    in_place = runner.run_batch([ask(WIDE, AGAIN)])[0]
    in_place_positions = held_positions(runner, 0) == expected_positions(qwen_vl, kept_tokens(runner, 0), [WIDE])
    runner.run_batch([ask(SQUARE)])  # the slot's WIDE conversation goes to the RAM tier
    from_ram = runner.run_batch([ask(WIDE, AGAIN)])[0]
    from_ram_positions = held_positions(runner, 0) == expected_positions(qwen_vl, kept_tokens(runner, 0), [WIDE])
    two = real_runner(qwen_vl, 2, slot_ctx=1024, batch_invariant=True)
    two.run_batch([ask(WIDE), ask(SQUARE)])
    both = two.run_batch([ask(SQUARE, AGAIN), ask(SQUARE, AND_AGAIN)])  # one in place, one from the other slot
    assert [in_place_positions, from_ram_positions] == [True, True]
    for slot in range(2):
        assert held_positions(two, slot) == expected_positions(qwen_vl, kept_tokens(two, slot), [SQUARE])
    tokens = image_layout(qwen_vl, WIDE)[1]
    assert in_place.prompt_tokens_cached >= tokens and from_ram.prompt_tokens_cached >= tokens
    assert min(result.prompt_tokens_cached for result in both) >= image_layout(qwen_vl, SQUARE)[1]
    assert [in_place.text, from_ram.text, *(result.text for result in both)] == [afresh[0], *afresh]
