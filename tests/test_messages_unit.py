"""Anthropic's Messages API: the translation of bodies, messages and streams onto Chat
Completions, checked on dicts and against the official `anthropic` SDK's own types and stream
accumulator."""

from __future__ import annotations

import asyncio
import http.client
import json
import re

import anthropic
import jsonschema
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from fakes import FakeBackend, LatestMention
from multiseq.server import ServerSettings, create_app
from multiseq.request import NO_TIMINGS, FinishReason, Result
from multiseq.server.errors import ApiError
from multiseq.tools import ArgumentsDelta, ReasoningDelta, TextDelta, ToolCallStart
from multiseq.server.messages_errors import error_response
from multiseq.server.messages_output import message_of
from multiseq.server.messages_request import MessagesRequest, translate_request
from multiseq.server.messages_stream import PING, message_events, with_pings
from pydantic import TypeAdapter

MODEL = "fake-model"
WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**fields):
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]} | fields


def refusal(request_body: dict, for_counting: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        translate_request(request_body, for_counting)
    assert caught.value.status == 400
    return caught.value


# --- requests -----------------------------------------------------------------------------------

def test_a_string_system_and_text_blocks_become_a_system_message_and_plain_messages():
    as_string = translate_request(body(system="Be brief.", temperature=0.5, top_k=4, metadata={"user_id": "u"},
                                       service_tier="auto", some_future_field=1)).chat_body
    assert as_string == {"model": MODEL, "max_tokens": 64, "temperature": 0.5, "top_k": 4, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    as_blocks = translate_request(body(system=[
        {"type": "text", "text": "You are a CLI."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}], messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}},
                                     {"type": "text", "text": "there"}]}])).chat_body
    assert as_blocks["messages"] == [{"role": "system", "content": "You are a CLI.\nBe brief."},
                                     {"role": "user", "content": "Hi\nthere"}]


def test_a_tool_round_trip_becomes_tool_calls_then_tool_messages_then_the_text():
    translated = translate_request(body(tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two cities.", "signature": "abc"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "No such city"}],
             "is_error": True},
            {"type": "text", "text": "Thanks!"}]}])).chat_body
    assert translated["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER_TOOL["input_schema"]}}]
    assert translated["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}],
         "reasoning_content": "Two cities."},  # for a thinking template to render back
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: No such city"},
        {"role": "user", "content": "Thanks!"}]


def test_an_assistant_turn_of_calls_only_has_null_content_and_a_turn_of_results_only_no_user_message():
    messages = translate_request(body(messages=[
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "run", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}])).chat_body["messages"]
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_9", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
    assert messages[2:] == [{"role": "tool", "tool_call_id": "toolu_9", "content": ""}]


def test_tool_choice_and_server_tools():
    def tools_of(**fields):
        return translate_request(body(tools=[WEATHER_TOOL], **fields))

    assert tools_of(tool_choice={"type": "auto"}).chat_body["tool_choice"] == "auto"
    assert tools_of(tool_choice={"type": "any"}).chat_body["tool_choice"] == "required"
    assert tools_of(tool_choice={"type": "none"}).chat_body["tool_choice"] == "none"
    forced = tools_of(tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}).chat_body
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert forced["parallel_tool_calls"] is False
    assert "tool_choice" not in tools_of().chat_body and "parallel_tool_calls" not in tools_of().chat_body
    mixed = translate_request(body(tools=[
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "bash_20250124", "name": "bash"},
        {**WEATHER_TOOL, "type": "custom", "cache_control": {"type": "ephemeral"}}]))
    assert mixed.ignored_tools == ("web_search", "bash")
    assert [tool["function"]["name"] for tool in mixed.chat_body["tools"]] == ["get_weather"]
    only_server = translate_request(body(tools=[{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]))
    assert "tools" not in only_server.chat_body and only_server.ignored_tools == ("str_replace_based_edit_tool",)


def test_stop_sequences_streaming_and_counting():
    streamed = translate_request(body(stop_sequences=["\n\nHuman:"], stream=True))
    assert streamed.is_stream and streamed.stop_sequences == ("\n\nHuman:",)
    assert streamed.chat_body["stop"] == ["\n\nHuman:"] and streamed.chat_body["stream"] is True
    assert streamed.chat_body["stream_options"] == {"include_usage": True}
    counted = translate_request({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                 "tools": [WEATHER_TOOL]}, for_counting=True)
    assert set(counted.chat_body) == {"model", "messages", "tools"}


@pytest.mark.parametrize("fields, field, reason", [
    ({"max_tokens": None}, "max_tokens", "Field required"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"model": None}, "model", "required"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "'user', 'assistant' or 'system'"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].source",
     "must be base64 data"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}]}]}, "messages[0].content[0].source.data",
     "is not an image or audio in a format multiseq reads"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0].type",
     "'document' blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "document"}]}]},
     "messages[0].content[1].type", "'document'"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]},
     "messages[1].content[0].tool_use_id", "unexpected tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "r"}]}]},
     "messages[0].content[0].tool_use_id", "needs the id"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": "x"}]}]}, "messages[1].content[0].input", "object"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "Field required"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name", "names the tool"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type", "auto, any, tool, none"),
    ({"system": [{"type": "image"}]}, "system[0].type", "only text"),
    ({"stop_sequences": "END"}, "stop_sequences", "list"),
    ({"stream": "yes"}, "stream", "true or false"),
])
def test_a_bad_body_is_a_400_naming_the_field(fields, field, reason):
    error = refusal(body(**fields))
    assert error.message.startswith(f"{field}: ") and reason in error.message and error.param == field


def test_count_tokens_needs_no_max_tokens_but_checks_the_rest():
    assert translate_request({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}, for_counting=True)
    assert refusal({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                   for_counting=True).param == "messages[0].content[0].source"


def test_errors_are_in_anthropics_shape_with_the_same_status():
    for status, error_type in [(400, "invalid_request_error"), (404, "not_found_error"), (503, "overloaded_error"),
                               (500, "api_error"), (413, "request_too_large")]:
        response = error_response(ApiError(status, "what went wrong", headers={"Retry-After": "2"}))
        assert response.status_code == status and response.headers["retry-after"] == "2"
        assert json.loads(response.body) == {"type": "error", "error": {"type": error_type,
                                                                         "message": "what went wrong"}}


# --- responses ----------------------------------------------------------------------------------

def completion(message: dict, finish_reason: str, **choice) -> dict:
    return {"id": "chatcmpl-abc123", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant"} | message, "finish_reason": finish_reason}
                        | choice],
            "usage": {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112,
                      "prompt_tokens_details": {"cached_tokens": 60, "cached_tokens_from_ram": 0}}}


CALLED = completion({"content": "Let me check.", "reasoning_content": "The user wants weather.", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    "tool_calls")


def test_a_completion_becomes_a_message_the_sdk_reads():
    plain = translate_request(body())
    message = message_of(CALLED, plain)
    assert Message.model_validate(message)  # every field the SDK requires, of the right type
    assert message["id"] == "msg_abc123" and message["model"] == MODEL and message["type"] == "message"
    assert message["content"] == [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]
    assert message["stop_reason"] == "tool_use" and message["stop_sequence"] is None
    # Anthropic's input_tokens leaves out what was read from the cache
    assert message["usage"] == {"input_tokens": 40, "output_tokens": 12, "cache_read_input_tokens": 60,
                                "cache_creation_input_tokens": 0}


def test_stop_reasons():
    stopping = translate_request(body(stop_sequences=["END", "STOP"]))
    assert message_of(completion({"content": "Hi"}, "stop"), stopping)["stop_reason"] == "end_turn"
    assert message_of(completion({"content": "Hi"}, "length"), stopping)["stop_reason"] == "max_tokens"
    matched = message_of(completion({"content": "Hi"}, "stop", stop_reason="STOP"), stopping)
    assert matched["stop_reason"] == "stop_sequence" and matched["stop_sequence"] == "STOP"
    empty = message_of(completion({"content": None}, "stop"), stopping)
    assert empty["content"] == [] and Message.model_validate(empty)


# --- streams ------------------------------------------------------------------------------------

def ends(finish_reason: str, stop_string: str | None = None) -> Result:
    """A stream's end: how, and CALLED's usage."""
    return Result("r-0", "", FinishReason(finish_reason), prompt_tokens=100, completion_tokens=12, timings=NO_TIMINGS,
                  prompt_tokens_cached=60, stop_string=stop_string)


CALLED_EVENTS = [
    ReasoningDelta("The user "), ReasoningDelta("wants weather."),
    TextDelta("Let me "), TextDelta("check."),
    ToolCallStart(0, "call_1", "get_weather"), ArgumentsDelta(0, '{"city": '), ArgumentsDelta(0, '"Paris"}'),
    ToolCallStart(1, "call_2", "get_weather"), ArgumentsDelta(1, '{"city": "Rome"}'),
    ends("tool_calls"),
]


async def iterate(items: list, delay: float = 0.0):
    for item in items:
        if delay:
            await asyncio.sleep(delay)
        yield item


def stream_of(chunks: list, request: MessagesRequest, delay: float = 0.0, ping_interval: float = 10.0) -> list[str]:
    async def collect() -> list[str]:
        return [event async for event in message_events(iterate(chunks, delay), request, "msg_abc123", ping_interval)]
    return asyncio.run(collect())


def parsed(events: list[str]) -> list[tuple[str, dict]]:
    """(event name, data) of each server-sent event; the name always equals the data's type."""
    pairs = []
    for event in events:
        assert event.endswith("\n\n")
        name_line, data_line = event.rstrip("\n").split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        pairs.append((name, data))
    return pairs


def accumulated(events: list[tuple[str, dict]]) -> Message:
    """The message the official SDK builds from the events (what get_final_message() returns)."""
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, buffers = None, {}
    for name, data in events:
        if name != "ping":
            snapshot = accumulate_event(event=adapter.validate_python(data), current_snapshot=snapshot,
                                        json_bufs=buffers)
    return snapshot


def test_a_stream_has_anthropics_events_in_order_and_adds_up_to_the_message():
    request = translate_request(body(stream=True))
    events = parsed(stream_of(CALLED_EVENTS, request))
    assert [name for name, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    deltas = [data["delta"]["type"] for name, data in events if name == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta", "text_delta",
                      "input_json_delta", "input_json_delta", "input_json_delta"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [start["index"] for start in starts] == [0, 1, 2, 3]
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"] == "msg_abc123"
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    final = accumulated(events)
    assert final.model_dump(exclude_none=True)["content"] == message_of(CALLED, request)["content"]
    assert final.stop_reason == "tool_use" and final.usage.input_tokens == 40
    assert final.usage.output_tokens == 12 and final.usage.cache_read_input_tokens == 60


def test_a_stream_that_matched_a_stop_sequence_says_which():
    request = translate_request(body(stream=True, stop_sequences=["END"]))
    events = parsed(stream_of([TextDelta("Hi"), ends("stop", "END")],
                              request))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_a_failure_mid_stream_is_an_error_event_and_ends_it():
    request = translate_request(body(stream=True))
    events = parsed(stream_of([TextDelta("Hi"), ApiError(500, "The server had an error.", "server_error")], request))
    assert [name for name, _ in events][-1] == "error" and "message_stop" not in [name for name, _ in events]
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "The server had an error."}}
    cancelled = parsed(stream_of([TextDelta("Hi"), ends("cancelled")], request))
    assert cancelled[-1][1]["error"]["type"] == "overloaded_error"


def test_pings_keep_a_waiting_stream_alive():
    request = translate_request(body(stream=True))
    events = stream_of([TextDelta("Hi"), ends("stop")], request, delay=0.2, ping_interval=0.05)
    first_block = events.index(next(event for event in events if event.startswith("event: content_block_start")))
    assert events[first_block - 2:first_block].count(PING) == 2, "pings came while the first chunk was awaited"


def test_with_pings_passes_every_item_through_in_order():
    async def collect():
        return [item async for item in with_pings(iterate([1, 2, 3], delay=0.03), interval=0.01)]
    items = asyncio.run(collect())
    assert [item for item in items if item is not None] == [1, 2, 3] and None in items


# --- the routes, spoken to with the official client -----------------------------------------------

HI_PROMPT = "<system>Be brief.<user>Hi<assistant>"  # how the fake backend renders a system and "Hi"
HELLO = "Hello there!"
PARIS = "What is the weather in Paris?"
PARIS_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
SUNNY = "Sunny, 21 C"
SUNNY_REPLY = "It is sunny in Paris."
API_KEY = "sekrit-key"
GREEDY = {"temperature": 0}  # this SDK's create() has no sampling parameters; the API still takes them
RAW_EVENTS = ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
              "message_stop")


@pytest.fixture
def server(make_runner, serve_app):
    """server(**settings) -> (anthropic client, base URL), on a fake backend with scripted replies."""
    def start(**settings):
        backend = FakeBackend(num_slots=4, window=1024, n_batch=64)
        backend.replies = LatestMention({key: reply.encode("utf-8") for key, reply in {
            HI_PROMPT: HELLO, "Be\nbrief.<user>Hi": "Hi, in blocks.", PARIS: PARIS_CALL, SUNNY: SUNNY_REPLY,
            "Tell me a story": "Once upon a time. THE END and more", "Pick a unit": "Celsius, please."}.items()})
        app = create_app(make_runner(backend), ServerSettings(model_name=MODEL, **settings))
        base = serve_app(app)
        return anthropic.Anthropic(base_url=base, api_key=settings.get("api_key") or "unused", max_retries=0), base
    return start


def raw_post(base: str, path: str, payload: dict | str, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a POST that no client shapes."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", path, body=payload if isinstance(payload, str) else json.dumps(payload),
                       headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data), {name.lower(): value for name, value in response.getheaders()}


def blocks_of(message) -> list[dict]:
    """A message's content blocks as plain dicts (a streamed one's blocks are the SDK's Parsed* kind),
    tool_use ids checked and left out (each response has new ones)."""
    blocks = [block.model_dump(exclude={"parsed_output"}, exclude_none=True) for block in message.content]
    assert all(block.pop("id").startswith("toolu_") for block in blocks if block["type"] == "tool_use")
    return blocks


def assert_anthropic_error(body: dict, error_type: str, field: str | None = None) -> None:
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == error_type
    assert "Traceback" not in body["error"]["message"]
    if field is not None:
        assert body["error"]["message"].startswith(f"{field}: ")


def test_create_with_a_string_system_and_with_blocks(server):
    client, _ = server()
    message = client.messages.create(model=MODEL, max_tokens=64, system="Be brief.", extra_body=GREEDY,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].type == "text" and message.content[0].text == HELLO and len(message.content) == 1
    assert message.stop_reason == "end_turn" and message.stop_sequence is None and message.model == MODEL
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(HI_PROMPT) + 1  # + BOS
    assert message.usage.output_tokens == len(HELLO) + 1  # + EOS
    again = client.messages.create(model=MODEL, max_tokens=64, system="Be brief.", extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Hi"}])
    assert again.usage.cache_read_input_tokens > 0, "the same prompt again reads its prefix from the cache"
    assert again.usage.input_tokens == len(HI_PROMPT) + 1 - again.usage.cache_read_input_tokens
    blocks = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}],
        system=[{"type": "text", "text": "Be"}, {"type": "text", "text": "brief.", "cache_control": {"type": "ephemeral"}}])
    assert blocks.content[0].text == "Hi, in blocks."


def test_a_tool_round_trip(server):
    client, _ = server()
    question = [{"role": "user", "content": PARIS}]
    called = client.messages.create(model=MODEL, max_tokens=128, extra_body=GREEDY, tools=[WEATHER_TOOL],
                                    messages=question)
    assert called.stop_reason == "tool_use"
    [call] = [block for block in called.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather" and call.input == {"city": "Paris"}
    answered = client.messages.create(model=MODEL, max_tokens=128, extra_body=GREEDY, tools=[WEATHER_TOOL], messages=[
        *question, {"role": "assistant", "content": called.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": SUNNY}]}])
    assert [block.type for block in answered.content] == ["text"] and answered.content[0].text == SUNNY_REPLY
    assert answered.stop_reason == "end_turn"


UNIT_TOOL = {"name": "set_unit", "description": "Choose the temperature unit.", "input_schema": {
    "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
    "additionalProperties": False}}


def test_a_forced_tool_is_called_with_input_that_validates_against_its_schema(server):
    client, _ = server()
    pick = {"model": MODEL, "max_tokens": 128, "extra_body": GREEDY, "tools": [UNIT_TOOL],
            "messages": [{"role": "user", "content": "Pick a unit"}]}
    unforced = client.messages.create(**pick)
    assert unforced.content[0].text == "Celsius, please." and unforced.stop_reason == "end_turn"
    forced = client.messages.create(**pick, tool_choice={"type": "tool", "name": "set_unit"})
    assert [block.type for block in forced.content] == ["tool_use"] and forced.stop_reason == "tool_use"
    assert forced.content[0].name == "set_unit"
    jsonschema.validate(forced.content[0].input, UNIT_TOOL["input_schema"])


@pytest.mark.parametrize("question, tools, block_types", [
    (PARIS, [WEATHER_TOOL], ["tool_use"]), ("Hi", [], ["text"])])
def test_a_stream_gives_every_event_in_order_and_the_same_message(server, question, tools, block_types):
    client, _ = server()
    request = {"model": MODEL, "max_tokens": 128, "extra_body": GREEDY, "system": "Be brief.", "tools": tools,
               "messages": [{"role": "user", "content": question}]}
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [event for event in events if event in RAW_EVENTS]
    num_deltas = raw.count("content_block_delta")
    assert num_deltas >= 1 and raw == ["message_start", "content_block_start", *["content_block_delta"] * num_deltas,
                                       "content_block_stop", "message_delta", "message_stop"]
    assert ("input_json" if block_types == ["tool_use"] else "text") in events, "the SDK read the deltas"
    assert [block.type for block in final.content] == block_types
    assert blocks_of(final) == blocks_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_the_beta_route_and_count_tokens(server):
    client, _ = server()
    message = client.beta.messages.create(model=MODEL, max_tokens=64, system="Be brief.", extra_body=GREEDY,
                                          messages=[{"role": "user", "content": "Hi"}],
                                          betas=["interleaved-thinking-2025-05-14"])
    assert message.content[0].text == HELLO
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    assert counted.input_tokens == len(HI_PROMPT) + 1
    with_tools = client.messages.count_tokens(model=MODEL, system="Be brief.", tools=[WEATHER_TOOL],
                                              messages=[{"role": "user", "content": "Hi"}])
    assert with_tools.input_tokens > counted.input_tokens, "the tools are part of the prompt"


def test_a_stop_sequence_ends_the_message(server):
    client, _ = server()
    message = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, stop_sequences=["THE END"],
                                     messages=[{"role": "user", "content": "Tell me a story"}])
    assert message.content[0].text == "Once upon a time. "
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "THE END"
    with client.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, stop_sequences=["THE END"],
                                messages=[{"role": "user", "content": "Tell me a story"}]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == "THE END"


def test_errors_are_in_anthropics_shape_and_name_the_field(server):
    client, base = server()
    status, body, _ = raw_post(base, "/v1/messages?beta=true", {"model": MODEL, "messages": [
        {"role": "user", "content": "Hi"}]})
    assert status == 400
    assert_anthropic_error(body, "invalid_request_error", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as bad_block:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert_anthropic_error(bad_block.value.body, "invalid_request_error", "messages[0].content[1].source.data")
    with pytest.raises(anthropic.BadRequestError) as orphan:
        client.messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])
    assert_anthropic_error(orphan.value.body, "invalid_request_error", "messages[2].content[0].tool_use_id")
    with pytest.raises(anthropic.NotFoundError) as unknown_model:
        client.messages.create(model="claude-opus-9", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert_anthropic_error(unknown_model.value.body, "not_found_error")
    status, body, _ = raw_post(base, "/v1/messages", "{not json")
    assert status == 400
    assert_anthropic_error(body, "invalid_request_error")
    status, body, _ = raw_post(base, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "Hi"}], "temperature": "hot"})
    assert status == 400
    assert_anthropic_error(body, "invalid_request_error")
    assert "temperature" in body["error"]["message"], "the chat layer's refusal names the field too"


def test_a_prompt_too_long_for_the_slot_is_said_in_anthropics_words_with_the_numbers(server):
    client, _ = server()
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "word " * 1100}])
    assert_anthropic_error(too_long.value.body, "invalid_request_error")
    # Claude Code compacts the conversation on this message, and reads the numbers with this pattern.
    numbers = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", too_long.value.body["error"]["message"])
    assert numbers is not None and int(numbers[1]) > 1024 and int(numbers[2]) == 1023


def test_the_api_key_by_x_api_key_or_bearer(server):
    client, base = server(api_key=API_KEY)
    hello = {"model": MODEL, "max_tokens": 64, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    assert client.messages.create(**hello).content[0].text == HELLO  # the SDK sends x-api-key
    bearer = anthropic.Anthropic(base_url=base, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(**hello).content[0].text == HELLO
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        status, body, _ = raw_post(base, "/v1/messages?beta=true", hello, headers)
        assert status == 401
        assert_anthropic_error(body, "authentication_error")
    status, body, _ = raw_post(base, "/v1/messages/count_tokens", hello)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, body, _ = raw_post(base, "/v1/chat/completions", chat, {"x-api-key": API_KEY})
    assert status == 200, "x-api-key opens the OpenAI routes too"
    status, body, _ = raw_post(base, "/v1/chat/completions", chat)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", "OpenAI's shape on OpenAI's routes"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(**hello)


SERVER_TOOLS = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
                {"type": "bash_20250124", "name": "bash"}]


def test_server_tools_are_left_out_and_listed_in_a_header(server):
    client, _ = server()
    hello = {"model": MODEL, "max_tokens": 64, "extra_body": GREEDY, "system": "Be brief.",
             "messages": [{"role": "user", "content": "Hi"}]}
    raw = client.messages.with_raw_response.create(tools=SERVER_TOOLS, **hello)
    assert raw.headers["x-multiseq-ignored-tools"] == "web_search, bash"
    assert raw.parse().content[0].text == HELLO, "the prompt has no tools: the same reply as without them"
    with client.messages.stream(tools=SERVER_TOOLS, **hello) as stream:
        assert stream.response.headers["x-multiseq-ignored-tools"] == "web_search, bash"
        assert stream.get_final_message().content[0].text == HELLO
    plain = client.messages.with_raw_response.create(**hello)
    assert "x-multiseq-ignored-tools" not in plain.headers


def test_the_custom_tools_beside_server_tools_are_called(server):
    client, _ = server()
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=128, extra_body=GREEDY,
                                                   tools=[*SERVER_TOOLS, WEATHER_TOOL],
                                                   messages=[{"role": "user", "content": PARIS}])
    assert raw.headers["x-multiseq-ignored-tools"] == "web_search, bash"
    assert raw.parse().content[0].input == {"city": "Paris"}


def test_a_system_message_between_turns_is_kept_where_it_stands():
    """Claude Code sends reminders as system messages inside `messages`."""
    body = translate_request({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Again"}]}).chat_body
    assert [message["role"] for message in body["messages"]] == ["user", "system", "user"]
    assert body["messages"][1]["content"] == "Be brief."


def test_image_blocks_become_the_chats_image_parts_in_their_place():
    import base64

    from tiny_projectors import image_of

    png = base64.b64encode(image_of(8, 8, seed=1)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    request = translate_request({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, image, {"type": "text", "text": "with"},
                                     image]}]})
    assert request.chat_body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "with"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}]
