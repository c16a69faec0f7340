"""Who the server lets in, and what it takes from them, on the fake backend: the API key on
every route but /health (mounted under a prefix too), JSON bodies only, the Host and Origin
checks against DNS rebinding and other sites' pages, CORS, input bounds, and the fields other
clients send. Raw http.client requests make the refusals; the openai client, the requests that
must pass."""

from __future__ import annotations

import http.client
import json

import openai
import pytest
from fakes import FakeBackend
from multiseq.server import ServerSettings, create_app
from multiseq.server.door import allowed_hosts_for
from starlette.applications import Starlette
from starlette.routing import Mount

MODEL = "fake-model"
HI = "<user>Hi<assistant>"
REPLY = "Hello there, friend!"
USER_HI = [{"role": "user", "content": "Hi"}]
KEY = "s3cret"
CHAT = "/v1/chat/completions"


@pytest.fixture
def server(make_runner, serve_app):
    """server(**settings) -> (openai client, base URL)."""
    def start(backend: FakeBackend | None = None, **settings):
        backend = backend or FakeBackend(num_slots=4, window=256, n_batch=64, replies={HI: REPLY})
        app = create_app(make_runner(backend), ServerSettings(model_name=MODEL, **settings))
        base = serve_app(app)
        return openai.OpenAI(base_url=f"{base}/v1", api_key=settings.get("api_key") or "unused", max_retries=0), base
    return start


def call(base: str, method: str, path: str, body: bytes | str | None = None,
         headers: dict | None = None) -> tuple[int, dict | None, dict]:
    """A raw request: (status, JSON body or None when not JSON, lowercased headers). JSON is declared unless
    the headers say otherwise; Host is http.client's (the address connected to) unless given."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    sent = ({"Content-Type": "application/json"} if body is not None else {}) | (headers or {})
    connection.request(method, path, body=body, headers=sent)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    headers = {name.lower(): value for name, value in response.getheaders()}
    is_json = headers.get("content-type", "").startswith("application/json")
    return response.status, json.loads(data) if is_json else None, headers


def chat_body(**fields) -> str:
    return json.dumps({"messages": USER_HI, "max_tokens": 3} | fields)


def assert_openai_error(body: dict, code: str | None = None, param: str | None = None) -> None:
    assert set(body) == {"error"} and body["error"]["message"]
    assert body["error"]["code"] == code and body["error"]["param"] == param


# --- 7. deny by default ----------------------------------------------------------------------------

def test_a_mounted_app_wants_the_key_on_every_route_but_health(make_runner, serve_app):
    inner = create_app(make_runner(FakeBackend(replies={HI: REPLY})), ServerSettings(model_name=MODEL, api_key=KEY))
    outer = Starlette(routes=[Mount("/api", app=inner)])
    outer.state.server = inner.state.server  # what the test server stops and closes
    base = serve_app(outer)
    assert call(base, "GET", "/api/health")[0] == 200
    for path in ("/api/v1/models", "/api/metrics", "/api/v1/nothing-here"):
        assert call(base, "GET", path)[0] == 401, path
    status, body, _ = call(base, "POST", "/api/v1/messages", json.dumps({"max_tokens": 3, "messages": USER_HI}))
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    client = openai.OpenAI(base_url=f"{base}/api/v1", api_key=KEY, max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=USER_HI).choices[0].message.content == REPLY
    assert call(base, "GET", "/api/metrics", headers={"x-api-key": KEY})[0] == 200


def test_llama_servers_aliases_answer_and_want_the_key_as_their_routes_do(server):
    """A client given the server's root as its OpenAI base URL (Continue's llama.cpp provider)
    posts to /chat/completions; llama-server also answers /models, /responses and, without a
    key, /v1/health."""
    client, base = server(api_key=KEY)
    root = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
    assert root.chat.completions.create(model=MODEL, messages=USER_HI).choices[0].message.content == REPLY
    assert [model.id for model in root.models.list()] == [MODEL]
    assert root.responses.create(model=MODEL, input="Hi", store=False).output_text == REPLY
    assert call(base, "GET", "/v1/health")[0] == 200
    for method, path, body in (("POST", "/chat/completions", chat_body()), ("GET", "/models", None),
                               ("POST", "/responses", json.dumps({"input": "Hi"}))):
        assert call(base, method, path, body)[0] == 401, path


# --- 8. other sites and rebinding ----------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_415_in_the_shape_of_its_api(server, content_type):
    _, base = server()
    headers = {"Content-Type": content_type} if content_type else {"Content-Type": ""}
    status, body, _ = call(base, "POST", CHAT, chat_body(), headers)
    assert status == 415 and "application/json" in body["error"]["message"]
    assert_openai_error(body, "unsupported_media_type")
    status, body, _ = call(base, "POST", "/v1/messages", json.dumps({"max_tokens": 3, "messages": USER_HI}), headers)
    assert status == 415 and body["type"] == "error" and "application/json" in body["error"]["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.api+json",
                                          "Application/JSON"])
def test_json_with_parameters_or_a_json_suffix_is_taken(server, content_type):
    _, base = server()
    status, body, _ = call(base, "POST", CHAT, chat_body(), {"Content-Type": content_type})
    assert status == 200 and body["object"] == "chat.completion"


def test_a_host_header_naming_another_server_is_refused(server):
    _, base = server()
    port = base.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "[::1"):
        status, body, _ = call(base, "GET", "/v1/models", headers={"Host": host})
        assert status == 421, host
        assert_openai_error(body, "host_not_allowed")
        assert "--allowed-hosts" in body["error"]["message"]
    for host in (f"localhost:{port}", "LOCALHOST", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert call(base, "GET", "/v1/models", headers={"Host": host})[0] == 200, host


def test_allowed_hosts_adds_names_and_a_star_allows_any(server):
    _, base = server(allowed_hosts=("my.lan", "*.team.example"))
    assert call(base, "GET", "/v1/models", headers={"Host": "my.lan:8080"})[0] == 200
    assert call(base, "GET", "/v1/models", headers={"Host": "box.team.example"})[0] == 200
    assert call(base, "GET", "/v1/models", headers={"Host": "other.lan"})[0] == 421
    _, open_base = server(allowed_hosts=("*",))
    assert call(open_base, "GET", "/v1/models", headers={"Host": "anything.example"})[0] == 200


def test_the_hosts_a_bound_address_allows():
    assert allowed_hosts_for("0.0.0.0", ()) == ("*",), "every interface, no names given: any (with a warning)"
    assert allowed_hosts_for("0.0.0.0", ("my.lan",)) == ("my.lan",)
    assert allowed_hosts_for("box.lan", ()) == ("box.lan",), "a name bound is a name clients use"


def test_a_request_from_another_sites_page_is_refused(server):
    _, base = server()
    status, body, headers = call(base, "POST", CHAT, chat_body(), {"Origin": "http://evil.example"})
    assert status == 403 and "access-control-allow-origin" not in headers
    assert_openai_error(body, "origin_not_allowed")
    assert "--cors-origins" in body["error"]["message"]
    status, body, _ = call(base, "POST", "/v1/messages", json.dumps({"max_tokens": 3, "messages": USER_HI}),
                           {"Origin": "null"})
    assert status == 403 and body["error"]["type"] == "permission_error"
    assert call(base, "POST", CHAT, chat_body(), {"Origin": base})[0] == 200, "the server's own origin"


def test_cors_origins_lets_a_site_in_with_cors_headers_and_preflights_before_the_key(server):
    _, base = server(api_key=KEY, cors_origins=("http://app.example",))
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    status, _, headers = call(base, "OPTIONS", CHAT, headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    assert "authorization" in headers["access-control-allow-headers"].lower()
    status, _, headers = call(base, "POST", CHAT, chat_body(), {"Origin": "http://app.example",
                                                                "Authorization": f"Bearer {KEY}"})
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    assert call(base, "POST", CHAT, chat_body(), {"Origin": "http://app.example"})[0] == 401
    assert call(base, "OPTIONS", CHAT, headers=preflight | {"Origin": "http://evil.example"})[0] == 403


# --- 9. input bounds --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, param", [
    ('{"messages": [{"role": "user", "content": "Hi"}], "temperature": Infinity}', "temperature"),
    ('{"messages": [{"role": "user", "content": "Hi"}], "top_p": NaN}', "top_p"),
    ('{"messages": [{"role": "user", "content": "Hi"}], "temperature": -1e999}', "temperature"),
    ('{"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"65": -Infinity}}', "logit_bias.65"),
])
def test_nan_and_infinity_are_400_naming_the_field(server, text, param):
    _, base = server()
    status, body, _ = call(base, "POST", CHAT, text)
    assert status == 400 and "finite" in body["error"]["message"]
    assert_openai_error(body, param=param)


@pytest.mark.parametrize("stop, words", [([f"s{index}" for index in range(17)], "17 strings"),
                                         (["x" * 257], "257 characters")])
def test_stop_is_bounded_in_count_and_length(server, stop, words):
    client, base = server()
    status, body, _ = call(base, "POST", CHAT, chat_body(stop=stop))
    assert status == 400 and words in body["error"]["message"]
    assert_openai_error(body, param="stop")
    assert client.chat.completions.create(model=MODEL, messages=USER_HI, stop=[f"s{i}" for i in range(16)]).choices


def test_more_choices_than_the_queue_holds_is_400_not_busy(server):
    client, _ = server(max_queue=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=USER_HI, n=3)
    assert refused.value.body["param"] == "n" and "queue" in refused.value.body["message"]
    assert len(client.chat.completions.create(model=MODEL, messages=USER_HI, n=2).choices) == 2


# --- 10. fields other clients send -------------------------------------------------------------------

def test_unknown_fields_are_ignored_and_named_in_a_header(server):
    client, base = server()
    # chat_template_kwargs is read (the template's switches), cache_prompt always holds here.
    status, body, headers = call(base, "POST", CHAT, chat_body(frobnicate=1, typical_p=0.9, chat_template_kwargs={
        "enable_thinking": False}, cache_prompt=True))
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY[:3]
    assert headers["x-multiseq-ignored-fields"] == "frobnicate, typical_p"
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="abc", max_tokens=2, stream=True,
                                                      extra_body={"mirostat": 2})
    assert raw.headers["x-multiseq-ignored-fields"] == "mirostat"
    status, _, headers = call(base, "POST", CHAT, chat_body())
    assert status == 200 and "x-multiseq-ignored-fields" not in headers


def test_strict_fields_refuses_an_unknown_field_naming_it(server):
    _, base = server(strict_fields=True)
    status, body, _ = call(base, "POST", CHAT, chat_body(frobnicate=1))
    assert status == 400 and "unknown field 'frobnicate'" in body["error"]["message"]
    assert_openai_error(body, param="frobnicate")
    assert call(base, "POST", CHAT, chat_body(cache_prompt=False, repetition_penalty=1.1))[0] == 200


def test_min_tokens_holds_the_end_off_and_repetition_penalty_is_checked_as_repeat_penalty(server):
    client, base = server()
    plain = client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0)
    assert plain.choices[0].message.content == REPLY and plain.usage.completion_tokens == len(REPLY) + 1
    longer = client.chat.completions.create(model=MODEL, messages=USER_HI, temperature=0, max_tokens=len(REPLY) + 4,
                                            extra_body={"min_tokens": len(REPLY) + 4, "top_k": 5, "min_p": 0.1})
    assert longer.choices[0].message.content.startswith(REPLY) and longer.choices[0].finish_reason == "length"
    assert longer.usage.completion_tokens == len(REPLY) + 4
    status, body, _ = call(base, "POST", CHAT, chat_body(min_tokens=10, max_tokens=5))
    assert status == 400 and "min_tokens" in body["error"]["message"]
    status, body, _ = call(base, "POST", CHAT, chat_body(repetition_penalty=-1))
    assert status == 400 and body["error"]["message"].startswith("repetition_penalty must be a number > 0")
    assert_openai_error(body, param="repetition_penalty")
