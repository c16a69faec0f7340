"""Tool calling on both registry models (neither template knows tools: the generic format):
forced calls always parse and validate, streamed or not, through the openai client too, and a
conversation's next turn reuses what its call computed."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from helpers import TEST_SEED, TEST_THREADS, serving
from multiseq import FinishReason, Request, SamplingParams
from multiseq.tools import ChoiceMode, Tool, ToolChoice
from multiseq.server import ServerSettings, create_app

pytestmark = pytest.mark.model

# Strings of bounded length, so that a forced call surely ends within CALL_MAX_TOKENS (a small
# model may write a path until max_tokens: Gemma 3 did, here): a call is its compact JSON
# (runner/tools/grammars.py: fixed separators, numbers of bounded length) of under 250 bytes,
# and every token the grammar lets through holds at least one.
TOOLS = (
    Tool("get_weather", "The current weather in a city", {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}),
    Tool("read_file", "Read a file of the repository", {
        "type": "object", "properties": {"path": {"type": "string", "maxLength": 24}, "max_lines": {"type": "integer"}},
        "required": ["path"]}),
)
CALL_MAX_TOKENS = 256
QUESTIONS = ["What is the weather like in Paris?", "Show me the file src/main.py.",
             "Is it raining in Tokyo right now?", "Read README.md and summarize it."]
FORCED = [ToolChoice(ChoiceMode.REQUIRED), ToolChoice(ChoiceMode.FUNCTION, "read_file")]


def assert_valid_calls(result) -> None:
    """The output is calls, each naming a tool, its arguments valid under that tool's parameters."""
    assert result.finish_reason is FinishReason.TOOL_CALLS, (result.finish_reason, result.text, result.tool_call_error)
    schemas = {tool.name: tool.parameters for tool in TOOLS}
    for call in result.tool_calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])


@pytest.mark.parametrize("model_name", ["smollm", "gemma"])
def test_forced_calls_parse_and_validate_on_both_models(request, real_runner, model_name):
    runner = real_runner(request.getfixturevalue(model_name), parallel=4, slot_ctx=1024)
    # One call per answer: given the choice, a small model adds call after call to the list.
    requests = [Request(messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=choice,
                        parallel_tool_calls=False, sampling=SamplingParams(max_tokens=CALL_MAX_TOKENS, temperature=0))
                for question in QUESTIONS for choice in FORCED]
    results = runner.run_batch(requests)
    for result in results:
        assert_valid_calls(result)
    assert all(result.tool_calls[0].name == "read_file" for result in results[1::2])


@pytest.fixture(scope="module")
def client(unpacked_model):
    from multiseq import Runner, RunnerConfig

    model = unpacked_model("smollm2-135m")
    runner = Runner.on_model(model, RunnerConfig(model=model.path, parallel=2, slot_ctx=1024, seed=TEST_SEED,
                                                 threads=TEST_THREADS, batch_invariant=True))
    with serving(create_app(runner, ServerSettings(model_name="smollm2-135m"))) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    runner.close()


def test_the_openai_client_reads_the_same_calls_streamed_or_not(client):
    tools = [tool.openai() for tool in TOOLS]
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    chat = client.chat.completions.create(model="smollm2-135m", messages=messages, tools=tools, tool_choice="required",
                                          max_tokens=CALL_MAX_TOKENS, temperature=0, parallel_tool_calls=False)
    [call] = chat.choices[0].message.tool_calls
    stream = client.chat.completions.create(model="smollm2-135m", messages=messages, tools=tools,
                                            tool_choice="required", max_tokens=CALL_MAX_TOKENS, temperature=0,
                                            stream=True, parallel_tool_calls=False)
    pieces = [entry for chunk in stream if chunk.choices for entry in chunk.choices[0].delta.tool_calls or ()]
    assert pieces[0].function.name == call.function.name
    assert "".join(piece.function.arguments or "" for piece in pieces) == call.function.arguments
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0].parameters if call.function.name ==
                        "get_weather" else TOOLS[1].parameters)


def test_the_next_turn_reuses_everything_its_call_computed(smollm, real_runner):
    """The call, sent back in the history as the client got it, re-renders to the very tokens
    the model generated: the next turn prefills only the tool's result and what follows."""
    runner = real_runner(smollm, parallel=2, slot_ctx=1024)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    sampling = SamplingParams(max_tokens=CALL_MAX_TOKENS, temperature=0)
    [first] = runner.run_batch([Request(messages=messages, tools=TOOLS, tool_choice=ToolChoice(ChoiceMode.REQUIRED),
                                        parallel_tool_calls=False, sampling=sampling)])
    assert_valid_calls(first)
    calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
             for call in first.tool_calls]
    history = messages + [{"role": "assistant", "content": None, "tool_calls": calls},
                          {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny, 21 C"}]
    [second] = runner.run_batch([Request(messages=history, tools=TOOLS, sampling=sampling)])
    # Every token of the first turn but its last, which ended it and was never decoded.
    assert second.prompt_tokens_cached == first.prompt_tokens + first.completion_tokens - 1
