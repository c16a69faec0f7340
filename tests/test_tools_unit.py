"""Tool calling on the fake backend: the engine's calls, and the chat API's, streamed and not,
read by the official openai client; batch files with tools; a conversation's next turn reusing
the slot that generated its call. The fake model follows a script per rendered prompt, and the
grammar holds it to valid calls."""

from __future__ import annotations

import json

import openai
import pytest

from fakes import FakeBackend
from multiseq import FinishReason, Request, SamplingParams
from multiseq.tools import ChoiceMode, ReasoningDelta, TextDelta, Tool, ToolCallStart, ToolChoice, ToolFormat
from multiseq.tools.prompts import generic_messages
from multiseq.server import ServerSettings, create_app

MODEL = "fake-model"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = (Tool("get_weather", "Weather in a city", WEATHER["function"]["parameters"]),)
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
GREEDY = SamplingParams(temperature=0, max_tokens=120)


def rendered(messages: list[dict], tools=TOOLS) -> str:
    """The prompt the engine renders for a chat with tools on the fake backend (generic format)."""
    return FakeBackend().render_chat(tuple(generic_messages(messages, tools, ToolFormat.GENERIC)))


def backend(replies: dict[str, str]) -> FakeBackend:
    return FakeBackend(num_slots=2, window=1024, n_batch=64, replies=replies)


@pytest.fixture
def server(make_runner, serve_app):
    def start(replies: dict[str, str]):
        runner = make_runner(backend(replies))
        base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))
        return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0), runner
    return start


def test_a_forced_call_is_parsed_into_the_result(make_runner):
    runner = make_runner(backend({rendered(ASK): CALL}))
    [result] = runner.run_batch([Request(messages=ASK, tools=TOOLS, tool_choice=ToolChoice(ChoiceMode.REQUIRED),
                                         sampling=GREEDY)])
    assert result.finish_reason is FinishReason.TOOL_CALLS and result.ok
    [call] = result.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id.startswith("call_") and result.text == ""


def test_the_grammar_holds_a_model_that_would_not_call_to_a_valid_call(make_runner):
    """The script says text; tool_choice required makes it a call whose arguments validate (the
    fake model would write a string forever: the schema bounds it, as it bounds a real model)."""
    tools = (Tool("get_weather", None, {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                        "required": ["city"]}),)
    runner = make_runner(backend({rendered(ASK, tools): "It is sunny."}))
    [result] = runner.run_batch([Request(messages=ASK, tools=tools, tool_choice=ToolChoice(ChoiceMode.REQUIRED),
                                         parallel_tool_calls=False, sampling=SamplingParams(temperature=0, max_tokens=200))])
    assert result.finish_reason is FinishReason.TOOL_CALLS
    assert 0 < len(json.loads(result.tool_calls[0].arguments)["city"]) <= 8


def test_auto_lets_the_model_answer_in_text(make_runner):
    runner = make_runner(backend({rendered(ASK): "It is sunny."}))
    [result] = runner.run_batch([Request(messages=ASK, tools=TOOLS, sampling=GREEDY)])
    assert (result.finish_reason, result.text, result.tool_calls) == (FinishReason.STOP, "It is sunny.", ())


def test_the_chat_api_returns_calls_as_openai_does_streamed_or_not(server):
    client, _ = server({rendered(ASK): CALL})
    chat = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                          temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    calls = [entry for delta in deltas for entry in delta.tool_calls or ()]
    assert calls[0].index == 0 and calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert all(entry.index == 0 and entry.id is None for entry in calls[1:])  # later pieces: index only
    assert "".join(entry.function.arguments or "" for entry in calls) == call.function.arguments
    assert not any(delta.content for delta in deltas)  # no call text leaks into the content
    assert chunks[-2].choices[0].finish_reason == "tool_calls" and chunks[-1].usage.completion_tokens > 0


def test_a_named_function_is_called_and_a_bad_name_is_a_400(server):
    client, _ = server({rendered(ASK): CALL})
    chat = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert chat.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert refused.value.body["param"] == "tool_choice" and "not among the tools" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "object"}}})
    assert "cannot constrain an output that may call tools" in both.value.body["message"]


def test_legacy_functions_map_onto_tools(server):
    client, _ = server({rendered(ASK): CALL})
    chat = client.chat.completions.create(model=MODEL, messages=ASK, functions=[WEATHER["function"]],
                                          function_call={"name": "get_weather"}, temperature=0)
    assert chat.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_the_next_turn_reuses_the_slot_up_to_the_call_it_generated(server):
    """The call, sent back as the client got it, renders to the tokens the model generated: the
    next turn computes only its new messages."""
    client, runner = server({rendered(ASK): CALL})
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0,
                                            max_tokens=8)
    # Every token of the first turn but its last, which ended it and was never decoded.
    computed = first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert second.usage.prompt_tokens_details.cached_tokens == computed


def test_a_batch_file_line_with_tools_gets_its_calls(fake_job, tmp_path, read_jsonl):
    prompts = tmp_path / "batch.jsonl"
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
            "max_tokens": 100}
    prompts.write_text(json.dumps({"custom_id": "w", "method": "POST", "url": "/v1/chat/completions",
                                   "body": body}) + "\n")
    output = tmp_path / "out.jsonl"
    fake_job(prompts, output, backend({rendered(ASK): CALL}))
    [line] = read_jsonl(output)
    message = line["response"]["body"]["choices"][0]["message"]
    assert line["response"]["body"]["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


def test_an_output_no_one_reads_piece_by_piece_is_read_once_at_its_end_to_the_same_result(make_runner):
    """A caller of pieces (on_piece) gets each piece's deltas, read as the output streams; a
    caller of the result alone gets the output read once, whole, when it ends: the same
    content, reasoning and calls (the family's reader: qwen3-xml)."""
    reply = ("<think>The user wants the weather.</think>\nLet me check.\n<tool_call>\n<function=get_weather>\n"
             "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    messages = ({"role": "user", "content": "Weather?"},)
    fake = FakeBackend(num_slots=2, window=512, n_batch=256, replies={"<user>Weather?<assistant>": reply})
    runner = make_runner(fake, tool_format="qwen3-xml")
    ask = Request(messages=messages, sampling=SamplingParams(max_tokens=200, temperature=0))
    deltas = []
    streamed = runner.submit(ask, on_piece=lambda piece: deltas.extend(piece.deltas or ())).result(timeout=30)
    whole = runner.submit(ask).result(timeout=30)
    assert len(deltas) > 3, "the pieces were read as they came"
    for result in (streamed, whole):
        assert (result.text, result.reasoning) == ("Let me check.", "The user wants the weather.")
        assert [(call.name, json.loads(call.arguments)) for call in result.tool_calls] == [
            ("get_weather", {"city": "Paris"})]


def test_a_consumer_that_asks_only_some_pieces_gets_every_delta_once_in_order(make_runner):
    """A consumer that took several pieces at once and asks only the last (a stream that fell
    behind) gets what all of them parse into: together the deltas are the whole output's, each
    once, in order, whichever pieces were asked."""
    reply = ("<think>Weather, then time.</think>Checking both.\n<tool_call>\n<function=get_weather>\n"
             "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
             "<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    fake = FakeBackend(num_slots=2, window=512, n_batch=256, replies={"<user>Both?<assistant>": reply})
    runner = make_runner(fake, tool_format="qwen3-xml")
    ask = Request(messages=({"role": "user", "content": "Both?"},), sampling=SamplingParams(max_tokens=300,
                                                                                            temperature=0))

    def collected(asked_every: int) -> list:
        pieces = []
        result = runner.submit(ask, on_piece=pieces.append).result(timeout=30)  # nothing read yet
        asked = [piece for index, piece in enumerate(pieces) if index % asked_every == 0 or piece is pieces[-1]]
        return result, [delta for piece in asked for delta in piece.deltas]

    every, every_deltas = collected(1)
    some, some_deltas = collected(7)
    for result, deltas in ((every, every_deltas), (some, some_deltas)):
        assert "".join(delta.text for delta in deltas if isinstance(delta, TextDelta)) == result.text == "Checking both."
        assert "".join(delta.text for delta in deltas if isinstance(delta, ReasoningDelta)) == result.reasoning
        assert [delta.name for delta in deltas if isinstance(delta, ToolCallStart)] == ["get_weather", "get_time"]


def test_pieces_asked_together_are_read_as_one_text_and_none_before_it_is_asked():
    """The reading happens on the asking thread, when asked: the step only keeps the text."""
    from multiseq.loop.pieces import OutputPieces
    from multiseq.loop.step_output import TextPiece
    from multiseq.tools import output_parser

    parser = output_parser("qwen3-xml", prompt="<think>\n")
    fed = []
    feed = parser.feed
    parser.feed = lambda text: fed.append(text) or feed(text)
    output = OutputPieces(parser, wants_logprobs=False)
    pieces = []
    for token in (b"Two ", b"cities.", b"</think>", b"Paris ", b"first."):
        pieces.append(TextPiece("r", output.take_bytes(token), (), output, len(output.text_parts)))
    assert fed == [], "nothing is read before a piece is asked"
    assert pieces[3].deltas == (ReasoningDelta("Two cities."), TextDelta("Paris"))
    assert fed == ["Two cities.</think>Paris "], "the four pieces were read as one text"
    assert pieces[3].deltas is pieces[3].deltas and pieces[0].deltas == ()  # handed out once
    assert output.parsed().content == "Paris first."
