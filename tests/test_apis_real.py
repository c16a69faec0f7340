"""The Responses API and Anthropic's Messages API on a real model (SmolLM2), spoken to with the
official `openai` and `anthropic` clients: a forced tool call carries arguments valid under its
tool's schema, streamed or not, and a streamed answer is the non-streamed one."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from helpers import TEST_SEED, TEST_THREADS, serving
from multiseq.server import ServerSettings, create_app

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
MAX_TOKENS = 64
# Strings of bounded length, so that a forced call surely ends within CALL_MAX_TOKENS, whatever
# the model writes: a call is its compact JSON (runner/tools/grammars.py: fixed separators,
# numbers of bounded length) of under 250 bytes, and every token the grammar lets through holds
# at least one.
SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]},
    "read_file": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 24},
                                                   "max_lines": {"type": "integer"}},
                  "required": ["path"]},
}
CALL_MAX_TOKENS = 256
DESCRIPTIONS = {"get_weather": "The current weather in a city", "read_file": "Read a file of the repository"}
QUESTION = "What is the weather like in Paris?"
TEXT_QUESTION = "What is the capital of France?"
# tool_choice forcing a call: any tool, or the one named (one the question does not ask for).
RESPONSES_CHOICES = {"required": "required", "named": {"type": "function", "name": "read_file"}}
# disable_parallel_tool_use: given the choice, a small model adds call after call.
ANTHROPIC_CHOICES = {"required": {"type": "any", "disable_parallel_tool_use": True},
                     "named": {"type": "tool", "name": "read_file", "disable_parallel_tool_use": True}}
GREEDY = {"temperature": 0}  # this anthropic SDK's create() has no sampling parameters; the API takes them
# The text answers run to max tokens (llama.cpp's ignore_eos, an extension of both APIs): there is
# a text to compare whatever this machine's greedy choice of first token.
EVERY_TOKEN = {"ignore_eos": True}


@pytest.fixture(scope="module")
def base(unpacked_model):
    """The server's base URL: a batch-invariant runner (greedy text independent of what shares
    the batch, so a streamed answer compares exactly with a whole one) for the module."""
    from multiseq import Runner, RunnerConfig

    model = unpacked_model(MODEL)
    runner = Runner.on_model(model, RunnerConfig(model=model.path, parallel=2, slot_ctx=1024, n_batch=512,
                                                 threads=TEST_THREADS, seed=TEST_SEED, batch_invariant=True))
    with serving(create_app(runner, ServerSettings(model_name=MODEL))) as url:
        yield url
    runner.close()


@pytest.fixture
def openai_client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def anthropic_client(base):
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


def assert_valid_call(name: str, arguments: dict, choice: str) -> None:
    """A call of a known tool (the named one, when named), its arguments valid under its schema."""
    assert name in SCHEMAS
    if choice == "named":
        assert name == "read_file"
    jsonschema.validate(arguments, SCHEMAS[name])


# --- the Responses API ---------------------------------------------------------------------------

def responses_arguments(client: openai.OpenAI, choice: str, is_stream: bool):
    """The Response to the forced question, whole or streamed (then its arguments as the
    deltas spelt them, too)."""
    tools = [{"type": "function", "name": name, "description": DESCRIPTIONS[name], "parameters": schema,
              "strict": False} for name, schema in SCHEMAS.items()]
    fields = dict(model=MODEL, input=QUESTION, tools=tools, tool_choice=RESPONSES_CHOICES[choice],
                  parallel_tool_calls=False, max_output_tokens=CALL_MAX_TOKENS, temperature=0, store=False)
    if not is_stream:
        return client.responses.create(**fields), None
    with client.responses.stream(**fields) as stream:
        deltas = "".join(event.delta for event in stream if event.type == "response.function_call_arguments.delta")
        return stream.get_final_response(), deltas


@pytest.mark.parametrize("is_stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("choice", list(RESPONSES_CHOICES))
def test_responses_forced_call_validates(openai_client, choice, is_stream):
    response, deltas = responses_arguments(openai_client, choice, is_stream)
    assert response.status == "completed"
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.call_id and call.status == "completed"
    assert_valid_call(call.name, json.loads(call.arguments), choice)
    if is_stream:
        assert deltas == call.arguments, "the argument deltas add up to the call's arguments"


def test_responses_streamed_answer_is_the_whole_one(openai_client):
    fields = dict(model=MODEL, input=TEXT_QUESTION, max_output_tokens=MAX_TOKENS, temperature=0, store=False,
                  extra_body=EVERY_TOKEN)
    whole = openai_client.responses.create(**fields)
    with openai_client.responses.stream(**fields) as stream:
        events = list(stream)
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    # Cut at max_output_tokens, both end incomplete (the SDK's get_final_response() takes only
    # response.completed): the stream's last event carries its Response.
    assert events[-1].type == "response.incomplete" and whole.status == "incomplete"
    streamed = events[-1].response
    assert whole.output_text, "the model answered something"
    assert streamed.output_text == deltas == whole.output_text
    assert streamed.usage.input_tokens == whole.usage.input_tokens
    assert streamed.usage.output_tokens == whole.usage.output_tokens


# --- Anthropic's Messages API --------------------------------------------------------------------

def anthropic_message(client: anthropic.Anthropic, choice: str, is_stream: bool):
    """The Message answering the forced question, whole or streamed (then its tool_use input
    as the input_json_delta events spelt it, too)."""
    tools = [{"name": name, "description": DESCRIPTIONS[name], "input_schema": schema}
             for name, schema in SCHEMAS.items()]
    fields = dict(model=MODEL, max_tokens=CALL_MAX_TOKENS, tools=tools, tool_choice=ANTHROPIC_CHOICES[choice],
                  messages=[{"role": "user", "content": QUESTION}], extra_body=GREEDY)
    if not is_stream:
        return client.messages.create(**fields), None
    with client.messages.stream(**fields) as stream:
        partial = "".join(event.delta.partial_json for event in stream
                          if event.type == "content_block_delta" and event.delta.type == "input_json_delta")
        return stream.get_final_message(), partial


@pytest.mark.parametrize("is_stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("choice", list(ANTHROPIC_CHOICES))
def test_messages_forced_tool_use_validates(anthropic_client, choice, is_stream):
    message, partial = anthropic_message(anthropic_client, choice, is_stream)
    assert message.stop_reason == "tool_use"
    [tool_use] = [block for block in message.content if block.type == "tool_use"]
    assert tool_use.id.startswith("toolu_")
    assert_valid_call(tool_use.name, tool_use.input, choice)
    if is_stream:
        assert json.loads(partial) == tool_use.input, "the input_json_delta pieces add up to the input"


def test_messages_streamed_answer_is_the_whole_one(anthropic_client):
    fields = dict(model=MODEL, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": TEXT_QUESTION}],
                  extra_body=GREEDY | EVERY_TOKEN)
    whole = anthropic_client.messages.create(**fields)
    with anthropic_client.messages.stream(**fields) as stream:
        deltas = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    [text] = [block.text for block in whole.content if block.type == "text"]
    assert text, "the model answered something"
    assert deltas == streamed.content[0].text == text
    assert streamed.stop_reason == whole.stop_reason
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert (streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
            == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)
