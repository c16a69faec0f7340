"""llama-server's native /completion and /apply-template, as editors call them (Continue's
llama.cpp provider, llama.vscode), on the fake backend through HTTP."""

from __future__ import annotations

import json

import pytest
from fakes import FakeBackend
from helpers import post_json as post
from multiseq.server import ServerSettings, create_app


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
