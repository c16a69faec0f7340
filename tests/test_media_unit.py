"""Images in prompts on the fake backend: a medium stands as placeholder tokens made from its
content, is prefilled whole in a chunk of its own, is reused as a prefix like text (never from
inside it), and a prompt that cannot hold its media is refused alone."""

from __future__ import annotations

from fakes import FAKE_MEDIA_TOKENS, FakeBackend, fake_media_name
from multiseq import MEDIA_MARKER, Request, SamplingParams
from multiseq.llama.batch import ChunkRules

CAT, DOG = b"\x89PNG a cat", b"\x89PNG a dog"
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def ask(image: bytes, question: str, **fields) -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "image", "data": image},
                                                         {"type": "text", "text": question}]}],
                   sampling=GREEDY, **fields)


def test_a_medium_is_prefilled_whole_and_alone_and_its_answer_depends_on_it(make_runner):
    backend = FakeBackend(replies={f"<user>{fake_media_name(CAT)}What is it?<assistant>": "a cat",
                                   f"<user>{fake_media_name(DOG)}What is it?<assistant>": "a dog"})
    with make_runner(backend, step_tokens=4) as runner:  # a budget smaller than a medium
        cat, dog = runner.run_batch([ask(CAT, "What is it?"), ask(DOG, "What is it?")])
    assert (cat.text, dog.text) == ("a cat", "a dog")
    assert sorted(placeholder for _, placeholder in backend.media_decodes) == sorted(
        {token for token in runner.prompt_tokens(ask(CAT, "What is it?")) + runner.prompt_tokens(ask(DOG, "x"))
         if token < 0})
    assert cat.prompt_tokens == len("<user>What is it?<assistant>") + 1 + FAKE_MEDIA_TOKENS


def test_one_image_asked_again_is_computed_once(make_runner):
    backend = FakeBackend(num_slots=1)
    with make_runner(backend) as runner:
        first = runner.run_batch([ask(CAT, "What is it?")])[0]
        again = runner.run_batch([ask(CAT, "What color is it?")])[0]
    assert len(backend.media_decodes) == 1, "the second question reuses the image's KV"
    assert again.prompt_tokens_cached >= 1 + len("<user>") + FAKE_MEDIA_TOKENS
    assert first.error is None and again.error is None


def test_another_image_is_not_taken_for_the_first(make_runner):
    backend = FakeBackend(num_slots=1)
    with make_runner(backend) as runner:
        runner.run_batch([ask(CAT, "What is it?")])
        other = runner.run_batch([ask(DOG, "What is it?")])[0]
    assert other.prompt_tokens_cached == 1 + len("<user>"), "the text before the image, nothing of it"
    assert len(backend.media_decodes) == 2


def test_a_reused_prefix_that_would_end_inside_a_medium_ends_before_it(make_runner):
    """The chunk rules leave the last 16 of the 26 prompt tokens to compute, so they would reuse
    10 (inside the image, at 7 to 13): the prefix ends where the image starts."""
    backend = FakeBackend(num_slots=1, chunk_rules=ChunkRules(min_tokens=16, alignment=1, exact_reuse=True))
    with make_runner(backend) as runner:
        runner.run_batch([ask(CAT, "ab")])
        again = runner.run_batch([ask(CAT, "ac")])[0]
    assert again.error is None and again.prompt_tokens_cached == 1 + len("<user>")
    assert len(backend.media_decodes) == 2


def test_a_prompt_string_places_its_media_with_the_marker(make_runner):
    backend = FakeBackend(replies={f"Look: {fake_media_name(CAT)} Well?": "a cat"})
    with make_runner(backend) as runner:
        [result] = runner.run_batch([Request(prompt=f"Look: {MEDIA_MARKER} Well?", media=(CAT,), sampling=GREEDY)])
    assert result.text == "a cat"


def test_media_that_do_not_fit_or_cannot_be_read_fail_their_request_alone(make_runner):
    backend = FakeBackend(window=32)
    with make_runner(backend) as runner:
        long, unreadable, fine = runner.run_batch([
            ask(CAT, "x" * 40), ask(b"not an image", "What is it?"), ask(DOG, "Hi")])
    assert "the prompt has" in long.error and "context window is 32 tokens" in long.error
    assert unreadable.error == "media 0 is not an image or audio that llama.cpp can read (12 bytes)"
    assert fine.error is None


def test_a_medium_is_encoded_beside_the_steps_while_a_stream_is_watched(make_runner, stepped_engine):
    """With a stream decoding, the image waits for its encoding beside the steps (the stream's
    tokens keep coming); with none, the step that needs the image encodes it at once."""
    backend = FakeBackend(num_slots=2)
    stepped = stepped_engine(backend)
    stream = stepped.submit(Request(prompt="Tell me", sampling=SamplingParams(max_tokens=30, temperature=0)),
                            streams=True)
    stepped.step()  # the stream's prompt
    image = stepped.submit(ask(CAT, "What is it?"))
    while not {image, stream} <= stepped.results.keys():
        stepped.step()
    assert stepped.result(image).error is None and stepped.result(stream).error is None
    assert backend.beside_checks.count(backend.media_decodes[0][1]) == backend.encode_checks + 1
    quiet = FakeBackend(num_slots=2)
    with make_runner(quiet) as runner:
        runner.run_batch([Request(prompt="Tell me", sampling=GREEDY), ask(CAT, "What is it?")])
    assert quiet.beside_checks == [] and len(quiet.media_decodes) == 1


def test_llama_servers_completion_takes_a_prompt_with_multimodal_data(make_runner, serve_app):
    """/completion's {"prompt_string" with <__media__>, "multimodal_data": [base64]}, as
    llama-server takes it."""
    import base64
    import json

    from helpers import post_json
    from multiseq.server import ServerSettings, create_app
    from tiny_projectors import image_of

    png = image_of(8, 8, seed=4)
    backend = FakeBackend(replies={f"Look: {fake_media_name(png)} Well?": "a square"})
    base = serve_app(create_app(make_runner(backend), ServerSettings(model_name="fake")))
    status, data = post_json(base, "/completion", {"prompt": {"prompt_string": "Look: <__media__> Well?",
                                                              "multimodal_data": [base64.b64encode(png).decode()]},
                                                   "n_predict": 8, "temperature": 0})
    assert status == 200 and json.loads(data)["content"] == "a square"
    status, data = post_json(base, "/completion", {"prompt": {"prompt_string": "No marker", "multimodal_data": [
        base64.b64encode(png).decode()]}, "n_predict": 8})
    assert status == 400 and "places 0 media (<__media__>), and 1 are given" in json.loads(data)["error"]["message"]


def test_a_medium_larger_than_a_decode_goes_alone_when_read_causally_and_is_refused_otherwise(make_runner):
    """n_batch 4 against a medium of 6 tokens: read causally (audio), it is the step's only
    prompt chunk, beside the decoding tokens (the backend decodes it in pieces); read both ways
    (Gemma 3's images), it cannot be, and its request alone fails saying so."""
    causal = FakeBackend(n_batch=4, replies={f"<user>{fake_media_name(CAT)}What is it?<assistant>": "a cat"})
    causal.media_non_causal = False
    with make_runner(causal) as runner:
        heard, plain = runner.run_batch([ask(CAT, "What is it?"), Request(prompt="Hi there", sampling=GREEDY)])
    assert (heard.error, heard.text, plain.error) == (None, "a cat", None)
    medium_steps = [call for call in causal.calls if any(count == FAKE_MEDIA_TOKENS for _, count, _ in call.entries)]
    assert medium_steps and all(sum(prefill for *_, prefill in call.entries) == 1 for call in medium_steps)
    both_ways = FakeBackend(n_batch=4)
    with make_runner(both_ways) as runner:
        refused, fine = runner.run_batch([ask(CAT, "What is it?"), Request(prompt="Hi", sampling=GREEDY)])
    assert refused.error.startswith("a medium takes 6 tokens, more than one llama_decode holds (-b/--batch-size 4)")
    assert fine.error is None
