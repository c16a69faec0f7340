"""The Responses API: requests translated onto Chat Completions bodies, chat completions and
chunk streams translated back into Response objects and events (checked against the official
openai SDK's models), and the routes spoken to with the real openai client on the fake backend."""

from __future__ import annotations

import http.client
import json

import openai
import pydantic
import pytest
from fakes import FakeBackend
from multiseq.server import ServerSettings, create_app
from multiseq.request import NO_TIMINGS, FinishReason, Result
from multiseq.server.errors import ApiError
from multiseq.tools import ArgumentsDelta, ReasoningDelta, TextDelta, ToolCallStart
from multiseq.server.response_store import (
    MemoryResponseStore,
    MissingResponse,
    SqliteResponseStore,
    StoredResponse,
)
from multiseq.server.responses_events import EventTranslator
from multiseq.server.responses_input import chat_messages, normalize_input
from multiseq.server.responses_output import response_from_completion
from multiseq.server.responses_request import chat_body, chat_param, parse_request
from openai.types.responses import Response, ResponseStreamEvent

MODEL = "fake-model"
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "strict": True}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_request(body)
    assert caught.value.status == 400
    return caught.value


def completion(message: dict, finish_reason: str = "stop", cached: int = 0) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                      "prompt_tokens_details": {"cached_tokens": cached, "cached_tokens_from_ram": 0}}}


def text(value: str) -> TextDelta:
    return TextDelta(value)


def thought(value: str) -> ReasoningDelta:
    return ReasoningDelta(value)


def call(index: int, call_id: str, name: str, *arguments: str) -> list:
    return [ToolCallStart(index, call_id, name), *(ArgumentsDelta(index, piece) for piece in arguments)]


def ends(finish_reason: str) -> Result:
    """The choice's end: how, and its usage (USAGE's counts)."""
    return Result("r-0", "", FinishReason(finish_reason), prompt_tokens=20, completion_tokens=7, timings=NO_TIMINGS,
                  prompt_tokens_cached=12)


def translate(body: dict, parts: list) -> tuple[list[dict], dict]:
    """All the events a stream of deltas and an end makes, each checked against the SDK's event models."""
    translator = EventTranslator(parse_request(body), "resp_1", 1, MODEL)
    events = translator.start()
    for part in parts:
        events += translator.feed(part)
    events += translator.finish()
    for event in events:
        EVENTS.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events, translator.response


USAGE = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
         "prompt_tokens_details": {"cached_tokens": 12, "cached_tokens_from_ram": 0}}


# --- requests -> Chat Completions bodies ----------------------------------------------------------

def test_a_string_input_is_one_user_message_after_the_instructions():
    request = parse_request({"model": MODEL, "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9,
                             "temperature": 0.5, "top_p": 0.9})
    assert chat_body(request, []) == {"model": MODEL, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 9, "temperature": 0.5, "top_p": 0.9}
    assert [item["type"] for item in request.input_items] == ["message"]
    assert request.input_items[0]["id"].startswith("msg_") and request.is_stored and not request.is_stream


def test_items_become_messages_with_calls_gathered_into_one_assistant_turn():
    request = parse_request({"input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                        {"type": "input_text", "text": "Paris and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    ], "tools": [WEATHER_TOOL]})
    assert chat_body(request, [])["messages"] == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in\nParis and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]


def test_calls_without_text_are_an_assistant_turn_with_null_content():
    request = parse_request({"input": [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"}]})
    messages = chat_body(request, [])["messages"]
    assert [message["role"] for message in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["content"] is None and messages[3] == {"role": "assistant", "content": "Sunny."}


def test_history_comes_before_the_new_items():
    earlier = parse_request({"input": "First"}).input_items
    request = parse_request({"input": "Second", "instructions": "Sys"})
    assert chat_body(request, earlier)["messages"] == [
        {"role": "system", "content": "Sys"}, {"role": "user", "content": "First"},
        {"role": "user", "content": "Second"}]


def test_function_tools_are_translated_and_hosted_tools_left_out_and_named():
    request = parse_request({"input": "Hi", "tool_choice": "required", "parallel_tool_calls": False, "tools": [
        {"type": "web_search_preview"}, WEATHER_TOOL, {"type": "custom", "name": "apply_patch"},
        {"type": "mcp", "server_label": "docs", "server_url": "https://example.com"}, {"type": "local_shell"}]})
    body = chat_body(request, [])
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_TOOL["parameters"],
        "strict": True}}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert request.ignored_tools == ["web_search_preview", "custom:apply_patch", "mcp:docs", "local_shell"]
    assert request.echo["tools"] == [WEATHER_TOOL]


def test_tool_choice_naming_a_function_and_allowed_tools():
    named = parse_request({"input": "Hi", "tools": [WEATHER_TOOL],
                           "tool_choice": {"type": "function", "name": "get_weather"}})
    assert named.chat_fields["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    other = {**WEATHER_TOOL, "name": "get_time"}
    allowed = parse_request({"input": "Hi", "tools": [WEATHER_TOOL, other], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}})
    assert [tool["function"]["name"] for tool in allowed.chat_fields["tools"]] == ["get_time"]
    assert allowed.chat_fields["tool_choice"] == "required"
    assert "tool_choice" not in parse_request({"input": "Hi", "tool_choice": "auto"}).chat_fields


def test_text_format_json_schema_becomes_response_format():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    request = parse_request({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "thing",
                                                               "schema": schema, "strict": True}}})
    assert request.chat_fields["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    assert "response_format" not in parse_request({"input": "Hi", "text": {"format": {"type": "text"}}}).chat_fields


def test_fields_codex_sends_are_accepted_and_unknown_ones_ignored():
    request = parse_request({
        "model": MODEL, "input": "Hi", "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "metadata": {"k": "v"}, "user": "u", "prompt_cache_key": "abc",
        "service_tier": "auto", "truncation": "auto", "store": False, "stream": True, "a_field_from_next_year": 1})
    # The effort reaches the chat template (a thinking model's switch); the rest is not the model's.
    assert chat_body(request, []) == {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                      "reasoning_effort": "low"}
    assert request.is_stream and not request.is_stored and request.echo["metadata"] == {"k": "v"}


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "function_call_output", "output": "x"}]},
     "input[1].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"role": "tool", "content": "a"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"content": "no role"}]}, "input[0].type"),
    ({"input": "Hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "Hi", "tools": "all"}, "tools"),
    ({"input": "Hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "Hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "temperature": "hot"}, "temperature"),
    ({"input": "Hi", "ignore_eos": "yes"}, "ignore_eos"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "Hi", "background": True}, "background"),
    ({"input": "Hi", "stream": "yes"}, "stream"),
    ({"input": "Hi", "previous_response_id": 3}, "previous_response_id"),
])
def test_bad_input_is_a_400_naming_the_field(body, param):
    error = refused(body)
    assert error.param == param and error.kind == "invalid_request_error" and error.message


def test_background_is_refused_saying_so():
    assert "not supported" in refused({"input": "Hi", "background": True}).message


def test_chat_errors_name_the_responses_field():
    assert chat_param("max_tokens") == "max_output_tokens"
    assert chat_param("messages[3].content") == "input"
    assert chat_param("response_format.json_schema") == "text.format"
    assert chat_param("temperature") == "temperature" and chat_param(None) is None


# --- chat completions -> Response objects ---------------------------------------------------------

def test_a_completion_becomes_a_response_the_sdk_reads():
    request = parse_request({"model": MODEL, "input": "Hi", "instructions": "Sys", "max_output_tokens": 50})
    body = response_from_completion(request, completion({"content": "Hello!"}, cached=12), "resp_1", 5, MODEL)
    response = Response.model_validate(body)
    assert response.id == "resp_1" and response.status == "completed" and response.output_text == "Hello!"
    assert response.instructions == "Sys" and response.max_output_tokens == 50 and response.model == MODEL
    assert response.usage.input_tokens == 20 and response.usage.output_tokens == 7
    assert response.usage.total_tokens == 27 and response.usage.input_tokens_details.cached_tokens == 12
    message = response.output[0]
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert response.tool_choice == "auto" and response.parallel_tool_calls is True and response.error is None


def test_calls_and_reasoning_become_items_in_order():
    request = parse_request({"input": "Hi", "tools": [WEATHER_TOOL]})
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]
    body = response_from_completion(request, completion({"content": None, "reasoning_content": "Two cities.",
                                                         "tool_calls": calls}, "tool_calls"), "resp_1", 5, MODEL)
    response = Response.model_validate(body)
    assert [item.type for item in response.output] == ["reasoning", "function_call", "function_call"]
    assert response.output[0].content[0].text == "Two cities."
    assert [(item.call_id, json.loads(item.arguments)["city"]) for item in response.output[1:]] == [
        ("call_a", "Oslo"), ("call_b", "Rome")]
    assert all(item.id.startswith("fc_") and item.status == "completed" for item in response.output[1:])


def test_a_cut_short_completion_is_incomplete_for_max_output_tokens():
    request = parse_request({"input": "Hi", "max_output_tokens": 1})
    response = Response.model_validate(response_from_completion(request, completion({"content": "H"}, "length"),
                                                                "resp_1", 5, MODEL))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.output_text == "H"


def test_an_empty_reply_is_still_a_message():
    request = parse_request({"input": "Hi"})
    response = Response.model_validate(response_from_completion(request, completion({"content": ""}), "r", 5, MODEL))
    assert [item.type for item in response.output] == ["message"] and response.output_text == ""


# --- typed stream events -> events ----------------------------------------------------------------------

def test_a_streamed_reply_has_every_event_in_order_and_ends_with_the_usage():
    parts = [thought("Think"), thought("ing."), text("Hel"), text("lo"), ends("stop")]
    events, final = translate({"input": "Hi"}, parts)
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    text_done = next(event for event in events if event["type"] == "response.output_text.done")
    assert text_done["text"] == "Hello" and text_done["output_index"] == 1 and text_done["item_id"].startswith("msg_")
    response = Response.model_validate(final)
    assert response.status == "completed" and response.output_text == "Hello"
    assert response.output[0].content[0].text == "Thinking."
    assert response.usage.input_tokens_details.cached_tokens == 12
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


def test_streamed_calls_are_function_call_items_with_their_arguments():
    parts = [*call(0, "call_a", "get_weather", '{"city": ', '"Oslo"}'),
             *call(1, "call_b", "get_weather", '{"city": "Rome"}'), ends("tool_calls")]
    events, final = translate({"input": "Hi", "tools": [WEATHER_TOOL]}, parts)
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    done = [event for event in events if event["type"] == "response.output_item.done"]
    assert [json.loads(event["item"]["arguments"]) for event in done] == [{"city": "Oslo"}, {"city": "Rome"}]
    response = Response.model_validate(final)
    assert [(item.call_id, item.name) for item in response.output] == [("call_a", "get_weather"),
                                                                        ("call_b", "get_weather")]


def test_a_stream_cut_short_ends_incomplete_and_one_that_fails_ends_failed():
    events, final = translate({"input": "Hi"}, [text("H"), ends("length")])
    assert events[-1]["type"] == "response.incomplete" and final["incomplete_details"] == {
        "reason": "max_output_tokens"}
    events, final = translate({"input": "Hi"}, [text("H"), ApiError(500, "It broke.", "server_error")])
    assert events[-1]["type"] == "response.failed" and final["status"] == "failed"
    assert final["error"] == {"code": "server_error", "message": "It broke."}
    assert final["output"][0]["status"] == "incomplete"


def test_a_stream_with_no_text_still_gives_a_message():
    events, final = translate({"input": "Hi"}, [ends("stop")])
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert Response.model_validate(final).output_text == ""


def test_the_streamed_response_has_the_shape_of_the_non_streamed_one():
    request_body = {"input": "Hi", "tools": [WEATHER_TOOL], "instructions": "Sys"}
    _, streamed = translate(request_body, [
        thought("R"), text("Text"), *call(0, "call_a", "get_weather", "{}"), ends("tool_calls")])
    whole = response_from_completion(parse_request(request_body), completion(
        {"content": "Text", "reasoning_content": "R", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        "tool_calls", cached=12), "resp_1", 1, MODEL)

    def shape(response: dict) -> dict:
        return {**response, "output": [{key: value for key, value in item.items() if key != "id"}
                                       for item in response["output"]], "completed_at": None}

    assert shape(streamed) == shape(whole)


# --- stored responses -----------------------------------------------------------------------------

def stored(response_id: str, previous: str | None, text_in: str, text_out: str) -> StoredResponse:
    request = parse_request({"input": text_in, "previous_response_id": previous})
    response = response_from_completion(request, completion({"content": text_out}), response_id, 1, MODEL)
    return StoredResponse(response_id, 1, previous, request.input_items, response)


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    return MemoryResponseStore() if request.param == "memory" else SqliteResponseStore(tmp_path / "data")


def test_a_conversation_is_the_chain_of_its_responses_oldest_first(store):
    store.put(stored("resp_1", None, "One", "Uno"))
    store.put(stored("resp_2", "resp_1", "Two", "Dos"))
    store.put(stored("resp_3", "resp_2", "Three", "Tres"))
    items = store.conversation("resp_3")
    assert [(item["role"], item["content"][0]["text"]) for item in items] == [
        ("user", "One"), ("assistant", "Uno"), ("user", "Two"), ("assistant", "Dos"), ("user", "Three"),
        ("assistant", "Tres")]
    assert store.get("resp_2").response["output"][0]["content"][0]["text"] == "Dos"


def test_a_missing_link_of_the_chain_is_named(store):
    store.put(stored("resp_1", None, "One", "Uno"))
    store.put(stored("resp_2", "resp_1", "Two", "Dos"))
    assert store.delete("resp_1") and not store.delete("resp_1")
    with pytest.raises(MissingResponse) as caught:
        store.conversation("resp_2")
    assert caught.value.response_id == "resp_1"


def test_the_sqlite_store_keeps_responses_across_restarts(tmp_path):
    SqliteResponseStore(tmp_path).put(stored("resp_1", None, "One", "Uno"))
    assert SqliteResponseStore(tmp_path).get("resp_1").input_items[0]["content"][0]["text"] == "One"


def test_the_memory_store_forgets_the_least_recently_used_beyond_its_capacity():
    store = MemoryResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(stored(name, None, name, name))
    assert store.get("a") is not None  # read: now more recent than b
    store.put(stored("c", None, "c", "c"))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None


# --- the routes, with the official client on the fake backend -------------------------------------

PARIS_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'


class ScriptedBackend(FakeBackend):
    """Replies chosen by how the rendered prompt ends (the tools' description comes first, so
    whole prompts are long), and every prompt the engine was given."""

    def __init__(self, endings: dict[str, str]) -> None:
        super().__init__(num_slots=2, window=1024, n_batch=256)
        self.endings = {ending: reply.encode("utf-8") for ending, reply in endings.items()}
        self.prompts_seen: list[str] = []

    def _next_token(self, slot: int) -> int:
        prompt = bytes(t for t in self.prompts[slot] if t < 256).decode("utf-8", "replace")
        if not self.prompts_seen or self.prompts_seen[-1] != prompt:
            self.prompts_seen.append(prompt)
        reply = next((reply for ending, reply in self.endings.items() if prompt.endswith(ending)), None)
        if reply is None:
            return super()._next_token(slot)
        generated = self.num_generated_fed[slot]
        return reply[generated] if generated < len(reply) else 257  # EOS


@pytest.fixture
def serve(make_runner, serve_app):
    """serve(endings, **settings) -> (openai client, base URL, backend)."""
    def start(endings: dict[str, str] | None = None, **settings):
        backend = ScriptedBackend(endings or {"<user>Hi<assistant>": "Hello!"})
        app = create_app(make_runner(backend), ServerSettings(model_name=MODEL, **settings))
        base = serve_app(app)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=settings.get("api_key") or "unused", max_retries=0)
        return client, base, backend
    return start


def send(base: str, method: str, path: str, body: dict | None = None, headers: dict | None = None):
    """A raw request: (status, JSON body, headers)."""
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data), {name.lower(): value for name, value in response.getheaders()}


def assert_error(status: int, body: dict, expected_status: int, param: str | None) -> None:
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param and body["error"]["message"]
    assert "Traceback" not in body["error"]["message"]


def test_a_string_input_gets_a_response_the_client_reads(serve):
    client, _, _ = serve()
    response = client.responses.create(model=MODEL, input="Hi", temperature=0)
    assert response.object == "response" and response.status == "completed" and response.id.startswith("resp_")
    assert response.output_text == "Hello!" and response.model == MODEL
    assert response.usage.input_tokens == len("<user>Hi<assistant>") + 1  # + BOS
    assert response.usage.output_tokens == len("Hello!") + 1  # + EOS
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    Response.model_validate(response.model_dump(mode="json", exclude_unset=True))


def test_instructions_are_the_system_message(serve):
    client, _, backend = serve({"<system>Be brief.<user>Hi<assistant>": "Ok."})
    response = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.", temperature=0)
    assert response.output_text == "Ok." and response.instructions == "Be brief."
    assert backend.prompts_seen[-1] == "<system>Be brief.<user>Hi<assistant>"


def test_a_probe_of_one_output_token_is_incomplete_not_an_error(serve):
    client, _, _ = serve()
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "H" and response.max_output_tokens == 1


def test_a_forced_tool_call_is_a_function_call_item_with_json_arguments(serve):
    client, _, _ = serve({"Weather in Paris?<assistant>": PARIS_CALL})
    response = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                       tool_choice="required", temperature=0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("fc_")
    assert json.loads(calls[0].arguments) == {"city": "Paris"} and calls[0].call_id
    assert response.status == "completed" and response.tool_choice == "required"


def test_a_function_call_and_its_output_go_round_to_the_model(serve):
    client, _, backend = serve({"Weather in Paris?<assistant>": PARIS_CALL, '"sunny"}}<assistant>': "It is sunny."})
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                    tool_choice="required", temperature=0, store=False)
    call = next(item for item in first.output if item.type == "function_call")
    history = [{"role": "user", "content": "Weather in Paris?"},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = client.responses.create(model=MODEL, input=history, tools=[WEATHER_TOOL], temperature=0)
    assert second.output_text == "It is sunny."
    assert backend.prompts_seen[-1].endswith(
        f'<user>Weather in Paris?<assistant>{PARIS_CALL}'
        f'<user>{{"tool_response": {{"name": "get_weather", "content": "sunny"}}}}<assistant>')


def without_repeats(types: list[str]) -> list[str]:
    return [kind for index, kind in enumerate(types) if index == 0 or types[index - 1] != kind]


def test_every_streamed_event_comes_in_order_and_the_final_response_matches(serve):
    client, _, _ = serve()
    with client.responses.stream(model=MODEL, input="Hi", temperature=0) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert final.output_text == "Hello!" and final.usage.output_tokens == len("Hello!") + 1
    raw = list(client.responses.create(model=MODEL, input="Hi", temperature=0, stream=True))
    # The same events either way; how many text deltas depends on how far the reader lagged
    # the engine (pieces queued behind it come joined).
    assert without_repeats([event.type for event in raw]) == without_repeats(types)
    assert [event.sequence_number for event in raw] == list(range(len(raw)))
    streamed, whole = raw[-1].response, client.responses.create(model=MODEL, input="Hi", temperature=0)
    varying = {"id", "created_at", "completed_at", "output", "usage"}  # a later run hits the prompt cache
    assert streamed.model_dump(exclude=varying) == whole.model_dump(exclude=varying)
    assert [item.model_dump(exclude={"id"}) for item in streamed.output] == [
        item.model_dump(exclude={"id"}) for item in whole.output]


def test_a_streamed_tool_call(serve):
    client, _, _ = serve({"Weather in Paris?<assistant>": PARIS_CALL})
    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                 tool_choice={"type": "function", "name": "get_weather"}, temperature=0) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in types and "response.output_text.delta" not in types
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert json.loads(final.output[0].arguments) == {"city": "Paris"}


def test_cached_tokens_are_counted_in_the_usage(serve):
    client, _, _ = serve()
    client.responses.create(model=MODEL, input="Hi", temperature=0)
    again = client.responses.create(model=MODEL, input="Hi", temperature=0)
    assert 0 < again.usage.input_tokens_details.cached_tokens <= again.usage.input_tokens


def test_hosted_tools_are_left_out_named_in_a_header_and_never_refused(serve):
    client, _, backend = serve()
    raw = client.responses.with_raw_response.create(model=MODEL, input="Hi", temperature=0, tools=[
        {"type": "web_search_preview"}, {"type": "image_generation"}, {"type": "custom", "name": "apply_patch"}])
    assert raw.headers["x-multiseq-ignored-tools"] == "web_search_preview, image_generation, custom:apply_patch"
    assert raw.parse().output_text == "Hello!" and backend.prompts_seen[-1] == "<user>Hi<assistant>"
    with client.responses.with_streaming_response.create(model=MODEL, input="Hi", stream=True,
                                                         tools=[{"type": "web_search"}]) as streamed:
        assert streamed.headers["x-multiseq-ignored-tools"] == "web_search"
    assert "x-multiseq-ignored-tools" not in client.responses.with_raw_response.create(
        model=MODEL, input="Hi").headers


@pytest.mark.parametrize("data_dir", [False, True])
def test_previous_response_id_continues_a_stored_conversation(serve, tmp_path, data_dir):
    client, _, backend = serve({"<user>One<assistant>": "Uno",
                                "<user>One<assistant>Uno<user>Two<assistant>": "Dos",
                                "<assistant>Dos<user>Three<assistant>": "Tres"},
                               **({"data_dir": tmp_path} if data_dir else {}))
    first = client.responses.create(model=MODEL, input="One", temperature=0)
    second = client.responses.create(model=MODEL, input="Two", previous_response_id=first.id, temperature=0)
    third = client.responses.create(model=MODEL, input="Three", previous_response_id=second.id, temperature=0)
    assert (first.output_text, second.output_text, third.output_text) == ("Uno", "Dos", "Tres")
    assert backend.prompts_seen[-1] == "<user>One<assistant>Uno<user>Two<assistant>Dos<user>Three<assistant>"
    assert third.previous_response_id == second.id
    assert (tmp_path / "responses.db").exists() == data_dir


def test_a_response_not_stored_cannot_be_continued_or_fetched(serve):
    client, _, _ = serve()
    unstored = client.responses.create(model=MODEL, input="Hi", store=False)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=unstored.id)
    assert caught.value.body["param"] == "previous_response_id" and unstored.id in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_get_delete_cancel_and_input_items_of_a_stored_response(serve):
    client, _, _ = serve()
    created = client.responses.create(model=MODEL, input=[{"role": "developer", "content": "Sys"},
                                                          {"role": "user", "content": "Hi"}], temperature=0)
    fetched = client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    assert client.responses.cancel(created.id).status == "completed"  # finished: returned as it is
    items = client.responses.input_items.list(created.id)
    assert [item.role for item in items.data] == ["user", "developer"]  # newest first, as OpenAI lists
    assert [item.role for item in client.responses.input_items.list(created.id, order="asc", limit=1).data] == [
        "developer"]
    page = client.responses.input_items.list(created.id, order="asc", after=items.data[1].id)
    assert [item.role for item in page.data] == ["user"] and not page.has_more
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_unknown_responses_are_404s_naming_them(serve):
    _, base, _ = serve()
    for method, path in [("GET", "/v1/responses/resp_nope"), ("DELETE", "/v1/responses/resp_nope"),
                         ("POST", "/v1/responses/resp_nope/cancel"), ("GET", "/v1/responses/resp_nope/input_items")]:
        status, body, _ = send(base, method, path)
        assert_error(status, body, 404, "response_id")
        assert "resp_nope" in body["error"]["message"]


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": [{"role": "user", "content": "a"}, {"type": "function_call", "name": "f"}]},
     "input[1].call_id"),
    ({"model": MODEL, "input": "Hi", "background": True}, "background"),
    ({"model": MODEL, "input": "x" * 2000}, "input"),  # longer than the window: the chat path's error, renamed
    ({"model": MODEL, "input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "no-such-type"}}}}}}, "text.format"),
    ({"model": "another-model", "input": "Hi"}, "model"),
])
def test_bad_requests_are_errors_in_openais_shape_naming_the_field(serve, body, param):
    _, base, _ = serve()
    status, answer, _ = send(base, "POST", "/v1/responses", body)
    assert_error(status, answer, 404 if param == "model" else 400, param)


def test_the_api_key_is_wanted_as_a_bearer_token(serve):
    client, base, _ = serve(api_key="sesame")
    assert client.responses.create(model=MODEL, input="Hi", temperature=0).output_text == "Hello!"
    status, body, _ = send(base, "POST", "/v1/responses", {"model": MODEL, "input": "Hi"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _, _ = send(base, "POST", "/v1/responses", {"model": MODEL, "input": "Hi"},
                        {"Authorization": "Bearer sesame"})
    assert status == 200


def test_the_models_list_also_answers_as_models(serve):
    client, base, _ = serve()
    status, body, _ = send(base, "GET", "/v1/models")
    assert status == 200 and body["models"] == body["data"] and body["data"][0]["id"] == MODEL
    assert [model.id for model in client.models.list()] == [MODEL]


def test_cancelling_a_response_being_generated_ends_it_cancelled(make_runner, serve_app):
    backend = ScriptedBackend({})  # unscripted: it counts on through the bytes until max_output_tokens
    backend.decode_delay = 0.02
    app = create_app(make_runner(backend), ServerSettings(model_name=MODEL))
    client = openai.OpenAI(base_url=f"{serve_app(app)}/v1", api_key="unused", max_retries=0)
    with client.responses.create(model=MODEL, input="Hi", max_output_tokens=500, stream=True) as stream:
        events = iter(stream)
        created = next(events)
        cancelled = client.responses.cancel(created.response.id)
        rest = list(events)
    assert cancelled.status == "cancelled" and rest[-1].type == "response.failed"
    assert rest[-1].response.status == "cancelled" and rest[-1].response.error is None
    assert client.responses.retrieve(created.response.id).status == "cancelled"


def test_a_reasoning_item_comes_back_as_the_next_turns_reasoning_content():
    items = normalize_input([
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"},  # unreadable: nothing to give back
        {"role": "assistant", "content": "Sunny."}])
    messages = chat_messages(None, items)
    assert messages[1] == {"role": "assistant", "content": None, "reasoning_content": "Call the tool.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}
    assert messages[3] == {"role": "assistant", "content": "Sunny."}


def test_an_input_image_becomes_the_chats_image_part_in_its_place():
    import base64

    from tiny_projectors import image_of

    url = "data:image/png;base64," + base64.b64encode(image_of(8, 8, seed=1)).decode()
    request = parse_request({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": url}]}]})
    assert chat_body(request, [])["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": url}}]}]
