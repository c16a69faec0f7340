"""llama-server's native /completion and /apply-template, as editors call them (Continue's
llama.cpp provider, llama.vscode), on the fake backend through HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeBackend
from helpers import TemplateModel
from helpers import post_json as post
from multiseq.server import ServerSettings, create_app

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"


@pytest.fixture
def base(make_runner, serve_app):
    backend = FakeBackend(replies={"Say hi": "hi there. More"})
    return serve_app(create_app(make_runner(backend), ServerSettings(model_name="fake-model")))


def test_completion_answers_in_llama_servers_fields(base):
    status, data = post(base, "/completion", {"prompt": "Say hi", "n_predict": 20, "stop": ["."],
                                              "cache_prompt": True, "n_probs": 2, "temperature": 0})
    answer = json.loads(data)
    assert status == 200 and answer["content"] == "hi there" and answer["stop"] is True
    assert answer["stop_type"] == "word" and answer["stopping_word"] == "."
    assert answer["tokens_predicted"] == len("hi there.") and answer["tokens_evaluated"] == len(b"Say hi") + 1
    probabilities = answer["completion_probabilities"]
    assert [entry["token"] for entry in probabilities] == list("hi there."), "every token predicted, the stop included"
    assert all(len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0 for entry in probabilities)


def test_completion_with_n_predict_ends_at_the_limit_and_streams_piece_by_piece(base):
    status, data = post(base, "/completion", {"prompt": "Say hi", "n_predict": 4, "stream": True, "temperature": 0})
    events = [json.loads(line.removeprefix("data: ")) for line in data.splitlines() if line.startswith("data: ")]
    assert status == 200 and "".join(event["content"] for event in events) == "hi t"
    assert all(event["stop"] is False for event in events[:-1])
    assert events[-1]["stop"] is True and events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] == 4


def test_apply_template_renders_the_chat_as_the_model_sees_it(base):
    status, data = post(base, "/apply-template", {"messages": [{"role": "user", "content": "Hello"}]})
    assert status == 200 and json.loads(data) == {"prompt": "<user>Hello<assistant>"}


@pytest.mark.parametrize("path, body, param", [
    ("/completion", {"n_predict": 4}, "prompt"),
    ("/completion", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ("/completion", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("/apply-template", {"messages": "Hello"}, "messages"),
])
def test_bad_input_is_a_400_naming_the_field(base, path, body, param):
    status, data = post(base, path, body)
    assert status == 400 and json.loads(data)["error"]["param"] == param


class TemplateBackend(FakeBackend):
    """The fake backend with a real model's chat template (its BOS and EOS texts made up)."""

    def __init__(self, template: str) -> None:
        super().__init__()
        self._template = TemplateModel((TEMPLATES / template).read_text())
        self.chat_template_source = self._template.chat_template_source
        self.render_chat = self._template.render_chat


def template_server(make_runner, serve_app, template: str) -> str:
    return serve_app(create_app(make_runner(TemplateBackend(template)), ServerSettings(model_name="fake-model")))


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def test_apply_template_renders_tools_and_template_switches_as_a_chat_would(make_runner, serve_app):
    base = template_server(make_runner, serve_app, "Qwen-Qwen3-0.6B.jinja")
    chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}]}
    status, data = post(base, "/apply-template", chat | {"tools": [WEATHER],
                                                         "chat_template_kwargs": {"enable_thinking": False}})
    prompt = json.loads(data)["prompt"]
    assert status == 200 and '"name": "get_weather"' in prompt.split("</tools>")[-2]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "enable_thinking false closes the thinking"
    status, data = post(base, "/apply-template", chat)
    assert json.loads(data)["prompt"].endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_a_conversation_keeps_its_prompt_when_a_turn_offers_tools(make_runner, serve_app):
    """The messages reach the template in one shape, tools or none: only what the template writes
    for the tools (its system block) differs, and the rest of the conversation's prompt is the same."""
    base = template_server(make_runner, serve_app, "Qwen-Qwen2.5-7B-Instruct.jinja")
    history = {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
    without = json.loads(post(base, "/apply-template", history)[1])["prompt"]
    with_tools = json.loads(post(base, "/apply-template", history | {"tools": [WEATHER]})[1])["prompt"]
    after_system = "<|im_end|>\n<|im_start|>user\nWeather in Paris?"
    assert without[without.index(after_system):] == with_tools[with_tools.index(after_system):]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in without


def test_a_template_that_refuses_the_chat_is_a_400_with_its_message(make_runner, serve_app):
    base = serve_app(create_app(make_runner(TemplateBackend("google-gemma-2-2b-it.jinja")),
                                ServerSettings(model_name="fake-model")))
    status, data = post(base, "/apply-template", {"messages": [{"role": "assistant", "content": "Hi"}]})
    error = json.loads(data)["error"]
    assert status == 400 and "Conversation roles must alternate user/assistant/user/assistant/..." in error["message"]
    assert error["param"] == "messages"
