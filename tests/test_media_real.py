"""Images through llama.cpp's multimodal library on Gemma 3 270M with a tiny random projector
(tests/tiny_projectors.py): the answer does not depend on what runs beside it or on a reused
prefix, an image asked again is not computed again, and a model without a projector, or a
file llama.cpp cannot decode, fails its request alone."""

from __future__ import annotations

import base64
import json
import urllib.request

import anthropic
import openai
import pytest
from helpers import serving
from tiny_projectors import image_of, tiny_gemma3_projector

from multiseq import Request, SamplingParams
from multiseq.server import ServerSettings, create_app

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=8, temperature=0)
IMAGES = {"png": image_of(80, 60, 1), "jpeg": image_of(50, 100, 2, "JPEG"), "alpha": image_of(40, 40, 3, alpha=True)}


@pytest.fixture(scope="module")
def seeing_gemma(unpacked_model, tmp_path_factory, request):
    """Gemma 3 (loaded for batch-invariant runners) with a tiny projector for this module's
    tests, taken off after them."""
    gemma = unpacked_model("gemma3-270m")
    path = tiny_gemma3_projector(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", text_embedding=640)
    gemma.load_projector(str(path), threads=2, flash_attn="off")
    request.addfinalizer(lambda: (gemma.projector.close(), setattr(gemma, "projector", None)))
    return gemma


def ask(image: bytes, question: str = "Describe this image.") -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "image", "data": image},
                                                         {"type": "text", "text": question}]}], sampling=GREEDY)


def test_image_chats_are_answered_the_same_batched_and_alone(seeing_gemma, real_runner):
    requests = [ask(image) for image in IMAGES.values()]
    together = real_runner(seeing_gemma, 4, slot_ctx=1024, batch_invariant=True).run_batch(requests)
    alone = [real_runner(seeing_gemma, 1, slot_ctx=1024, batch_invariant=True).run_batch([request])[0]
             for request in requests]
    assert [result.error for result in together] == [None] * 3
    assert [result.text for result in together] == [result.text for result in alone]
    # BOS, the turn's opening, <start_of_image>, 4 image tokens, <end_of_image>, the question, the model's turn
    assert {result.prompt_tokens for result in together} == {19}


def test_an_image_asked_again_is_reused_not_encoded_again(seeing_gemma, real_runner):
    runner, image = real_runner(seeing_gemma, 1, slot_ctx=1024), image_of(64, 48, 9)
    encoded_before = seeing_gemma.projector.encoded
    runner.run_batch([ask(image)])
    again = runner.run_batch([ask(image, "What color is it?")])[0]
    # BOS and the turn's opening (4), <start_of_image>, the image's 4 tokens, <end_of_image>
    assert again.prompt_tokens_cached == 10
    assert seeing_gemma.projector.encoded - encoded_before == 1


def test_a_reused_prefix_with_an_image_answers_as_one_computed_afresh(seeing_gemma, real_runner):
    """Batch-invariant: a prefix is reused only up to a multiple of 4 tokens, so here to the
    image's start (5), which is computed again: the answer is the one computed from nothing."""
    runner = real_runner(seeing_gemma, 1, slot_ctx=1024, batch_invariant=True)
    runner.run_batch([ask(IMAGES["jpeg"])])
    again = runner.run_batch([ask(IMAGES["jpeg"], "What color is it?")])[0]
    afresh = real_runner(seeing_gemma, 1, slot_ctx=1024, batch_invariant=True, prefix_cache=False).run_batch(
        [ask(IMAGES["jpeg"], "What color is it?")])[0]
    assert again.prompt_tokens_cached == 5 and again.text == afresh.text


def test_a_file_llama_cpp_cannot_decode_fails_its_request_alone(seeing_gemma, real_runner):
    broken = IMAGES["png"][:40]  # a PNG cut short
    bad, good = real_runner(seeing_gemma, 2, slot_ctx=1024).run_batch([ask(broken), ask(IMAGES["jpeg"])])
    assert bad.error == "media 0 is not an image or audio that llama.cpp can read (40 bytes)"
    assert good.error is None


def test_a_model_without_a_projector_says_it_reads_text_only(smollm, real_runner):
    [result] = real_runner(smollm, 1).run_batch([ask(IMAGES["png"])])
    assert result.error == "the model reads text only: give it a projector (--mmproj) to read images or audio"


def data_url(image: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(image).decode()}"


def test_the_three_apis_answer_an_image_as_the_engine_does(seeing_gemma, real_runner):
    """One image and question through Chat Completions (image_url), Responses (input_image) and
    Messages (an image block), with the official clients: the answer the engine gives, every
    time; /props and /v1/models say the model reads images."""
    runner = real_runner(seeing_gemma, 2, slot_ctx=1024, batch_invariant=True)
    expected = runner.run_batch([ask(IMAGES["jpeg"])])[0].text
    url = data_url(IMAGES["jpeg"], "jpeg")
    with serving(create_app(runner, ServerSettings(model_name="gemma"))) as base:
        chat = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0).chat.completions.create(
            model="gemma", max_tokens=8, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe this image."}]}])
        response = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0).responses.create(
            model="gemma", max_output_tokens=8, temperature=0, input=[{"role": "user", "content": [
                {"type": "input_image", "image_url": url}, {"type": "input_text", "text": "Describe this image."}]}])
        message = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0).messages.create(
            model="gemma", max_tokens=8, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                             "data": base64.b64encode(IMAGES["jpeg"]).decode()}},
                {"type": "text", "text": "Describe this image."}]}])
        props = json.loads(urllib.request.urlopen(f"{base}/props").read())
        card = json.loads(urllib.request.urlopen(f"{base}/v1/models").read())["data"][0]
    assert chat.choices[0].message.content == expected
    assert response.output_text == expected
    assert "".join(block.text for block in message.content if block.type == "text") == expected
    assert props["modalities"] == {"vision": True, "audio": False}
    assert card["capabilities"] == ["completion", "multimodal"]


def test_batch_run_captions_a_folder_and_resumes_it(tmp_path, run_cli):
    """batch-run --images DIR: a result per image file, its path the id; a file that is no image
    fails alone; --resume runs what did not succeed."""
    projector = tiny_gemma3_projector(tmp_path / "mmproj.gguf", text_embedding=640)
    photos = tmp_path / "photos"
    (photos / "2026").mkdir(parents=True)
    (photos / "cat.png").write_bytes(IMAGES["png"])
    (photos / "2026" / "dog.jpg").write_bytes(IMAGES["jpeg"])
    (photos / "notes.png").write_bytes(b"not an image at all")
    out = tmp_path / "captions.jsonl"
    common = ["batch-run", "--images", str(photos), "-m", "gemma3-270m", "--mmproj", str(projector), "-n", "4",
              "--temperature", "0", "-o", str(out), "--no-dashboard"]
    first = run_cli(*common)
    records = {record["id"]: record for record in map(json.loads, out.read_text().splitlines())}
    assert first.exit_code == 1 and sorted(records) == ["2026/dog.jpg", "cat.png", "notes.png"]
    assert records["cat.png"]["error"] is None and records["cat.png"]["prompt_tokens"] == 19
    assert "notes.png" not in records or "is not an image or audio" in records["notes.png"]["error"]
    (photos / "notes.png").write_bytes(IMAGES["alpha"])
    again = run_cli(*common, "--resume")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert again.exit_code == 0 and sorted(record["id"] for record in records) == ["2026/dog.jpg", "cat.png",
                                                                                  "notes.png"]
    assert all(record["error"] is None for record in records)


def test_a_hub_model_reads_images_with_its_repositorys_projector(tmp_path, hub_cache, run_cli):
    """-hf OWNER/REPO, offline: the projector beside the model in the repository is loaded (as
    llama.cpp's -hf fetches it), and --no-mmproj leaves it."""
    from helpers import add_hub_repo

    from multiseq import models

    projector = tiny_gemma3_projector(tmp_path / "built-mmproj.gguf", text_embedding=640)
    add_hub_repo(hub_cache, "someone/gemma-3-270m-vision-GGUF", {
        "gemma-3-270m-Q4_K_M.gguf": models.resolve("gemma3-270m").path, "mmproj-gemma-3-270m-f16.gguf": projector})
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "cat", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(IMAGES["png"])}}, {"type": "text", "text": "Hi"}]}]}) + "\n")
    common = ["batch-run", str(lines), "-hf", "someone/gemma-3-270m-vision-GGUF", "--chat-template",
              models.resolve("gemma3-270m").chat_template_fallback, "-n", "2", "--no-dashboard"]
    seeing = run_cli(*common, "-o", str(tmp_path / "seeing.jsonl"))
    blind = run_cli(*common, "--no-mmproj", "-o", str(tmp_path / "blind.jsonl"))
    assert seeing.exit_code == 0, (tmp_path / "seeing.jsonl").read_text()
    assert json.loads((tmp_path / "seeing.jsonl").read_text())["prompt_tokens"] == 16
    assert blind.exit_code == 1 and "reads text only" in json.loads((tmp_path / "blind.jsonl").read_text())["error"]
