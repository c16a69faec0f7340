"""/v1/completions with echo and logprobs, as lm-evaluation-harness scores with it (prompts as
token ids, several in one body, the answer's last entry its generated token), on the fake
backend through HTTP."""

from __future__ import annotations

import json

import pytest
from fakes import BOS, FakeBackend
from helpers import post_json
from multiseq.server import ServerSettings, create_app


@pytest.fixture
def base(make_runner, serve_app):
    return serve_app(create_app(make_runner(FakeBackend(noisy=True)), ServerSettings(model_name="fake-model")))


def complete(base: str, **body) -> tuple[int, dict]:
    status, data = post_json(base, "/v1/completions", {"model": "fake-model", **body})
    return status, json.loads(data)


def test_an_echoed_prompt_comes_back_with_a_log_probability_for_every_token_after_the_first(base):
    status, body = complete(base, prompt="Hello there", max_tokens=1, logprobs=1, echo=True, temperature=0)
    assert status == 200
    [choice] = body["choices"]
    logprobs = choice["logprobs"]
    tokens = [BOS, *b"Hello there"]
    assert choice["text"].startswith("Hello there") and len(choice["text"]) == len("Hello there") + 1
    assert len(logprobs["tokens"]) == len(tokens) + 1, "every prompt token, then the generated one"
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(isinstance(value, float) and value <= 0 for value in logprobs["token_logprobs"][1:])
    assert all(len(top) == 1 for top in logprobs["top_logprobs"][1:])
    assert logprobs["tokens"][1:-1] == [chr(byte) for byte in b"Hello there"]
    # lm-eval's rule: a continuation is greedy when each token's logprob is its row's best.
    generated_top = logprobs["top_logprobs"][-1]
    assert logprobs["token_logprobs"][-1] == max(generated_top.values()), "greedy: the generated token is the best"
    assert body["usage"]["prompt_tokens"] == len(tokens) and body["usage"]["completion_tokens"] == 1


def test_token_id_prompts_in_one_body_each_get_a_choice_scored_as_it_would_be_alone(base):
    contexts = [[*b"The sky is"], [*b"Two and two"]]
    continuations = [[*b" blue"], [*b" make four"]]
    prompts = [context + continuation for context, continuation in zip(contexts, continuations)]
    status, together = complete(base, prompt=prompts, max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234)
    assert status == 200 and [choice["index"] for choice in together["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, together["choices"]):
        _, alone = complete(base, prompt=[prompt], max_tokens=1, logprobs=1, echo=True, temperature=0)
        assert choice["logprobs"]["token_logprobs"] == alone["choices"][0]["logprobs"]["token_logprobs"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(prompt) + 1, "token ids go in as they are: no BOS"
    assert together["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_max_tokens_0_with_echo_scores_the_prompt_alone(base):
    status, body = complete(base, prompt="Score me", max_tokens=0, logprobs=0, echo=True)
    [choice] = body["choices"]
    assert status == 200 and choice["text"] == "Score me" and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(b"Score me") + 1 and body["usage"]["completion_tokens"] == 0


def test_echo_without_logprobs_repeats_the_prompts_text(base):
    status, body = complete(base, prompt=[[104, 105]], max_tokens=2, echo=True, temperature=0)
    assert status == 200 and body["choices"][0]["text"].startswith("hi") and body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": [[104, 99999]], "echo": True, "logprobs": 1, "max_tokens": 1}, None, "99999 is not in the vocabulary"),
    ({"prompt": "x", "echo": True, "n": 2, "max_tokens": 1}, "n", "takes n = 1"),
    ({"prompt": "x" * 300, "echo": True, "logprobs": 1, "max_tokens": 1}, None, "context window is 256 tokens"),
])
def test_bad_scoring_input_is_a_400_naming_what_is_wrong(base, body, param, words):
    status, answer = complete(base, **body)
    assert status == 400 and words in answer["error"]["message"]
    if param:
        assert answer["error"]["param"] == param


def streamed(base: str, **body) -> list[dict]:
    import urllib.request

    request = urllib.request.Request(f"{base}/v1/completions", method="POST",
                                     data=json.dumps({"model": "fake-model", "stream": True, **body}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]


def joined_choice(chunks: list[dict], index: int) -> dict:
    """A streamed choice put together: its text, its logprobs' lists, its finish_reason."""
    choices = [choice for chunk in chunks for choice in chunk["choices"] if choice["index"] == index]
    logprobs = [choice["logprobs"] for choice in choices if choice["logprobs"]]
    return {"text": "".join(choice["text"] for choice in choices),
            "finish_reason": choices[-1]["finish_reason"],
            "logprobs": {key: [value for entry in logprobs for value in entry[key]]
                         for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")} if logprobs else None}


@pytest.mark.parametrize("fields", [
    dict(prompt="Hello there", max_tokens=3, logprobs=1),
    dict(prompt=[[*b"The sky is"], [*b"Two and two"]], max_tokens=2, logprobs=2, seed=7),
    dict(prompt="Hello there", max_tokens=0, logprobs=1),
    dict(prompt="Hello there", max_tokens=2),
])
def test_a_streamed_echo_puts_together_as_the_whole_answer(base, fields):
    """The prompt comes first (its text, and its tokens' logprobs as soon as it was computed),
    then the output: joined, the chunks are the answer the same body gets unstreamed."""
    _, whole = complete(base, echo=True, temperature=0, **fields)
    chunks = streamed(base, echo=True, temperature=0, stream_options={"include_usage": True}, **fields)
    for choice in whole["choices"]:
        together = joined_choice(chunks, choice["index"])
        first = next(c for chunk in chunks for c in chunk["choices"] if c["index"] == choice["index"])
        assert choice["text"].startswith(first["text"]) and first["text"], "the prompt's text first"
        assert together["text"] == choice["text"] and together["finish_reason"] == choice["finish_reason"]
        assert together["logprobs"] == choice["logprobs"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # (the second run reuses the first's prompt)
    assert [chunks[-1]["usage"][key] for key in counts] == [whole["usage"][key] for key in counts]
