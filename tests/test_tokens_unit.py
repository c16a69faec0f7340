"""POST /tokenize and /detokenize in llama-server's shapes and vLLM's, and GET /tokenizer_info, on the fake backend (a token per
byte, BOS = 256), through HTTP."""

from __future__ import annotations

import http.client
import json

import pytest
from fakes import BOS, FakeBackend
from multiseq.server import ServerSettings, create_app

API_KEY = "sekrit-key"


@pytest.fixture
def server(make_runner, serve_app):
    """server(**settings) -> base URL of an app on a fake backend."""
    def start(**settings):
        return serve_app(create_app(make_runner(FakeBackend()), ServerSettings(model_name="fake-model", **settings)))
    return start


def get(base: str, path: str, headers: dict | None = None) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data)


def post(base: str, path: str, payload: dict, headers: dict | None = None) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json",
                                                                       **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data)


def test_tokenize_and_detokenize_round_trip_with_pieces(server):
    base = server()
    text = "héllo"
    status, plain = post(base, "/tokenize", {"content": text})
    assert status == 200 and plain == {"tokens": list(text.encode("utf-8"))}, "no BOS unless add_special"
    _, special = post(base, "/tokenize", {"content": text, "add_special": True})
    assert special["tokens"] == [BOS, *plain["tokens"]]
    _, pieces = post(base, "/tokenize", {"content": text, "with_pieces": True})
    # "é" is two bytes, so two tokens whose pieces are not whole characters: their byte values
    assert pieces["tokens"] == [{"id": 104, "piece": "h"}, {"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]},
                                {"id": 108, "piece": "l"}, {"id": 108, "piece": "l"}, {"id": 111, "piece": "o"}]
    status, detokenized = post(base, "/detokenize", {"tokens": [token["id"] for token in pieces["tokens"]]})
    assert status == 200 and detokenized["content"] == text
    assert post(base, "/detokenize", {"tokens": special["tokens"]})[1]["content"] == text, "BOS renders as nothing"


@pytest.mark.parametrize("path, payload, field, reason", [
    ("/detokenize", {"tokens": [104, 99999]}, "tokens", "99999 is not in the vocabulary"),
    ("/detokenize", {"tokens": [104, -1]}, "tokens", "-1 is not in the vocabulary"),
    ("/detokenize", {"tokens": "104"}, "tokens", "list of token ids"),
    ("/detokenize", {"tokens": [True]}, "tokens", "list of token ids"),
    ("/tokenize", {"content": 5}, "content", "a string"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces", "true or false"),
    ("/tokenize", {"prompt": ["x"]}, "prompt", "a string"),
    ("/tokenize", {"prompt": "x", "content": "x"}, "prompt", "not both"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": 1}, "add_special_tokens", "true or false"),
])
def test_bad_input_is_a_400_naming_the_field(server, path, payload, field, reason):
    status, body = post(server(), path, payload)
    assert status == 400 and body["error"]["param"] == field and reason in body["error"]["message"]


def test_the_token_routes_want_the_api_key(server):
    base = server(api_key=API_KEY)
    assert post(base, "/tokenize", {"content": "hi"})[0] == 401
    assert post(base, "/detokenize", {"tokens": [104]}, {"x-api-key": "wrong"})[0] == 401
    assert post(base, "/tokenize", {"content": "hi"}, {"Authorization": f"Bearer {API_KEY}"}) == (200, {"tokens": [104, 105]})
    assert post(base, "/detokenize", {"tokens": [104]}, {"x-api-key": API_KEY}) == (200, {"content": "h", "prompt": "h"})
    assert get(base, "/tokenizer_info")[0] == 401
    assert get(base, "/tokenizer_info", {"x-api-key": API_KEY})[0] == 200


def test_vllm_shapes_as_lm_eval_uses_them(server):
    """lm-evaluation-harness's remote tokenizer: GET /tokenizer_info, then /tokenize with
    `prompt` (vLLM adds special tokens unless told not to) and /detokenize read as `prompt`."""
    base = server()
    status, info = get(base, "/tokenizer_info")
    assert status == 200 and info["eos_token"] == "</s>" and info["bos_token"] == "<s>"
    assert info["model_max_length"] > 0 and info["vocab_size"] == 512
    status, tokenized = post(base, "/tokenize", {"prompt": "hi", "add_special_tokens": False})
    assert status == 200 and tokenized["tokens"] == [104, 105] and tokenized["count"] == 2
    assert tokenized["max_model_len"] == info["model_max_length"] and tokenized["token_strs"] is None
    assert post(base, "/tokenize", {"prompt": "hi"})[1]["tokens"] == [BOS, 104, 105], "vLLM's default adds BOS"
    assert post(base, "/tokenize", {"prompt": "hi", "add_special_tokens": False,
                                    "return_token_strs": True})[1]["token_strs"] == ["h", "i"]
    assert post(base, "/detokenize", {"tokens": [104, 105]})[1]["prompt"] == "hi"
