"""One engine under three APIs: one conversation sent as Chat Completions, as Responses input
items and as Anthropic messages renders to the same prompt tokens, so a session that switches
API keeps its cache. Spoken to with the official clients, on the fake backend (its tokens are
the rendered prompt's bytes, so any difference in the rendering shows in the counts)."""

from __future__ import annotations

import anthropic
import openai
import pytest
from fakes import FakeBackend
from multiseq.server import ServerSettings, create_app

MODEL = "fake-model"
REPLY = "It is sunny in Paris."
SYSTEM = "You are a weather assistant. Answer in one sentence."
QUESTION = ["What is the weather in Paris?", "Use the tool."]  # the user's text, in two parts
CALL_ID = "call_7f3a"  # as a chat client got it; the Anthropic client's id is toolu_ of the same
ARGUMENTS = '{"city": "Paris"}'  # as the grammar has the model write them (json.dumps' separators)
TOOL_OUTPUT = ["Sunny, 21 C", "Wind: light"]  # the tool's result, in two parts
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MAX_TOKENS = 32


class AnyPrompt(dict):
    """Scripted replies for the fake backend: the same reply to every prompt."""

    def get(self, prompt, default=None):
        return REPLY.encode("utf-8")


@pytest.fixture
def app(make_runner):
    backend = FakeBackend(num_slots=2, window=1024, n_batch=64)
    backend.replies = AnyPrompt()
    return create_app(make_runner(backend), ServerSettings(model_name=MODEL))


@pytest.fixture
def base(app, serve_app):
    return serve_app(app)


def as_chat(client: openai.OpenAI):
    """(prompt tokens, cached) of the conversation over Chat Completions."""
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=MAX_TOKENS, temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}],
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": text} for text in QUESTION]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}]},
            {"role": "tool", "tool_call_id": CALL_ID,
             "content": [{"type": "text", "text": text} for text in TOOL_OUTPUT]}])
    assert completion.choices[0].message.content == REPLY
    usage = completion.usage
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def as_responses(client: openai.OpenAI):
    """(prompt tokens, cached) of the conversation over the Responses API, as input items."""
    response = client.responses.create(
        model=MODEL, max_output_tokens=MAX_TOKENS, temperature=0, store=False, instructions=SYSTEM,
        tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": None}],
        input=[
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": text} for text in QUESTION]},
            {"type": "function_call", "call_id": CALL_ID, "name": "get_weather", "arguments": ARGUMENTS},
            {"type": "function_call_output", "call_id": CALL_ID,
             "output": [{"type": "input_text", "text": text} for text in TOOL_OUTPUT]}])
    assert response.output_text == REPLY
    usage = response.usage
    return usage.input_tokens, usage.input_tokens_details.cached_tokens


def as_messages(client: anthropic.Anthropic):
    """(prompt tokens, cached) of the conversation over Anthropic's Messages API."""
    tool_use_id = "toolu_" + CALL_ID.removeprefix("call_")
    message = client.messages.create(
        model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": PARAMETERS}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": text} for text in QUESTION]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": tool_use_id, "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id,
                                          "content": [{"type": "text", "text": text} for text in TOOL_OUTPUT]}]}])
    assert message.content[0].text == REPLY
    usage = message.usage
    return usage.input_tokens + usage.cache_read_input_tokens, usage.cache_read_input_tokens


SENDERS = {"chat": as_chat, "responses": as_responses, "messages": as_messages}


def send(base: str, api: str):
    if api == "messages":
        return SENDERS[api](anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0))
    return SENDERS[api](openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0))


@pytest.mark.parametrize("first, second", [("chat", "responses"), ("responses", "messages"), ("messages", "chat")])
def test_one_conversation_renders_to_the_same_prompt_through_every_api(base, first, second):
    prompt_tokens, cached = send(base, first)
    assert cached == 0, "a fresh server has nothing cached"
    again_tokens, again_cached = send(base, second)
    assert again_tokens == prompt_tokens, f"{first} and {second} rendered different prompts"
    # All the first request computed, bar the last token (decoded again for the next token's logits).
    assert again_cached == prompt_tokens - 1



def output_tokens_ignoring_eos(base: str, api: str, budget: int) -> int:
    """How many tokens a short question's reply came to, with ignore_eos, through `api`."""
    question = [{"role": "user", "content": "Weather?"}]
    extension = {"ignore_eos": True, "temperature": 0}
    if api == "messages":
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        return client.messages.create(model=MODEL, max_tokens=budget, messages=question,
                                      extra_body=extension).usage.output_tokens
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    if api == "responses":
        return client.responses.create(model=MODEL, max_output_tokens=budget, input=question, store=False,
                                       extra_body=extension).usage.output_tokens
    return client.chat.completions.create(model=MODEL, max_tokens=budget, messages=question,
                                          extra_body=extension).usage.completion_tokens


@pytest.mark.parametrize("api", list(SENDERS))
def test_ignore_eos_makes_every_api_generate_its_whole_budget(base, api):
    """llama.cpp's ignore_eos, an extension every API passes on: a benchmark's replies are then
    max_tokens long through each, so the three do the same work."""
    budget = len(REPLY) + 5  # the scripted reply, its EOS ignored, then more
    assert output_tokens_ignoring_eos(base, api, budget) == budget


def test_the_metrics_count_requests_by_the_api_they_came_through(app, base):
    """What the dashboard of `multiseq serve` shows per API."""
    for api in ("chat", "responses", "messages", "messages"):
        send(base, api)
    assert app.state.server.metrics.requests_by_api() == {"chat": 1, "responses": 1, "messages": 2}
