"""multiseq's server on a real model (SmolLM2), one uvicorn for the module, spoken to with the
real openai client, sync and async: what a user of the API gets."""

from __future__ import annotations

import asyncio
import http.client
import json

import jsonschema
import openai
import pytest

from helpers import TEST_SEED, TEST_THREADS, sampling_seed, serving, wait_until
from multiseq import Request, SamplingParams
from multiseq.server import ServerSettings, create_app

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
PARALLEL = 4
# Bounded, so that the answer surely ends within SCHEMA_MAX_TOKENS whatever the model writes:
# two strings of at most 16 characters (6 bytes each at most, escaped), the keys and punctuation
# (20 bytes), whitespace in at most 10 places (22 bytes each at most: runner/sampling/schema.py): 436
# bytes, and every token the grammar lets through holds at least one (with the question's 24
# tokens, within the slot's 512).
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                           "country": {"type": "string", "maxLength": 16}},
          "required": ["city", "country"], "additionalProperties": False}
SCHEMA_MAX_TOKENS = 440


@pytest.fixture(scope="module")
def served(unpacked_model):
    """(base URL, runner): a batch-invariant runner (greedy text independent of what shares
    the batch, so answers compare exactly) behind one server for the module."""
    from multiseq import Runner, RunnerConfig

    model = unpacked_model(MODEL)
    runner = Runner.on_model(model, RunnerConfig(model=model.path, parallel=PARALLEL, slot_ctx=512, n_batch=512,
                                                 threads=TEST_THREADS, seed=TEST_SEED, batch_invariant=True))
    with serving(create_app(runner, ServerSettings(model_name=MODEL))) as base:
        yield base, runner
    runner.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_answers_what_the_runner_answers_streamed_or_not(client, served):
    _, runner = served
    messages = ask("What is the capital of France?")
    direct = runner.submit(Request(messages=messages, sampling=SamplingParams(max_tokens=12, temperature=0)))
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert chat.choices[0].message.content == streamed == direct.result(timeout=60).text
    assert chat.usage.completion_tokens <= 12 and chat.usage.prompt_tokens > 5


def test_completions_and_the_prefix_cache_count_cached_tokens(client):
    prompt = "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 2
    # min_tokens: a text to compare, whatever this machine's greedy choice of first token.
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                      extra_body={"min_tokens": 1})
    again = client.completions.create(model=MODEL, prompt=prompt + "every", max_tokens=6, temperature=0,
                                      extra_body={"min_tokens": 1})
    assert first.choices[0].text and again.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens > 0, "the shared start came from a slot's KV"


def test_json_schema_output_validates(client):
    chat = client.chat.completions.create(
        model=MODEL, messages=ask("Where is the Eiffel Tower? Answer in JSON with city and country."),
        max_tokens=SCHEMA_MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}})
    assert chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)


def test_logprobs_and_n_choices(client):
    # min_tokens: tokens to report on, and both choices' text, whatever this machine draws.
    chat = client.chat.completions.create(model=MODEL, messages=ask("Name a colour."), max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=3, extra_body={"min_tokens": 1})
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(entry.top_logprobs) == 3 for entry in content)
    assert all(entry.token == entry.top_logprobs[0].token and entry.logprob <= 0 for entry in content)
    two = client.chat.completions.create(model=MODEL, messages=ask("Say a word."), max_tokens=6, temperature=1.0,
                                         seed=sampling_seed(5), n=2, extra_body={"min_tokens": 6})
    assert [choice.index for choice in two.choices] == [0, 1] and all(choice.message.content for choice in two.choices)
    assert two.usage.completion_tokens == 12, "both choices' tokens, 6 each"
    assert two.usage.total_tokens == two.usage.prompt_tokens + two.usage.completion_tokens


def test_sixteen_streaming_clients_share_decode_steps(served):
    base, runner = served
    runner.reset_stats()

    async def one(client: openai.AsyncOpenAI, index: int) -> str:
        stream = await client.chat.completions.create(model=MODEL, messages=ask(f"Tell me fact number {index}."),
                                                      max_tokens=8, temperature=0, stream=True,
                                                      extra_body={"min_tokens": 1})  # a text, whatever the model
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client, index) for index in range(16)))

    texts = asyncio.run(main())
    assert len(texts) == 16 and all(texts)
    assert runner.stats().avg_seqs_per_decode_step > 1, "the streams were decoded together"


def test_a_disconnected_stream_frees_its_slot(served):
    base, runner = served
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
    connection.request("POST", "/v1/completions", body=json.dumps(
        # ignore_eos: still generating when the client goes, wherever the model would end.
        {"prompt": "Write a very long story:", "max_tokens": 400, "stream": True, "temperature": 0,
         "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.readline().startswith(b"data: ")
    cancelled_before = runner.engine.stats.finished_by_reason["cancelled"]
    response.close()
    connection.close()
    wait_until(lambda: runner.engine.stats.finished_by_reason["cancelled"] > cancelled_before
               and not runner.snapshot().num_running, timeout=30, what="the cancel and a free slot")
