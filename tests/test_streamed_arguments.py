"""A call's arguments as they are written, in the JSON-call families (Hermes, Mistral, Llama 3,
the generic format): once a call's arguments pass STREAM_ARGUMENTS_AFTER characters its start
goes out and its arguments follow piece by piece; the deltas add up to the call's arguments;
a shorter call still comes whole; a long call cut off by the end of the output was started in
the stream, and the result drops it with the error; a long call found malformed becomes content,
and the calls after it take the next index. Then the APIs' streams through the official clients."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from hypothesis import given, settings, strategies as st

from fakes import FakeBackend
from multiseq.server import ServerSettings, create_app
from multiseq.tools import ArgumentsDelta, TextDelta, ToolCallStart, ToolFormat
from multiseq.tools.reader import STREAM_ARGUMENTS_AFTER
from multiseq.tools.reading import output_parser
from test_tools_unit import rendered

CONTENT = "".join(f"print('line {number}: \"hello\" wörld')\n" for number in range(120))  # quotes, newlines
WRITE = json.dumps({"path": "main.py", "content": CONTENT}, ensure_ascii=False)
FORMATS = {  # by name: the family, the text before the arguments, and after them
    "hermes": (ToolFormat.HERMES, '<tool_call>\n{"name": "write_file", "arguments": ', "}\n</tool_call>"),
    "mistral": (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "write_file", "arguments": ', "}]"),
    "mistral-v11": (ToolFormat.MISTRAL, "[TOOL_CALLS]write_file[ARGS]", ""),  # Devstral, Mistral Small 3.2
    "llama3": (ToolFormat.LLAMA3, '{"name": "write_file", "parameters": ', "}"),
    "generic": (ToolFormat.GENERIC, '{"tool_calls": [{"name": "write_file", "arguments": ', "}]}"),
    "kimi": ("kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0<|tool_call_argument_begin|>",
             "<|tool_call_end|><|tool_calls_section_end|>"),
    "deepseek": ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write_file\n```json\n",
                 "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseek-v3.1": ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>",
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "gpt-oss": ("gpt-oss", "<|channel|>commentary to=functions.write_file <|constrain|>json<|message|>", "<|call|>"),
}


def feed(tool_format, pieces: list[str]) -> tuple[list, object]:
    parser = output_parser(tool_format, call_id=lambda index: f"call_{index}")
    deltas = [delta for piece in pieces for delta in parser.feed(piece)] + parser.close()
    return deltas, parser.result()


def in_pieces(text: str, size: int = 7) -> list[str]:
    return [text[start:start + size] for start in range(0, len(text), size)]


def arguments_of(deltas: list, index: int = 0) -> str:
    return "".join(delta.text for delta in deltas if isinstance(delta, ArgumentsDelta) and delta.index == index)


@pytest.mark.parametrize("name", list(FORMATS))
def test_long_arguments_stream_as_they_are_written_and_add_up(name):
    tool_format, before, after = FORMATS[name]
    text = before + WRITE + after
    deltas, result = feed(tool_format, in_pieces(text))
    [call] = result.tool_calls
    assert call.arguments == WRITE and arguments_of(deltas) == WRITE
    starts = [delta for delta in deltas if isinstance(delta, ToolCallStart)]
    assert starts == [ToolCallStart(0, "call_0", "write_file")]
    # The start came once the arguments were long enough (read again every 32 characters at
    # first), long before the call's end; then the arguments came at a pace, not at its end.
    start_at = deltas.index(starts[0])
    assert len(arguments_of(deltas[:start_at + 2])) <= STREAM_ARGUMENTS_AFTER + 32 + 7
    assert sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 20


def test_a_short_call_still_comes_whole():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    deltas, _ = feed(ToolFormat.HERMES, list(text))
    assert deltas == [ToolCallStart(0, "call_0", "get_weather"), ArgumentsDelta(0, '{"city": "Paris"}')]


def test_a_long_call_cut_off_was_started_and_the_result_drops_it():
    _, before, _ = FORMATS["hermes"]
    text = "Writing it. " + before + WRITE[:1500]
    deltas, result = feed(ToolFormat.HERMES, in_pieces(text))
    assert result.tool_calls == () and result.error == "the model's tool call was cut off before it ended"
    assert result.content == "Writing it."
    assert [delta for delta in deltas if isinstance(delta, ToolCallStart)] == [ToolCallStart(0, "call_0", "write_file")]
    assert WRITE.startswith(arguments_of(deltas)) and len(arguments_of(deltas)) > 1000
    assert "".join(delta.text for delta in deltas if isinstance(delta, TextDelta)) == "Writing it."


def test_a_long_call_found_malformed_is_content_and_the_next_call_takes_the_next_index():
    broken = WRITE[:-1] + ', "mode": tru}'
    text = ('<tool_call>\n{"name": "write_file", "arguments": ' + broken + "}\n</tool_call>\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    deltas, result = feed(ToolFormat.HERMES, in_pieces(text))
    assert "not valid JSON" in result.error and "write_file" in result.content
    assert [(delta.index, delta.name) for delta in deltas if isinstance(delta, ToolCallStart)] == [(0, "write_file")]
    assert result.tool_calls == ()  # a call after a malformed one is content too, as the format reads


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_long_call_cut_anywhere_gives_the_deltas_and_result_of_the_whole_text(data):
    tool_format, before, after = FORMATS[data.draw(st.sampled_from(list(FORMATS)), label="format")]
    text = before + WRITE + after
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=40), label="cuts"))
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])]
    deltas, result = feed(tool_format, pieces)
    whole_deltas, whole_result = feed(tool_format, [text])
    assert result == whole_result and arguments_of(deltas) == arguments_of(whole_deltas) == WRITE
    assert [delta for delta in deltas if not isinstance(delta, ArgumentsDelta)] == \
        [delta for delta in whole_deltas if not isinstance(delta, ArgumentsDelta)]


# --- the APIs, on the fake backend (the generic format), read by the official clients -----------

WRITE_TOOL = {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}
ASK = [{"role": "user", "content": "Write main.py"}]


@pytest.fixture
def base(make_runner, serve_app):
    from multiseq.tools import Tool

    tools = (Tool("write_file", "Write a file", WRITE_TOOL["function"]["parameters"]),)
    reply = '{"tool_calls": [{"name": "write_file", "arguments": ' + WRITE + "}]}"
    runner = make_runner(FakeBackend(num_slots=2, window=8192, n_batch=256, replies={rendered(ASK, tools): reply}))
    return serve_app(create_app(runner, ServerSettings(model_name="fake")))


def streamed_chat(client: openai.OpenAI, max_tokens: int) -> tuple[list, list[str]]:
    """A streamed chat's chunks, and the arguments deltas of its calls."""
    chunks = list(client.chat.completions.create(model="fake", messages=ASK, tools=[WRITE_TOOL], max_tokens=max_tokens,
                                                 temperature=0, stream=True))
    return chunks, [call.function.arguments for chunk in chunks if chunk.choices
                    for call in chunk.choices[0].delta.tool_calls or () if call.function.arguments]


def test_chat_completions_stream_the_arguments_in_many_chunks(base):
    _, parts = streamed_chat(openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0), 6000)
    assert len(parts) > 20 and "".join(parts) == WRITE


def test_responses_stream_the_arguments_in_many_deltas(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    events = list(client.responses.create(model="fake", input=ASK[0]["content"], max_output_tokens=6000,
                                          tools=[{"type": "function", **WRITE_TOOL["function"]}], stream=True))
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    done = [event.arguments for event in events if event.type == "response.function_call_arguments.done"]
    assert len(deltas) > 20 and "".join(deltas) == WRITE and done == [WRITE]


def test_messages_stream_the_arguments_as_input_json_deltas(base):
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    tool = {"name": "write_file", "description": "Write a file", "input_schema": WRITE_TOOL["function"]["parameters"]}
    with client.messages.stream(model="fake", max_tokens=6000, messages=ASK, tools=[tool]) as stream:
        parts = [event.delta.partial_json for event in stream
                 if event.type == "content_block_delta" and event.delta.type == "input_json_delta"]
        message = stream.get_final_message()
    assert len(parts) > 20 and json.loads("".join(parts)) == json.loads(WRITE)
    assert message.content[-1].input == json.loads(WRITE)


def test_a_long_call_cut_off_ends_the_stream_with_length_and_an_incomplete_item(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    chunks, parts = streamed_chat(client, 400)
    assert WRITE.startswith("".join(parts)) and len("".join(parts)) > 200
    assert chunks[-1].choices[0].finish_reason == "length"
    events = list(client.responses.create(model="fake", input=ASK[0]["content"], max_output_tokens=400,
                                          tools=[{"type": "function", **WRITE_TOOL["function"]}], stream=True))
    [done] = [event.item for event in events if event.type == "response.output_item.done"]
    assert done.type == "function_call" and done.status == "incomplete"
    assert events[-1].type == "response.incomplete"


# --- parameter-block families: a string value's JSON as it is written --------------------------

from multiseq.tools import Tool  # noqa: E402 - the XML part's own import

XML_TOOLS = (Tool("write_file", "Write a file", {"type": "object", "properties": {
    "path": {"type": "string"}, "mode": {"type": "integer"}, "content": {"type": "string"}}}),)
CODE = "".join(f"if x < {n}:\n    print(\"</parameter> is text here\", '{n}')\n" for n in range(60))
XML_CALLS = {
    "qwen3-xml": ("<tool_call>\n<function=write_file>\n<parameter=path>\nmain.py\n</parameter>\n<parameter=mode>\n"
                  "420\n</parameter>\n<parameter=content>\n" + CODE + "\n</parameter>\n</function>\n</tool_call>"),
    "minimax-m2": ('<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">\nmain.py\n</parameter>\n'
                   '<parameter name="mode">\n420\n</parameter>\n<parameter name="content">\n' + CODE +
                   "\n</parameter>\n</invoke>\n</minimax:tool_call>"),
    "glm": ("<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>main.py</arg_value>\n<arg_key>mode</arg_key>\n"
            "<arg_value>420</arg_value>\n<arg_key>content</arg_key>\n<arg_value>" + CODE + "</arg_value>\n</tool_call>"),
    "minicpm5": ('<function name="write_file"><param name="path">main.py</param><param name="mode">420</param>'
                 '<param name="content"><![CDATA[' + CODE + "]]></param></function>"),
    "gemma4": ('<|tool_call>call:write_file{path:<|"|>main.py<|"|>,mode:420,content:<|"|>' + CODE + '<|"|>}<tool_call|>'),
    "seed-oss": ("<seed:tool_call>\n<function=write_file>\n<parameter=path>main.py</parameter>\n<parameter=mode>420"
                 "</parameter>\n<parameter=content>" + CODE + "</parameter>\n</function>\n</seed:tool_call>"),
}


def feed_xml(family: str, pieces: list[str]) -> tuple[list, object]:
    parser = output_parser(family, tools=XML_TOOLS, call_id=lambda index: f"call_{index}")
    deltas = [delta for piece in pieces for delta in parser.feed(piece)] + parser.close()
    return deltas, parser.result()


@pytest.mark.parametrize("family", list(XML_CALLS))
def test_a_long_string_parameter_streams_as_json_and_adds_up(family):
    deltas, result = feed_xml(family, in_pieces(XML_CALLS[family], 5))
    [call] = result.tool_calls
    assert json.loads(call.arguments) == {"path": "main.py", "mode": 420, "content": CODE}
    assert arguments_of(deltas) == call.arguments
    assert sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 20
    assert [delta for delta in deltas if isinstance(delta, ToolCallStart)] == [ToolCallStart(0, "call_0", "write_file")]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_parameter_block_call_cut_anywhere_reads_as_the_whole_text(data):
    family = data.draw(st.sampled_from(list(XML_CALLS)), label="family")
    text = "Writing it.\n" + XML_CALLS[family]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=60), label="cuts"))
    deltas, result = feed_xml(family, [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])])
    whole_deltas, whole_result = feed_xml(family, [text])
    assert result == whole_result and arguments_of(deltas) == arguments_of(whole_deltas) == result.tool_calls[0].arguments


def test_a_family_that_normalizes_arguments_streams_them_normalized():
    """DeepSeek's arguments are handed out as json.dumps writes them, whatever the model wrote."""
    written = json.dumps(json.loads(WRITE), indent=2, ensure_ascii=True)
    _, before, after = FORMATS["deepseek"]
    deltas, result = feed("deepseek", in_pieces(before + written + after))
    assert arguments_of(deltas) == result.tool_calls[0].arguments == WRITE
    assert sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 20


# --- every family, its calls as its grammar writes them -----------------------------------------

from multiseq.tools.families import all_families, family_named  # noqa: E402
from multiseq.tools.writing import written as written_calls  # noqa: E402

# The families whose long arguments stream (the others hand a call out once it closes).
STREAMING = {"hermes", "mistral", "llama3", "generic", "gpt-oss", "kimi", "deepseek", "phi4-mini", "qwen3-xml", "lfm2",
             "apriel", "nemotron-v2", "command-r7b", "firefunction-v2", "granite", "minimax-m1", "solar-open", "functionary-v3.1", "functionary-v3.2", "hy3", "minicpm5", "apertus", "command-r-plus", "gemma4", "muse-glimmer", "minimax-m3",
             "minimax-m2", "seed-oss", "glm"}
ARGUMENTS = {"path": "main.py", "content": CODE.rstrip("\n")}  # (minimax-m2 reads a last newline as markup)


@pytest.mark.parametrize("family", [family for family in all_families() if family.call_syntax is not None],
                         ids=lambda family: family.name)
def test_a_long_call_written_as_the_grammar_writes_it_adds_up_and_streams_where_said(family):
    text = written_calls(family.call_syntax, [("write_file", ARGUMENTS)])
    deltas, result = feed_xml(family.name, in_pieces(text, 5))
    [call] = result.tool_calls
    assert json.loads(call.arguments) == ARGUMENTS and arguments_of(deltas) == call.arguments
    streamed = sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 20
    assert streamed == (family.name in STREAMING), f"{family.name} streams: {streamed}"


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_streaming_family_read_cut_anywhere_gives_the_whole_texts_call(data):
    family = data.draw(st.sampled_from(sorted(name for name in STREAMING if family_named(name).call_syntax)),
                       label="family")
    text = written_calls(family_named(family).call_syntax, [("write_file", ARGUMENTS)])
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=80), label="cuts"))
    deltas, result = feed_xml(family, [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])])
    _, whole = feed_xml(family, [text])
    assert result == whole and arguments_of(deltas) == result.tool_calls[0].arguments


@pytest.mark.parametrize("family, variant", [("deepseek", "deepseek-v3"), ("deepseek", "deepseek-v32"),
                                             ("deepseek", "deepseek-v4"), ("kimi", "kimi-k2"), ("kimi", "kimi-k3")])
def test_every_deepseek_and_kimi_form_streams_and_adds_up(family, variant):
    syntax = family_named(family).variant_call_syntax[variant]
    parser = output_parser(family, tools=XML_TOOLS, variant=variant, call_id=lambda index: f"call_{index}")
    text = written_calls(syntax, [("write_file", ARGUMENTS)])
    deltas = [delta for piece in in_pieces(text, 5) for delta in parser.feed(piece)] + parser.close()
    [call] = parser.result().tool_calls
    assert json.loads(call.arguments) == ARGUMENTS and arguments_of(deltas) == call.arguments
    assert sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 20


@pytest.mark.parametrize("argument", ["'" + "it\\'s a line\\n" * 30 + "'", '"' + "tab\\there \\u00e9\\\\" * 30 + '"',
                                      '"' + "x" * 200 + '\\x41 and more"'])
def test_lfm2_python_strings_stream_as_python_reads_them(argument):
    text = f"<|tool_call_start|>[write_file(force=True, meta={{'a': [1, None]}}, content={argument})]<|tool_call_end|>"
    deltas, result = feed("lfm2", in_pieces(text, 3))
    [call] = result.tool_calls
    assert arguments_of(deltas) == call.arguments and json.loads(call.arguments)["meta"] == {"a": [1, None]}
    _, whole = feed("lfm2", [text])
    assert result == whole


def test_kimi_k3_a_closers_text_inside_a_string_streams_as_text():
    """K3's argument closer counts only where the next tag follows it: a value holding the
    closer's text streams it as text, and the deltas still add up to the call's arguments."""
    syntax = family_named("kimi").variant_call_syntax["kimi-k3"]
    content = "".join(f"line {n}: <|close|>argument<|sep|> is text here\n" for n in range(40))
    text = written_calls(syntax, [("write_file", {"path": "a.md", "content": content})])
    for size in (1, 4, 9):
        parser = output_parser("kimi", tools=XML_TOOLS, variant="kimi-k3", call_id=lambda index: f"call_{index}")
        deltas = [delta for piece in in_pieces(text, size) for delta in parser.feed(piece)] + parser.close()
        [call] = parser.result().tool_calls
        assert json.loads(call.arguments)["content"] == content and arguments_of(deltas) == call.arguments
        assert sum(isinstance(delta, ArgumentsDelta) for delta in deltas) > 10
